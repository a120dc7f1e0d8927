//! `tool_choice`: whether the model may, must, or must not call the tools it is offered. A call
//! it must make (`required`, or one tool by name) is held to the tools' parameter schemas in the
//! model's own call format by a Lark grammar for the constraint engine (`generate::constraint`):
//! the model still picks the tool (under `required`) and writes the arguments, but it can only
//! write a call that parses and validates.
use super::{Tool, ToolCallFormat};
use serde_json::{json, Value};

/// What the model may do with the tools (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Call tools or answer in text, as the model likes (the default).
    Auto,
    /// Answer in text: the tools are not shown to the model.
    None,
    /// Call one or more of the tools.
    Required,
    /// Call this tool.
    Named(String),
}

impl ToolChoice {
    /// `"auto" | "none" | "required" | {"name": N} | {"type": "function", "function": {"name": N}}`.
    pub fn from_json(v: &Value, name: &str) -> Result<Self, String> {
        match v {
            Value::String(s) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(format!("{name} must be 'auto', 'none', 'required' or {{name}}, got {other:?}")),
            },
            Value::Object(o) => {
                let n = o
                    .get("name")
                    .or_else(|| o.get("function").and_then(|f| f.get("name")))
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("{name} as an object needs a tool 'name', got {v}"))?;
                Ok(ToolChoice::Named(n.to_string()))
            }
            other => Err(format!("{name} must be 'auto', 'none', 'required' or {{name}}, got {other}")),
        }
    }
}

/// The Lark grammar of the calls `choice` demands of `tools` in `format`; None when it demands
/// none (`auto`, `none`). Errors name what is wrong (an unknown tool, a format not covered).
pub fn call_grammar(choice: &ToolChoice, tools: &[Tool], format: ToolCallFormat) -> Result<Option<String>, String> {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(n) => {
            let t: Vec<&Tool> = tools.iter().filter(|t| &t.function.name == n).collect();
            if t.is_empty() {
                let names: Vec<&str> = tools.iter().map(|t| t.function.name.as_str()).collect();
                return Err(format!("tool_choice names {n:?}, which is not among the tools ({})", names.join(", ")));
            }
            t
        }
    };
    if chosen.is_empty() {
        return Err("tool_choice 'required' needs tools".into());
    }
    // One call object: {"name": <const>, "<args key>": <the tool's parameters>}.
    let call = |args: &str| {
        let options: Vec<Value> = chosen
            .iter()
            .map(|t| {
                let params = if t.function.parameters.is_object() { t.function.parameters.clone() } else { json!({"type": "object"}) };
                json!({"type": "object", "properties": {"name": {"const": t.function.name}, args: params},
                       "required": ["name", args], "additionalProperties": false})
            })
            .collect();
        let mut schema = if options.len() == 1 { options[0].clone() } else { json!({"anyOf": options}) };
        schema["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        format!("%json {schema}")
    };
    let many = !matches!(choice, ToolChoice::Named(_));
    Ok(Some(match format {
        ToolCallFormat::Hermes => {
            let rest = if many { " (\"\\n\" call)*" } else { "" };
            format!("start: call{rest}\ncall: \"<tool_call>\\n\" {} \"\\n</tool_call>\"\n", call("arguments"))
        }
        ToolCallFormat::Llama3Json => {
            let rest = if many { " (\"; \" call)*" } else { "" };
            format!("start: call{rest}\ncall: {}\n", call("parameters"))
        }
        other => {
            return Err(format!(
                "tool_choice {choice:?} is not supported yet for the {other} call format (supported: hermes, llama3_json)"
            ))
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_grammars_name_the_tools() {
        assert_eq!(ToolChoice::from_json(&json!("required"), "tc").unwrap(), ToolChoice::Required);
        assert_eq!(
            ToolChoice::from_json(&json!({"type": "function", "function": {"name": "f"}}), "tc").unwrap(),
            ToolChoice::Named("f".into())
        );
        assert!(ToolChoice::from_json(&json!("always"), "toolChoice").unwrap_err().contains("toolChoice"));
        let tools = vec![Tool::function("f", None, json!({"type": "object", "properties": {"a": {"type": "integer"}}}))];
        let g = call_grammar(&ToolChoice::Named("f".into()), &tools, ToolCallFormat::Hermes).unwrap().unwrap();
        assert!(g.contains("<tool_call>") && g.contains("\"const\":\"f\""), "{g}");
        assert!(call_grammar(&ToolChoice::Named("g".into()), &tools, ToolCallFormat::Hermes).unwrap_err().contains("\"g\""));
        assert!(call_grammar(&ToolChoice::Required, &tools, ToolCallFormat::Gemma4).unwrap_err().contains("gemma4"));
        assert_eq!(call_grammar(&ToolChoice::Auto, &tools, ToolCallFormat::Hermes).unwrap(), None);
    }
}
