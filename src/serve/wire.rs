//! What the three APIs' handlers share on the wire: reading a JSON body (too large → 413, not
//! JSON or not UTF-8 → 400), typed fields of it, generation options from a snake_case object
//! (the one options schema, so checks and defaults are the library's), ids and timestamps of
//! replies, and server-sent event streams fed by a task.
use super::error::ApiError;
pub(crate) use super::request::{flag, json_object, string_field};
use crate::generate::{GenerateOptions, Naming};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use serde_json::{Map, Value};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedSender;

/// The JSON object of a request body, or the error a client gets for it.
pub(crate) fn body_json(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::bad(format!("unreadable request body: {e}"))
        }
    })?;
    json_object(&bytes)
}

/// Generation options from an object of option names in snake_case (`GenerateOptions::FIELDS`).
pub(crate) fn options(o: Map<String, Value>) -> Result<GenerateOptions, ApiError> {
    GenerateOptions::from_json(&Value::Object(o), Naming::Snake).map_err(ApiError::bad)
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh id with `prefix` (unique within this server's life, ordered by time).
pub(crate) fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}{:x}{:06x}", now(), N.fetch_add(1, Ordering::Relaxed))
}

/// A stream of server-sent events fed by `producer` through a channel, in order. The producer
/// runs as its own task; the channel closes when the client goes away (`UnboundedSender::closed`
/// tells it, and sends fail).
pub(crate) fn event_stream<F, Fut>(producer: F) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>>
where
    F: FnOnce(UnboundedSender<SseEvent>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(producer(tx));
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) })
}

/// A named event whose data is `data` (Anthropic's and the Responses API's events).
pub(crate) fn named(name: &str, data: &Value) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}
