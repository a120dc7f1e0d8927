//! Anthropic's Messages API: `POST /v1/messages`, whole or streamed as Anthropic's server-sent
//! events (and `POST /v1/messages/count_tokens`), so that Anthropic's clients (and tools built
//! on them) reach a local model. The
//! request's messages (string or block content: text, tool_use, tool_result, thinking), system
//! prompt, tools (`input_schema`), `tool_choice` and `thinking` become a chat request and
//! generation options; the reply comes back as content blocks (thinking, text, tool_use) with
//! Anthropic's stop reasons and usage. Errors on this route, the API key's included, come in
//! Anthropic's shape (`error.rs`). `x-api-key` and `anthropic-version` are accepted (every
//! version: the shapes here are those of 2023-06-01, the only one there is).
use super::error::{ApiError, Dialect};
use super::generation::{Generation, Step};
use super::request::{messages_body, MessagesBody};
use super::wire::{body_json, event_stream, flag, named, new_id};
use super::App;
use crate::chat::{ChatMessage, Tool, ToolCall};
use crate::generate::{GenerateReply, TokenKind};
use crate::{FinishReason, Request, Session};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// A stream with nothing to say for this long sends a `ping` (as Anthropic's does), which also
/// finds out early when its client has gone.
const PING_EVERY: Duration = Duration::from_secs(10);

/// `POST /v1/messages`.
pub(super) async fn messages(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(&app, body).await.unwrap_or_else(|e| e.response(Dialect::Anthropic))
}

/// A Messages request, read.
struct Parsed {
    model: String,
    messages: Vec<ChatMessage>,
    tools: Option<Vec<Tool>>,
    options: crate::GenerateOptions,
    stop_sequences: Vec<String>,
    stream: bool,
}

/// `POST /v1/messages/count_tokens`: the size of a request's prompt as the model will see it.
pub(super) async fn count_tokens(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let p = parse(&body_json(body)?, false)?;
        let n = prompt_tokens(app.model(&p.model)?, &p).await?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": n})).into_response())
    };
    result.await.unwrap_or_else(|e| e.response(Dialect::Anthropic))
}

/// How many tokens `p`'s prompt is, rendered as the engine will render it (the tools left out
/// when `tool_choice` is none, as the session does). Rendering runs off the async workers.
async fn prompt_tokens(session: &Session, p: &Parsed) -> Result<usize, ApiError> {
    let shown = if p.options.tool_choice == Some(crate::chat::ToolChoice::None) { None } else { p.tools.clone() };
    let (msgs, think, session) = (p.messages.clone(), p.options.enable_thinking, session.clone());
    tokio::task::spawn_blocking(move || session.encode_messages(&msgs, shown.as_deref(), think).map(|ids| ids.len()))
        .await
        .map_err(|e| ApiError::from(crate::Error::Mlx(format!("counting the prompt's tokens: {e}"))))?
        .map_err(ApiError::from)
}

