//! Tool calls in model output: the formats models write them in, which one a chat template
//! teaches, and parsers that turn them into [`ToolCall`]s. Malformed calls never fail: they stay
//! in the text as the model wrote them.
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Number, Value};

use super::Tool;

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes; Qwen2.5, Qwen3, SmolLM3, GLM…).
    Hermes,
    /// `<tool_call><function=name><parameter=p>value</parameter></function></tool_call>`
    /// (Qwen3-Coder, Qwen3.5, Nemotron 3). Values are typed by the tool's JSON schema.
    Qwen3Coder,
    /// Gemma 4: `<|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>`.
    Gemma4,
    /// Gemma 3's documented convention: a ```` ```tool_code ```` block of Python calls
    /// `name(key="value", n=1)`, one per line.
    GemmaToolCode,
    /// Llama 3.x: `{"name": …, "parameters": {…}}` as the whole reply, optionally after
    /// `<|python_tag|>`; several calls separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}]` or `[TOOL_CALLS]name[ARGS]{…}`.
    Mistral,
    /// mlex's own format for models whose chat template has no tool support: the tools are
    /// described in a system prompt (`chat::generic`) that asks for
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (parsed as Hermes is).
    Generic,
}

impl ToolCallFormat {
    pub const ALL: [ToolCallFormat; 7] = [
        ToolCallFormat::Hermes,
        ToolCallFormat::Qwen3Coder,
        ToolCallFormat::Gemma4,
        ToolCallFormat::GemmaToolCode,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral,
        ToolCallFormat::Generic,
    ];

    /// The format a chat template teaches its model; Hermes when the template says nothing
    /// recognisable (the most widespread convention).
    pub fn detect(template_source: &str) -> ToolCallFormat {
        let has = |s: &str| template_source.contains(s);
        if has("<|tool_call>") {
            ToolCallFormat::Gemma4
        } else if has("<function=") && has("<parameter=") {
            ToolCallFormat::Qwen3Coder
        } else if has("<tool_call>") {
            ToolCallFormat::Hermes
        } else if has("[TOOL_CALLS]") {
            ToolCallFormat::Mistral
        } else if has("<|python_tag|>") || has("<|start_header_id|>") {
            ToolCallFormat::Llama3Json
        } else if has("<start_of_turn>") {
            ToolCallFormat::GemmaToolCode
        } else {
            ToolCallFormat::Hermes
        }
    }

    /// Markers that open a call, each with the marker that closes it (None: runs to the end).
    pub fn openers(self) -> &'static [(&'static str, Option<&'static str>)] {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Generic => &[("<tool_call>", Some("</tool_call>"))],
            // Qwen3-Coder sometimes leaves out the <tool_call> wrapper.
            ToolCallFormat::Qwen3Coder => {
                &[("<tool_call>", Some("</tool_call>")), ("<function=", Some("</function>"))]
            }
            ToolCallFormat::Gemma4 => &[("<|tool_call>", Some("<tool_call|>"))],
            ToolCallFormat::GemmaToolCode => &[("```tool_code", Some("```"))],
            ToolCallFormat::Llama3Json => &[("<|python_tag|>", None)],
            ToolCallFormat::Mistral => &[("[TOOL_CALLS]", None)],
        }
    }

    /// Markers after which the model waits for tool results.
    pub fn stop_markers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Gemma4 => &["<|tool_response>"],
            _ => &[],
        }
    }

    /// The closer of the span `open` starts ("" opens Llama 3's bare JSON, which runs to the end).
    pub(crate) fn closer_for(self, open: &str) -> Option<&'static str> {
        self.openers().iter().find(|(o, _)| *o == open).and_then(|(_, c)| *c)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Qwen3Coder => "qwen3_coder",
            ToolCallFormat::Gemma4 => "gemma4",
            ToolCallFormat::GemmaToolCode => "gemma_tool_code",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
            ToolCallFormat::Generic => "generic",
        }
    }
}

impl fmt::Display for ToolCallFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ToolCallFormat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl FromStr for ToolCallFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "hermes" | "json" | "qwen" | "qwen3" => ToolCallFormat::Hermes,
            "qwen3_coder" | "xml" | "qwen3.5" | "qwen3_5" => ToolCallFormat::Qwen3Coder,
            "gemma4" | "gemma" => ToolCallFormat::Gemma4,
            "gemma_tool_code" | "tool_code" | "gemma3" => ToolCallFormat::GemmaToolCode,
            "llama3_json" | "llama3" | "llama" => ToolCallFormat::Llama3Json,
            "mistral" => ToolCallFormat::Mistral,
            "generic" => ToolCallFormat::Generic,
            other => {
                return Err(format!(
                    "unknown tool call format {other:?} (expected hermes, qwen3_coder, gemma4, gemma_tool_code, llama3_json, mistral or generic)"
                ))
            }
        })
    }
}

