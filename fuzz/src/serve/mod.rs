//! `mlex::serve`'s request parsing (src/serve/request.rs), with a stand-in for its error type:
//! the real one (src/serve/error.rs) also writes HTTP responses through axum, which the parsing
//! never does. A real directory, so that the `#[path]` below resolves.

/// The fields and constructors of `ApiError` that request parsing uses.
pub mod error {
    #[derive(Debug)]
    pub struct ApiError {
        pub code: &'static str,
        pub message: String,
        pub param: Option<&'static str>,
    }

    impl ApiError {
        pub fn bad(message: impl Into<String>) -> Self {
            ApiError { code: "invalid_request_error", message: message.into(), param: None }
        }

        pub fn param(mut self, p: &'static str) -> Self {
            self.param = Some(p);
            self
        }
    }

    impl From<crate::error::Error> for ApiError {
        fn from(e: crate::error::Error) -> Self {
            let code = if e.code() == "INVALID_ARGUMENT" { "invalid_request_error" } else { "server_error" };
            ApiError { code, message: e.to_string(), param: None }
        }
    }
}

#[path = "../../../src/serve/request.rs"]
pub mod request;

use crate::chat::Role;
use request::Shape;

/// One request for the `serve_request` target: the first byte picks the endpoint, the rest is
/// the body. No panic; errors are 400s with a message; what is read back is consistent.
pub fn fuzz_request(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else { return };
    let body = match request::json_object(body) {
        Ok(b) => b,
        Err(e) => return assert!(!e.message.is_empty()),
    };
    let bad = |e: error::ApiError| assert!(!e.message.is_empty() && e.code == "invalid_request_error", "{e:?}");
    match which % 4 {
        0 | 1 => {
            let shape = if which % 4 == 0 { Shape::Chat } else { Shape::Completion };
            if let Err(e) = request::refuse_unsupported(&body) {
                bad(e);
            }
            match request::logprobs_wanted(&body, shape) {
                Ok(top) => {
                    let o = request::option_fields(&body, top);
                    if let Some(stop) = o.get("stop") {
                        assert!(stop.is_array());
                    }
                    assert!(o.get("max_tokens").is_none_or(|m| !m.is_null()));
                }
                Err(e) => bad(e),
            }
            if which % 4 == 0 {
                match request::chat_request(&body) {
                    Ok((_messages, tools)) => assert!(tools.is_none() || body.get("tools").is_some()),
                    Err(e) => assert!(!e.message.is_empty() && e.param.is_some(), "{e:?}"),
                }
            } else if let Err(e) = request::completion_prompt(&body) {
                assert_eq!(e.param, Some("prompt"));
                bad(e);
            }
        }
        2 => match request::responses_body(&body) {
            // (`input: []` is read as an empty conversation: the session refuses it, a 400.)
            Ok(r) => assert!(r.tools.as_ref().is_none_or(|t| !t.is_empty())),
            Err(e) => bad(e),
        },
        _ => match request::messages_body(&body, which & 4 != 0) {
            Ok(m) => {
                assert!(!m.messages.is_empty());
                assert!(m.messages.last().is_some_and(|l| l.role != Role::Assistant));
                assert_eq!(m.options.get("stop"), Some(&serde_json::json!(m.stop_sequences)));
            }
            Err(e) => bad(e),
        },
    }
}
