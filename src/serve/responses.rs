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
use super::request::{responses_body, ResponsesBody};
use super::wire::{body_json, event_stream, flag, named, new_id, now, string_field};
use super::App;
use crate::chat::{ChatMessage, Tool, ToolCall};
use crate::generate::{GenerateOptions, GenerateReply, TokenKind};
use crate::{FinishReason, Request};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

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
    let ResponsesBody { messages, tools, options: o, logprobs } = responses_body(body)?;
    let options = super::wire::options(o).map_err(|e| {
        let message = e.message.replace("response_format", "text.format").replace("max_tokens", "max_output_tokens");
        ApiError { message, ..e }
    })?;
    Ok(Parsed { messages, tools, options, stream: flag(body, "stream")?, logprobs })
}

#[cfg(test)]
mod tests {
    use super::*;

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