/// A call id unique in this process and unlikely to repeat across processes.
pub fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let seed = nanos ^ (std::process::id() as u64).rotate_left(32);
    format!("call_{:016x}{:08x}", splitmix(seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))), n as u32)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

type Calls = Vec<(String, Value)>;

/// Parses the inside of one call span (`open` is the marker that started it).
pub(crate) fn parse_call_body(format: ToolCallFormat, open: &str, body: &str, tools: Option<&[Tool]>) -> Result<Calls, String> {
    match format {
        ToolCallFormat::Hermes | ToolCallFormat::Qwen3Coder | ToolCallFormat::Generic => {
            let t = body.trim();
            if open == "<function=" {
                parse_xml_functions(&format!("<function={body}</function>"), tools)
            } else if t.starts_with("<function=") {
                parse_xml_functions(t, tools)
            } else {
                parse_json_calls(t)
            }
        }
        ToolCallFormat::Gemma4 => parse_gemma4_calls(body),
        ToolCallFormat::GemmaToolCode => parse_python_calls(body),
        ToolCallFormat::Llama3Json => parse_json_calls(body.trim()),
        ToolCallFormat::Mistral => parse_mistral_calls(body),
    }
}

// ---------------------------------------------------------------------------------------------
// JSON calls: one object, several (separated by whitespace, `;` or `,`), or an array.

fn parse_json_calls(text: &str) -> Result<Calls, String> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = match stream.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(format!("tool call is not valid JSON: {e}")),
            None => break,
        };
        let used = stream.byte_offset();
        match value {
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    calls.push(json_call(item)?);
                }
            }
            v => calls.push(json_call(v)?),
        }
        rest = rest[used..].trim_start().trim_start_matches([';', ',']).trim_start();
    }
    if calls.is_empty() {
        return Err("no tool call".into());
    }
    Ok(calls)
}

/// `{"name", "arguments" | "parameters"}`, also nested as `{"function": {…}}`.
fn json_call(v: Value) -> Result<(String, Value), String> {
    let Value::Object(mut obj) = v else { return Err("a tool call must be a JSON object".into()) };
    if let Some(Value::Object(f)) = obj.remove("function") {
        obj = f;
    }
    let name = match obj.remove("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s,
        _ => return Err("a tool call needs a \"name\" string".into()),
    };
    let args = obj.remove("arguments").or_else(|| obj.remove("parameters")).unwrap_or(Value::Object(Map::new()));
    Ok((name, normalize_arguments(args)?))
}

/// Arguments must be an object; a JSON string holding one is unwrapped.
fn normalize_arguments(args: Value) -> Result<Value, String> {
    match args {
        Value::Object(_) => Ok(args),
        Value::Null => Ok(Value::Object(Map::new())),
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ if s.trim().is_empty() => Ok(Value::Object(Map::new())),
            _ => Err("tool call arguments are not a JSON object".into()),
        },
        _ => Err("tool call arguments must be a JSON object".into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Qwen3-Coder XML.

fn parse_xml_functions(text: &str, tools: Option<&[Tool]>) -> Result<Calls, String> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<function=") {
        let after = &rest[start + "<function=".len()..];
        let end = after.find("</function>").ok_or("unclosed <function=")?;
        let inner = &after[..end];
        rest = &after[end + "</function>".len()..];
        let gt = inner.find('>').ok_or("no '>' after the function name")?;
        let name = inner[..gt].trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err("bad function name".into());
        }
        let schema = tools.and_then(|ts| ts.iter().find(|t| t.function.name == name)).map(|t| &t.function.parameters);
        let mut args = Map::new();
        let mut params = &inner[gt + 1..];
        while let Some(p) = params.find("<parameter=") {
            let after = &params[p + "<parameter=".len()..];
            let gt = after.find('>').ok_or("no '>' after the parameter name")?;
            let pname = after[..gt].trim();
            if pname.is_empty() {
                return Err("empty parameter name".into());
            }
            let value_and_rest = &after[gt + 1..];
            // A missing </parameter> ends the value at the next parameter.
            let (value, next) = match value_and_rest.find("</parameter>") {
                Some(e) => (&value_and_rest[..e], &value_and_rest[e + "</parameter>".len()..]),
                None => match value_and_rest.find("<parameter=") {
                    Some(e) => (&value_and_rest[..e], &value_and_rest[e..]),
                    None => (value_and_rest, ""),
                },
            };
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            let ptype = schema.and_then(|s| s.get("properties")).and_then(|p| p.get(pname)).and_then(|p| p.get("type"));
            args.insert(pname.to_string(), typed_value(value, ptype));
            params = next;
        }
        calls.push((name.to_string(), Value::Object(args)));
    }
    if calls.is_empty() {
        return Err("no <function=…> in the tool call".into());
    }
    Ok(calls)
}

