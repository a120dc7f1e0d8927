//! Tools for models whose chat template has no tool support (SmolLM2, Llama 2, most base and
//! older chat models): such a template renders the same prompt with or without `tools`, so the
//! model would never learn of them. The session then describes the tools itself, in a system
//! prompt of its own that asks for mlex's generic call format
//! ([`ToolCallFormat::Generic`](super::ToolCallFormat::Generic)):
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! (parsed as Hermes calls are; `tool_choice` required / named holds the reply to it), and
//! writes earlier calls and their results into the conversation as text in the same form
//! (results as `<tool_response>` blocks in a user turn), since the template would drop those too.
//! The reply says so: `GenerateReply::tool_call_format` is `Generic`.
use super::{ChatMessage, Role, Tool};
use crate::tokenizer::{TemplateOptions, Tokenizer};
use serde_json::{json, Value};

/// Whether `tokenizer`'s chat template leaves `tools` out of this conversation's prompt (it
/// renders the same text with and without them), or there is no template at all. A template
/// that fails to render says no (the error comes when the prompt is rendered for real).
pub fn template_drops_tools(tokenizer: &Tokenizer, messages: &[ChatMessage], tools: &[Tool], enable_thinking: Option<bool>) -> bool {
    if !tokenizer.has_chat_template() {
        return true;
    }
    let render = |tools: Option<&[Tool]>| {
        let opts = TemplateOptions { add_generation_prompt: true, tools, enable_thinking, extra: Default::default() };
        tokenizer.apply_chat_template(messages, &opts)
    };
    matches!((render(Some(tools)), render(None)), (Ok(with), Ok(without)) if with == without)
}

/// The system prompt that describes `tools` and the generic call format.
pub fn tool_prompt(tools: &[Tool]) -> String {
    let mut p = String::from(
        "# Tools\n\nYou may call one or more of these tools (functions) to answer. Each is given with \
         the JSON Schema of its arguments:\n\n",
    );
    for t in tools {
        let mut d = json!({"name": t.function.name});
        if let Some(desc) = t.function.description.as_deref().filter(|d| !d.is_empty()) {
            d["description"] = json!(desc);
        }
        d["parameters"] = if t.function.parameters.is_null() { json!({"type": "object"}) } else { t.function.parameters.clone() };
        p.push_str(&d.to_string());
        p.push('\n');
    }
    p.push_str(
        "\nTo call a tool, write the call in this form, one block per call, and stop after the last one:\n\
         <tool_call>\n\
         {\"name\": \"<tool name>\", \"arguments\": {<the arguments, as a JSON object>}}\n\
         </tool_call>\n\n\
         The results come back in the next message, each in a <tool_response> block. When no tool \
         is needed, answer directly in plain text.",
    );
    p
}

/// `messages` as a template without tool support should see them: the tool prompt in the
/// system message (`as_system`; else at the start of the first user message, for templates
/// that have no system role), earlier calls written into their assistant messages and tool
/// results into user messages, in the generic format.
pub fn with_tool_prompt(messages: &[ChatMessage], tools: &[Tool], as_system: bool) -> Vec<ChatMessage> {
    let prompt = tool_prompt(tools);
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    // A user message made of tool results, which more results (or the user's next words) join.
    let mut results_open = false;
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut text = m.content.trim_end().to_string();
                for c in &m.tool_calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{}\n</tool_call>", json!({"name": c.name, "arguments": c.arguments})));
                }
                out.push(ChatMessage { content: text, tool_calls: vec![], ..m.clone() });
                results_open = false;
            }
            Role::Tool => {
                let name = m.name.clone().or_else(|| {
                    let id = m.tool_call_id.as_deref()?;
                    messages[..i].iter().rev().flat_map(|p| &p.tool_calls).find(|c| c.id == id).map(|c| c.name.clone())
                });
                let content: Value = serde_json::from_str(&m.content).unwrap_or_else(|_| Value::String(m.content.clone()));
                let mut r = json!({"content": content});
                if let Some(n) = name {
                    r = json!({"name": n, "content": r["content"].take()});
                }
                let block = format!("<tool_response>\n{r}\n</tool_response>");
                match out.last_mut() {
                    Some(last) if results_open => {
                        last.content.push('\n');
                        last.content.push_str(&block);
                    }
                    _ => out.push(ChatMessage::user(block)),
                }
                results_open = true;
            }
            Role::User if results_open => {
                let last = out.last_mut().expect("results came first");
                last.content.push_str("\n\n");
                last.content.push_str(&m.content);
                results_open = false;
            }
            _ => {
                out.push(m.clone());
                results_open = false;
            }
        }
    }
    if as_system {
        match out.first_mut() {
            Some(first) if matches!(first.role, Role::System | Role::Developer) => {
                first.content = if first.content.trim().is_empty() { prompt } else { format!("{}\n\n{prompt}", first.content.trim_end()) };
            }
            _ => out.insert(0, ChatMessage::system(prompt)),
        }
    } else if let Some(first) = out.iter_mut().find(|m| m.role == Role::User) {
        first.content = format!("{prompt}\n\n{}", first.content);
    } else {
        out.insert(0, ChatMessage::user(prompt));
    }
    out
}

