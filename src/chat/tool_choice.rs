//! `tool_choice`: whether the model may, must, or must not call the tools it is offered. A call
//! it must make (`required`, or one tool by name) is held to the tools' parameter schemas in the
//! model's own call format by a Lark grammar for the constraint engine (`generate::constraint`):
//! the model still picks the tool (under `required`) and writes the arguments, but it can only
//! write a call that parses and validates.
use super::call_grammar::{lit, parameters, properties, Builder, Syntax};
pub use super::call_grammar::CallSyntax;
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

/// The grammar a call opened with `opener` must follow up to its end, under `tool_choice`
/// `auto` (the model writes freely until it opens a call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyCallGrammar {
    /// The marker that opens the call (as the output classifier finds it).
    pub opener: &'static str,
    /// Lark grammar of what follows the opener: one call of any of the tools, its closer
    /// included.
    pub lark: String,
    /// The call ends with a closing marker (after it the model writes freely again); false:
    /// the call runs to the end of the reply.
    pub closes: bool,
}

/// The tools `choice` lets the model call; None when it demands no call.
fn chosen<'t>(choice: &ToolChoice, tools: &'t [Tool]) -> Result<Option<Vec<&'t Tool>>, String> {
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
    Ok(Some(chosen))
}

/// The Lark grammar of the calls `choice` demands of `tools` in `format` (`required`: one call
/// or more, of any tool; a name: one call of that tool); None when it demands none (`auto`,
/// `none`). Errors name what is wrong (an unknown tool, a tool the format cannot write).
pub fn call_grammar(choice: &ToolChoice, tools: &[Tool], format: ToolCallFormat, syntax: &CallSyntax<'_>) -> Result<Option<String>, String> {
    let Some(chosen) = chosen(choice, tools)? else { return Ok(None) };
    let many = !matches!(choice, ToolChoice::Named(_));
    let mut b = Builder::new(syntax);
    let start = match format {
        ToolCallFormat::Hermes | ToolCallFormat::Generic => {
            let call = format!("{} {}", b.marker("<tool_call>"), hermes_after(&mut b, &chosen));
            repeated(&call, "\n", many)
        }
        ToolCallFormat::Llama3Json => repeated(&json_call(&mut b, &chosen, "parameters"), "; ", many),
        ToolCallFormat::Qwen3Coder => {
            let call = format!("{} {}", b.marker("<tool_call>"), qwen_after_tool_call(&mut b, &chosen)?);
            repeated(&call, "\n", many)
        }
        ToolCallFormat::Gemma4 => {
            let call = format!("{} {}", b.marker("<|tool_call>"), gemma4_after(&mut b, &chosen)?);
            repeated(&call, "", many)
        }
        ToolCallFormat::GemmaToolCode => {
            let call = python_calls(&mut b, &chosen)?;
            format!("{} {} {}", lit("```tool_code\n"), repeated(&call, "\n", many), lit("\n```"))
        }
        ToolCallFormat::Mistral if syntax.mistral_args => {
            let call = format!("{} {}", b.marker("[TOOL_CALLS]"), mistral_args_call(&mut b, &chosen)?);
            repeated(&call, "", many)
        }
        ToolCallFormat::Mistral => {
            let call = json_call(&mut b, &chosen, "arguments");
            format!("{} {} {} {}", b.marker("[TOOL_CALLS]"), lit("["), repeated(&call, ", ", many), lit("]"))
        }
    };
    Ok(Some(b.finish(&start)))
}

