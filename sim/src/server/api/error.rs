//! OpenAI-style error responses and request-body parsing.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An OpenAI-style error response: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The parameter at fault, if known.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// 400 BadRequestError.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: None }
    }

    pub(super) fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorInfo {
                message: &self.message,
                kind: self.kind(),
                param: self.param,
                code: self.status.as_u16(),
            },
        }
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The error.
    pub error: ErrorInfo<'a>,
}

/// The fields of an OpenAI-style error.
#[derive(Debug, Serialize)]
pub struct ErrorInfo<'a> {
    /// Human-readable message.
    pub message: &'a str,
    /// `BadRequestError`, `NotFoundError`, ...
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The parameter at fault.
    pub param: Option<&'static str>,
    /// The HTTP status.
    pub code: u16,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = self.status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

pub(super) fn unavailable() -> ApiError {
    ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "the engine is shutting down".into(), param: None }
}

/// Parses a JSON body into `T`, mapping every failure to a 400 that names the problem.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty; expected a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

pub(super) fn engine_error() -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: "the engine failed the request (the KV cache could not hold it)".into(),
        param: None,
    }
}
