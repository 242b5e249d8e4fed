//! The one mapping of keeper and store errors to answers: code (hence
//! status), `Retry-After` and message, as plain functions, so that a server
//! answering some other way than [`HttpError`](crate::HttpError) reuses it
//! rather than copies it.

use std::time::Duration;

use lease_keeper::{KeeperError, KeeperErrorKind};
use session_store::{StoreError, StoreErrorKind};

use crate::ErrorCode;

/// How long a client refused by a store that did nothing is told to wait:
/// the same second the keeper gives for a failing lease backend
/// (`KeeperError::retry_after` of `Unavailable`).
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The code of a keeper refusal: the table on [`KeeperErrorKind`].
///
/// | kind | code | status |
/// |---|---|---|
/// | `LeasedElsewhere` | `session_leased_elsewhere` | 409 |
/// | `Busy` | `session_busy` | 409 |
/// | `Unavailable` | `lease_unavailable` | 503 |
/// | `ShuttingDown` | `shutting_down` | 503 |
/// | `Invalid` | `invalid` | 400 |
/// | `Rewound` | `state_rewound` | 500 |
/// | `RunEnded` | `lease_lost` | 409 |
/// | `WritesInFlight` | `internal` | 500 |
///
/// The keeper's table answers nothing for the last two, which are not
/// refusals of a request but of a run's write (`RunEnded`) and of its end
/// (`WritesInFlight`). A handler that passes them on with `?` still needs
/// an answer: a write not made because the lease was lost is a conflict
/// like a fenced one, and writes outliving their request are the server's
/// fault, their outcome unknown.
///
/// `Invalid` is 400 because the keeper says so of bad input; a server that
/// validates every id before it reaches the keeper (as [`Leased`](crate::Leased)
/// does) can only meet it from a backend breaking its contract, and may
/// answer it as `internal` instead.
pub fn keeper_code(kind: KeeperErrorKind) -> ErrorCode {
    match kind {
        KeeperErrorKind::LeasedElsewhere => ErrorCode::SessionLeasedElsewhere,
        KeeperErrorKind::Busy => ErrorCode::SessionBusy,
        KeeperErrorKind::Unavailable => ErrorCode::LeaseUnavailable,
        KeeperErrorKind::ShuttingDown => ErrorCode::ShuttingDown,
        KeeperErrorKind::Invalid => ErrorCode::Invalid,
        KeeperErrorKind::Rewound => ErrorCode::StateRewound,
        KeeperErrorKind::RunEnded => ErrorCode::LeaseLost,
        // `WritesInFlight`, and kinds added later: a fault, not a refusal.
        _ => ErrorCode::Internal,
    }
}

/// The code of a store error.
///
/// | kind | code | status |
/// |---|---|---|
/// | `NotFound` | `not_found` | 404 |
/// | `AlreadyExists` | `session_exists` | 409 |
/// | `Fenced` | `write_fenced` | 409 |
/// | `Unfenced` | `unfenced_write_refused` | 409 |
/// | `Invalid` | `invalid` | 400 |
/// | `Busy` | `store_busy` | 503 |
/// | `Unavailable` | `store_unavailable` | 503 |
/// | `Rewound` | `state_rewound` | 500 |
/// | `Io`, `Corrupt`, `AuthorityMismatch`, `Unsupported` | `internal` | 500 |
///
/// `Io` is never retryable: a write whose reply was lost may have been
/// made. Only `Busy` and `Unavailable` say the store did nothing.
pub fn store_code(kind: StoreErrorKind) -> ErrorCode {
    match kind {
        StoreErrorKind::NotFound => ErrorCode::NotFound,
        StoreErrorKind::AlreadyExists => ErrorCode::SessionExists,
        StoreErrorKind::Fenced => ErrorCode::WriteFenced,
        StoreErrorKind::Unfenced => ErrorCode::UnfencedWriteRefused,
        StoreErrorKind::Invalid => ErrorCode::Invalid,
        StoreErrorKind::Busy => ErrorCode::StoreBusy,
        StoreErrorKind::Unavailable => ErrorCode::StoreUnavailable,
        StoreErrorKind::Rewound => ErrorCode::StateRewound,
        _ => ErrorCode::Internal,
    }
}

