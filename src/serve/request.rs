//! The pure part of the server's request parsing: a request body's JSON into the conversation,
//! tools and option fields of OpenAI's chat completions and completions, Anthropic's messages and
//! OpenAI's responses, every malformed field a 400 naming it. Plain Rust over serde_json, apart
//! from the handlers (openai.rs, anthropic.rs, responses.rs) and the generation options they
//! build from the fields, so the fuzz crate compiles it on its own
//! (fuzz/fuzz_targets/serve_request.rs).
use super::error::ApiError;
use crate::chat::{parse_messages_json_with, parse_tools_json, ChatMessage, MediaAccess, Role, Tool, ToolCall};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// The JSON object of a request body's bytes.
pub(crate) fn json_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad(format!("the request body is not valid JSON: {e}"))),
    }
}

/// A required string field.
pub(crate) fn string_field<'a>(body: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, ApiError> {
    match body.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(ApiError::bad(format!("{name} must be a string, got {v}")).param(name)),
        None => Err(ApiError::bad(format!("{name} is required")).param(name)),
    }
}

/// A field that is absent, null, or of `kind` (checked by `is`); the wrong type is a 400.
pub(crate) fn optional<'a>(
    body: &'a Map<String, Value>,
    name: &'static str,
    kind: &str,
    is: fn(&Value) -> bool,
) -> Result<Option<&'a Value>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) if is(v) => Ok(Some(v)),
        Some(v) => Err(ApiError::bad(format!("{name} must be {kind}, got {v}")).param(name)),
    }
}

/// A boolean field (absent or null: false).
pub(crate) fn flag(body: &Map<String, Value>, name: &'static str) -> Result<bool, ApiError> {
    Ok(optional(body, name, "a boolean", Value::is_boolean)?.and_then(Value::as_bool).unwrap_or(false))
}

/// Copies the fields `names` that are set (not null) from `body` into `o`.
pub(crate) fn copy_fields(body: &Map<String, Value>, names: &[&str], o: &mut Map<String, Value>) {
    for f in names {
        if let Some(v) = body.get(*f).filter(|v| !v.is_null()) {
            o.insert(f.to_string(), v.clone());
        }
    }
}

// ---- OpenAI: chat completions and completions ----

/// What a streamed request sends its chunks as: a chat delta or a completion's text.
#[derive(Clone, Copy)]
pub(crate) enum Shape {
    Chat,
    Completion,
}

/// Fields of a request that become generation options, by their OpenAI (snake_case) names.
const OPTION_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "seed",
    "response_format",
    "tool_choice",
    "top_k",
    "min_p",
    "repetition_penalty",
    "reasoning_budget_tokens",
    "enable_thinking",
    "ignore_eos",
];

/// OpenAI fields with no effect here, accepted when they ask for nothing.
pub(crate) fn refuse_unsupported(body: &Map<String, Value>) -> Result<(), ApiError> {
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n != 1) {
        return Err(ApiError::bad("n > 1 is not supported: send several requests (they are batched)").param("n"));
    }
    for p in ["presence_penalty", "frequency_penalty"] {
        if body.get(p).and_then(Value::as_f64).is_some_and(|x| x != 0.0) {
            return Err(ApiError::bad(format!("{p} is not supported (repetition_penalty is)")).param(p));
        }
    }
    if body.get("logit_bias").and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::bad("logit_bias is not supported").param("logit_bias"));
    }
    Ok(())
}

/// What a request asks of log probabilities: None, or each token's with its `n` most likely
/// alternatives (chat: `logprobs: true` and `top_logprobs: n`; completions: `logprobs: n`).
pub(crate) fn logprobs_wanted(body: &Map<String, Value>, shape: Shape) -> Result<Option<usize>, ApiError> {
    let count = |name: &'static str| -> Result<Option<usize>, ApiError> {
        Ok(optional(body, name, "a non-negative integer", |v| v.is_u64())?.and_then(Value::as_u64).map(|n| n as usize))
    };
    match shape {
        Shape::Chat => {
            let top = count("top_logprobs")?;
            if !flag(body, "logprobs")? {
                if top.is_some_and(|n| n > 0) {
                    return Err(ApiError::bad("top_logprobs needs logprobs: true").param("top_logprobs"));
                }
                return Ok(None);
            }
            Ok(Some(top.unwrap_or(0)))
        }
        Shape::Completion => match body.get("logprobs") {
            Some(Value::Bool(b)) => Ok(b.then_some(0)),
            _ => count("logprobs"),
        },
    }
}