async fn run(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let p = parse(&body_json(body)?, true)?;
    let session = app.model(&p.model)?.clone();
    if !p.stream {
        let mut gen = Generation::start(app, &p.model, Request::Chat { messages: p.messages, tools: p.tools }, p.options)?;
        let reply = gen.reply().await?;
        let (stop_reason, stop_sequence) = stop_reason(&session, &reply, &p.stop_sequences);
        let mut content: Vec<Value> = vec![];
        if let Some(r) = reply.reasoning.as_deref().filter(|r| !r.is_empty()) {
            content.push(json!({"type": "thinking", "thinking": r, "signature": signature(r)}));
        }
        if !reply.text.is_empty() {
            content.push(json!({"type": "text", "text": reply.text}));
        }
        content.extend(reply.tool_calls.iter().map(|c| tool_use(c, json!(input_of(c)))));
        if content.is_empty() {
            content.push(json!({"type": "text", "text": ""}));
        }
        return Ok(Json(json!({
            "id": new_id("msg_"), "type": "message", "role": "assistant", "model": p.model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage(&reply),
        }))
        .into_response());
    }
    // message_start carries the prompt's size, before any token (counted once the request is
    // admitted, so that a full queue costs no rendering).
    let gen = Generation::start(app, &p.model, Request::Chat { messages: p.messages.clone(), tools: p.tools.clone() }, p.options.clone())?;
    let input_tokens = prompt_tokens(&session, &p).await?;
    let start = json!({"type": "message_start", "message": {
        "id": new_id("msg_"), "type": "message", "role": "assistant", "model": p.model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": input_tokens, "output_tokens": 0}}});
    let events = event_stream(move |out| stream(gen, session, p.stop_sequences, start, out));
    Ok(Sse::new(events).into_response())
}

/// The events of a streamed reply, in Anthropic's order: message_start, ping, each content
/// block (content_block_start, its deltas, content_block_stop), message_delta (stop reason,
/// usage), message_stop; an `error` event instead of the end when it fails or times out.
async fn stream(mut gen: Generation, session: Session, stops: Vec<String>, start: Value, out: UnboundedSender<SseEvent>) {
    let send = |name: &str, data: Value| out.send(named(name, &data)).is_ok();
    send("message_start", start);
    send("ping", json!({"type": "ping"}));
    let mut blocks = Blocks { next: 0, open: None, thinking: String::new() };
    loop {
        let step = tokio::select! {
            s = gen.next() => s,
            _ = out.closed() => return,
            _ = tokio::time::sleep(PING_EVERY) => {
                send("ping", json!({"type": "ping"}));
                continue;
            }
        };
        match step {
            Step::Token(t) if t.text.is_empty() || t.kind == TokenKind::ToolCall => {}
            Step::Token(t) => {
                if blocks.open != Some(t.kind) {
                    blocks.close(&send);
                    let block = match t.kind {
                        TokenKind::Reasoning => json!({"type": "thinking", "thinking": "", "signature": ""}),
                        _ => json!({"type": "text", "text": ""}),
                    };
                    send("content_block_start", json!({"type": "content_block_start", "index": blocks.next, "content_block": block}));
                    blocks.open = Some(t.kind);
                }
                let delta = match t.kind {
                    TokenKind::Reasoning => {
                        blocks.thinking.push_str(&t.text);
                        json!({"type": "thinking_delta", "thinking": t.text})
                    }
                    _ => json!({"type": "text_delta", "text": t.text}),
                };
                if !send("content_block_delta", json!({"type": "content_block_delta", "index": blocks.next, "delta": delta})) {
                    return;
                }
            }
            Step::Done(reply) => {
                blocks.close(&send);
                for c in &reply.tool_calls {
                    let i = blocks.next;
                    send("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": tool_use(c, json!({}))}));
                    let partial = json!({"type": "input_json_delta", "partial_json": input_of(c).to_string()});
                    send("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": partial}));
                    send("content_block_stop", json!({"type": "content_block_stop", "index": i}));
                    blocks.next += 1;
                }
                if blocks.next == 0 {
                    send("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
                    send("content_block_stop", json!({"type": "content_block_stop", "index": 0}));
                }
                let (stop_reason, stop_sequence) = stop_reason(&session, &reply, &stops);
                send("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}, "usage": usage(&reply)}));
                send("message_stop", json!({"type": "message_stop"}));
                return;
            }
            Step::Failed(e) => {
                send("error", e.body(Dialect::Anthropic));
                return;
            }
        }
    }
}

/// The content blocks of a stream so far: the next block's index and the one open.
struct Blocks {
    next: usize,
    open: Option<TokenKind>,
    /// The open thinking block's text (its signature is sent when it closes).
    thinking: String,
}

impl Blocks {
    fn close(&mut self, send: &dyn Fn(&str, Value) -> bool) {
        let Some(kind) = self.open.take() else { return };
        if kind == TokenKind::Reasoning {
            let sig = json!({"type": "signature_delta", "signature": signature(&std::mem::take(&mut self.thinking))});
            send("content_block_delta", json!({"type": "content_block_delta", "index": self.next, "delta": sig}));
        }
        send("content_block_stop", json!({"type": "content_block_stop", "index": self.next}));
        self.next += 1;
    }
}

/// The `signature` of a thinking block. Anthropic's clients expect one and send it back with
/// the block; this is not cryptographic (a 64-bit FNV-1a hash of the text, marked as mlex's),
/// nothing checks it, and signatures that come back are ignored.
fn signature(thinking: &str) -> String {
    let h = thinking.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("mlex-{h:016x}")
}

fn tool_use(c: &ToolCall, input: Value) -> Value {
    let id = if c.id.starts_with("toolu_") { c.id.clone() } else { format!("toolu_{}", c.id.trim_start_matches("call_")) };
    json!({"type": "tool_use", "id": id, "name": c.name, "input": input})
}

/// A call's arguments as the object `input` must be (arguments that are not an object are
/// kept under `arguments`).
fn input_of(c: &ToolCall) -> Value {
    match &c.arguments {
        Value::Object(_) => c.arguments.clone(),
        other => json!({"arguments": other}),
    }
}

fn usage(r: &GenerateReply) -> Value {
    let u = &r.usage;
    json!({"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_tokens})
}

/// Anthropic's `stop_reason` and `stop_sequence`: a stop string that ended the reply is found
/// in its decoded tokens (the reply's text leaves it out).
fn stop_reason(session: &Session, r: &GenerateReply, stops: &[String]) -> (&'static str, Option<String>) {
    match r.finish_reason {
        FinishReason::ToolCalls => ("tool_use", None),
        FinishReason::Length => ("max_tokens", None),
        _ if !stops.is_empty() => {
            let text = session.tokenizer().and_then(|t| t.decode(&r.tokens, false)).unwrap_or_default();
            match stops.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s))).min() {
                Some((_, s)) => ("stop_sequence", Some(s.clone())),
                None => ("end_turn", None),
            }
        }
        _ => ("end_turn", None),
    }
}

