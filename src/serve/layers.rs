//! What every request goes through around its route: the API key (every route but /health;
//! a wrong key is answered in the route's own error shape), CORS for the origins `--cors`
//! names (no CORS headers at all without it; preflights answered here, before the key is
//! asked for, as browsers send none with them), and the count of requests by route and status
//! for `/metrics`.
use super::error::{ApiError, Dialect};
use super::App;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Every route but /health needs the key, when one is set: `Authorization: Bearer KEY` (OpenAI
/// clients) or `x-api-key: KEY` (Anthropic clients).
pub(super) async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let h = req.headers();
        let bearer = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let x = h.get("x-api-key").and_then(|v| v.to_str().ok());
        let path = req.uri().path();
        let given = [bearer, x].into_iter().flatten().any(|k| same(k.trim().as_bytes(), key.as_bytes()));
        if !given && path != "/health" {
            let said = if bearer.is_some() || x.is_some() { "wrong" } else { "missing" };
            return ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", format!("{said} API key (send Authorization: Bearer KEY or x-api-key: KEY)"))
                .response(Dialect::of(path, h));
        }
    }
    next.run(req).await
}

/// Compares in time that does not depend on where the two differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The origins browsers may call from (`*`: any).
pub(super) struct Cors {
    pub(super) origins: Vec<String>,
}

impl Cors {
    fn allows(&self, origin: &str) -> bool {
        self.origins.iter().any(|o| o == "*" || o.trim_end_matches('/').eq_ignore_ascii_case(origin))
    }

    fn any(&self) -> bool {
        self.origins.iter().any(|o| o == "*")
    }
}

/// CORS: a preflight (`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin is
/// answered 204 with what it may send; one from another origin 403. Other requests from an
/// allowed origin get `Access-Control-Allow-Origin` on their response, whatever it is.
pub(super) async fn cors(State(cors): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()).filter(|o| cors.allows(o)).map(str::to_string);
    let allow_origin = origin.as_ref().map(|o| if cors.any() { HeaderValue::from_static("*") } else { HeaderValue::from_str(o).unwrap_or(HeaderValue::from_static("null")) });
    if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        let Some(allow_origin) = allow_origin else { return StatusCode::FORBIDDEN.into_response() };
        let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            asked.unwrap_or(HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version")),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        h.insert(header::VARY, HeaderValue::from_static("origin, access-control-request-method, access-control-request-headers"));
        return r;
    }
    let mut r = next.run(req).await;
    if let Some(allow_origin) = allow_origin {
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("retry-after"));
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
    r
}

/// Counts each answered request by its route (the route's pattern, never the raw path, so the
/// labels stay few) and status.
pub(super) async fn count(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_string();
    let r = next.run(req).await;
    app.metrics.count_request(&route, r.status().as_u16());
    r
}