/// A bare-text parameter value, typed by the schema's `type` when it has one: strings stay
/// strings; other types take the JSON value when the text parses as JSON (else the text).
/// Without a schema type, JSON numbers, booleans, null, arrays and objects are taken as such.
fn typed_value(text: &str, schema_type: Option<&Value>) -> Value {
    let is_string = |t: &Value| t.as_str().is_some_and(|s| matches!(s, "string" | "str" | "text" | "enum"));
    let string_only = match schema_type {
        Some(Value::Array(types)) => !types.is_empty() && types.iter().all(is_string),
        Some(t) => is_string(t),
        None => false,
    };
    if string_only {
        return Value::String(text.to_string());
    }
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::String(_)) | Err(_) => Value::String(text.to_string()),
        Ok(v) => v,
    }
}

// ---------------------------------------------------------------------------------------------
// Gemma 4: call:name{key:value,…} with <|"|> as the string delimiter and bare keys.

const GEMMA_QUOTE: &str = "<|\"|>";

fn parse_gemma4_calls(body: &str) -> Result<Calls, String> {
    let mut calls = Vec::new();
    let mut p = Cursor { s: body, i: 0 };
    p.skip_ws();
    while !p.done() {
        if !p.eat("call:") {
            return Err("expected call:".into());
        }
        let name = p.take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if name.is_empty() {
            return Err("missing function name".into());
        }
        p.skip_ws();
        if !p.peek_is('{') {
            return Err("expected '{' after the function name".into());
        }
        let args = gemma_value(&mut p, 0)?;
        calls.push((name.to_string(), args));
        p.skip_ws();
        p.eat(",");
        p.skip_ws();
    }
    if calls.is_empty() {
        return Err("no call".into());
    }
    Ok(calls)
}

const MAX_DEPTH: usize = 64;

