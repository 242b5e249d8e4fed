//! The stable codes of error answers, and the status each is answered with.

use http::StatusCode;
use serde::{Deserialize, Serialize};

/// The stable, machine-readable code of an error answer: what a client
/// matches on. Serialised in snake case (`session_leased_elsewhere`).
///
/// The codes and their statuses are the ones `mecated` answers, so a
/// client of one server understands the other; [`WriteFenced`] and
/// [`LeaseLost`] are the two a server built on this crate can answer
/// that `mecated` folds into others.
///
/// [`WriteFenced`]: ErrorCode::WriteFenced
/// [`LeaseLost`]: ErrorCode::LeaseLost
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// 409: another process holds the session's lease (`holder` names it
    /// when known). `Retry-After` says when its lease runs out.
    SessionLeasedElsewhere,
    /// 409: this process is serving another request for the session.
    /// Retryable, with `Retry-After`.
    SessionBusy,
    /// 503: the lease backend failed or did not answer in time; nothing is
    /// held. Retryable, with `Retry-After`.
    LeaseUnavailable,
    /// 503: the server is shutting down; retry on another process.
    ShuttingDown,
    /// 400: bad input (a session id breaking the id rules, a store refusing
    /// the input); nothing was written.
    Invalid,
    /// 500: the lease authority or the store answered from older state
    /// than this process saw (a backup put back, a lagging replica).
    /// Retrying cannot help until an operator acts.
    StateRewound,
    /// 409: the request's lease was lost (taken over or expired, or the
    /// server began shutting down) before a write: that write was not made.
    LeaseLost,
    /// 404: no such session.
    NotFound,
    /// 409: a session with this id exists.
    SessionExists,
    /// 409: the store refused the write because a later owner of the
    /// session has written since (a takeover while this request paused):
    /// that write was not made.
    WriteFenced,
    /// 409: the write carried no lease token, and the store does not accept
    /// one without (or the session has fenced writes).
    UnfencedWriteRefused,
    /// 503: the session is locked in the store by someone else past the
    /// store's wait; nothing was done. Retryable, with `Retry-After`.
    StoreBusy,
    /// 503: the store could not be reached, or refused before acting;
    /// nothing was done. Retryable, with `Retry-After`.
    StoreUnavailable,
    /// 500: a fault of the server or its storage. A write may or may not
    /// have been made: read the session before writing again.
    Internal,
    /// 409, from a service receiving a run's side effects
    /// ([`EffectFence`](crate::EffectFence)): a later owner of the session
    /// has been seen, so this request comes from an owner that lost it.
    /// The effect was not performed; the run must not act for the session.
    StaleFencingToken,
    /// 409, from a service receiving a run's side effects: this effect
    /// key's effect was performed already under the same token; it is not
    /// performed again.
    RepeatedEffect,
    /// 409, from a service receiving a run's side effects: this effect
    /// key's effect is being performed by another request right now.
    /// Retryable, with `Retry-After`: asked again, it is either done
    /// (`repeated_effect`) or admitted.
    EffectInProgress,
}

impl ErrorCode {
    /// The code as it is written in the body: `session_leased_elsewhere`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::SessionLeasedElsewhere => "session_leased_elsewhere",
            ErrorCode::SessionBusy => "session_busy",
            ErrorCode::LeaseUnavailable => "lease_unavailable",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Invalid => "invalid",
            ErrorCode::StateRewound => "state_rewound",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::NotFound => "not_found",
            ErrorCode::SessionExists => "session_exists",
            ErrorCode::WriteFenced => "write_fenced",
            ErrorCode::UnfencedWriteRefused => "unfenced_write_refused",
            ErrorCode::StoreBusy => "store_busy",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::StaleFencingToken => "stale_fencing_token",
            ErrorCode::RepeatedEffect => "repeated_effect",
            ErrorCode::EffectInProgress => "effect_in_progress",
        }
    }

    /// The status the code is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::Invalid => StatusCode::BAD_REQUEST,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::SessionLeasedElsewhere
            | ErrorCode::SessionBusy
            | ErrorCode::LeaseLost
            | ErrorCode::SessionExists
            | ErrorCode::WriteFenced
            | ErrorCode::UnfencedWriteRefused
            | ErrorCode::StaleFencingToken
            | ErrorCode::RepeatedEffect
            | ErrorCode::EffectInProgress => StatusCode::CONFLICT,
            ErrorCode::LeaseUnavailable
            | ErrorCode::ShuttingDown
            | ErrorCode::StoreBusy
            | ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StateRewound | ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// True when the same request may succeed later on the same process,
    /// having certainly done nothing: `session_busy`, `lease_unavailable`,
    /// `store_busy`, `store_unavailable`, `effect_in_progress`.
    ///
    /// A session leased elsewhere is not: it is another process's until
    /// its holder lets go (`Retry-After` says when that may be). Nor is a
    /// refused write: the request may have written before it.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::SessionBusy
                | ErrorCode::LeaseUnavailable
                | ErrorCode::StoreBusy
                | ErrorCode::StoreUnavailable
                | ErrorCode::EffectInProgress
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
