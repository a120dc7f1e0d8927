//! The OpenAI wire format: `POST /v1/chat/completions` and `POST /v1/completions`, whole or
//! streamed as server-sent events (the final usage chunk when `stream_options.include_usage`).
//! A request's fields become a `GenerateOptions` through the one options schema (snake_case, as
//! OpenAI spells them), so checks and defaults are the library's; mlex's own options (`top_k`,
//! `min_p`, `repetition_penalty`, `reasoning_budget_tokens`, `enable_thinking`, `ignore_eos`)
//! are accepted too. Log probabilities: `logprobs: true` with `top_logprobs: N` (0–20) on chat
//! completions, `logprobs: N` on completions (the legacy shape: tokens, token_logprobs,
//! top_logprobs as token → logprob maps, text_offset), whole and in each streamed chunk (every
//! generated token's entry rides on the first chunk sent after it, so the streamed entries are
//! the whole reply's). They are the log-softmax of the model's logits before temperature and
//! top-p (after a repetition penalty and a response_format mask), as OpenAI reports them.
use super::error::{ApiError, Dialect};
use super::generation::{Generation, Step};
use super::request::{chat_request, completion_prompt, logprobs_wanted, option_fields, refuse_unsupported, Shape};
use super::wire::{body_json, event_stream, new_id, now, string_field};
use super::App;
use crate::chat::ToolCall;
use crate::generate::{GenerateOptions, GenerateReply, TokenKind, TopLogprob};
use crate::tokenizer::Tokenizer;
use crate::{FinishReason, Request, Session};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The generation options of a request body (`top_logprobs`: what [`logprobs_wanted`] said).
fn options(body: &Map<String, Value>, top_logprobs: Option<usize>, shape: Shape) -> Result<GenerateOptions, ApiError> {
    let o = option_fields(body, top_logprobs);
    super::wire::options(o).map_err(|e| match (e.message.starts_with("top_logprobs"), shape) {
        (true, Shape::Chat) => e.param("top_logprobs"),
        (true, Shape::Completion) => ApiError { message: e.message.replacen("top_logprobs", "logprobs", 1), ..e }.param("logprobs"),
        _ => e,
    })
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        _ => "stop",
    }
}

fn usage(r: &GenerateReply) -> Value {
    let u = &r.usage;
    json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens}})
}

fn tool_calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let args = match &c.arguments {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            json!({"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
        })
        .collect()
}

/// One generated token's log probability with its alternatives, as the wire shows them
/// (`logprob_entry`: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`; the
/// text of each token decoded alone).
pub(super) struct TokenLogprob {
    text: String,
    logprob: f32,
    top: Vec<(String, f32)>,
}

impl TokenLogprob {
    pub(super) fn new(tokenizer: Option<&Tokenizer>, id: u32, logprob: f32, top: &[TopLogprob]) -> Self {
        let text = tokenizer.and_then(|t| t.decode(&[id], false).ok()).unwrap_or_default();
        TokenLogprob { text, logprob, top: top.iter().map(|t| (t.text.clone(), t.logprob)).collect() }
    }

    /// OpenAI's entry of chat completions' `logprobs.content` and the Responses API's
    /// `output_text.logprobs`.
    pub(super) fn entry(&self) -> Value {
        let alt = |text: &str, lp: f32| json!({"token": text, "logprob": lp, "bytes": text.as_bytes()});
        let mut e = alt(&self.text, self.logprob);
        e["top_logprobs"] = self.top.iter().map(|(t, lp)| alt(t, *lp)).collect();
        e
    }
}

/// Every token's entry of a reply.
pub(super) fn reply_logprobs(s: &Session, r: &GenerateReply) -> Vec<TokenLogprob> {
    let tok = s.tokenizer().ok();
    let none = vec![];
    (0..r.tokens.len()).map(|i| TokenLogprob::new(tok, r.tokens[i], r.logprobs[i], r.top_logprobs.get(i).unwrap_or(&none))).collect()
}

/// A choice's `logprobs` for these tokens' entries: chat's `{content: [...]}`, or the legacy
/// completions shape whose text offsets start at `*offset` (moved past them).
fn logprobs_json(entries: &[TokenLogprob], shape: Shape, offset: &mut usize) -> Value {
    match shape {
        Shape::Chat => json!({"content": entries.iter().map(TokenLogprob::entry).collect::<Vec<_>>()}),
        Shape::Completion => {
            let mut text_offset = Vec::with_capacity(entries.len());
            for e in entries {
                text_offset.push(*offset);
                *offset += e.text.chars().count();
            }
            let top: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let mut m = Map::new();
                    for (t, lp) in &e.top {
                        // Two ids may decode alike: the likelier one stands for both.
                        m.entry(t.clone()).or_insert(json!(lp));
                    }
                    Value::Object(m)
                })
                .collect();
            json!({"tokens": entries.iter().map(|e| e.text.as_str()).collect::<Vec<_>>(),
                   "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                   "top_logprobs": top, "text_offset": text_offset})
        }
    }
}

