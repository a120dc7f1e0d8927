//! `GET /v1/models` and `GET /v1/models/{id}`: the models served, in OpenAI's shape, or in
//! Anthropic's when the client says it speaks Anthropic's API (an `anthropic-version` header,
//! which Anthropic's clients always send), so that either vendor's client can list them.
use super::error::{ApiError, Dialect};
use super::App;
use crate::Session;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

fn dialect(headers: &HeaderMap) -> Dialect {
    Dialect::of("/v1/models", headers)
}

fn entry(app: &App, id: &str, s: &Session, d: Dialect) -> Value {
    match d {
        Dialect::OpenAi => json!({"id": id, "object": "model", "created": app.started, "owned_by": "mlex",
                                  "model_type": s.info().model_type, "device": s.info().device}),
        Dialect::Anthropic => {
            let created = chrono::DateTime::from_timestamp(app.started as i64, 0).map(|t| t.to_rfc3339()).unwrap_or_default();
            json!({"type": "model", "id": id, "display_name": id, "created_at": created})
        }
    }
}

/// `GET /v1/models`.
pub(super) async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Json<Value> {
    let d = dialect(&headers);
    let data: Vec<Value> = app.models.iter().map(|(id, s)| entry(&app, id, s, d)).collect();
    Json(match d {
        Dialect::OpenAi => json!({"object": "list", "data": data}),
        Dialect::Anthropic => {
            let (first, last) = (app.models.first().map(|m| &m.0), app.models.last().map(|m| &m.0));
            json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
        }
    })
}

/// `GET /v1/models/{id}`.
pub(super) async fn get(State(app): State<Arc<App>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let d = dialect(&headers);
    match app.model(&id) {
        Ok(s) => Json(entry(&app, &id, s, d)).into_response(),
        Err(e) => ApiError { param: None, ..e }.response(d),
    }
}
