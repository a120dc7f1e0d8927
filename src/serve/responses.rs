//! OpenAI's Responses API: `POST /v1/responses`, whole or streamed as its typed events (each
//! with a `sequence_number`). `input` (a string, or items: messages with input_text /
//! output_text parts, function_call and function_call_output items, reasoning items),
//! `instructions`, function `tools`, `tool_choice`, `text.format` (json_schema, json_object),
//! `reasoning.effort`, `max_output_tokens`, `temperature` and `top_p` become a chat request and
//! its options; the reply comes back as output items: a reasoning item when the model thought,
//! a message with its output_text, a function_call item per call. The server keeps no state:
//! `store: true`, `previous_response_id`, `conversation` and `background` are refused (400)
//! rather than silently ignored. `include: ["message.output_text.logprobs"]` (or `top_logprobs`
//! above 0) fills output_text's `logprobs` (the message's tokens, each with its `top_logprobs`
//! most likely alternatives), whole and on each output_text delta.
use super::error::ApiError;
use super::generation::{Generation, Step};
use super::openai::TokenLogprob;
use super::wire::{body_json, copy_fields, event_stream, flag, named, new_id, now, optional, string_field};
use super::App;
use crate::chat::{ChatMessage, Role, Tool, ToolCall};
use crate::generate::{GenerateOptions, GenerateReply, TokenKind};
use crate::{FinishReason, Request};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// mlex's own sampling options, accepted here as on chat completions.
const EXTRA_OPTIONS: &[&str] = &["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "reasoning_budget_tokens", "enable_thinking", "ignore_eos"];

/// What `include` names to ask for output_text's logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// `POST /v1/responses`.
pub(super) async fn create(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(&app, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// A Responses request, read.
struct Parsed {
    messages: Vec<ChatMessage>,
    tools: Option<Vec<Tool>>,
    options: GenerateOptions,
    stream: bool,
    /// Whether output_text carries its tokens' logprobs.
    logprobs: bool,
}

/// What every response object of one request says besides its output (its id, model, and the
/// request's settings echoed back).
struct Envelope {
    id: String,
    fields: Map<String, Value>,
}

impl Envelope {
    /// The response object with `status`, `output` and `usage`.
    fn response(&self, status: &str, output: &[Value], usage: Value, extra: &[(&str, Value)]) -> Value {
        let mut r = Map::new();
        r.insert("id".into(), json!(self.id));
        r.insert("object".into(), json!("response"));
        r.extend(self.fields.clone());
        r.insert("status".into(), json!(status));
        r.insert("output".into(), json!(output));
        r.insert("usage".into(), usage);
        for (k, v) in extra {
            r.insert(k.to_string(), v.clone());
        }
        Value::Object(r)
    }
}

async fn run(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let model = string_field(&body, "model")?.to_string();
    let p = parse(&body)?;
    let env = Envelope { id: new_id("resp_"), fields: echo(&body, &model) };
    let mut gen = Generation::start(app, &model, Request::Chat { messages: p.messages, tools: p.tools }, p.options)?;
    let logprobs = Logprobs::new(&gen, p.logprobs);
    if !p.stream {
        // The message's tokens' logprobs, when asked for.
        let mut text_logprobs = vec![];
        let reply = loop {
            match gen.next().await {
                Step::Token(t) if t.kind == TokenKind::Text => text_logprobs.extend(logprobs.entry(&t)),
                Step::Token(_) => {}
                Step::Done(r) => break r,
                Step::Failed(e) => return Err(e),
            }
        };
        let mut output = vec![];
        if let Some(r) = reply.reasoning.as_deref().filter(|r| !r.is_empty()) {
            output.push(reasoning_item(&new_id("rs_"), r));
        }
        if !reply.text.is_empty() || reply.tool_calls.is_empty() {
            output.push(message_item(&new_id("msg_"), &reply.text, item_status(&reply), &text_logprobs));
        }
        output.extend(reply.tool_calls.iter().map(|c| call_item(c, &args_of(c))));
        let (status, extra) = ending(&reply);
        return Ok(Json(env.response(status, &output, usage(&reply, gen.reasoning_tokens), &extra)).into_response());
    }
    let events = event_stream(move |out| stream(gen, env, logprobs, out));
    Ok(Sse::new(events).into_response())
}

/// Whether a response carries output_text logprobs, and the tokenizer that names its tokens.
struct Logprobs(Option<Option<crate::tokenizer::Tokenizer>>);

impl Logprobs {
    fn new(gen: &Generation, wanted: bool) -> Self {
        Logprobs(wanted.then(|| gen.session().tokenizer().ok().cloned()))
    }

    /// A streamed token's entry (None when not asked for).
    fn entry(&self, t: &crate::generate::GeneratedToken) -> Option<Value> {
        let tokenizer = self.0.as_ref()?;
        Some(TokenLogprob::new(tokenizer.as_ref(), t.id, t.logprob, &t.top_logprobs).entry())
    }
}

/// The events of a streamed response: response.created, response.in_progress, each output item
/// (output_item.added, its content part and deltas, their .done events, output_item.done),
/// then response.completed (or response.incomplete when max_output_tokens cut it); an `error`
/// event and response.failed when it fails or times out.
async fn stream(mut gen: Generation, env: Envelope, logprobs: Logprobs, out: UnboundedSender<SseEvent>) {
    let mut seq = 0u64;
    let mut send = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        out.send(named(kind, &data)).is_ok()
    };
    let started = env.response("in_progress", &[], Value::Null, &[]);
    send("response.created", json!({"response": started}));
    send("response.in_progress", json!({"response": started}));
    let mut done: Vec<Value> = vec![];
    // The item being streamed: its kind, id, text and logprobs so far.
    let mut open: Option<Open> = None;
    let mut had_message = false;
    // Logprobs of message tokens with no text of their own yet: the next delta carries them.
    let mut unsent: Vec<Value> = vec![];
    loop {
        let step = tokio::select! {
            s = gen.next() => s,
            _ = out.closed() => return,
        };
        match step {
            Step::Token(t) if t.text.is_empty() || t.kind == TokenKind::ToolCall => {
                if t.kind == TokenKind::Text {
                    unsent.extend(logprobs.entry(&t));
                }
            }
            Step::Token(t) => {
                if open.as_ref().map(|o| o.0) != Some(t.kind) {
                    if let Some(o) = open.take() {
                        done.push(close_item(&mut send, done.len(), o, "completed"));
                    }
                    let id = if t.kind == TokenKind::Reasoning { new_id("rs_") } else { new_id("msg_") };
                    had_message |= t.kind == TokenKind::Text;
                    open_item(&mut send, done.len(), t.kind, &id);
                    open = Some((t.kind, id, String::new(), vec![]));
                }
                let Some((kind, id, text, item_logprobs)) = open.as_mut() else { continue };
                text.push_str(&t.text);
                let (event, delta) = match kind {
                    TokenKind::Reasoning => ("response.reasoning_text.delta", json!({"item_id": id, "output_index": done.len(), "content_index": 0, "delta": t.text})),
                    _ => {
                        unsent.extend(logprobs.entry(&t));
                        item_logprobs.extend(unsent.iter().cloned());
                        let lps = std::mem::take(&mut unsent);
                        ("response.output_text.delta", json!({"item_id": id, "output_index": done.len(), "content_index": 0, "delta": t.text, "logprobs": lps}))
                    }
                };
                if !send(event, delta) {
                    return;
                }
            }
            Step::Done(reply) => {
                let status = item_status(&reply);
                if let Some(o) = open.take() {
                    done.push(close_item(&mut send, done.len(), o, status));
                }
                if !had_message && reply.tool_calls.is_empty() {
                    let id = new_id("msg_");
                    open_item(&mut send, done.len(), TokenKind::Text, &id);
                    done.push(close_item(&mut send, done.len(), (TokenKind::Text, id, String::new(), vec![]), status));
                }
                for c in &reply.tool_calls {
                    let (i, args) = (done.len(), args_of(c));
                    let mut item = call_item(c, "");
                    item["status"] = json!("in_progress");
                    let item_id = item["id"].clone();
                    send("response.output_item.added", json!({"output_index": i, "item": item}));
                    send("response.function_call_arguments.delta", json!({"item_id": item_id, "output_index": i, "delta": args}));
                    send("response.function_call_arguments.done", json!({"item_id": item_id, "output_index": i, "name": c.name, "arguments": args}));
                    item["arguments"] = json!(args);
                    item["status"] = json!("completed");
                    send("response.output_item.done", json!({"output_index": i, "item": item}));
                    done.push(item);
                }
                let (status, extra) = ending(&reply);
                let r = env.response(status, &done, usage(&reply, gen.reasoning_tokens), &extra);
                send(if status == "completed" { "response.completed" } else { "response.incomplete" }, json!({"response": r}));
                return;
            }
            Step::Failed(e) => {
                send("error", json!({"code": e.code, "message": e.message, "param": e.param}));
                let error = json!({"code": e.code, "message": e.message});
                send("response.failed", json!({"response": env.response("failed", &done, Value::Null, &[("error", error)])}));
                return;
            }
        }
    }
}

/// Announces a new output item (a reasoning item or a message) and its one content part.
fn open_item(send: &mut impl FnMut(&str, Value) -> bool, index: usize, kind: TokenKind, id: &str) {
    let (item, part) = match kind {
        TokenKind::Reasoning => (json!({"type": "reasoning", "id": id, "summary": [], "content": []}), json!({"type": "reasoning_text", "text": ""})),
        _ => (
            json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
            json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
        ),
    };
    send("response.output_item.added", json!({"output_index": index, "item": item}));
    send("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
}

/// An output item being streamed: its kind, id, text and (a message's) logprobs so far.
type Open = (TokenKind, String, String, Vec<Value>);

/// Ends an output item opened by [`open_item`]; returns the item as it ended.
fn close_item(send: &mut impl FnMut(&str, Value) -> bool, index: usize, (kind, id, text, logprobs): Open, status: &str) -> Value {
    let at = json!({"item_id": id, "output_index": index, "content_index": 0});
    let with = |k: &str, v: Value| {
        let mut e = at.clone();
        e[k] = v;
        e
    };
    let item = match kind {
        TokenKind::Reasoning => {
            send("response.reasoning_text.done", with("text", json!(text)));
            send("response.content_part.done", with("part", json!({"type": "reasoning_text", "text": text})));
            reasoning_item(&id, &text)
        }
        _ => {
            let mut done = with("text", json!(text));
            done["logprobs"] = json!(logprobs);
            send("response.output_text.done", done);
            send("response.content_part.done", with("part", output_text(&text, &logprobs)));
            message_item(&id, &text, status, &logprobs)
        }
    };
    send("response.output_item.done", json!({"output_index": index, "item": item}));
    item
}

fn output_text(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

fn message_item(id: &str, text: &str, status: &str, logprobs: &[Value]) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": [output_text(text, logprobs)]})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
}

fn call_item(c: &ToolCall, arguments: &str) -> Value {
    let call_id = if c.id.is_empty() { new_id("call_") } else { c.id.clone() };
    json!({"type": "function_call", "id": format!("fc_{}", call_id.trim_start_matches("call_")), "call_id": call_id,
           "name": c.name, "arguments": arguments, "status": "completed"})
}

fn args_of(c: &ToolCall) -> String {
    match &c.arguments {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// A message item's status: incomplete when max_output_tokens cut it.
fn item_status(r: &GenerateReply) -> &'static str {
    if r.finish_reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

/// The response's status, and its incomplete_details.
fn ending(r: &GenerateReply) -> (&'static str, Vec<(&'static str, Value)>) {
    match r.finish_reason {
        FinishReason::Length => ("incomplete", vec![("incomplete_details", json!({"reason": "max_output_tokens"}))]),
        _ => ("completed", vec![]),
    }
}

fn usage(r: &GenerateReply, reasoning_tokens: usize) -> Value {
    let u = &r.usage;
    json!({"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
           "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
           "total_tokens": u.prompt_tokens + u.completion_tokens})
}

/// The request's settings as a response object repeats them.
fn echo(body: &Map<String, Value>, model: &str) -> Map<String, Value> {
    let get = |k: &str, default: Value| body.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    let mut m = Map::new();
    m.insert("created_at".into(), json!(now()));
    m.insert("model".into(), json!(model));
    m.insert("error".into(), Value::Null);
    m.insert("incomplete_details".into(), Value::Null);
    m.insert("background".into(), json!(false));
    m.insert("previous_response_id".into(), Value::Null);
    m.insert("store".into(), json!(false));
    m.insert("truncation".into(), json!("disabled"));
    for (k, d) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("temperature", Value::Null),
        ("top_p", Value::Null),
        ("tools", json!([])),
        ("tool_choice", json!("auto")),
        ("text", json!({"format": {"type": "text"}})),
        ("parallel_tool_calls", json!(true)),
        ("reasoning", json!({"effort": null, "summary": null})),
        ("metadata", json!({})),
        ("top_logprobs", json!(0)),
    ] {
        m.insert(k.into(), get(k, d));
    }
    m
}

/// The request's fields: a chat request and its options. Unknown fields are ignored.
fn parse(body: &Map<String, Value>) -> Result<Parsed, ApiError> {
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
        Some(Value::Array(t)) if !t.is_empty() => Some(t.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Result<Vec<_>, _>>()?),
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
    let options = super::wire::options(o).map_err(|e| {
        let message = e.message.replace("response_format", "text.format").replace("max_tokens", "max_output_tokens");
        ApiError { message, ..e }
    })?;
    Ok(Parsed { messages, tools, options, stream: flag(body, "stream")?, logprobs })
}

/// Input items as chat messages: function_call items join the assistant turn before them (or
/// open one), function_call_output items become tool messages named after their call, and a
/// reasoning item becomes the reasoning of the assistant turn that follows it.
fn input_items(items: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
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
                let text = content_text(obj.get("content").unwrap_or(&Value::Null)).map_err(at)?;
                let mut m = ChatMessage::new(role, text);
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
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").or_else(|| p.get("refusal")).and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text" | "refusal"), Some(t)) => text.push_str(t),
                    (Some(k @ ("input_image" | "input_file" | "input_audio")), _) => return Err(format!("{k} parts are not supported (text-only models)")),
                    _ => return Err(format!("unsupported content part {p}")),
                }
            }
            Ok(text)
        }
        other => Err(format!("content must be a string or an array of parts, got {other}")),
    }
}