/// The option fields of a chat or completions request, by their snake_case names
/// (`top_logprobs`: what [`logprobs_wanted`] said).
pub(crate) fn option_fields(body: &Map<String, Value>, top_logprobs: Option<usize>) -> Map<String, Value> {
    let mut o = Map::new();
    if let Some(n) = top_logprobs.filter(|&n| n > 0) {
        o.insert("top_logprobs".into(), json!(n));
    }
    copy_fields(body, OPTION_FIELDS, &mut o);
    if let Some(n) = body.get("max_completion_tokens").or_else(|| body.get("max_tokens")).filter(|v| !v.is_null()) {
        o.insert("max_tokens".into(), n.clone());
    }
    match body.get("stop") {
        Some(Value::String(s)) => {
            o.insert("stop".into(), json!([s]));
        }
        Some(v @ Value::Array(_)) => {
            o.insert("stop".into(), v.clone());
        }
        _ => {}
    }
    if let Some(t) = body.get("chat_template_kwargs").and_then(|k| k.get("enable_thinking")) {
        o.insert("enable_thinking".into(), t.clone());
    }
    o
}

/// A chat completion's messages and tools.
pub(crate) fn chat_request(body: &Map<String, Value>) -> Result<(Vec<ChatMessage>, Option<Vec<Tool>>), ApiError> {
    let messages = body.get("messages").ok_or_else(|| ApiError::bad("messages is required").param("messages"))?;
    // A client sends images inline (data: URLs): the server reads none of its own files for it.
    let messages = parse_messages_json_with(&messages.to_string(), MediaAccess::InlineOnly)
        .map_err(|e| ApiError::from(e).param("messages"))?;
    let tools = match body.get("tools").filter(|t| !t.is_null()) {
        Some(t) => Some(parse_tools_json(&t.to_string()).map_err(|e| ApiError::from(e).param("tools"))?),
        None => None,
    };
    Ok((messages, tools))
}

/// A completion's prompt: a string, or an array of one string.
pub(crate) fn completion_prompt(body: &Map<String, Value>) -> Result<String, ApiError> {
    Ok(match body.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
        Some(_) => return Err(ApiError::bad("prompt must be a string (one prompt per request)").param("prompt")),
        None => return Err(ApiError::bad("prompt is required").param("prompt")),
    })
}

// ---- Anthropic: messages ----

/// A Messages request's fields (the options as snake_case fields, for `GenerateOptions`).
pub(crate) struct MessagesBody {
    pub(crate) model: String,
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) tools: Option<Vec<Tool>>,
    pub(crate) options: Map<String, Value>,
    pub(crate) stop_sequences: Vec<String>,
}