/// Runs `request` on the body's model: the whole reply, or (with `stream`) server-sent events.
/// The request is refused before anything is sent when its options or prompt are invalid.
async fn respond(
    app: &App,
    body: Map<String, Value>,
    request: impl FnOnce(&Session) -> Result<Request, ApiError>,
    shape: Shape,
) -> Result<Response, ApiError> {
    refuse_unsupported(&body)?;
    let model = string_field(&body, "model")?.to_string();
    let top_logprobs = logprobs_wanted(&body, shape)?;
    let want_logprobs = top_logprobs.is_some();
    let options = options(&body, top_logprobs, shape)?;
    let request = request(app.model(&model)?)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = body.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let (id, created) = (new_id(match shape {
        Shape::Chat => "chatcmpl-",
        Shape::Completion => "cmpl-",
    }), now());
    let mut gen = Generation::start(app, &model, request, options)?;

    if !stream {
        let reply = gen.reply().await?;
        let logprobs = if want_logprobs { logprobs_json(&reply_logprobs(gen.session(), &reply), shape, &mut 0) } else { Value::Null };
        let fin = finish_reason(reply.finish_reason);
        let body = match shape {
            Shape::Chat => {
                let mut message = json!({"role": "assistant", "content": reply.text});
                if let Some(r) = &reply.reasoning {
                    message["reasoning_content"] = json!(r);
                }
                if !reply.tool_calls.is_empty() {
                    message["tool_calls"] = json!(tool_calls_json(&reply.tool_calls));
                    if reply.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"id": id, "object": "chat.completion", "created": created, "model": model,
                       "choices": [{"index": 0, "message": message, "finish_reason": fin, "logprobs": logprobs}],
                       "usage": usage(&reply)})
            }
            Shape::Completion => json!({"id": id, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": 0, "text": reply.text, "finish_reason": fin, "logprobs": logprobs}],
                       "usage": usage(&reply)}),
        };
        return Ok(Json(body).into_response());
    }

    let object = match shape {
        Shape::Chat => "chat.completion.chunk",
        Shape::Completion => "text_completion",
    };
    let chunk = move |choice: Value, usage: Option<Value>| {
        let mut c = json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]});
        if let Some(u) = usage {
            c["choices"] = json!([]);
            c["usage"] = u;
        } else if include_usage {
            c["usage"] = Value::Null;
        }
        SseEvent::default().data(c.to_string())
    };
    let delta = move |d: Value, finish: Option<&str>| match shape {
        Shape::Chat => json!({"index": 0, "delta": d, "finish_reason": finish, "logprobs": null}),
        Shape::Completion => json!({"index": 0, "text": d.get("content").cloned().unwrap_or(json!("")), "finish_reason": finish, "logprobs": null}),
    };
    // Entries of the tokens read since the last chunk went out: the next chunk carries them.
    let tokenizer = if want_logprobs { gen.session().tokenizer().ok().cloned() } else { None };
    let mut unsent: Vec<TokenLogprob> = vec![];
    let mut offset = 0usize;
    let mut with_logprobs = move |mut choice: Value, unsent: &mut Vec<TokenLogprob>| {
        if want_logprobs {
            choice["logprobs"] = logprobs_json(unsent, shape, &mut offset);
            unsent.clear();
        }
        choice
    };
    let events = event_stream(move |out| async move {
        if let Shape::Chat = shape {
            out.send(chunk(delta(json!({"role": "assistant", "content": ""}), None), None)).ok();
        }
        loop {
            let step = tokio::select! {
                s = gen.next() => s,
                // The client went away: dropping the generation aborts it.
                _ = out.closed() => return,
            };
            match step {
                Step::Token(t) => {
                    if want_logprobs {
                        unsent.push(TokenLogprob::new(tokenizer.as_ref(), t.id, t.logprob, &t.top_logprobs));
                    }
                    let d = match t.kind {
                        TokenKind::Text if !t.text.is_empty() => json!({"content": t.text}),
                        TokenKind::Reasoning if !t.text.is_empty() => json!({"reasoning_content": t.text}),
                        _ => continue,
                    };
                    if matches!(shape, Shape::Completion) && t.kind != TokenKind::Text {
                        continue;
                    }
                    if out.send(chunk(with_logprobs(delta(d, None), &mut unsent), None)).is_err() {
                        return;
                    }
                }
                Step::Done(reply) => {
                    if !reply.tool_calls.is_empty() {
                        let calls = delta(json!({"tool_calls": tool_calls_json(&reply.tool_calls)}), None);
                        out.send(chunk(with_logprobs(calls, &mut unsent), None)).ok();
                    }
                    let last = delta(json!({}), Some(finish_reason(reply.finish_reason)));
                    let last = if unsent.is_empty() { last } else { with_logprobs(last, &mut unsent) };
                    out.send(chunk(last, None)).ok();
                    if include_usage {
                        out.send(chunk(Value::Null, Some(usage(&reply)))).ok();
                    }
                    break;
                }
                Step::Failed(e) => {
                    out.send(SseEvent::default().data(e.body(Dialect::OpenAi).to_string())).ok();
                    break;
                }
            }
        }
        out.send(SseEvent::default().data("[DONE]")).ok();
    });
    Ok(Sse::new(events).into_response())
}

/// `POST /v1/chat/completions`.
pub(super) async fn chat_completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body_json(body)?;
        let (messages, tools) = chat_request(&body)?;
        respond(&app, body.clone(), move |_| Ok(Request::Chat { messages, tools }), Shape::Chat).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`: a raw prompt (no chat template).
pub(super) async fn completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body_json(body)?;
        let prompt = completion_prompt(&body)?;
        let make = move |s: &Session| -> Result<Request, ApiError> {
            let ids = s.tokenizer()?.encode(&prompt, true)?;
            Ok(Request::Tokens(ids))
        };
        respond(&app, body.clone(), make, Shape::Completion).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}
