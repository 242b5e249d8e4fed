//! The API's errors: a stable `code`, an HTTP status, a message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lease_keeper::{KeeperError, KeeperErrorKind};
use serde_json::json;
use session_store::{StoreError, StoreErrorKind};

/// An error answered to a client.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable, machine-readable code (see the OpenAPI document).
    pub code: &'static str,
    /// Human-readable detail.
    pub message: String,
    /// The live lease holder, for `session_leased_elsewhere`.
    pub holder: Option<String>,
}

impl ApiError {
    /// An error with no holder.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            holder: None,
        }
    }

    /// 400 `invalid`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    fn retryable(&self) -> bool {
        matches!(
            self.code,
            "lease_unavailable" | "session_busy" | "store_busy"
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable(),
        });
        if let Some(h) = &self.holder {
            body["holder"] = json!(h);
        }
        let mut response = (self.status, Json(json!({ "error": body }))).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE && self.retryable() {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<KeeperError> for ApiError {
    fn from(e: KeeperError) -> Self {
        // These say all there is to say; the backend's error only repeats it.
        let message = match e.kind() {
            KeeperErrorKind::LeasedElsewhere | KeeperErrorKind::Busy => e.to_string(),
            _ => error_chain(&e),
        };
        match e.kind() {
            KeeperErrorKind::LeasedElsewhere => Self {
                holder: e.holder().map(|h| h.to_string()),
                ..Self::new(StatusCode::CONFLICT, "session_leased_elsewhere", message)
            },
            KeeperErrorKind::Busy => Self::new(StatusCode::CONFLICT, "session_busy", message),
            KeeperErrorKind::Unavailable => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "lease_unavailable",
                message,
            ),
            KeeperErrorKind::ShuttingDown => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
            // Ids are validated before they reach the keeper: an `Invalid`
            // from it is a backend or configuration fault, not the client's.
            _ => Self::internal(message),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = error_chain(&e);
        match e.kind() {
            StoreErrorKind::NotFound => Self::not_found(message),
            StoreErrorKind::AlreadyExists => {
                Self::new(StatusCode::CONFLICT, "session_exists", message)
            }
            StoreErrorKind::Invalid => Self::invalid(message),
            // A fenced write at the API surface means another process took
            // the session between our acquire and our write.
            StoreErrorKind::Fenced => {
                Self::new(StatusCode::CONFLICT, "session_leased_elsewhere", message)
            }
            // Another process holds the session's file longer than the
            // store waits (for example one paused mid-write): retry later.
            StoreErrorKind::Busy => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_busy", message)
            }
            // The session has fenced writes, and this process runs unleased.
            StoreErrorKind::Unfenced => {
                Self::new(StatusCode::CONFLICT, "unfenced_write_refused", message)
            }
            _ => Self::internal(message),
        }
    }
}

/// The error and its sources, joined, for messages that explain themselves.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}
