//! The store's error type.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lease_port::{AuthorityId, FencingToken, OwnerId, SessionId};

/// The coarse kind of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The session does not exist (never created, or deleted).
    NotFound,
    /// `create` of a session that exists.
    AlreadyExists,
    /// The write carried a token below the session's high-water mark, or
    /// equal to it from another writer than the mark's: the writer lost
    /// ownership to a later owner (or holds a token of another lease
    /// authority). Stop acting for the session.
    Fenced,
    /// An unfenced write (no token) the store does not accept.
    Unfenced,
    /// Bad input: nothing was written.
    Invalid,
    /// Stored data that cannot be read as the store wrote it.
    Corrupt,
    /// An I/O failure. For a write, whether it was done is unknown (the
    /// reply may be what was lost): read the session before writing again.
    Io,
    /// The store could not be reached, or refused the request before
    /// acting on it (a remote store still loading its data, busy, read-only
    /// or out of memory): nothing was done, and the same request may
    /// succeed later.
    Unavailable,
    /// The session is locked by someone else (another process holding its
    /// file lock, typically) for longer than the store waits
    /// ([`JsonlOptions::lock_timeout`](crate::JsonlOptions::lock_timeout)).
    /// Nothing was done; retrying later is safe.
    Busy,
    /// The store is fenced by another lease authority than the one offered
    /// ([`SessionStore::bind_authority`](crate::SessionStore::bind_authority)):
    /// the offered backend's tokens mean nothing to it.
    AuthorityMismatch,
    /// The store does not offer the operation (a trait method it left to
    /// its default).
    Unsupported,
    /// The store answered from older state than this client already saw (a
    /// snapshot restore, a failover to a lagging replica, a directory put
    /// back from a backup, keys evicted), or it is deployed in a way that
    /// can lose acknowledged writes (an evicting memory policy). Nothing was
    /// done. Retrying cannot help: the message names what to fix.
    Rewound,
}

/// The error of every [`SessionStore`](crate::SessionStore) operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The session does not exist.
    #[error("session {session} not found")]
    NotFound {
        /// The session asked for.
        session: SessionId,
    },
    /// The session exists already.
    #[error("session {session} already exists")]
    AlreadyExists {
        /// The session asked for.
        session: SessionId,
    },
    /// Refused: the presented token is below the session's high-water
    /// mark, or equal to it while the mark belongs to another writer.
    #[error("write to session {session} fenced: {}", fenced_reason(*presented, presented_by, *high_water, high_water_owner.as_ref()))]
    Fenced {
        /// The session written to.
        session: SessionId,
        /// The token the writer presented.
        presented: FencingToken,
        /// The writer that presented it.
        presented_by: OwnerId,
        /// The highest token the store has accepted for the session.
        high_water: FencingToken,
        /// The writer the mark belongs to; `None` when the mark was set
        /// before the store recorded writers (an equal token is then
        /// refused from everyone).
        high_water_owner: Option<OwnerId>,
    },
    /// Refused: the write carried no token, and the store does not allow
    /// unfenced writes, or a fenced write was already accepted.
    #[error("unfenced write to session {session} refused{}", high_water.map(|h| format!(" (high-water mark {h})")).unwrap_or_else(|| " (unfenced writes are not enabled)".to_owned()))]
    Unfenced {
        /// The session written to.
        session: SessionId,
        /// The session's high-water mark, when a fenced write was accepted.
        high_water: Option<FencingToken>,
    },
    /// Bad input; nothing was written.
    #[error("invalid input: {message}")]
    Invalid {
        /// What was wrong.
        message: String,
    },
    /// Stored data that cannot be read as the store wrote it.
    #[error("corrupt session file {}{}: {message}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The 1-based line, when the problem is in one line.
        line: Option<u64>,
        /// What was wrong.
        message: String,
        /// The parse error, when there is one.
        #[source]
        source: Option<serde_json::Error>,
    },
    /// An I/O failure.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What the store was doing.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The store could not be reached, or refused the request before
    /// acting on it; nothing was done. Retryable.
    #[error("{op} {}: {source} (nothing was done; retry later)", path.display())]
    Unavailable {
        /// What the store was doing.
        op: &'static str,
        /// Where the store is (a remote store: its address, without
        /// credentials).
        path: PathBuf,
        /// Why, as an I/O error (a remote store's own error reachable
        /// through [`io::Error::get_ref`]).
        #[source]
        source: io::Error,
    },
    /// The session's lock was not free within the store's deadline;
    /// nothing was done. Retryable.
    #[error(
        "session file {} is locked by another holder; gave up after {timeout:?} (nothing was done; retry later)",
        path.display()
    )]
    Busy {
        /// The session file.
        path: PathBuf,
        /// How long the store waited for the lock.
        timeout: Duration,
    },
    /// The store is fenced by another lease authority than the one offered.
    #[error(
        "store {location} is fenced by lease authority {recorded}, not {offered}: tokens of one authority mean nothing to another; serve it with the lease backend of authority {recorded}, or use another store"
    )]
    AuthorityMismatch {
        /// Where the store keeps its record (the JSONL store: the file).
        location: String,
        /// The authority the store is fenced by.
        recorded: AuthorityId,
        /// The authority offered.
        offered: AuthorityId,
    },
    /// The store does not offer the operation.
    #[error("this store does not support {what}")]
    Unsupported {
        /// The operation.
        what: &'static str,
    },
    /// The store's state went back, or its deployment can lose
    /// acknowledged writes; nothing was done.
    #[error("store {location}: {detail}")]
    Rewound {
        /// Where the store is (a directory, a server without credentials).
        location: String,
        /// What went back or what is misconfigured, and what to do about it.
        detail: String,
    },
}