/// A Messages request's fields; `generating`: whether `max_tokens` is required (not for
/// count_tokens).
pub(crate) fn messages_body(body: &Map<String, Value>, generating: bool) -> Result<MessagesBody, ApiError> {
    let model = string_field(body, "model")?.to_string();
    match body.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {}
        None if !generating => {}
        Some(v) => return Err(ApiError::bad(format!("max_tokens must be an integer >= 1, got {v}")).param("max_tokens")),
        None => return Err(ApiError::bad("max_tokens is required").param("max_tokens")),
    }
    let mut messages = vec![];
    if let Some(s) = optional(body, "system", "a string or an array of text blocks", |v| v.is_string() || v.is_array())? {
        let text = text_of(s, "system")?;
        if !text.is_empty() {
            messages.push(ChatMessage::system(text));
        }
    }
    let list = match body.get("messages") {
        Some(Value::Array(l)) if !l.is_empty() => l,
        Some(Value::Array(_)) => return Err(ApiError::bad("messages must not be empty").param("messages")),
        Some(v) => return Err(ApiError::bad(format!("messages must be an array, got {v}")).param("messages")),
        None => return Err(ApiError::bad("messages is required").param("messages")),
    };
    messages.extend(chat_messages(list).map_err(|e| e.param("messages"))?);
    let tools = match optional(body, "tools", "an array", Value::is_array)? {
        Some(Value::Array(t)) if !t.is_empty() => Some(t.iter().enumerate().map(|(i, t)| anthropic_tool(i, t)).collect::<Result<Vec<_>, _>>()?),
        _ => None,
    };
    let stop_sequences: Vec<String> = match optional(body, "stop_sequences", "an array of strings", Value::is_array)? {
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| ApiError::bad("stop_sequences must be an array of strings").param("stop_sequences")))
            .collect::<Result<_, _>>()?,
        _ => vec![],
    };
    let mut o = Map::new();
    copy_fields(body, &["max_tokens", "temperature", "top_p", "top_k"], &mut o);
    // mlex's own sampling options, as on the OpenAI routes.
    copy_fields(body, &["min_p", "repetition_penalty", "seed", "ignore_eos"], &mut o);
    o.insert("stop".into(), json!(stop_sequences));
    if let Some(c) = optional(body, "tool_choice", "an object", Value::is_object)? {
        let choice = match c.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => match c.get("name").and_then(Value::as_str) {
                Some(n) => json!({"name": n}),
                None => return Err(ApiError::bad("tool_choice of type 'tool' needs a 'name'").param("tool_choice")),
            },
            _ => return Err(ApiError::bad(format!("tool_choice.type must be 'auto', 'any', 'tool' or 'none', got {}", c["type"])).param("tool_choice")),
        };
        o.insert("tool_choice".into(), choice);
    }
    if let Some(t) = optional(body, "thinking", "an object", Value::is_object)? {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                o.insert("enable_thinking".into(), json!(true));
                if let Some(b) = t.get("budget_tokens").filter(|b| !b.is_null()) {
                    o.insert("reasoning_budget_tokens".into(), b.clone());
                }
            }
            Some("adaptive") => {
                o.insert("enable_thinking".into(), json!(true));
            }
            Some("disabled") => {
                o.insert("enable_thinking".into(), json!(false));
            }
            _ => return Err(ApiError::bad(format!("thinking.type must be 'enabled', 'adaptive' or 'disabled', got {}", t["type"])).param("thinking")),
        }
    }
    Ok(MessagesBody { model, messages, tools, options: o, stop_sequences })
}

/// The text of a string or of an array of text blocks (joined by newlines).
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = vec![];
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => parts.push(t),
                    (Some(k @ ("image" | "document")), _) => {
                        return Err(ApiError::bad(format!("{what}: {k} blocks are not supported here (images go in a user message's content)")))
                    }
                    _ => return Err(ApiError::bad(format!("{what}: expected text blocks ({{type: 'text', text}}), got {b}"))),
                }
            }
            Ok(parts.join("\n"))
        }
        other => Err(ApiError::bad(format!("{what} must be a string or an array of text blocks, got {other}"))),
    }
}

