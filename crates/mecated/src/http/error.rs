//! Errors at the HTTP edge: the one place where a refusal or failure
//! becomes a status, a stable code and the JSON error body.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lease_keeper::{KeeperError, KeeperErrorKind};
use session_store::StoreError;

use crate::auth::Role;
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
    /// The role the request lacked, for `forbidden`.
    pub role: Option<Role>,
}

/// The `Retry-After` of 429 `too_many_follows`, in seconds.
pub(crate) const TOO_MANY_FOLLOWS_RETRY_AFTER_SECS: u64 = 5;

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
            role: None,
        }
    }

    /// 401 `unauthenticated`: no bearer token, or one the server does not
    /// know.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthenticated, message)
    }

    /// 403 `forbidden`: `caller`'s token lacks `role`.
    pub fn forbidden(caller: &str, role: Role) -> Self {
        Self {
            role: Some(role),
            ..Self::new(
                ErrorCode::Forbidden,
                format!(
                    "the token {caller:?} lacks the {role} role this request needs: nothing was \
                     done (the token file lists each token's roles)"
                ),
            )
        }
    }

    /// 429 `too_many_follows`: `caller`'s token holds `limit` follows.
    pub fn too_many_follows(caller: &str, limit: usize) -> Self {
        Self {
            // A follow lasts: a client that asks again at once, in a loop,
            // is the storm the bound is there to stop.
            retry_after: Some(TOO_MANY_FOLLOWS_RETRY_AFTER_SECS),
            ..Self::new(
                ErrorCode::TooManyFollows,
                format!(
                    "the token {caller:?} holds {limit} follows open, as many as this server \
                     allows one client (--max-follows-per-client): close one before following \
                     again"
                ),
            )
        }
    }

    /// 405 `invalid`: the route does not take the request's method;
    /// `allowed` lists the ones it does.
    pub fn method_not_allowed(allowed: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..Self::invalid(format!(
                "this route does not take the request's method; it takes {allowed}"
            ))
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
                role: self.role,
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
        | ErrorCode::Draining
        | ErrorCode::StoreBusy
        | ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal | ErrorCode::StateRewound => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::TooManyFollows => StatusCode::TOO_MANY_REQUESTS,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut response = (self.status, Json(body)).into_response();
        // The audit trail reads the code back from the answer.
        response.extensions_mut().insert(self.code);
        if self.code == ErrorCode::Unauthenticated {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"mecated\""),
            );
        }
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
            // Not retryable here (this replica will not take it), but
            // nothing was done: a client sending it again a second later
            // reaches a replica still in the load balancer's rotation.
            EngineError::Draining => Self {
                retry_after: Some(1),
                ..Self::new(ErrorCode::Draining, e.to_string())
            },
            EngineError::NotExclusive => Self::new(ErrorCode::UnleasedNotExclusive, e.to_string()),
            EngineError::Lease(e) => e.into(),
            EngineError::Store(e) => e.into(),
            EngineError::FailedAfterClaim(_) => Self::new(ErrorCode::Internal, error_chain(&e)),
        }
    }
}

/// Keeper and store errors are answered through `lease-http`, the mapping
/// every server of the workspace shares; only the code is this API's own
/// ([`ErrorCode`]'s `From`), and the status follows from it.
impl From<lease_http::HttpError> for ApiError {
    fn from(e: lease_http::HttpError) -> Self {
        Self {
            holder: e.holder().map(str::to_owned),
            retry_after: e.retry_after(),
            ..Self::new(e.code().into(), e.message())
        }
    }
}

