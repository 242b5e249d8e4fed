//! The error answer: status, `Retry-After`, and the JSON body every error
//! is answered with.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use lease_keeper::{KeeperError, KeeperErrorKind};
use serde::{Deserialize, Serialize};
use session_store::StoreError;

use crate::ErrorCode;
use crate::mapping::{
    keeper_code, keeper_message, keeper_retry_after, store_code, store_message, store_retry_after,
};

/// An error answered to a client: a status, a stable [`ErrorCode`], a
/// message for people, the lease holder when known, and `Retry-After`.
///
/// Made from a [`KeeperError`] or a [`StoreError`] (so `?` answers them in
/// a handler returning `Result<_, HttpError>`), or by hand with
/// [`new`](Self::new). Answered as [`ErrorBody`] JSON:
///
/// ```json
/// {"error": {"code": "session_leased_elsewhere", "holder": "host-a",
///            "message": "session chat-7 is being served by another process (host-a); try again later",
///            "retryable": false}}
/// ```
///
/// with `Retry-After: 12`. `holder` is left out when unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    holder: Option<String>,
    retry_after: Option<u64>,
}

impl HttpError {
    /// An error with `code`'s status, and no holder or `Retry-After`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: code.status(),
            code,
            message: message.into(),
            holder: None,
            retry_after: None,
        }
    }

    /// Answers `Retry-After: secs`.
    #[must_use]
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message for people.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The live lease holder, for `session_leased_elsewhere`, when known.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// `Retry-After`, in whole seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code,
                holder: self.holder.clone(),
                message: self.message.clone(),
                retryable: self.code.is_retryable(),
            },
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for HttpError {}

impl From<KeeperError> for HttpError {
    fn from(e: KeeperError) -> Self {
        Self {
            holder: match e.kind() {
                KeeperErrorKind::LeasedElsewhere => e.holder().map(|h| h.as_str().to_owned()),
                _ => None,
            },
            retry_after: keeper_retry_after(&e),
            ..Self::new(keeper_code(e.kind()), keeper_message(&e))
        }
    }
}

impl From<StoreError> for HttpError {
    fn from(e: StoreError) -> Self {
        Self {
            retry_after: store_retry_after(e.kind()),
            ..Self::new(store_code(e.kind()), store_message(&e))
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The body of every error answer: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong. Fields in alphabetical order, as `mecated` writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable code to act on.
    pub code: ErrorCode,
    /// The live lease holder, for `session_leased_elsewhere`, when known;
    /// left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// What happened, for people.
    pub message: String,
    /// True when the same request may succeed later on the same process
    /// ([`ErrorCode::is_retryable`]).
    pub retryable: bool,
}
