//! PostgreSQL's failures in the store's words.

use std::io;
use std::path::PathBuf;

use session_store::StoreError;
use tokio_postgres::error::SqlState;

use crate::conn::Failure;

/// Whether the failed statement wrote (or would have): a write whose
/// outcome is unknown is `Io`, never `Unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

/// The store's error for `failure` of `what` against the database at
/// `location` (credentials removed).
///
/// - Nothing sent, or PostgreSQL refused the statement for a passing
///   reason (connection loss, shutdown, a serialization failure or
///   deadlock, a standby refusing writes, resources): `Unavailable` —
///   a refused statement is its own transaction and did nothing.
/// - Bad data (class 22: a value PostgreSQL cannot store): `Invalid`.
/// - No answer in time, or a connection broken with the statement sent:
///   `Io` for a write (it may have been done), `Unavailable` for a read.
/// - Anything else PostgreSQL refused: `Io`, its message kept.
pub(crate) fn store_error(
    failure: Failure,
    what: &'static str,
    location: &str,
    op: Op,
) -> StoreError {
    let path = PathBuf::from(location);
    let unavailable = match &failure {
        Failure::NotSent(..) => true,
        Failure::TimedOut(_) | Failure::Broken(_) => op == Op::Read,
        Failure::Refused(e) => {
            let code = e.code();
            if code.is_some_and(|c| c.code().starts_with("22")) {
                return StoreError::Invalid {
                    message: format!("{what}: {failure}"),
                };
            }
            code.is_some_and(passing)
        }
    };
    let source = io::Error::other(failure);
    if unavailable {
        StoreError::Unavailable {
            op: what,
            path,
            source,
        }
    } else {
        StoreError::Io {
            op: what,
            path,
            source,
        }
    }
}

/// Refusals that a retry may get past: connection trouble, the server
/// shutting down, serialization failures and deadlocks, resources, a
/// standby (read-only) or a lock not available.
fn passing(code: &SqlState) -> bool {
    let class = &code.code()[..2];
    matches!(class, "08" | "40" | "53" | "57" | "58")
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::LOCK_NOT_AVAILABLE
}

/// `Corrupt` for data of `table` this crate did not write in the shape it
/// writes.
pub(crate) fn corrupt(table: &str, message: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: PathBuf::from(table),
        line: None,
        message: message.into(),
        source: None,
    }
}

pub(crate) fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        message: message.into(),
    }
}