/// Anthropic's messages as chat messages: a user turn's tool_result blocks become tool messages
/// (named after the tool_use they answer) ahead of its text; an assistant turn's thinking
/// becomes its reasoning and its tool_use blocks its tool calls.
pub(crate) fn chat_messages(list: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = vec![];
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, m) in list.iter().enumerate() {
        let at = |msg: String| ApiError::bad(format!("messages[{i}]: {msg}"));
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => return Err(at(format!("role must be 'user' or 'assistant', got {}", m.get("role").unwrap_or(&Value::Null)))),
        };
        let blocks = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(b)) => b.clone(),
            other => return Err(at(format!("content must be a string or an array of content blocks, got {}", other.unwrap_or(&Value::Null)))),
        };
        let (mut text, mut reasoning, mut calls, mut results) = (String::new(), String::new(), vec![], vec![]);
        let mut images = vec![];
        for b in &blocks {
            let field = |k: &str| b.get(k).and_then(Value::as_str).ok_or_else(|| at(format!("a {} block needs a string '{k}'", b["type"])));
            match (role, b.get("type").and_then(Value::as_str)) {
                (_, Some("text")) => text.push_str(field("text")?),
                (Role::Assistant, Some("thinking")) => reasoning.push_str(field("thinking")?),
                (Role::Assistant, Some("redacted_thinking")) => {}
                (Role::Assistant, Some("tool_use")) => {
                    let (id, name) = (field("id")?.to_string(), field("name")?.to_string());
                    names.insert(id.clone(), name.clone());
                    calls.push(ToolCall::new(id, name, b.get("input").cloned().unwrap_or_else(|| json!({}))));
                }
                (Role::User, Some("tool_result")) => {
                    let id = field("tool_use_id")?.to_string();
                    let mut content = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_of(c, &format!("messages[{i}]: tool_result content"))?,
                    };
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    let mut msg = ChatMessage::tool(id.clone(), content);
                    msg.name = names.get(&id).cloned();
                    results.push(msg);
                }
                (Role::User, Some("image")) => {
                    let obj = b.as_object().cloned().unwrap_or_default();
                    let image = crate::chat::media::image_from_part(&obj, MediaAccess::InlineOnly).map_err(|e| at(e.to_string()))?;
                    images.push(crate::chat::MessageImage::image(text.len(), image));
                }
                (_, Some(k @ ("image" | "document"))) => return Err(at(format!("{k} blocks are not supported in a {role} message"))),
                (_, k) => return Err(at(format!("unsupported content block type {} in a {} message", k.map_or("(none)".into(), |k| format!("{k:?}")), role))),
            }
        }
        match role {
            Role::Assistant => {
                let mut msg = ChatMessage::assistant_with_tool_calls(text, calls);
                msg.reasoning = (!reasoning.is_empty()).then_some(reasoning);
                out.push(msg);
            }
            _ => {
                let answered = !results.is_empty();
                out.extend(results);
                if !text.is_empty() || !images.is_empty() || !answered {
                    let mut msg = ChatMessage::user(text);
                    msg.images = images;
                    out.push(msg);
                }
            }
        }
    }
    if out.last().is_some_and(|m| m.role == Role::Assistant) {
        return Err(ApiError::bad("the last message is the assistant's: continuing a prefilled reply is not supported, end with a user message"));
    }
    Ok(out)
}

/// A custom tool (`name`, `description`, `input_schema`); Anthropic's server tools are refused.
fn anthropic_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let bad = |m: String| ApiError::bad(format!("tools[{i}]: {m}")).param("tools");
    if let Some(k) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
        return Err(bad(format!("tool type {k:?} is not supported (only custom tools with an input_schema)")));
    }
    let name = t.get("name").and_then(Value::as_str).ok_or_else(|| bad("a tool needs a string 'name'".into()))?;
    let schema = t.get("input_schema").filter(|s| s.is_object()).ok_or_else(|| bad(format!("tool {name:?} needs an 'input_schema' object")))?;
    let description = t.get("description").and_then(Value::as_str).map(str::to_string);
    Ok(Tool::function(name, description, schema.clone()))
}

// ---- OpenAI: responses ----

/// mlex's own sampling options, accepted here as on chat completions.
const EXTRA_OPTIONS: &[&str] = &["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "reasoning_budget_tokens", "enable_thinking", "ignore_eos"];

/// What `include` names to ask for output_text's logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// A Responses request's fields (the options as snake_case fields, for `GenerateOptions`).
pub(crate) struct ResponsesBody {
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) tools: Option<Vec<Tool>>,
    pub(crate) options: Map<String, Value>,
    /// Whether output_text carries its tokens' logprobs.
    pub(crate) logprobs: bool,
}

