//! The API's errors: a status and a message, sent as `{"error": "..."}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::access::Refusal;
use crate::store::Error;

/// An API request that did not succeed.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
}

impl ApiError {
    /// A request that cannot be understood: 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    /// Nothing there: 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(serde_json::json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        ApiError { status: refusal.status(), message: refusal.message() }
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        let status = match &error {
            Error::UnknownJobType(_) => StatusCode::NOT_FOUND,
            Error::PayloadNotObject { .. }
            | Error::PayloadTooLarge { .. }
            | Error::InvalidEnqueue(_)
            | Error::InvalidWorkflow(_)
            | Error::InvalidEvent(_)
            | Error::InvalidSchedule(_) => StatusCode::BAD_REQUEST,
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::WrongState { .. }
            | Error::LimitReached(_)
            | Error::Duplicate { .. }
            | Error::BatchRefused(_)
            | Error::DeployRefused(_) => StatusCode::CONFLICT,
            error if error.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            // The database's own words (its name, the server's text) go to
            // the log; the caller is told what it can act on.
            tracing::warn!(%error, "an HTTP request failed in the store");
            let message = if status == StatusCode::SERVICE_UNAVAILABLE {
                "the database is unavailable; try again later (the server's log says why)"
            } else {
                "the database failed to answer this request (the server's log says why)"
            };
            return ApiError { status, message: message.to_string() };
        }
        ApiError { status, message: error.to_string() }
    }
}