/// The request's fields: a chat request and its options (`max_tokens` required unless only the
/// prompt is counted). Unknown fields are ignored.
fn parse(body: &Map<String, Value>, generating: bool) -> Result<Parsed, ApiError> {
    let MessagesBody { model, messages, tools, options: o, stop_sequences } = messages_body(body, generating)?;
    let options = super::wire::options(o).map_err(|e| ApiError { message: e.message.replace("reasoning_budget_tokens", "thinking.budget_tokens"), ..e })?;
    Ok(Parsed { model, messages, tools, options, stop_sequences, stream: flag(body, "stream")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_fields_become_options() {
        let body = json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "S"}], "messages": [{"role": "user", "content": "hi"}],
                          "stop_sequences": ["END"], "top_k": 3, "tool_choice": {"type": "any"},
                          "tools": [{"name": "f", "input_schema": {"type": "object"}}], "thinking": {"type": "enabled", "budget_tokens": 5}});
        let p = parse(body.as_object().unwrap(), true).unwrap();
        assert_eq!(p.messages[0], ChatMessage::system("S"));
        assert_eq!((p.options.max_tokens, p.options.sampling.top_k, p.options.stop.clone()), (9, 3, vec!["END".to_string()]));
        assert_eq!(p.options.tool_choice, Some(crate::chat::ToolChoice::Required));
        assert_eq!((p.options.enable_thinking, p.options.reasoning_budget_tokens), (Some(true), Some(5)));
        let no_max = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(parse(no_max.as_object().unwrap(), true).err().unwrap().param, Some("max_tokens"));
        let server_tool = json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search_20250305", "name": "s"}]});
        assert!(parse(server_tool.as_object().unwrap(), true).err().unwrap().message.contains("web_search"));
        assert!(signature("abc").starts_with("mlex-") && signature("abc") != signature("abd"));
    }
}
