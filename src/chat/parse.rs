//! Whole-reply parsing: a complete reply's reasoning spans or tool calls taken out, by running
//! it through the streaming classifier (`stream.rs`) in one push, so both paths parse alike.
use super::reasoning::ReasoningFormat;
use super::stream::OutputClassifier;
use super::tools::ToolCallFormat;
use super::{Tool, ToolCall};

/// A reply with its reasoning split off.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SplitReasoning {
    /// What is left: the answer, without markers.
    pub text: String,
    /// The reasoning (spans joined by a blank line); None when there was none.
    pub reasoning: Option<String>,
}

/// Splits the reasoning spans out of a complete reply. `starts_inside`: the prompt ended in an
/// open span (see [`ReasoningFormat::prompt_opens_reasoning`]). Markers never remain in `text`;
/// whitespace next to them is dropped; an unclosed span is reasoning up to the end.
pub fn split_reasoning(text: &str, format: ReasoningFormat, starts_inside: bool) -> SplitReasoning {
    let mut c = OutputClassifier::new(Some(format), None, starts_inside);
    c.push(text);
    c.finish();
    let out = c.into_output(None);
    SplitReasoning { text: out.text, reasoning: out.reasoning }
}

/// Text with its tool calls taken out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedToolCalls {
    /// The text without the calls' markup (whitespace next to it dropped); calls that did not
    /// parse stay in it as written.
    pub text_without_calls: String,
    pub calls: Vec<ToolCall>,
}

/// Parses the tool calls out of a complete reply. Ids are fresh (`call_` + 24 hex digits).
pub fn parse_tool_calls(text: &str, format: ToolCallFormat) -> ParsedToolCalls {
    parse_tool_calls_with_tools(text, format, None)
}

/// [`parse_tool_calls`] with the tools that were offered: their JSON schemas type the values of
/// formats that write parameters as bare text (Qwen3-Coder's XML).
pub fn parse_tool_calls_with_tools(text: &str, format: ToolCallFormat, tools: Option<&[Tool]>) -> ParsedToolCalls {
    let mut c = OutputClassifier::new(None, Some(format), false);
    c.push(text);
    c.finish();
    let out = c.into_output(tools);
    ParsedToolCalls { text_without_calls: out.text, calls: out.tool_calls }
}

/// [`parse_tool_calls`] for text of an unknown format: every format is tried (Hermes first)
/// and the first that finds calls wins; none: the text as it is.
pub fn parse_tool_calls_any(text: &str) -> ParsedToolCalls {
    for f in ToolCallFormat::ALL {
        let r = parse_tool_calls(text, f);
        if !r.calls.is_empty() {
            return r;
        }
    }
    ParsedToolCalls { text_without_calls: text.to_string(), calls: vec![] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_basic_and_inside() {
        let s = split_reasoning("<think>\nLet me see.\n</think>\n\nParis.", ReasoningFormat::Think, false);
        assert_eq!(s, SplitReasoning { text: "Paris.".into(), reasoning: Some("Let me see.".into()) });
        let s = split_reasoning("Let me see.\n</think>\n\nParis.", ReasoningFormat::Think, true);
        assert_eq!(s, SplitReasoning { text: "Paris.".into(), reasoning: Some("Let me see.".into()) });
        let s = split_reasoning("Just text.", ReasoningFormat::Think, false);
        assert_eq!(s, SplitReasoning { text: "Just text.".into(), reasoning: None });
        let s = split_reasoning("<|channel>thought\nHmm.<channel|>Answer", ReasoningFormat::Gemma4Channel, false);
        assert_eq!(s, SplitReasoning { text: "Answer".into(), reasoning: Some("Hmm.".into()) });
        // Unclosed: reasoning to the end; a stray closer is dropped from text.
        let s = split_reasoning("<think>still going", ReasoningFormat::Think, false);
        assert_eq!(s, SplitReasoning { text: "".into(), reasoning: Some("still going".into()) });
        let s = split_reasoning("a</think>b", ReasoningFormat::Think, false);
        assert_eq!(s.text, "ab");
    }
}