impl From<KeeperError> for ApiError {
    fn from(e: KeeperError) -> Self {
        // Ids are validated before they reach the keeper: an `Invalid` from
        // it is a backend or configuration fault, not the client's (it is
        // 400 in `lease-http`, for servers that pass ids on unchecked).
        if e.kind() == KeeperErrorKind::Invalid {
            return Self::new(ErrorCode::Internal, error_chain(&e));
        }
        lease_http::HttpError::from(e).into()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        lease_http::HttpError::from(e).into()
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
            (Draining, 503, false),
            (StoreBusy, 503, true),
            (StoreUnavailable, 503, true),
            (StateRewound, 500, false),
            (Internal, 500, false),
            (Unauthenticated, 401, false),
            (Forbidden, 403, false),
            (TooManyFollows, 429, true),
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

    /// The codes keeper and store errors had before they went through
    /// `lease-http`, kind by kind: a client of this API sees no change.
    #[test]
    fn keeper_and_store_errors_keep_their_codes() {
        use std::io::Error;
        use std::time::Duration;

        use lease_port::{FencingToken, LeaseError, OwnerId, SessionId};

        let s = || SessionId::new("s").unwrap();
        let o = |n: &str| OwnerId::new(n).unwrap();
        let keeper = [
            (
                KeeperError::LeasedElsewhere {
                    session: s(),
                    holder: Some(o("b")),
                    retry_after: Duration::from_secs(2),
                    source: LeaseError::held(Some(o("b"))),
                },
                ErrorCode::SessionLeasedElsewhere,
            ),
            (
                KeeperError::Busy {
                    session: s(),
                    waited: Duration::ZERO,
                    retry_after: Duration::from_secs(2),
                },
                ErrorCode::SessionBusy,
            ),
            (
                KeeperError::Unavailable {
                    session: s(),
                    source: LeaseError::transient("down"),
                },
                ErrorCode::LeaseUnavailable,
            ),
            (KeeperError::ShuttingDown, ErrorCode::ShuttingDown),
            (
                KeeperError::Invalid {
                    message: "nonsense".into(),
                    source: Some(LeaseError::invalid("nonsense")),
                },
                ErrorCode::Internal,
            ),
            (
                KeeperError::Rewound {
                    session: s(),
                    source: LeaseError::rewound("older"),
                },
                ErrorCode::StateRewound,
            ),
            (KeeperError::RunEnded { session: s() }, ErrorCode::Internal),
            (
                KeeperError::WritesInFlight {
                    session: s(),
                    waited: Duration::ZERO,
                },
                ErrorCode::Internal,
            ),
        ];
        for (e, code) in keeper {
            let holder = e.holder().map(|h| h.to_string());
            let api = ApiError::from(e);
            assert_eq!((api.code, api.status), (code, status_of(code)), "{api:?}");
            assert_eq!(api.holder, holder);
        }
        let io = || Error::other("x");
        let store = [
            (StoreError::NotFound { session: s() }, ErrorCode::NotFound),
            (
                StoreError::AlreadyExists { session: s() },
                ErrorCode::SessionExists,
            ),
            (
                StoreError::Fenced {
                    session: s(),
                    presented: FencingToken::new(1),
                    presented_by: o("a"),
                    high_water: FencingToken::new(2),
                    high_water_owner: Some(o("b")),
                },
                ErrorCode::SessionLeasedElsewhere,
            ),
            (
                StoreError::Unfenced {
                    session: s(),
                    high_water: Some(FencingToken::new(2)),
                },
                ErrorCode::UnfencedWriteRefused,
            ),
            (
                StoreError::Invalid {
                    message: "x".into(),
                },
                ErrorCode::Invalid,
            ),
            (
                StoreError::Busy {
                    path: "p".into(),
                    timeout: Duration::ZERO,
                },
                ErrorCode::StoreBusy,
            ),
            (
                StoreError::Unavailable {
                    op: "o",
                    path: "p".into(),
                    source: io(),
                },
                ErrorCode::StoreUnavailable,
            ),
            (StoreError::rewound("p", "x"), ErrorCode::StateRewound),
            (
                StoreError::Io {
                    op: "o",
                    path: "p".into(),
                    source: io(),
                },
                ErrorCode::Internal,
            ),
            (
                StoreError::Corrupt {
                    path: "p".into(),
                    line: None,
                    message: "x".into(),
                    source: None,
                },
                ErrorCode::Internal,
            ),
            (StoreError::Unsupported { what: "x" }, ErrorCode::Internal),
        ];
        for (e, code) in store {
            let api = ApiError::from(e);
            assert_eq!((api.code, api.status), (code, status_of(code)), "{api:?}");
        }
    }

    #[test]
    fn too_large_is_413_with_code_invalid() {
        let e = ApiError::too_large("limit 1024");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.code, ErrorCode::Invalid);
    }

    /// 429 `too_many_follows` says `retryable: true`
    /// but carries no `Retry-After`, unlike every other retryable answer
    /// (503s get `Retry-After: 1` at least, 409 `session_leased_elsewhere`
    /// its holder's expiry). A client that honours only the header (or a
    /// proxy's retry policy) retries at once, in a loop, against a token
    /// that is at its bound: the very reconnect storm the bound is for.
    #[test]
    fn too_many_follows_says_when_to_retry() {
        let response = ApiError::too_many_follows("bot", 1000).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            response.headers().contains_key(header::RETRY_AFTER),
            "a retryable 429 without Retry-After: {:?}",
            response.headers()
        );
    }
}