impl StoreError {
    /// `AuthorityMismatch` for the store at `location`.
    pub fn authority_mismatch(
        location: impl Into<String>,
        recorded: AuthorityId,
        offered: AuthorityId,
    ) -> Self {
        StoreError::AuthorityMismatch {
            location: location.into(),
            recorded,
            offered,
        }
    }

    /// `Rewound` for the store at `location`: `detail` says what went back
    /// (or what setting can lose writes) and what to do.
    pub fn rewound(location: impl Into<String>, detail: impl Into<String>) -> Self {
        StoreError::Rewound {
            location: location.into(),
            detail: detail.into(),
        }
    }

    /// The kind of this error.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::NotFound { .. } => StoreErrorKind::NotFound,
            StoreError::AlreadyExists { .. } => StoreErrorKind::AlreadyExists,
            StoreError::Fenced { .. } => StoreErrorKind::Fenced,
            StoreError::Unfenced { .. } => StoreErrorKind::Unfenced,
            StoreError::Invalid { .. } => StoreErrorKind::Invalid,
            StoreError::Corrupt { .. } => StoreErrorKind::Corrupt,
            StoreError::Io { .. } => StoreErrorKind::Io,
            StoreError::Unavailable { .. } => StoreErrorKind::Unavailable,
            StoreError::Busy { .. } => StoreErrorKind::Busy,
            StoreError::AuthorityMismatch { .. } => StoreErrorKind::AuthorityMismatch,
            StoreError::Unsupported { .. } => StoreErrorKind::Unsupported,
            StoreError::Rewound { .. } => StoreErrorKind::Rewound,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        StoreError::Invalid {
            message: message.into(),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.as_ref().to_owned(),
            source,
        }
    }

    pub(crate) fn corrupt(
        path: impl AsRef<Path>,
        line: Option<u64>,
        message: impl Into<String>,
    ) -> Self {
        StoreError::Corrupt {
            path: path.as_ref().to_owned(),
            line,
            message: message.into(),
            source: None,
        }
    }
}

fn fenced_reason(
    presented: FencingToken,
    by: &OwnerId,
    high_water: FencingToken,
    owner: Option<&OwnerId>,
) -> String {
    if presented < high_water {
        return format!("token {presented} of {by} is below the high-water mark {high_water}");
    }
    match owner {
        Some(owner) => format!(
            "token {presented} of {by} equals the high-water mark, which belongs to writer {owner}"
        ),
        None => format!(
            "token {presented} of {by} equals the high-water mark, whose writer is not recorded (set before writers were)"
        ),
    }
}