fn gemma_value(p: &mut Cursor<'_>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("nested too deeply".into());
    }
    p.skip_ws();
    if p.eat(GEMMA_QUOTE) {
        let end = p.rest().find(GEMMA_QUOTE).ok_or("unterminated string")?;
        let s = p.rest()[..end].to_string();
        p.i += end + GEMMA_QUOTE.len();
        return Ok(Value::String(s));
    }
    if p.eat("{") {
        let mut obj = Map::new();
        p.skip_ws();
        if p.eat("}") {
            return Ok(Value::Object(obj));
        }
        loop {
            p.skip_ws();
            let key = if p.eat(GEMMA_QUOTE) {
                let end = p.rest().find(GEMMA_QUOTE).ok_or("unterminated key")?;
                let k = p.rest()[..end].to_string();
                p.i += end + GEMMA_QUOTE.len();
                k
            } else {
                p.take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '$')).to_string()
            };
            if key.is_empty() {
                return Err("expected a key".into());
            }
            p.skip_ws();
            if !p.eat(":") {
                return Err("expected ':' after a key".into());
            }
            let v = gemma_value(p, depth + 1)?;
            obj.insert(key, v);
            p.skip_ws();
            if p.eat(",") {
                continue;
            }
            if p.eat("}") {
                return Ok(Value::Object(obj));
            }
            return Err("expected ',' or '}'".into());
        }
    }
    if p.eat("[") {
        let mut items = Vec::new();
        p.skip_ws();
        if p.eat("]") {
            return Ok(Value::Array(items));
        }
        loop {
            items.push(gemma_value(p, depth + 1)?);
            p.skip_ws();
            if p.eat(",") {
                continue;
            }
            if p.eat("]") {
                return Ok(Value::Array(items));
            }
            return Err("expected ',' or ']'".into());
        }
    }
    // A bare scalar: up to the next delimiter.
    let raw = p.take_while(|c| !matches!(c, ',' | '}' | ']' | '{' | '[')).trim();
    if raw.is_empty() {
        return Err("expected a value".into());
    }
    Ok(match raw {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "null" | "None" => Value::Null,
        _ => match serde_json::from_str::<Value>(raw) {
            Ok(v @ Value::Number(_)) => v,
            _ => Value::String(raw.to_string()),
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Python calls (Gemma 3's ```tool_code blocks): name(key=literal, …), optionally in print(…).

fn parse_python_calls(body: &str) -> Result<Calls, String> {
    let mut calls = Vec::new();
    let mut p = Cursor { s: body, i: 0 };
    loop {
        p.skip_ws_and(&[',', ';']);
        if p.done() {
            break;
        }
        calls.push(python_call(&mut p, 0)?);
    }
    if calls.is_empty() {
        return Err("no call".into());
    }
    Ok(calls)
}

fn python_call(p: &mut Cursor<'_>, depth: usize) -> Result<(String, Value), String> {
    if depth > 2 {
        return Err("nested calls".into());
    }
    let name = p.take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '.')).to_string();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("expected a function name".into());
    }
    p.skip_ws();
    if !p.eat("(") {
        return Err("expected '('".into());
    }
    p.skip_ws();
    // print(f(...)) is how Gemma's docs show a call.
    if name == "print" {
        let inner = python_call(p, depth + 1)?;
        p.skip_ws();
        return if p.eat(")") { Ok(inner) } else { Err("expected ')'".into()) };
    }
    let mut args = Map::new();
    if p.eat(")") {
        return Ok((name, Value::Object(args)));
    }
    loop {
        p.skip_ws();
        let key = p.take_while(|c| c.is_alphanumeric() || c == '_').to_string();
        p.skip_ws();
        if key.is_empty() || !p.eat("=") {
            return Err("only keyword arguments are supported".into());
        }
        let v = python_literal(p, 0)?;
        args.insert(key, v);
        p.skip_ws();
        if p.eat(",") {
            p.skip_ws();
            if p.eat(")") {
                break;
            }
            continue;
        }
        if p.eat(")") {
            break;
        }
        return Err("expected ',' or ')'".into());
    }
    Ok((name, Value::Object(args)))
}

fn python_literal(p: &mut Cursor<'_>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("nested too deeply".into());
    }
    p.skip_ws();
    let Some(c) = p.peek() else { return Err("expected a value".into()) };
    match c {
        '"' | '\'' => python_string(p).map(Value::String),
        '[' | '(' => {
            let close = if c == '[' { "]" } else { ")" };
            p.i += 1;
            let mut items = Vec::new();
            loop {
                p.skip_ws();
                if p.eat(close) {
                    return Ok(Value::Array(items));
                }
                items.push(python_literal(p, depth + 1)?);
                p.skip_ws();
                if !p.eat(",") {
                    p.skip_ws();
                    return if p.eat(close) { Ok(Value::Array(items)) } else { Err("unclosed list".into()) };
                }
            }
        }
        '{' => {
            p.i += 1;
            let mut obj = Map::new();
            loop {
                p.skip_ws();
                if p.eat("}") {
                    return Ok(Value::Object(obj));
                }
                let key = match python_literal(p, depth + 1)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                p.skip_ws();
                if !p.eat(":") {
                    return Err("expected ':' in a dict".into());
                }
                let v = python_literal(p, depth + 1)?;
                obj.insert(key, v);
                p.skip_ws();
                if !p.eat(",") {
                    p.skip_ws();
                    return if p.eat("}") { Ok(Value::Object(obj)) } else { Err("unclosed dict".into()) };
                }
            }
        }
        _ => {
            let word = p.take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+'));
            match word {
                "True" | "true" => Ok(Value::Bool(true)),
                "False" | "false" => Ok(Value::Bool(false)),
                "None" | "null" => Ok(Value::Null),
                w => number(w).ok_or_else(|| format!("not a literal: {w:?}")),
            }
        }
    }
}

fn number(w: &str) -> Option<Value> {
    if let Ok(i) = w.parse::<i64>() {
        return Some(Value::Number(i.into()));
    }
    let f = w.parse::<f64>().ok()?;
    Number::from_f64(f).map(Value::Number)
}