/// The conversation to render for `tools` when the template drops them: the tool prompt as a
/// system message, or in the first user message when the template refuses a system role.
/// None when the template shows the tools itself.
pub fn prepare(tokenizer: &Tokenizer, messages: &[ChatMessage], tools: &[Tool], enable_thinking: Option<bool>) -> Option<Vec<ChatMessage>> {
    if !template_drops_tools(tokenizer, messages, tools, enable_thinking) {
        return None;
    }
    let with_system = with_tool_prompt(messages, tools, true);
    if tokenizer.has_chat_template() {
        let opts = TemplateOptions { add_generation_prompt: true, tools: None, enable_thinking, extra: Default::default() };
        if tokenizer.apply_chat_template(&with_system, &opts).is_err() {
            let in_user = with_tool_prompt(messages, tools, false);
            if tokenizer.apply_chat_template(&in_user, &opts).is_ok() {
                return Some(in_user);
            }
        }
    }
    Some(with_system)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;

    #[test]
    fn history_and_prompt_in_the_generic_form() {
        let tools = vec![Tool::function("get_weather", Some("Weather now".into()), json!({"type": "object", "properties": {"city": {"type": "string"}}}))];
        let call = ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: json!({"city": "Paris"}) };
        let msgs = vec![
            ChatMessage::system("Be brief."),
            ChatMessage::user("Weather in Paris?"),
            ChatMessage::assistant_with_tool_calls("", vec![call]),
            ChatMessage::tool("call_1", "{\"temp\": 21}"),
            ChatMessage::user("And then?"),
        ];
        let out = with_tool_prompt(&msgs, &tools, true);
        assert_eq!(out.len(), 4, "{out:?}");
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools") && out[0].content.contains("\"name\":\"get_weather\""));
        assert!(out[0].content.contains("\"description\":\"Weather now\""));
        let expected = format!("<tool_call>\n{}\n</tool_call>", json!({"name": "get_weather", "arguments": {"city": "Paris"}}));
        assert_eq!(out[2].content, expected);
        assert!(out[2].tool_calls.is_empty());
        assert_eq!(out[3].role, Role::User);
        assert!(out[3].content.starts_with("<tool_response>\n") && out[3].content.contains("\"temp\":21") && out[3].content.ends_with("</tool_response>\n\nAnd then?"), "{}", out[3].content);
        // A parsed call in this form comes back as the call.
        let parsed = crate::chat::parse_tool_calls(&out[2].content, crate::chat::ToolCallFormat::Generic);
        assert_eq!(parsed.calls[0].arguments, json!({"city": "Paris"}));
        // Without a system role: at the start of the first user message.
        let out = with_tool_prompt(&msgs[1..2], &tools, false);
        assert_eq!(out.len(), 1);
        assert!(out[0].content.starts_with("# Tools") && out[0].content.ends_with("\n\nWeather in Paris?"));
    }
}