/// A Responses request's fields. Unknown fields are ignored.
pub(crate) fn responses_body(body: &Map<String, Value>) -> Result<ResponsesBody, ApiError> {
    if flag(body, "store")? {
        return Err(ApiError::bad("store: true is not supported: this server keeps no responses (send store: false, or leave it out)").param("store"));
    }
    for (k, what) in [("previous_response_id", "previous responses"), ("conversation", "conversations")] {
        if body.get(k).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(format!("{k} is not supported: this server keeps no {what}; send the whole conversation as input items")).param(k));
        }
    }
    if flag(body, "background")? {
        return Err(ApiError::bad("background: true is not supported (no server-side state); use stream: true").param("background"));
    }
    let mut messages = vec![];
    if let Some(Value::String(s)) = optional(body, "instructions", "a string", Value::is_string)? {
        messages.push(ChatMessage::system(s.clone()));
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(ChatMessage::user(s.clone())),
        Some(Value::Array(items)) => messages.extend(input_items(items)?),
        Some(v) => return Err(ApiError::bad(format!("input must be a string or an array of items, got {v}")).param("input")),
        None => return Err(ApiError::bad("input is required").param("input")),
    }
    let tools = match optional(body, "tools", "an array", Value::is_array)? {
        Some(Value::Array(t)) if !t.is_empty() => Some(t.iter().enumerate().map(|(i, t)| responses_tool(i, t)).collect::<Result<Vec<_>, _>>()?),
        _ => None,
    };
    let mut o = Map::new();
    copy_fields(body, EXTRA_OPTIONS, &mut o);
    if let Some(n) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        o.insert("max_tokens".into(), n.clone());
    }
    if let Some(c) = body.get("tool_choice").filter(|v| !v.is_null()) {
        match c {
            Value::String(_) => o.insert("tool_choice".into(), c.clone()),
            Value::Object(m) if m.get("type").and_then(Value::as_str) == Some("function") && m.contains_key("name") => {
                o.insert("tool_choice".into(), json!({"name": m["name"]}))
            }
            _ => return Err(ApiError::bad(format!("tool_choice must be 'auto', 'none', 'required' or {{type: 'function', name}}, got {c}")).param("tool_choice")),
        };
    }
    if let Some(f) = body.get("text").and_then(|t| t.get("format")).filter(|v| !v.is_null()) {
        o.insert("response_format".into(), f.clone());
    }
    if let Some(effort) = body.get("reasoning").and_then(|r| r.get("effort")).and_then(Value::as_str) {
        o.entry("enable_thinking").or_insert(json!(!matches!(effort, "none" | "minimal")));
    }
    let include = match optional(body, "include", "an array of strings", Value::is_array)? {
        Some(Value::Array(a)) => a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| ApiError::bad(format!("include must be an array of strings, got {v}")).param("include"))).collect::<Result<Vec<_>, _>>()?,
        _ => vec![],
    };
    let top = optional(body, "top_logprobs", "a non-negative integer", Value::is_u64)?;
    if let Some(n) = top {
        o.insert("top_logprobs".into(), n.clone());
    }
    let logprobs = include.iter().any(|i| i == INCLUDE_LOGPROBS) || top.and_then(Value::as_u64).is_some_and(|n| n > 0);
    Ok(ResponsesBody { messages, tools, options: o, logprobs })
}

/// Input items as chat messages: function_call items join the assistant turn before them (or
/// open one), function_call_output items become tool messages named after their call, and a
/// reasoning item becomes the reasoning of the assistant turn that follows it.
pub(crate) fn input_items(items: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = vec![];
    let mut names: HashMap<String, String> = HashMap::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let at = |m: String| ApiError::bad(format!("input[{i}]: {m}")).param("input");
        let Some(obj) = item.as_object() else { return Err(at(format!("an item must be an object, got {item}"))) };
        let field = |k: &str| obj.get(k).and_then(Value::as_str).ok_or_else(|| at(format!("needs a string '{k}'")));
        let kind = obj.get("type").and_then(Value::as_str).unwrap_or(if obj.contains_key("role") { "message" } else { "" });
        match kind {
            "message" => {
                let role = match field("role")? {
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "system" => Role::System,
                    "developer" => Role::Developer,
                    r => return Err(at(format!("role must be user, assistant, system or developer, got {r:?}"))),
                };
                let (text, images) = content_parts(obj.get("content").unwrap_or(&Value::Null)).map_err(at)?;
                let mut m = ChatMessage::new(role, text);
                m.images = images;
                if role == Role::Assistant {
                    m.reasoning = reasoning.take();
                }
                out.push(m);
            }
            "function_call" => {
                let (call_id, name) = (field("call_id")?.to_string(), field("name")?.to_string());
                let raw = obj.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let args = serde_json::from_str(raw).unwrap_or_else(|_| json!(raw));
                names.insert(call_id.clone(), name.clone());
                let call = ToolCall::new(call_id, name, args);
                match out.last_mut() {
                    Some(m) if m.role == Role::Assistant && reasoning.is_none() => m.tool_calls.push(call),
                    _ => {
                        let mut m = ChatMessage::assistant_with_tool_calls("", vec![call]);
                        m.reasoning = reasoning.take();
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                let call_id = field("call_id")?.to_string();
                let output = match obj.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(v).map_err(at)?,
                    other => return Err(at(format!("output must be a string or content parts, got {}", other.unwrap_or(&Value::Null)))),
                };
                let mut m = ChatMessage::tool(call_id.clone(), output);
                m.name = names.get(&call_id).cloned();
                out.push(m);
            }
            "reasoning" => {
                let texts = |k: &str| -> Vec<String> {
                    obj.get(k).and_then(Value::as_array).map_or(vec![], |a| a.iter().filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string)).collect())
                };
                let content = texts("content");
                let text = if content.is_empty() { texts("summary").join("\n") } else { content.join("") };
                reasoning = (!text.is_empty()).then_some(text);
            }
            "item_reference" => return Err(at("item_reference is not supported: this server keeps no items; send the item itself".into())),
            k => return Err(at(format!("unsupported item type {k:?} (message, function_call, function_call_output, reasoning)"))),
        }
    }
    Ok(out)
}

