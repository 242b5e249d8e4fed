//! What a keeper call can fail with.

use std::time::Duration;

use lease_port::{LeaseError, OwnerId, SessionId};

/// How long a caller refused `Unavailable` is told to wait: long enough
/// not to hammer a failing backend, short enough to catch its recovery.
pub(crate) const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The coarse kind of a [`KeeperError`], for deciding what to answer.
///
/// | kind | server answer | `Retry-After` ([`KeeperError::retry_after`]) |
/// |---|---|---|
/// | `LeasedElsewhere` | 409 *session leased elsewhere* | the holder's lease's time left, else the TTL |
/// | `Busy` | 409: a run of this session is live in this process | the TTL |
/// | `Unavailable` | 503, retry later | 1 s |
/// | `ShuttingDown` | 503: retry on another process | none |
/// | `Invalid` | 400 / configuration error | none |
/// | `Rewound` | 500, not retryable: the authority must be fixed | none |
/// | `RunEnded` | 409 `lease_lost`: the write was not made, the run must stop | none |
/// | `WritesInFlight` | 500 when passed on; normally logged when a run ends | none |
///
/// `lease-http` answers exactly this table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeeperErrorKind {
    /// Another owner holds the session's lease.
    LeasedElsewhere,
    /// The lease backend failed transiently or did not answer in time; nothing is held.
    Unavailable,
    /// A run of the session is live in this process (or did not end within
    /// the wait asked for).
    Busy,
    /// [`LeaseKeeper::shutdown`](crate::LeaseKeeper::shutdown) has begun.
    ShuttingDown,
    /// Bad input or configuration, or a backend answer that breaks the contract.
    Invalid,
    /// A write was asked for after its run lost its lease or began its release.
    RunEnded,
    /// A run ended while writes it started were still running: its lease
    /// was not released and its session stays busy in this process until
    /// they end.
    WritesInFlight,
    /// The lease authority answered from older state than this process
    /// already saw: nothing is held, and retrying cannot help until an
    /// operator acts (see [`LeaseErrorKind::Rewound`](lease_port::LeaseErrorKind::Rewound)).
    Rewound,
}

/// The error of [`LeaseKeeper`](crate::LeaseKeeper) and
/// [`LeaseGuard`](crate::LeaseGuard) operations.
///
/// Match on [`kind()`](Self::kind); the backend's error, when there is one,
/// is the [`source()`](std::error::Error::source), for matching and
/// downcasting. Its text is already part of this error's own, since most
/// callers print an error alone: print this error, not the chain of its
/// sources, or the cause appears twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeeperError {
    /// Acquire answered `Held`: another owner holds the session. Nothing was started.
    #[error("session {session} is leased elsewhere: {source}")]
    LeasedElsewhere {
        /// The session asked for.
        session: SessionId,
        /// The live holder, when the backend named it.
        holder: Option<OwnerId>,
        /// When to ask again: the holder's lease's time left when the
        /// backend said, else the keeper's TTL.
        retry_after: Duration,
        /// The backend's `Held` error.
        #[source]
        source: LeaseError,
    },
    /// The backend failed transiently or timed out. Retryable; nothing is held.
    #[error("lease backend unavailable for session {session}: {source}")]
    Unavailable {
        /// The session concerned.
        session: SessionId,
        /// The backend's error (a `Transient` one, or a timeout made into one).
        #[source]
        source: LeaseError,
    },
    /// The backend answered `Rewound`: its state is older than what this
    /// process saw. Not retryable; nothing is held.
    #[error("the lease authority's state went back (session {session}): {source}")]
    Rewound {
        /// The session concerned.
        session: SessionId,
        /// The backend's `Rewound` error, naming what went back.
        #[source]
        source: LeaseError,
    },
    /// Another run of the same session is live in this process, and did not
    /// end within the wait asked for (none, by default: a competitor in this
    /// process is refused at once, like one elsewhere).
    #[error("session {session} is busy: a run of it is live in this process (waited {waited:?})")]
    Busy {
        /// The session asked for.
        session: SessionId,
        /// How long the call waited for the lock.
        waited: Duration,
        /// When to ask again: the keeper's TTL.
        retry_after: Duration,
    },
    /// The keeper is shutting down and takes no new runs.
    #[error("the lease keeper is shutting down")]
    ShuttingDown,
    /// [`WriteGate::begin`](crate::WriteGate::begin) after the run lost its
    /// lease (or shutdown ended it) or began its release: the write must not
    /// start.
    #[error("the run of session {session} is over: no write may start")]
    RunEnded {
        /// The run's session.
        session: SessionId,
    },
    /// [`LeaseGuard::finish`](crate::LeaseGuard::finish): writes of the run
    /// were still running after the write wait
    /// ([`KeeperBuilder::write_wait`](crate::KeeperBuilder::write_wait)). The
    /// lease was not released — it lapses at its expiry, and the next run in
    /// this process gets a greater token — and the session's in-process lock
    /// is held until the last write ends.
    #[error(
        "writes of session {session}'s run were still running after {waited:?}: \
         the lease was left to lapse and the session stays busy until they end"
    )]
    WritesInFlight {
        /// The run's session.
        session: SessionId,
        /// How long the release waited for them.
        waited: Duration,
    },
    /// Bad input or configuration, or a backend answer that breaks the contract.
    #[error("invalid: {message}{}", source.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    Invalid {
        /// What was wrong.
        message: String,
        /// The backend's error, when it reported `Invalid`.
        #[source]
        source: Option<LeaseError>,
    },
}

impl KeeperError {
    /// The kind of this error.
    pub fn kind(&self) -> KeeperErrorKind {
        match self {
            KeeperError::LeasedElsewhere { .. } => KeeperErrorKind::LeasedElsewhere,
            KeeperError::Unavailable { .. } => KeeperErrorKind::Unavailable,
            KeeperError::Busy { .. } => KeeperErrorKind::Busy,
            KeeperError::ShuttingDown => KeeperErrorKind::ShuttingDown,
            KeeperError::Invalid { .. } => KeeperErrorKind::Invalid,
            KeeperError::RunEnded { .. } => KeeperErrorKind::RunEnded,
            KeeperError::WritesInFlight { .. } => KeeperErrorKind::WritesInFlight,
            KeeperError::Rewound { .. } => KeeperErrorKind::Rewound,
        }
    }

    /// True when the same call may succeed later on this process
    /// (`Unavailable`, `Busy`).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            KeeperErrorKind::Unavailable | KeeperErrorKind::Busy
        )
    }

    /// When the same call is worth trying again, for a `Retry-After`
    /// answer: see the table on [`KeeperErrorKind`]. `None` when retrying
    /// here cannot help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            KeeperError::LeasedElsewhere { retry_after, .. }
            | KeeperError::Busy { retry_after, .. } => Some(*retry_after),
            KeeperError::Unavailable { .. } => Some(UNAVAILABLE_RETRY_AFTER),
            _ => None,
        }
    }

    /// The live holder for `LeasedElsewhere`, when known.
    pub fn holder(&self) -> Option<&OwnerId> {
        match self {
            KeeperError::LeasedElsewhere { holder, .. } => holder.as_ref(),
            _ => None,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        KeeperError::Invalid {
            message: message.into(),
            source: None,
        }
    }
}