fn python_string(p: &mut Cursor<'_>) -> Result<String, String> {
    let quote = p.peek().ok_or("expected a string")?;
    p.i += quote.len_utf8();
    let mut out = String::new();
    loop {
        let c = p.peek().ok_or("unterminated string")?;
        p.i += c.len_utf8();
        if c == quote {
            return Ok(out);
        }
        if c == '\\' {
            let e = p.peek().ok_or("unterminated string")?;
            p.i += e.len_utf8();
            out.push(match e {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                other => other,
            });
        } else {
            out.push(c);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mistral.

fn parse_mistral_calls(body: &str) -> Result<Calls, String> {
    let mut calls = Vec::new();
    for chunk in body.split("[TOOL_CALLS]") {
        let chunk = chunk.trim();
        if chunk.is_empty() {
            continue;
        }
        if chunk.starts_with(['[', '{']) {
            calls.extend(parse_json_calls(chunk)?);
            continue;
        }
        // name[ARGS]{…} or name[CALL_ID]id[ARGS]{…}
        let args_at = chunk.find("[ARGS]").ok_or("expected [ARGS]")?;
        let head = &chunk[..args_at];
        let name = head.split("[CALL_ID]").next().unwrap_or("").trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err("bad function name".into());
        }
        let args: Value = serde_json::from_str(chunk[args_at + "[ARGS]".len()..].trim())
            .map_err(|e| format!("arguments are not valid JSON: {e}"))?;
        calls.push((name.to_string(), normalize_arguments(args)?));
    }
    if calls.is_empty() {
        return Err("no call".into());
    }
    Ok(calls)
}

// ---------------------------------------------------------------------------------------------

struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }
    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }
    fn peek_is(&self, c: char) -> bool {
        self.peek() == Some(c)
    }
    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }
    fn skip_ws(&mut self) {
        self.skip_ws_and(&[]);
    }
    fn skip_ws_and(&mut self, extra: &[char]) {
        let rest = self.rest();
        let trimmed = rest.trim_start_matches(|c: char| c.is_whitespace() || extra.contains(&c));
        self.i += rest.len() - trimmed.len();
    }
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let rest = self.rest();
        let n = rest.find(|c: char| !f(c)).unwrap_or(rest.len());
        self.i += n;
        &rest[..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::parse::{parse_tool_calls, parse_tool_calls_with_tools};
    use serde_json::json;

    fn one(text: &str, f: ToolCallFormat) -> (String, Value, String) {
        let r = parse_tool_calls(text, f);
        assert_eq!(r.calls.len(), 1, "{text:?} → {r:?}");
        (r.calls[0].name.clone(), r.calls[0].arguments.clone(), r.text_without_calls)
    }

    #[test]
    fn hermes() {
        let (n, a, t) = one("I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", ToolCallFormat::Hermes);
        assert_eq!((n.as_str(), a, t.as_str()), ("get_weather", json!({"city": "Paris"}), "I'll look."));
        let r = parse_tool_calls(
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
            ToolCallFormat::Hermes,
        );
        assert_eq!(r.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(r.calls[1].arguments, json!({"x": 1}));
        assert_ne!(r.calls[0].id, r.calls[1].id);
        assert!(r.calls[0].id.starts_with("call_"));
        assert_eq!(r.text_without_calls, "");
    }

    #[test]
    fn malformed_is_text() {
        for (text, f) in [
            ("<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>", ToolCallFormat::Hermes),
            ("<tool_call>{\"arguments\": {}}</tool_call>", ToolCallFormat::Hermes),
            ("<tool_call>{\"name\": \"a\"", ToolCallFormat::Hermes),
            ("<tool_call><function=f><parameter=x>1</parameter></tool_call>", ToolCallFormat::Qwen3Coder),
            ("<|tool_call>call:f{a:<|\"|>x}<tool_call|>", ToolCallFormat::Gemma4),
            ("<|tool_call>call:f{a:1<tool_call|>", ToolCallFormat::Gemma4),
            ("```tool_code\nf(1, 2)\n```", ToolCallFormat::GemmaToolCode),
            ("```tool_code\nf(a=\n```", ToolCallFormat::GemmaToolCode),
            ("[TOOL_CALLS]f[ARGS]{oops", ToolCallFormat::Mistral),
            ("<|python_tag|>{\"name\": 3}", ToolCallFormat::Llama3Json),
        ] {
            let r = parse_tool_calls(text, f);
            assert!(r.calls.is_empty(), "{text:?}: {r:?}");
            assert_eq!(r.text_without_calls, text, "{f}");
        }
    }

    #[test]
    fn qwen3_coder_xml_typed_by_schema() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>";
        let tools = vec![Tool::function(
            "get_weather",
            None,
            json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}),
        )];
        let r = parse_tool_calls_with_tools(text, ToolCallFormat::Qwen3Coder, Some(&tools));
        assert_eq!(r.calls[0].name, "get_weather");
        assert_eq!(r.calls[0].arguments, json!({"city": "New York", "days": 3, "zip": "10001", "opts": {"a": [1, 2]}}));
        // Without a schema the number stays a number.
        let (_, a, _) = one(text, ToolCallFormat::Qwen3Coder);
        assert_eq!(a["zip"], json!(10001));
        // The bare form without <tool_call>, and Hermes falling back to XML.
        let (n, a, _) = one("<function=f>\n<parameter=q>\nhi there\n</parameter>\n</function>", ToolCallFormat::Qwen3Coder);
        assert_eq!((n.as_str(), a), ("f", json!({"q": "hi there"})));
        let (n, _, _) = one("<tool_call>\n<function=f>\n</function>\n</tool_call>", ToolCallFormat::Hermes);
        assert_eq!(n, "f");
    }

    #[test]
    fn gemma4_values() {
        let (n, a, _) = one(
            "<|tool_call>call:plan{steps:[<|\"|>a, b<|\"|>,<|\"|>c{}<|\"|>],opts:{deep:true,n:-2.5,none:null},title:<|\"|>Hi \"you\"<|\"|>}<tool_call|>",
            ToolCallFormat::Gemma4,
        );
        assert_eq!(n, "plan");
        assert_eq!(a, json!({"steps": ["a, b", "c{}"], "opts": {"deep": true, "n": -2.5, "none": null}, "title": "Hi \"you\""}));
    }

    #[test]
    fn gemma_tool_code() {
        let r = parse_tool_calls(
            "Sure.\n```tool_code\nget_weather(city='Paris', days=2, metric=True)\nprint(search(query=\"a \\\"b\\\"\", tags=['x', 1.5], o={'k': None}))\n```\nDone.",
            ToolCallFormat::GemmaToolCode,
        );
        assert_eq!(r.text_without_calls, "Sure.Done.");
        assert_eq!(r.calls[0].arguments, json!({"city": "Paris", "days": 2, "metric": true}));
        assert_eq!(r.calls[1].name, "search");
        assert_eq!(r.calls[1].arguments, json!({"query": "a \"b\"", "tags": ["x", 1.5], "o": {"k": null}}));
    }

    #[test]
    fn llama3() {
        let (n, a, _) = one("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": \"1\"}}", ToolCallFormat::Llama3Json);
        assert_eq!((n.as_str(), a), ("f", json!({"x": "1"})));
        let r = parse_tool_calls("{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}", ToolCallFormat::Llama3Json);
        assert_eq!(r.calls.len(), 2);
    }

    #[test]
    fn mistral() {
        let r = parse_tool_calls("[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", ToolCallFormat::Mistral);
        assert_eq!(r.calls.len(), 2);
        let r = parse_tool_calls("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]b[CALL_ID]abc123456[ARGS]{}", ToolCallFormat::Mistral);
        assert_eq!(r.calls[0].arguments, json!({"city": "Rome"}));
        assert_eq!(r.calls[1].name, "b");
    }

    #[test]
    fn detect_and_names() {
        assert_eq!(ToolCallFormat::detect("<tool_call>\\n{\"name\""), ToolCallFormat::Hermes);
        assert_eq!(ToolCallFormat::detect("<tool_call>\\n<function=x>\\n<parameter=y>"), ToolCallFormat::Qwen3Coder);
        assert_eq!(ToolCallFormat::detect("'<|tool_call>call:'"), ToolCallFormat::Gemma4);
        assert_eq!(ToolCallFormat::detect("<|start_header_id|>"), ToolCallFormat::Llama3Json);
        assert_eq!(ToolCallFormat::detect("[TOOL_CALLS]"), ToolCallFormat::Mistral);
        assert_eq!(ToolCallFormat::detect("<start_of_turn>"), ToolCallFormat::GemmaToolCode);
        for f in ToolCallFormat::ALL {
            assert_eq!(f.as_str().parse::<ToolCallFormat>().unwrap(), f);
        }
        assert!("nope".parse::<ToolCallFormat>().is_err());
    }
}