/// A message's content: a string, or parts (input_text / output_text / text / refusal) joined.
fn content_text(v: &Value) -> Result<String, String> {
    match content_parts(v)? {
        (text, images) if images.is_empty() => Ok(text),
        _ => Err("input_image and input_audio parts are only taken in a message's content".into()),
    }
}

/// [`content_text`], with `input_image` parts (inline `image_url` data URLs) kept at their place.
fn content_parts(v: &Value) -> Result<(String, Vec<crate::chat::MessageImage>), String> {
    match v {
        Value::String(s) => Ok((s.clone(), vec![])),
        Value::Array(parts) => {
            let mut text = String::new();
            let mut images = vec![];
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").or_else(|| p.get("refusal")).and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text" | "refusal"), Some(t)) => text.push_str(t),
                    (Some("input_image"), _) => {
                        let obj = p.as_object().cloned().unwrap_or_default();
                        let image = crate::chat::media::image_from_part(&obj, MediaAccess::InlineOnly).map_err(|e| e.to_string())?;
                        images.push(crate::chat::MessageImage::image(text.len(), image));
                    }
                    (Some("input_audio"), _) => {
                        let obj = p.as_object().cloned().unwrap_or_default();
                        let clip = crate::chat::audio_part::audio_from_part(&obj, MediaAccess::InlineOnly).map_err(|e| e.to_string())?;
                        images.push(crate::chat::MessageImage::audio(text.len(), clip));
                    }
                    (Some(k @ "input_file"), _) => return Err(format!("{k} parts are not supported")),
                    _ => return Err(format!("unsupported content part {p}")),
                }
            }
            Ok((text, images))
        }
        other => Err(format!("content must be a string or an array of parts, got {other}")),
    }
}

