//! `mlex serve`: an HTTP server (axum on tokio) in front of one or more sessions, speaking
//! OpenAI's wire format (`openai.rs`: chat completions and completions; `responses.rs`: the
//! Responses API) and Anthropic's (`anthropic.rs`: the Messages API), so that either vendor's
//! clients reach a local model. Requests to one model are batched by its session's engine
//! (continuous batching); each is admitted, timed and counted by `generation.rs` (429 when the
//! model's queue is full, `--request-timeout`, `/metrics`); a client that goes away aborts its
//! request at the next step. Binds 127.0.0.1 unless told otherwise; `--api-key`, `--cors`
//! (`layers.rs`); SIGINT/SIGTERM stop accepting and let in-flight replies finish.
mod anthropic;
mod error;
mod generation;
mod layers;
mod metrics;
mod models;
mod openai;
mod request;
mod responses;
mod wire;

use crate::error::{Error, Result};
use crate::Session;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::{ApiError, Dialect};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// What `mlex serve` runs.
pub struct ServeConfig {
    /// The models served, each with the id clients address it by.
    pub models: Vec<(String, Session)>,
    pub host: String,
    pub port: u16,
    /// Required of every request but /health when set.
    pub api_key: Option<String>,
    /// Largest request body accepted (bytes).
    pub max_body_bytes: usize,
    /// Origins browsers may call from (`*`: any); empty: no CORS headers at all.
    pub cors: Vec<String>,
    /// A request running longer is stopped (whole replies get 504, streams an error event).
    pub request_timeout: Option<Duration>,
    /// Requests a model may hold waiting beyond its batch (`Session::max_batch`) before the
    /// server answers 429 with `Retry-After`.
    pub max_queue: usize,
}

impl ServeConfig {
    /// `models` on 127.0.0.1:8080 with the defaults: no key, 16 MiB bodies, no CORS, no
    /// timeout, a queue of [`DEFAULT_MAX_QUEUE`].
    pub fn new(models: Vec<(String, Session)>) -> Self {
        ServeConfig {
            models,
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            max_body_bytes: 16 << 20,
            cors: vec![],
            request_timeout: None,
            max_queue: DEFAULT_MAX_QUEUE,
        }
    }
}

/// Requests a model may queue beyond its batch unless `--max-queue` says otherwise.
pub const DEFAULT_MAX_QUEUE: usize = 256;

struct App {
    models: Vec<(String, Session)>,
    api_key: Option<String>,
    started: u64,
    metrics: Arc<metrics::Metrics>,
    request_timeout: Option<Duration>,
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

async fn health(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let ids: Vec<&str> = app.models.iter().map(|(m, _)| m.as_str()).collect();
    Json(json!({"status": "ok", "models": ids}))
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render()).into_response()
}

const ROUTES: &str = "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages, \
                      POST /v1/messages/count_tokens, GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics";

async fn not_found(req: Request) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no such route ({ROUTES})")).response(Dialect::of(req.uri().path(), req.headers()))
}

async fn wrong_method(req: Request) -> Response {
    let msg = format!("{} is not allowed on {} ({ROUTES})", req.method(), req.uri().path());
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", msg).response(Dialect::of(req.uri().path(), req.headers()))
}

/// The server's routes, with the key, CORS and request counting around them.
fn router(cfg: ServeConfig) -> Router {
    let started = wire::now();
    let counted: Vec<(String, usize)> = cfg.models.iter().map(|(id, s)| (id.clone(), s.max_batch())).collect();
    let metrics = Arc::new(metrics::Metrics::new(&counted, cfg.max_queue));
    let app = Arc::new(App { models: cfg.models, api_key: cfg.api_key, started, metrics, request_timeout: cfg.request_timeout });
    let mut router = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::get))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(app.clone(), layers::auth))
        .layer(middleware::from_fn_with_state(app.clone(), layers::count))
        .layer(DefaultBodyLimit::max(cfg.max_body_bytes));
    if !cfg.cors.is_empty() {
        let cors = Arc::new(layers::Cors { origins: cfg.cors });
        router = router.layer(middleware::from_fn_with_state(cors, layers::cors));
    }
    router.with_state(app)
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
        let app = router(cfg);
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
