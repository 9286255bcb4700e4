//! The one mapping from failures to HTTP responses: OpenAI's error body
//! `{"error": {"message", "type", "param", "code"}}` with the matching status, and
//! `Retry-After` on 429 and on a busy 503.

use crate::error::EngineError;
use crate::scheduler::Refusal;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An error as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI's `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is (`max_tokens`, `messages[0].content`).
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (429, and 503 when busy).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 for a bad request field.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// 400 for a field whose path is only known at run time (`messages[2].role`).
    pub fn invalid_field(message: impl Into<String>, param: String) -> Self {
        ApiError { param: Some(param), ..ApiError::invalid(message, None) }
    }

    /// An error the HTTP layer produced before a handler ran (no route, wrong method, a body
    /// over the limit), with a default message when the layer gave none.
    pub fn from_status(status: StatusCode, message: String, method: &str, path: &str) -> Self {
        let (code, default) = match status {
            StatusCode::NOT_FOUND => ("not_found", format!("No such route: {method} {path}.")),
            StatusCode::METHOD_NOT_ALLOWED => {
                ("method_not_allowed", format!("{method} is not allowed on {path}."))
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                ("request_too_large", "The request body is larger than this server accepts.".to_string())
            }
            StatusCode::REQUEST_TIMEOUT => {
                ("request_timeout", "The request body did not arrive in time.".to_string())
            }
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                ("unsupported_media_type", "Send the body as application/json.".to_string())
            }
            _ => ("http_error", status.canonical_reason().unwrap_or("error").to_string()),
        };
        ApiError {
            status,
            message: if message.is_empty() { default } else { format!("{default} {message}") },
            kind: if status.is_server_error() { "server_error" } else { "invalid_request_error" },
            param: None,
            code: Some(code),
            retry_after: None,
        }
    }

    /// 404 for a model this server does not serve.
    pub fn model_not_found(requested: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{requested}` does not exist. This server serves `{served}`."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
        }
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid or missing API key: send `Authorization: Bearer <key>`.".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After` for a server that is at a limit of its own for a moment.
    pub fn busy(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("server_busy"),
            retry_after: Some(1),
        }
    }

    /// 500 for a failure inside the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The label of `pacer_engine_requests_rejected_total` this error counts under.
    pub fn reason(&self) -> &'static str {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => "queue_full",
            StatusCode::SERVICE_UNAVAILABLE if self.code == Some("server_busy") => "busy",
            StatusCode::SERVICE_UNAVAILABLE => "draining",
            StatusCode::NOT_FOUND => "model_not_found",
            StatusCode::UNAUTHORIZED => "unauthorized",
            s if s.is_client_error() => "invalid",
            _ => "internal",
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let (status, message, code, retry_after) = match r {
            Refusal::QueueFull => (
                StatusCode::TOO_MANY_REQUESTS,
                "The engine's request queue is full; retry shortly.",
                "queue_full",
                Some(1),
            ),
            Refusal::Draining => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The engine is shutting down; send the request elsewhere.",
                "draining",
                None,
            ),
            Refusal::NotReady => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The engine is not ready to serve requests.",
                "not_ready",
                None,
            ),
        };
        // OpenAI marks a 429 with type `requests` and code `rate_limit_exceeded`; SDKs retry on
        // the status, and the message says it is this engine's queue.
        let (kind, code) = if status == StatusCode::TOO_MANY_REQUESTS {
            ("requests", "rate_limit_exceeded")
        } else {
            ("server_error", code)
        };
        ApiError { status, message: message.into(), kind, param: None, code: Some(code), retry_after }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match &e {
            EngineError::ContextOverflow { .. } => ApiError::invalid(e.to_string(), Some("messages")),
            EngineError::InvalidRequest(_) | EngineError::Template(_) | EngineError::Tokenizer(_) => {
                ApiError::invalid(e.to_string(), None)
            }
            EngineError::KvCacheFull { .. } => ApiError::from(Refusal::QueueFull),
            EngineError::Model(_) | EngineError::Io(_) | EngineError::Tensor(_) => {
                ApiError::internal(e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        });
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
