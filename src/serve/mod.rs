//! `mlex serve`: an HTTP server (axum on tokio) in front of one or more sessions, speaking the
//! OpenAI wire format (`openai.rs`), so that any OpenAI client reaches a local model. Requests
//! to one model are batched by its session's engine (continuous batching); a client that goes
//! away mid-stream drops its channel, which aborts its request at the next step. Binds
//! 127.0.0.1 unless told otherwise; `--api-key` requires `Authorization: Bearer` or `x-api-key`;
//! SIGINT/SIGTERM stop accepting and let in-flight replies finish.
mod openai;

use crate::error::{Error, Result};
use crate::Session;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

/// What `mlex serve` runs.
pub struct ServeConfig {
    /// The models served, each with the id clients address it by.
    pub models: Vec<(String, Session)>,
    pub host: String,
    pub port: u16,
    /// Required of every request when set.
    pub api_key: Option<String>,
    /// Largest request body accepted (bytes).
    pub max_body_bytes: usize,
}

struct App {
    models: Vec<(String, Session)>,
    api_key: Option<String>,
    started: u64,
}

impl App {
    fn model(&self, id: &str) -> std::result::Result<&Session, ApiError> {
        self.models.iter().find(|(m, _)| m == id).map(|(_, s)| s).ok_or_else(|| {
            let ids: Vec<&str> = self.models.iter().map(|(m, _)| m.as_str()).collect();
            ApiError::new(StatusCode::NOT_FOUND, "model_not_found", format!("model {id:?} is not served here (models: {})", ids.join(", ")))
                .param("model")
        })
    }
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), param: None }
    }

    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match e.code() {
            "INVALID_ARGUMENT" => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            "OUT_OF_MEMORY" => (StatusCode::SERVICE_UNAVAILABLE, "out_of_memory"),
            "ABORTED" => (StatusCode::BAD_REQUEST, "aborted"),
            "SESSION_CLOSED" => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status.is_client_error() { "invalid_request_error" } else { "server_error" };
        let body = json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}});
        (self.status, Json(body)).into_response()
    }
}

/// Every route but /health needs the key, when one is set.
async fn auth(State(app): State<Arc<App>>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let x = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        if bearer != Some(key.as_str()) && x != Some(key.as_str()) && req.uri().path() != "/health" {
            return ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", "missing or wrong API key (Authorization: Bearer … or x-api-key)")
                .into_response();
        }
    }
    next.run(req).await
}

async fn health(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let ids: Vec<&str> = app.models.iter().map(|(m, _)| m.as_str()).collect();
    Json(json!({"status": "ok", "models": ids}))
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let data: Vec<_> = app
        .models
        .iter()
        .map(|(id, s)| json!({"id": id, "object": "model", "created": app.started, "owned_by": "mlex",
                              "model_type": s.info().model_type, "device": s.info().device}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health)")
}

/// The server's routes over `models`.
fn router(cfg_models: Vec<(String, Session)>, api_key: Option<String>, max_body: usize) -> Router {
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let app = Arc::new(App { models: cfg_models, api_key, started });
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app)
}

/// Serves until SIGINT or SIGTERM, then lets in-flight replies finish. Prints the address
/// it listens on (`port` 0 picks a free one).
pub fn run(cfg: ServeConfig) -> Result<()> {
    if cfg.models.is_empty() {
        return Err(Error::InvalidArgument("mlex serve needs at least one --model".into()));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the server's runtime", e))?;
    rt.block_on(async move {
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| Error::io(format!("binding {addr}"), e))?;
        let local = listener.local_addr().map_err(|e| Error::io("reading the bound address", e))?;
        let ids: Vec<String> = cfg.models.iter().map(|(m, _)| m.clone()).collect();
        println!("mlex serve: listening on http://{local} (models: {})", ids.join(", "));
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let app = router(cfg.models, cfg.api_key, cfg.max_body_bytes);
        let (stopping, mut stopped) = tokio::sync::watch::channel(false);
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown_signal().await;
            let _ = stopping.send(true);
        });
        // In-flight replies get DRAIN to finish after the signal; then the server exits anyway.
        tokio::select! {
            r = server => r.map_err(|e| Error::io("serving", e)),
            _ = async {
                let _ = stopped.wait_for(|s| *s).await;
                tokio::time::sleep(DRAIN).await;
            } => {
                eprintln!("mlex serve: replies still running {}s after the signal were cut off", DRAIN.as_secs());
                Ok(())
            }
        }
    })
}

/// How long in-flight replies may run on after SIGINT/SIGTERM.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
