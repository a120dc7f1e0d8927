//! The server's errors, each written in the shape its API's clients parse: OpenAI's
//! `{"error": {message, type, param, code}}` and Anthropic's `{"type": "error", "error": {type,
//! message}}`. A handler (or a middleware) builds one [`ApiError`]; the route it answers for
//! ([`Dialect::of`]) decides how it is written, so that a 401 or a 404 from the middleware
//! reaches an Anthropic client as Anthropic would have sent it.
use crate::error::Error;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// Whose wire format a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    OpenAi,
    Anthropic,
}

impl Dialect {
    /// Anthropic's routes (`/v1/messages…`), and any request an Anthropic client sends (it
    /// always says `anthropic-version`); everything else is answered in OpenAI's shape.
    pub(crate) fn of(path: &str, headers: &HeaderMap) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") || headers.contains_key("anthropic-version") {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }
    }
}

/// An error a client gets: the HTTP status, a stable code, a message, the offending field.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) param: Option<&'static str>,
    /// Seconds a client should wait before trying again (`Retry-After`, with 429).
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), param: None, retry_after: None }
    }

    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(crate) fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }

    /// The model's queue is full (`--max-queue`).
    pub(crate) fn queue_full(model: &str, in_flight: usize) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!("model {model:?} has {in_flight} requests in flight, its batch and queue are full (--max-queue): retry later"),
            )
        }
    }

    /// The request ran past `--request-timeout`.
    pub(crate) fn timeout(secs: f64) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, "timeout", format!("the request ran longer than the server's limit of {secs} s (--request-timeout) and was stopped"))
    }

    pub(crate) fn too_large() -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", "the request body is larger than the server accepts (--max-body-bytes)")
    }

    /// OpenAI's `type` for this error.
    fn openai_type(&self) -> &'static str {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// Anthropic's error `type` for this error's status.
    fn anthropic_type(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The JSON body in `dialect`'s shape (also what a stream's error event carries).
    pub(crate) fn body(&self, dialect: Dialect) -> Value {
        match dialect {
            Dialect::OpenAi => json!({"error": {"message": self.message, "type": self.openai_type(), "param": self.param, "code": self.code}}),
            Dialect::Anthropic => json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}}),
        }
    }

    /// The whole HTTP response in `dialect`'s shape.
    pub(crate) fn response(self, dialect: Dialect) -> Response {
        let mut r = (self.status, Json(self.body(dialect))).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
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

/// OpenAI's shape, for the OpenAI routes' handlers.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response(Dialect::OpenAi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_has_its_shape() {
        let e = ApiError::queue_full("m", 3);
        assert_eq!(e.body(Dialect::OpenAi)["error"]["code"], "rate_limit_exceeded");
        assert_eq!(e.body(Dialect::Anthropic)["error"]["type"], "rate_limit_error");
        assert_eq!(e.body(Dialect::Anthropic)["type"], "error");
        let r = e.response(Dialect::Anthropic);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(ApiError::timeout(2.0).body(Dialect::Anthropic)["error"]["type"], "timeout_error");
        let none = HeaderMap::new();
        assert_eq!(Dialect::of("/v1/messages", &none), Dialect::Anthropic);
        assert_eq!(Dialect::of("/v1/messages/count_tokens", &none), Dialect::Anthropic);
        assert_eq!(Dialect::of("/v1/messagesx", &none), Dialect::OpenAi);
        assert_eq!(Dialect::of("/v1/responses", &none), Dialect::OpenAi);
        let mut anthropic = HeaderMap::new();
        anthropic.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        assert_eq!(Dialect::of("/v1/models", &anthropic), Dialect::Anthropic);
    }
}
