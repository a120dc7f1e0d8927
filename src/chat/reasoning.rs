//! Reasoning ("thinking") spans: which markers a model uses, found from its chat template, and
//! splitting them out of a reply. The streaming side lives in [`super::stream`].
use std::fmt;
use std::str::FromStr;

use super::stream::OutputClassifier;

/// The markers a model puts around its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningFormat {
    /// `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1, SmolLM3, GLM, MiniMax, …).
    Think,
    /// Gemma 4: `<|channel>thought\n…<channel|>`.
    Gemma4Channel,
    /// Mistral reasoning models (Magistral, Ministral 3 Reasoning): `[THINK]…[/THINK]`.
    MistralThink,
}

impl ReasoningFormat {
    pub const ALL: [ReasoningFormat; 3] =
        [ReasoningFormat::Think, ReasoningFormat::Gemma4Channel, ReasoningFormat::MistralThink];

    /// The marker that opens a reasoning span.
    pub fn open(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "<think>",
            ReasoningFormat::Gemma4Channel => "<|channel>thought",
            ReasoningFormat::MistralThink => "[THINK]",
        }
    }

    /// The marker that closes it.
    pub fn close(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "</think>",
            ReasoningFormat::Gemma4Channel => "<channel|>",
            ReasoningFormat::MistralThink => "[/THINK]",
        }
    }

    /// What is fed to the model to end its reasoning early (reasoning budgets): the closer laid
    /// out as the model's own template writes it.
    pub fn forced_close(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "\n</think>\n\n",
            ReasoningFormat::Gemma4Channel => "\n<channel|>",
            ReasoningFormat::MistralThink => "[/THINK]",
        }
    }

    /// The format a chat template writes, if it writes one.
    pub fn detect(template_source: &str) -> Option<ReasoningFormat> {
        if template_source.contains("<|channel>") {
            Some(ReasoningFormat::Gemma4Channel)
        } else if template_source.contains("<think>") {
            Some(ReasoningFormat::Think)
        } else if template_source.contains("[THINK]") {
            Some(ReasoningFormat::MistralThink)
        } else {
            None
        }
    }

    /// Whether `prompt` (rendered text, special tokens kept) ends inside an open reasoning span:
    /// templates such as Qwen3-Thinking's or DeepSeek-R1's end the generation prompt with
    /// `<think>\n`, so the reply starts inside the reasoning without an opening marker.
    pub fn prompt_opens_reasoning(self, prompt: &str) -> bool {
        match prompt.rfind(self.open()) {
            Some(open) => !prompt[open..].contains(self.close()),
            None => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "think",
            ReasoningFormat::Gemma4Channel => "gemma4",
            ReasoningFormat::MistralThink => "mistral",
        }
    }
}

impl fmt::Display for ReasoningFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReasoningFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "think" => Ok(ReasoningFormat::Think),
            "gemma4" | "channel" => Ok(ReasoningFormat::Gemma4Channel),
            "mistral" => Ok(ReasoningFormat::MistralThink),
            other => Err(format!("unknown reasoning format {other:?} (expected think, gemma4 or mistral)")),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_from_templates() {
        assert_eq!(ReasoningFormat::detect("{{ '<think>\\n' }}"), Some(ReasoningFormat::Think));
        assert_eq!(ReasoningFormat::detect("'<|channel>thought\\n<channel|>'"), Some(ReasoningFormat::Gemma4Channel));
        assert_eq!(ReasoningFormat::detect("[THINK]x[/THINK]"), Some(ReasoningFormat::MistralThink));
        assert_eq!(ReasoningFormat::detect("<|im_start|>"), None);
    }

    #[test]
    fn prompt_open_span() {
        let f = ReasoningFormat::Think;
        assert!(f.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!f.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!f.prompt_opens_reasoning("<|im_start|>assistant\n"));
        let g = ReasoningFormat::Gemma4Channel;
        assert!(!g.prompt_opens_reasoning("<|turn>model\n<|channel>thought\n<channel|>"));
    }

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