/// The `Retry-After` of a keeper refusal, in whole seconds: its
/// [`retry_after`](KeeperError::retry_after) rounded up — the holder's
/// lease's time left (else the TTL) for a session leased elsewhere, the
/// TTL for a busy one, 1 s for an unavailable backend — and `None` where
/// retrying cannot help.
pub fn keeper_retry_after(e: &KeeperError) -> Option<u64> {
    e.retry_after().map(whole_seconds)
}

/// The `Retry-After` of a store error, in whole seconds: 1
/// ([`STORE_RETRY_AFTER`]) when the store did nothing and says so (`Busy`,
/// `Unavailable`), else `None`.
pub fn store_retry_after(kind: StoreErrorKind) -> Option<u64> {
    matches!(kind, StoreErrorKind::Busy | StoreErrorKind::Unavailable)
        .then(|| whole_seconds(STORE_RETRY_AFTER))
}

/// `wait` in whole seconds for `Retry-After`: rounded up, so a client never
/// comes back before the time, and at least 1, since one told to come back
/// at once would only be refused again.
pub fn whole_seconds(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// The message of a keeper refusal, written for the person reading the
/// answer: what happened to the session and what to do. When to retry is
/// `Retry-After`'s to say, not the message's: a server may know better
/// than the keeper (`mecated` asks the backend when the holder's lease
/// runs out) and answer another wait than [`keeper_retry_after`].
pub fn keeper_message(e: &KeeperError) -> String {
    match e {
        KeeperError::LeasedElsewhere {
            session, holder, ..
        } => {
            let by = holder
                .as_ref()
                .map(|h| format!(" ({h})"))
                .unwrap_or_default();
            format!("session {session} is being served by another process{by}; try again later")
        }
        KeeperError::Busy { session, .. } => format!(
            "session {session} is busy: this process is serving another request for it; \
             try again later"
        ),
        KeeperError::Unavailable { session, source } => format!(
            "the lease backend failed for session {session} ({}); nothing was done, try again",
            error_chain(source)
        ),
        KeeperError::ShuttingDown => {
            "the server is shutting down; send the request to another process".to_owned()
        }
        KeeperError::RunEnded { session } => format!(
            "this request's lease on session {session} was lost (taken over, expired, or the \
             server is shutting down) before its write: the write was not made"
        ),
        KeeperError::WritesInFlight { session, .. } => format!(
            "writes of this request to session {session} were still running when it ended: \
             whether they were made is unknown; read the session before writing again"
        ),
        // Invalid and Rewound say what is wrong and where; their sources
        // name the backend's part.
        other => error_chain(other),
    }
}

/// The message of a store error: its text and its causes'. Each says what
/// was being done, to which session or file, and why.
pub fn store_message(e: &StoreError) -> String {
    error_chain(e)
}

/// The error and its sources joined, each said once: a keeper's or
/// store's text already repeats its source's, and a client should not read
/// it twice.
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::io;

    use axum::response::IntoResponse;
    use http::{StatusCode, header};
    use lease_port::{FencingToken, LeaseError, OwnerId, SessionId};

    use super::*;
    use crate::HttpError;

    fn session() -> SessionId {
        SessionId::new("chat-7").unwrap()
    }

    fn owner(name: &str) -> OwnerId {
        OwnerId::new(name).unwrap()
    }

    /// One of each keeper kind, with what it must be answered.
    fn keeper_cases() -> Vec<(KeeperError, u16, &'static str, Option<u64>)> {
        let held = LeaseError::held(Some(owner("host-b")));
        vec![
            (
                KeeperError::LeasedElsewhere {
                    session: session(),
                    holder: Some(owner("host-b")),
                    retry_after: Duration::from_millis(2_300),
                    source: held,
                },
                409,
                "session_leased_elsewhere",
                Some(3),
            ),
            (
                KeeperError::Busy {
                    session: session(),
                    waited: Duration::ZERO,
                    retry_after: Duration::from_secs(30),
                },
                409,
                "session_busy",
                Some(30),
            ),
            (
                KeeperError::Unavailable {
                    session: session(),
                    source: LeaseError::transient("etcd did not answer"),
                },
                503,
                "lease_unavailable",
                Some(1),
            ),
            (KeeperError::ShuttingDown, 503, "shutting_down", None),
            (
                KeeperError::Invalid {
                    message: "the backend refused session chat-7".into(),
                    source: Some(LeaseError::invalid("name too long for a Lease object")),
                },
                400,
                "invalid",
                None,
            ),
            (
                KeeperError::Rewound {
                    session: session(),
                    source: LeaseError::rewound("revision 7 is older than 9"),
                },
                500,
                "state_rewound",
                None,
            ),
            (
                KeeperError::RunEnded { session: session() },
                409,
                "lease_lost",
                None,
            ),
            (
                KeeperError::WritesInFlight {
                    session: session(),
                    waited: Duration::from_secs(10),
                },
                500,
                "internal",
                None,
            ),
        ]
    }

    /// One of each store kind, with what it must be answered.
    fn store_cases() -> Vec<(StoreError, u16, &'static str, Option<u64>)> {
        let path = || std::path::PathBuf::from("/var/lib/chat/chat-7.jsonl");
        let authority = |a: &str| lease_port::AuthorityId::new(a).unwrap();
        vec![
            (
                StoreError::NotFound { session: session() },
                404,
                "not_found",
                None,
            ),
            (
                StoreError::AlreadyExists { session: session() },
                409,
                "session_exists",
                None,
            ),
            (
                StoreError::Fenced {
                    session: session(),
                    presented: FencingToken::new(3),
                    presented_by: owner("host-a#1"),
                    high_water: FencingToken::new(4),
                    high_water_owner: Some(owner("host-b#1")),
                },
                409,
                "write_fenced",
                None,
            ),
            (
                StoreError::Unfenced {
                    session: session(),
                    high_water: None,
                },
                409,
                "unfenced_write_refused",
                None,
            ),
            (
                StoreError::Invalid {
                    message: "an empty batch".into(),
                },
                400,
                "invalid",
                None,
            ),
            (
                StoreError::Busy {
                    path: path(),
                    timeout: Duration::from_secs(5),
                },
                503,
                "store_busy",
                Some(1),
            ),
            (
                StoreError::Unavailable {
                    op: "appending to a session",
                    path: "redis://127.0.0.1:6379".into(),
                    source: io::Error::new(io::ErrorKind::ConnectionRefused, "refused"),
                },
                503,
                "store_unavailable",
                Some(1),
            ),
            (
                StoreError::rewound("/var/lib/chat", "the directory was put back"),
                500,
                "state_rewound",
                None,
            ),
            (
                StoreError::Io {
                    op: "appending to a session",
                    path: path(),
                    source: io::Error::new(io::ErrorKind::TimedOut, "disk stalled"),
                },
                500,
                "internal",
                None,
            ),
            (
                StoreError::Corrupt {
                    path: path(),
                    line: Some(3),
                    message: "not JSON".into(),
                    source: None,
                },
                500,
                "internal",
                None,
            ),
            (
                StoreError::authority_mismatch("/var/lib/chat", authority("a"), authority("b")),
                500,
                "internal",
                None,
            ),
            (
                StoreError::Unsupported {
                    what: "cancel requests",
                },
                500,
                "internal",
                None,
            ),
        ]
    }

    #[track_caller]
    fn check(e: &HttpError, status: u16, code: &str, retry_after: Option<u64>) {
        assert_eq!(e.status().as_u16(), status, "{e}");
        assert_eq!(e.code().as_str(), code, "{e}");
        assert_eq!(e.code().status(), e.status(), "{e}");
        assert_eq!(e.retry_after(), retry_after, "{e}");
        // Written for people: no Rust debug output of the error's fields.
        let m = e.message();
        assert!(
            !m.is_empty() && !m.contains('{') && !m.contains("Some("),
            "{m}"
        );
    }

    #[test]
    fn every_keeper_kind_has_its_status_code_and_retry_after() {
        let cases = keeper_cases();
        let kinds: HashSet<_> = cases.iter().map(|(e, ..)| e.kind()).collect();
        assert_eq!(kinds.len(), 8, "one case per KeeperErrorKind");
        for (e, status, code, retry_after) in cases {
            assert_eq!(keeper_code(e.kind()).as_str(), code);
            assert_eq!(keeper_retry_after(&e), retry_after, "{e}");
            check(&HttpError::from(e), status, code, retry_after);
        }
    }

    #[test]
    fn every_store_kind_has_its_status_code_and_retry_after() {
        let cases = store_cases();
        let kinds: HashSet<_> = cases.iter().map(|(e, ..)| e.kind()).collect();
        assert_eq!(kinds.len(), 12, "one case per StoreErrorKind");
        for (e, status, code, retry_after) in cases {
            assert_eq!(store_code(e.kind()).as_str(), code);
            assert_eq!(store_retry_after(e.kind()), retry_after, "{e}");
            check(&HttpError::from(e), status, code, retry_after);
        }
    }

    #[test]
    fn leased_elsewhere_names_the_holder_and_when_to_retry() {
        let (e, ..) = keeper_cases().remove(0);
        let e = HttpError::from(e);
        assert_eq!(e.holder(), Some("host-b"));
        assert_eq!(
            e.message(),
            "session chat-7 is being served by another process (host-b); try again later"
        );
        let unnamed = HttpError::from(KeeperError::LeasedElsewhere {
            session: session(),
            holder: None,
            retry_after: Duration::from_secs(30),
            source: LeaseError::held(None),
        });
        assert_eq!(unnamed.holder(), None);
        assert_eq!(
            unnamed.message(),
            "session chat-7 is being served by another process; try again later"
        );
    }

    #[test]
    fn causes_are_in_the_message_once() {
        let e = HttpError::from(StoreError::Io {
            op: "appending to a session",
            path: "/var/lib/chat/chat-7.jsonl".into(),
            source: io::Error::other("injected fault"),
        });
        assert_eq!(e.message().matches("injected fault").count(), 1, "{e}");
        let e = HttpError::from(KeeperError::Unavailable {
            session: session(),
            source: LeaseError::transient("renew").with_source(io::Error::other("etcd down")),
        });
        assert_eq!(e.message().matches("etcd down").count(), 1, "{e}");
    }

    #[test]
    fn waits_are_whole_seconds_rounded_up_and_never_zero() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2_001)), 3);
    }

    #[test]
    fn codes_serialise_as_they_are_spelled() {
        let every = [
            ErrorCode::SessionLeasedElsewhere,
            ErrorCode::SessionBusy,
            ErrorCode::LeaseUnavailable,
            ErrorCode::ShuttingDown,
            ErrorCode::Invalid,
            ErrorCode::StateRewound,
            ErrorCode::LeaseLost,
            ErrorCode::NotFound,
            ErrorCode::SessionExists,
            ErrorCode::WriteFenced,
            ErrorCode::UnfencedWriteRefused,
            ErrorCode::StoreBusy,
            ErrorCode::StoreUnavailable,
            ErrorCode::Internal,
        ];
        for code in every {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str());
            assert_eq!(serde_json::from_value::<ErrorCode>(json).unwrap(), code);
        }
        let retryable: Vec<_> = every.iter().filter(|c| c.is_retryable()).collect();
        assert_eq!(
            retryable,
            [
                &ErrorCode::SessionBusy,
                &ErrorCode::LeaseUnavailable,
                &ErrorCode::StoreBusy,
                &ErrorCode::StoreUnavailable
            ]
        );
    }

    #[tokio::test]
    async fn the_answer_is_the_status_the_body_and_retry_after() {
        let (e, ..) = keeper_cases().remove(0);
        let answer = HttpError::from(e).into_response();
        assert_eq!(answer.status(), StatusCode::CONFLICT);
        assert_eq!(answer.headers()[header::RETRY_AFTER], "3");
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        // mecated's shape, fields in its order.
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"error":{"code":"session_leased_elsewhere","holder":"host-b","message":"session chat-7 is being served by another process (host-b); try again later","retryable":false}}"#
        );
        let answer = HttpError::from(KeeperError::ShuttingDown).into_response();
        assert!(!answer.headers().contains_key(header::RETRY_AFTER));
    }
}