/// A function tool (`name`, `description`, `parameters` at the top level); hosted tools are refused.
fn responses_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let bad = |m: String| ApiError::bad(format!("tools[{i}]: {m}")).param("tools");
    match t.get("type").and_then(Value::as_str) {
        Some("function") => {}
        k => return Err(bad(format!("tool type {} is not supported (only 'function')", k.map_or("(none)".into(), |k| format!("{k:?}"))))),
    }
    let name = t.get("name").and_then(Value::as_str).ok_or_else(|| bad("a function tool needs a string 'name'".into()))?;
    let params = t.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    Ok(Tool::function(name, t.get("description").and_then(Value::as_str).map(str::to_string), params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_become_chat_messages() {
        let list = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                {"type": "text", "text": "Thanks"}]},
        ]);
        let m = chat_messages(list.as_array().unwrap()).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].reasoning.as_deref(), Some("Use the tool."));
        assert_eq!(m[1].tool_calls[0], ToolCall::new("toolu_1", "weather", json!({"city": "Paris"})));
        assert_eq!((m[2].role, m[2].content.as_str(), m[2].name.as_deref()), (Role::Tool, "18C", Some("weather")));
        assert_eq!(m[3], ChatMessage::user("Thanks"));
        let prefill = json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]);
        assert!(chat_messages(prefill.as_array().unwrap()).unwrap_err().message.contains("prefill"));
        let image = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert!(chat_messages(image.as_array().unwrap()).unwrap_err().message.contains("image"));
    }

    #[test]
    fn items_become_a_conversation() {
        let items = json!([
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18C."}]},
        ]);
        let m = input_items(items.as_array().unwrap()).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].tool_calls[0], ToolCall::new("call_1", "weather", json!({"city": "Paris"})));
        assert_eq!(m[1].reasoning.as_deref(), Some("Call it."));
        assert_eq!((m[2].role, m[2].name.as_deref()), (Role::Tool, Some("weather")));
        assert_eq!(m[3], ChatMessage::assistant("18C."));
        assert!(input_items(json!([{"type": "item_reference", "id": "x"}]).as_array().unwrap()).is_err());
    }

    #[test]
    fn images_come_inline_on_every_route() {
        let data = "data:image/png;base64,YWJjZA==";
        // responses: input_image with an image_url string
        let items = json!([{"role": "user", "content": [{"type": "input_text", "text": "see "}, {"type": "input_image", "image_url": data}]}]);
        let m = input_items(items.as_array().unwrap()).unwrap();
        assert_eq!((m[0].content.as_str(), m[0].images.len(), m[0].images[0].at), ("see ", 1, 4));
        assert_eq!(&m[0].images[0].image.bytes[..], b"abcd");
        // Anthropic: a base64 source
        let msgs = json!([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "YWJjZA=="}}, {"type": "text", "text": "what?"}]}]);
        let m = chat_messages(msgs.as_array().unwrap()).unwrap();
        assert_eq!((m[0].content.as_str(), m[0].images[0].at), ("what?", 0));
        // neither reads the server's files nor fetches URLs
        for url in ["/etc/hostname", "file:///etc/hostname", "https://example.com/a.png"] {
            let items = json!([{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]);
            assert!(input_items(items.as_array().unwrap()).is_err(), "{url}");
        }
        let msgs = json!([{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]);
        assert!(chat_messages(msgs.as_array().unwrap()).is_err());
    }

    #[test]
    fn a_video_may_be_an_inline_animated_image() {
        use base64::Engine as _;
        let frame = |c: u8| image::Frame::from_parts(image::RgbaImage::from_pixel(2, 2, image::Rgba([c, c, 0, 255])), 0, 0,
            image::Delay::from_numer_denom_ms(250, 1));
        let mut gif = vec![];
        image::codecs::gif::GifEncoder::new(&mut gif).encode_frames([frame(10), frame(200)]).unwrap();
        let url = format!("data:image/gif;base64,{}", base64::engine::general_purpose::STANDARD.encode(&gif));
        let body = |part: Value| json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, part]}]});
        for part in [json!({"type": "video", "video": url}), json!({"type": "video_url", "video_url": {"url": url}})] {
            let (m, _) = chat_request(body(part).as_object().unwrap()).unwrap();
            let times: Vec<_> = m[0].images[0].video.as_ref().unwrap().iter().map(|f| f.time).collect();
            assert_eq!(times, [Some([0.0, 0.25]), Some([0.25, 0.5])]);
        }
        // A video file by name or content is a 400 naming the missing codecs; a path is not read.
        for part in [json!({"type": "video", "video": "clip.mp4"}), json!({"type": "video", "video": "data:video/mp4;base64,AAAAIGZ0eXA="}),
            json!({"type": "video", "video": "data:application/octet-stream;base64,AAAAIGZ0eXBpc29t"})] {
            let e = chat_request(body(part.clone()).as_object().unwrap()).unwrap_err();
            assert!(format!("{e:?}").contains("decodes no video codecs"), "{part}: {e:?}");
        }
        let e = chat_request(body(json!({"type": "video", "video": "/tmp/clip.gif"})).as_object().unwrap()).unwrap_err();
        assert!(format!("{e:?}").contains("inline"), "{e:?}");
    }
}