/// A function tool (`name`, `description`, `parameters` at the top level); hosted tools are refused.
fn tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
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
    fn stateful_fields_are_refused_and_options_read() {
        let req = |extra: Value| {
            let mut b = json!({"model": "m", "input": "hi"});
            b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            parse(b.as_object().unwrap())
        };
        assert_eq!(req(json!({"store": true})).err().unwrap().param, Some("store"));
        assert_eq!(req(json!({"previous_response_id": "resp_1"})).err().unwrap().param, Some("previous_response_id"));
        assert!(req(json!({"store": false})).is_ok());
        let p = req(json!({"max_output_tokens": 7, "instructions": "S", "tool_choice": {"type": "function", "name": "f"},
                           "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                           "reasoning": {"effort": "minimal"}}))
        .unwrap();
        assert_eq!((p.options.max_tokens, p.options.enable_thinking), (7, Some(false)));
        assert_eq!(p.options.tool_choice, Some(crate::chat::ToolChoice::Named("f".into())));
        assert_eq!(p.messages[0], ChatMessage::system("S"));
        let bad = req(json!({"text": {"format": {"type": "xml"}}})).err().unwrap();
        assert!(bad.message.contains("text.format"), "{}", bad.message);
        assert!(req(json!({"max_output_tokens": -1})).err().unwrap().message.contains("max_output_tokens"));
    }
}