/// For `tool_choice` `auto`: per marker that opens a call in `format`, the grammar of the rest
/// of one call of any of `tools`.
pub fn lazy_call_grammars(tools: &[Tool], format: ToolCallFormat, syntax: &CallSyntax<'_>) -> Result<Vec<LazyCallGrammar>, String> {
    let tools: Vec<&Tool> = tools.iter().collect();
    if tools.is_empty() {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for &(opener, closer) in format.openers() {
        let mut b = Builder::new(syntax);
        let start = match (format, opener) {
            (ToolCallFormat::Hermes | ToolCallFormat::Generic, _) => hermes_after(&mut b, &tools),
            (ToolCallFormat::Llama3Json, _) => json_call(&mut b, &tools, "parameters"),
            (ToolCallFormat::Qwen3Coder, "<function=") => qwen_function_rest(&mut b, &tools)?,
            (ToolCallFormat::Qwen3Coder, _) => qwen_after_tool_call(&mut b, &tools)?,
            (ToolCallFormat::Gemma4, _) => gemma4_after(&mut b, &tools)?,
            (ToolCallFormat::GemmaToolCode, _) => format!("{} {} {}", lit("\n"), python_calls(&mut b, &tools)?, lit("\n```")),
            (ToolCallFormat::Mistral, _) if syntax.mistral_args => mistral_args_call(&mut b, &tools)?,
            (ToolCallFormat::Mistral, _) => format!("{} {} {}", lit("["), json_call(&mut b, &tools, "arguments"), lit("]")),
        };
        out.push(LazyCallGrammar { opener, lark: b.finish(&start), closes: closer.is_some() });
    }
    Ok(out)
}

/// `call` once, or several times with `sep` between.
fn repeated(call: &str, sep: &str, many: bool) -> String {
    match (many, sep) {
        (false, _) => call.to_string(),
        (true, "") => format!("({call})+"),
        (true, sep) => format!("({call}) ({} ({call}))*", lit(sep)),
    }
}

/// One call as a JSON object: {"name": <a tool>, "<args>": <its parameters>}.
fn json_call(b: &mut Builder<'_, '_>, tools: &[&Tool], args: &str) -> String {
    let options: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"type": "object", "properties": {"name": {"const": t.function.name}, args: parameters(t)},
                   "required": ["name", args], "additionalProperties": false})
        })
        .collect();
    let schema = if options.len() == 1 { options[0].clone() } else { json!({"anyOf": options}) };
    b.json(&schema, &Value::Null)
}

/// Hermes after `<tool_call>`: "\n{json}\n</tool_call>".
fn hermes_after(b: &mut Builder<'_, '_>, tools: &[&Tool]) -> String {
    let call = json_call(b, tools, "arguments");
    format!("{} {call} {} {}", lit("\n"), lit("\n"), b.marker("</tool_call>"))
}

/// Qwen3-Coder after `<tool_call>`: "\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n…</function>\n</tool_call>".
fn qwen_after_tool_call(b: &mut Builder<'_, '_>, tools: &[&Tool]) -> Result<String, String> {
    let rest = qwen_function_rest(b, tools)?;
    Ok(format!("{} {} {rest} {} {}", lit("\n"), b.marker("<function="), lit("\n"), b.marker("</tool_call>")))
}

/// Qwen3-Coder after `<function=`: "NAME>\n" the parameters "</function>".
fn qwen_function_rest(b: &mut Builder<'_, '_>, tools: &[&Tool]) -> Result<String, String> {
    let mut alts = vec![];
    for t in tools {
        let name = &t.function.name;
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains('>') {
            return Err(format!("tool name {name:?} cannot be written in the qwen3_coder call format"));
        }
        let params = parameters(t);
        let mut items = vec![];
        if let Some(o) = params.as_object() {
            for (p, schema, required) in properties(o) {
                if p.is_empty() || p.contains('>') || p.trim() != p {
                    return Err(format!("parameter {p:?} of {name:?} cannot be written in the qwen3_coder call format"));
                }
                let v = b.xml_value(&schema, &params).map_err(|e| format!("tool {name:?}, parameter {p:?}: {e}"))?;
                let item = format!(
                    "{} {} {v} {} {} {}",
                    b.marker("<parameter="),
                    lit(&format!("{p}>\n")),
                    lit("\n"),
                    b.marker("</parameter>"),
                    lit("\n")
                );
                items.push((item, required));
            }
        }
        let body = b.seq(&items, "");
        alts.push(format!("{} {body} {}", lit(&format!("{name}>\n")), b.marker("</function>")));
    }
    Ok(format!("({})", alts.join(" | ")))
}

