//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status that says who is at fault.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error answered to the client. Every request that cannot be served ends here; nothing
/// in the server panics on what a client sends.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400: the field `param` is invalid.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::invalid(message);
        e.param = Some(param.to_string());
        e
    }

    /// 400: the request is invalid as a whole.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 `context_length_exceeded`: the prompt (plus the completion asked for) does not
    /// fit the context.
    pub fn context_length(
        param: &str,
        prompt: usize,
        max_tokens: Option<usize>,
        n_ctx: usize,
    ) -> ApiError {
        let message = match max_tokens {
            Some(m) => format!(
                "This model's maximum context length is {n_ctx} tokens. However, you requested \
                 {} tokens ({prompt} in the prompt, {m} for the completion). Please reduce the \
                 prompt or {param}.",
                prompt + m
            ),
            None => format!(
                "This model's maximum context length is {n_ctx} tokens. However, your prompt \
                 has {prompt} tokens. Please reduce the length of the prompt."
            ),
        };
        let mut e = ApiError::param(param, message);
        e.code = Some("context_length_exceeded");
        e
    }

    /// 401: no or a wrong API key.
    pub fn unauthorized() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect or missing API key: pass it as 'Authorization: Bearer KEY'.",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 404: a model this server does not serve.
    pub fn model_not_found(asked: &str, served: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model '{asked}' does not exist; this server serves '{served}'."),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 404: the embedding model named on a generation endpoint.
    pub fn not_a_generative_model(asked: &str, chat: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "The model '{asked}' is an embedding model: it serves /v1/embeddings only. \
                 Chat and completions use '{chat}'."
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 404: no such route.
    pub fn no_route(path: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Unknown endpoint {path}."),
        );
        e.code = Some("not_found");
        e
    }

    /// 405: the route exists for other methods.
    pub fn method_not_allowed(method: &axum::http::Method, path: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not accept {method}."),
        );
        e.code = Some("method_not_allowed");
        e
    }

    /// 413 or another status from reading the body.
    pub fn body(status: StatusCode, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(status, "invalid_request_error", message);
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            e.code = Some("request_too_large");
        }
        e
    }

    /// 429: the wait queue is full.
    pub fn queue_full(max_queue: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            match max_queue {
                0 => "The server is busy and keeps no requests waiting. Retry later.".to_string(),
                _ => format!(
                    "The server is busy: {max_queue} requests are already waiting. Retry later."
                ),
            },
        );
        e.code = Some("queue_full");
        e
    }

    /// 503: the model is still loading (or failed to load).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        );
        e.code = Some("model_loading");
        e
    }

    /// A stream its client left unread for `secs` seconds: its generation was stopped (the
    /// status only names the error; the stream's own status was sent long before).
    pub fn stalled(secs: u64) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            format!(
                "The stream was left unread for {secs} s, so its generation was stopped to give \
                 its memory back: read a stream as it comes."
            ),
        );
        e.code = Some("stream_stalled");
        e
    }

    /// 500: the engine failed while serving a valid request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body_json(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body_json())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // When to try again (RFC 9110): the queue moves in about a request's time.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

impl From<weft::Error> for ApiError {
    fn from(e: weft::Error) -> ApiError {
        use weft::Error as E;
        match &e {
            E::Grammar { .. } => ApiError::invalid(e.to_string()),
            // The request's constraint, biases and `min_tokens` left no token to sample.
            E::NothingAllowed => ApiError::invalid(format!(
                "{e}: the request's grammar or schema, 'logit_bias' and 'min_tokens' together \
                 allow nothing at some step."
            )),
            E::Sampler(_) => ApiError::invalid(e.to_string()),
            E::TokenOutOfVocab { .. } => ApiError::param("prompt", e.to_string()),
            E::Chat(_) => ApiError::param("messages", e.to_string()),
            E::ContextTooLong { len, n_ctx } => {
                ApiError::context_length("messages", *len, None, *n_ctx)
            }
            _ => ApiError::internal(e.to_string()),
        }
    }
}
