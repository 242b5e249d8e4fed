//! Errors at the HTTP edge: the one place where a refusal or failure
//! becomes a status, a stable code and the JSON error body.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lease_keeper::{KeeperError, KeeperErrorKind};
use session_store::{StoreError, StoreErrorKind};

use crate::engine::EngineError;
use crate::error::error_chain;
use crate::wire::{ErrorBody, ErrorCode, ErrorDetail};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable, machine-readable code.
    pub code: ErrorCode,
    /// Human-readable detail.
    pub message: String,
    /// The live lease holder, for `session_leased_elsewhere`.
    pub holder: Option<String>,
    /// Seconds to wait before retrying (`Retry-After`), when known better
    /// than the default of 1 for retryable errors.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error whose status follows from its code; `invalid` is 400 here
    /// (see [`ApiError::too_large`] for its 413).
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            code,
            message: message.into(),
            holder: None,
            retry_after: None,
        }
    }

    /// 400 `invalid`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, message)
    }

    /// 413 `invalid`: the request body exceeds the server's limit.
    pub fn too_large(detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..Self::invalid(format!("request body too large: {detail}"))
        }
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code,
                holder: self.holder.clone(),
                message: self.message.clone(),
                retryable: self.code.retryable(),
            },
        }
    }
}

/// The status of each code.
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::Invalid | ErrorCode::InvalidContinue => StatusCode::BAD_REQUEST,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::SessionLeasedElsewhere
        | ErrorCode::SessionBusy
        | ErrorCode::SessionExists
        | ErrorCode::UnleasedNotExclusive
        | ErrorCode::UnfencedWriteRefused => StatusCode::CONFLICT,
        ErrorCode::LeaseUnavailable
        | ErrorCode::ShuttingDown
        | ErrorCode::StoreBusy
        | ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal | ErrorCode::StateRewound => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE && self.code.retryable() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::ShuttingDown => Self::new(ErrorCode::ShuttingDown, e.to_string()),
            EngineError::NotExclusive => Self::new(ErrorCode::UnleasedNotExclusive, e.to_string()),
            EngineError::Lease(e) => e.into(),
            EngineError::Store(e) => e.into(),
            EngineError::FailedAfterClaim(_) => Self::new(ErrorCode::Internal, error_chain(&e)),
        }
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
                ..Self::new(ErrorCode::SessionLeasedElsewhere, message)
            },
            KeeperErrorKind::Busy => Self::new(ErrorCode::SessionBusy, message),
            KeeperErrorKind::Unavailable => Self::new(ErrorCode::LeaseUnavailable, message),
            KeeperErrorKind::ShuttingDown => Self::new(ErrorCode::ShuttingDown, message),
            KeeperErrorKind::Rewound => Self::new(ErrorCode::StateRewound, message),
            // Ids are validated before they reach the keeper: an `Invalid`
            // from it is a backend or configuration fault, not the client's.
            _ => Self::new(ErrorCode::Internal, message),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = error_chain(&e);
        let code = match e.kind() {
            StoreErrorKind::NotFound => ErrorCode::NotFound,
            StoreErrorKind::AlreadyExists => ErrorCode::SessionExists,
            StoreErrorKind::Invalid => ErrorCode::Invalid,
            // A fenced write at the API surface means another process took
            // the session between our acquire and our write.
            StoreErrorKind::Fenced => ErrorCode::SessionLeasedElsewhere,
            // Another process holds the session's file longer than the
            // store waits (for example one paused mid-write): retry later.
            StoreErrorKind::Busy => ErrorCode::StoreBusy,
            // The session has fenced writes, and this process runs unleased.
            StoreErrorKind::Unfenced => ErrorCode::UnfencedWriteRefused,
            // Nothing was done: the store told so. An `Io` failure of a
            // write may have been done, so it is never called retryable.
            StoreErrorKind::Unavailable => ErrorCode::StoreUnavailable,
            StoreErrorKind::Rewound => ErrorCode::StateRewound,
            _ => ErrorCode::Internal,
        };
        Self::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_the_documented_status_and_retryability() {
        use ErrorCode::*;
        let table = [
            (Invalid, 400, false),
            (InvalidContinue, 400, false),
            (NotFound, 404, false),
            (SessionLeasedElsewhere, 409, false),
            (SessionBusy, 409, true),
            (SessionExists, 409, false),
            (UnleasedNotExclusive, 409, false),
            (UnfencedWriteRefused, 409, false),
            (LeaseUnavailable, 503, true),
            (ShuttingDown, 503, false),
            (StoreBusy, 503, true),
            (StoreUnavailable, 503, true),
            (StateRewound, 500, false),
            (Internal, 500, false),
        ];
        for (code, status, retryable) in table {
            let e = ApiError::new(code, "x");
            assert_eq!(e.status.as_u16(), status, "{code:?}");
            assert_eq!(e.body().error.retryable, retryable, "{code:?}");
        }
    }

    #[test]
    fn only_a_store_that_did_nothing_is_retryable() {
        use std::io::{Error, ErrorKind};
        let unavailable = ApiError::from(StoreError::Unavailable {
            op: "appending to a session",
            path: "redis://127.0.0.1:6379".into(),
            source: Error::new(ErrorKind::ConnectionRefused, "x"),
        });
        assert_eq!(unavailable.code, ErrorCode::StoreUnavailable);
        assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(unavailable.body().error.retryable);
        // A write that may have been done, whatever its error says, and a
        // local file's failure are not for retrying blindly.
        for kind in [
            ErrorKind::TimedOut,
            ErrorKind::ConnectionReset,
            ErrorKind::NotConnected,
            ErrorKind::StorageFull,
            ErrorKind::Other,
        ] {
            let e = ApiError::from(StoreError::Io {
                op: "appending to a session",
                path: "/var/lib/mecated/s.jsonl".into(),
                source: Error::new(kind, "x"),
            });
            assert_eq!(e.code, ErrorCode::Internal, "{kind:?}");
            assert!(!e.body().error.retryable, "{kind:?}");
        }
    }

    #[test]
    fn a_store_that_failed_after_the_claim_is_not_called_untouched() {
        let e = ApiError::from(EngineError::FailedAfterClaim(StoreError::Unavailable {
            op: "reading a session",
            path: "redis://127.0.0.1:6379".into(),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "x"),
        }));
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(!e.body().error.retryable);
        assert!(
            e.message.contains("before its input was run"),
            "{}",
            e.message
        );
    }

    #[test]
    fn too_large_is_413_with_code_invalid() {
        let e = ApiError::too_large("limit 1024");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.code, ErrorCode::Invalid);
    }
}