/// Gemma 4 after `<|tool_call>`: "call:NAME{…}<tool_call|>".
fn gemma4_after(b: &mut Builder<'_, '_>, tools: &[&Tool]) -> Result<String, String> {
    let mut alts = vec![];
    for t in tools {
        let name = &t.function.name;
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            return Err(format!("tool name {name:?} cannot be written in the gemma4 call format"));
        }
        let mut params = parameters(t);
        if params.get("type").is_none() {
            params["type"] = json!("object");
        }
        let args = b.value(&params, &params, Syntax::Gemma, 0).map_err(|e| format!("tool {name:?}: {e}"))?;
        alts.push(format!("{} {args}", lit(name)));
    }
    Ok(format!("{} ({}) {}", lit("call:"), alts.join(" | "), b.marker("<tool_call|>")))
}

/// Gemma 3's Python call: NAME(key=value, …), one of the tools.
fn python_calls(b: &mut Builder<'_, '_>, tools: &[&Tool]) -> Result<String, String> {
    let ident = |s: &str| !s.is_empty() && !s.starts_with(|c: char| c.is_ascii_digit()) && s.chars().all(|c| c.is_alphanumeric() || c == '_');
    let mut alts = vec![];
    for t in tools {
        let name = &t.function.name;
        if !name.split('.').all(ident) {
            return Err(format!("tool name {name:?} cannot be written in the gemma_tool_code call format"));
        }
        let params = parameters(t);
        let mut items = vec![];
        if let Some(o) = params.as_object() {
            for (p, schema, required) in properties(o) {
                if !ident(&p) {
                    return Err(format!("parameter {p:?} of {name:?} is no Python keyword argument (gemma_tool_code call format)"));
                }
                let v = b.value(&schema, &params, Syntax::Python, 1).map_err(|e| format!("tool {name:?}, parameter {p:?}: {e}"))?;
                items.push((format!("{} {v}", lit(&format!("{p}="))), required));
            }
        }
        let args = b.seq(&items, ", ");
        alts.push(format!("{} {args} {}", lit(&format!("{name}(")), lit(")")));
    }
    Ok(format!("({})", alts.join(" | ")))
}

/// Mistral after `[TOOL_CALLS]`: NAME[ARGS]{json}.
fn mistral_args_call(b: &mut Builder<'_, '_>, tools: &[&Tool]) -> Result<String, String> {
    let mut alts = vec![];
    for t in tools {
        let name = &t.function.name;
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains('[') {
            return Err(format!("tool name {name:?} cannot be written in the mistral call format"));
        }
        let params = parameters(t);
        let args = b.json(&params, &params);
        alts.push(format!("{} {} {args}", lit(name), b.marker("[ARGS]")));
    }
    Ok(format!("({})", alts.join(" | ")))
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
        let plain = CallSyntax::plain();
        let g = call_grammar(&ToolChoice::Named("f".into()), &tools, ToolCallFormat::Hermes, &plain).unwrap().unwrap();
        assert!(g.contains("<tool_call>") && g.contains("\"const\":\"f\""), "{g}");
        assert!(call_grammar(&ToolChoice::Named("g".into()), &tools, ToolCallFormat::Hermes, &plain).unwrap_err().contains("\"g\""));
        assert_eq!(call_grammar(&ToolChoice::Auto, &tools, ToolCallFormat::Hermes, &plain).unwrap(), None);
        // Every format has a grammar; a marker that is a token of its own is matched as that token.
        for f in ToolCallFormat::ALL {
            assert!(call_grammar(&ToolChoice::Required, &tools, f, &plain).unwrap().is_some(), "{f}");
            assert_eq!(lazy_call_grammars(&tools, f, &plain).unwrap().len(), f.openers().len(), "{f}");
        }
        let special = CallSyntax { marker_id: Box::new(|m| (m == "<|tool_call>").then_some(7)), mistral_args: false };
        let g = call_grammar(&ToolChoice::Required, &tools, ToolCallFormat::Gemma4, &special).unwrap().unwrap();
        assert!(g.contains("<[7]>") && g.contains("\"call:\""), "{g}");
        // Names a format cannot write are refused, naming the tool.
        let odd = vec![Tool::function("a b", None, json!({"type": "object"}))];
        for f in [ToolCallFormat::Qwen3Coder, ToolCallFormat::Gemma4, ToolCallFormat::GemmaToolCode] {
            assert!(call_grammar(&ToolChoice::Required, &odd, f, &plain).unwrap_err().contains("\"a b\""), "{f}");
        }
    }
}
