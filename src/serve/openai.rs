//! The OpenAI wire format: `POST /v1/chat/completions` and `POST /v1/completions`, whole or
//! streamed as server-sent events (the final usage chunk when `stream_options.include_usage`).
//! A request's fields become a `GenerateOptions` through the one options schema (snake_case, as
//! OpenAI spells them), so checks and defaults are the library's; mlex's own options (`top_k`,
//! `min_p`, `repetition_penalty`, `reasoning_budget_tokens`, `enable_thinking`, `ignore_eos`)
//! are accepted too.
use super::error::{ApiError, Dialect};
use super::generation::{Generation, Step};
use super::wire::{body_json, copy_fields, event_stream, new_id, now, string_field};
use super::App;
use crate::chat::{parse_messages_json, parse_tools_json, ToolCall};
use crate::generate::{GenerateOptions, GenerateReply, TokenKind};
use crate::{FinishReason, Request, Session};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

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
fn refuse_unsupported(body: &Map<String, Value>) -> Result<(), ApiError> {
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
    if body.get("top_logprobs").and_then(Value::as_u64).is_some_and(|n| n > 0) {
        return Err(ApiError::bad("top_logprobs is not supported yet (logprobs: true is)").param("top_logprobs"));
    }
    Ok(())
}

/// The generation options of a request body.
fn options(body: &Map<String, Value>) -> Result<GenerateOptions, ApiError> {
    let mut o = Map::new();
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
    super::wire::options(o)
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

/// `logprobs.content` of a reply (each token's text and log probability).
fn logprobs_json(s: &Session, r: &GenerateReply) -> Value {
    let tok = s.tokenizer().ok();
    let content: Vec<Value> = r
        .tokens
        .iter()
        .zip(&r.logprobs)
        .map(|(&id, &lp)| {
            let text = tok.and_then(|t| t.decode(&[id], false).ok()).unwrap_or_default();
            json!({"token": text, "logprob": lp, "bytes": text.as_bytes(), "top_logprobs": []})
        })
        .collect();
    json!({"content": content})
}

/// What a streamed request sends its chunks as: a chat delta or a completion's text.
#[derive(Clone, Copy)]
enum Shape {
    Chat,
    Completion,
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
    let options = options(&body)?;
    let request = request(app.model(&model)?)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = body.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let want_logprobs = body.get("logprobs").and_then(Value::as_bool).unwrap_or(false);
    let (id, created) = (new_id(match shape {
        Shape::Chat => "chatcmpl-",
        Shape::Completion => "cmpl-",
    }), now());
    let mut gen = Generation::start(app, &model, request, options)?;

    if !stream {
        let reply = gen.reply().await?;
        let logprobs = if want_logprobs { logprobs_json(gen.session(), &reply) } else { Value::Null };
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
                    let d = match t.kind {
                        TokenKind::Text if !t.text.is_empty() => json!({"content": t.text}),
                        TokenKind::Reasoning if !t.text.is_empty() => json!({"reasoning_content": t.text}),
                        _ => continue,
                    };
                    if matches!(shape, Shape::Completion) && t.kind != TokenKind::Text {
                        continue;
                    }
                    if out.send(chunk(delta(d, None), None)).is_err() {
                        return;
                    }
                }
                Step::Done(reply) => {
                    if !reply.tool_calls.is_empty() {
                        out.send(chunk(delta(json!({"tool_calls": tool_calls_json(&reply.tool_calls)}), None), None)).ok();
                    }
                    out.send(chunk(delta(json!({}), Some(finish_reason(reply.finish_reason))), None)).ok();
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
        let messages = body.get("messages").ok_or_else(|| ApiError::bad("messages is required").param("messages"))?;
        let messages = parse_messages_json(&messages.to_string()).map_err(|e| ApiError::from(e).param("messages"))?;
        let tools = match body.get("tools").filter(|t| !t.is_null()) {
            Some(t) => Some(parse_tools_json(&t.to_string()).map_err(|e| ApiError::from(e).param("tools"))?),
            None => None,
        };
        respond(&app, body.clone(), move |_| Ok(Request::Chat { messages, tools }), Shape::Chat).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`: a raw prompt (no chat template).
pub(super) async fn completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body_json(body)?;
        let prompt = match body.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
            Some(_) => return Err(ApiError::bad("prompt must be a string (one prompt per request)").param("prompt")),
            None => return Err(ApiError::bad("prompt is required").param("prompt")),
        };
        let make = move |s: &Session| -> Result<Request, ApiError> {
            let ids = s.tokenizer()?.encode(&prompt, true)?;
            Ok(Request::Tokens(ids))
        };
        respond(&app, body.clone(), make, Shape::Completion).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}
