//! The values the store trait speaks in.

use std::time::SystemTime;

use lease_port::{FencingToken, SessionId};
use serde_json::Value;

use crate::StoreError;

/// One stored event.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Position in the session, from 1, strictly increasing, never reused.
    pub seq: u64,
    /// The token the write carried; `None` for an unfenced write.
    pub token: Option<FencingToken>,
    /// When the store accepted it (the store's clock, millisecond precision).
    pub at: SystemTime,
    /// The event itself.
    pub payload: Value,
}

/// What an accepted append was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendReceipt {
    /// Sequence number of the first event of the batch.
    pub first_seq: u64,
    /// Sequence number of the last event of the batch.
    pub last_seq: u64,
}

/// One page of a session's events.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// Events with `seq >= from_seq`, in order, at most `limit` of them.
    pub events: Vec<StoredEvent>,
    /// Where the next page starts, when there are more events.
    pub next_seq: Option<u64>,
    /// True when the store holds, after the last event, the remains of a
    /// write a crash cut short (in the JSONL store, a torn last line). They
    /// are not events and are ignored; the next write to the session
    /// removes them. A store whose writes are atomic always answers false.
    pub unfinished_write: bool,
}

/// The latest cancel request of a session.
#[cfg(feature = "cancel-requests")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRequest {
    /// The highest run token a cancel was requested for.
    pub run: FencingToken,
    /// How many requests were recorded for that token or a later one: it
    /// only grows.
    pub serial: u64,
}

/// The most sessions one [`SessionStore::list_page`](crate::SessionStore::list_page)
/// call may ask for.
pub const MAX_LIST_LIMIT: usize = 10_000;

/// `Invalid` unless `limit` is within `1..=`[`MAX_LIST_LIMIT`].
pub fn check_list_limit(limit: usize) -> Result<(), StoreError> {
    if (1..=MAX_LIST_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            message: format!("a session listing needs a limit within 1..={MAX_LIST_LIMIT}"),
        })
    }
}

/// Where a paged listing resumes: after the session a page ended with.
///
/// Clients hold it as an opaque text ([`ListCursor::encode`]); the text
/// read back ([`ListCursor::decode`]) is checked like any input.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListCursor {
    last: SessionId,
}

/// Marks the cursor text's format, so it can change without old texts
/// being misread.
const CURSOR_VERSION: &str = "s1.";

impl ListCursor {
    /// The cursor of a page that ended with `last`.
    pub fn after(last: SessionId) -> Self {
        Self { last }
    }

    /// The session the page ended with; the next page starts after it.
    pub fn last(&self) -> &SessionId {
        &self.last
    }

    /// The opaque text handed to clients (`s1.` and the id's bytes in
    /// hexadecimal: safe in a URL query without escaping).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(CURSOR_VERSION.len() + 2 * self.last.as_str().len());
        out.push_str(CURSOR_VERSION);
        for b in self.last.as_str().bytes() {
            out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
            out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
        }
        out
    }

    /// Reads a text made by [`encode`](Self::encode); anything else is
    /// `Invalid`.
    pub fn decode(text: &str) -> Result<Self, StoreError> {
        let bad = |why: &str| StoreError::Invalid {
            message: format!("malformed continue token: {why}"),
        };
        let hex = text
            .strip_prefix(CURSOR_VERSION)
            .ok_or_else(|| bad("not one this server issued"))?;
        if hex.len() % 2 != 0 {
            return Err(bad("odd length"));
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(bad("not lower-case hexadecimal")),
        };
        let bytes = hex
            .as_bytes()
            .chunks(2)
            .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
            .collect::<Result<Vec<u8>, StoreError>>()?;
        let id = String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let last = SessionId::new(id).map_err(|e| bad(&e.to_string()))?;
        Ok(Self { last })
    }
}

/// One page of a session listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPage {
    /// Sessions in id order.
    pub sessions: Vec<SessionId>,
    /// Where the next page starts; `None` when no session follows.
    pub next: Option<ListCursor>,
}

impl SessionPage {
    /// A page of `sessions` (sorted), followed by more when `more`.
    pub fn new(sessions: Vec<SessionId>, more: bool) -> Self {
        let next = if more {
            sessions.last().cloned().map(ListCursor::after)
        } else {
            None
        };
        Self { sessions, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        for id in [
            "a",
            "Chat 7/é",
            "%7D{x}",
            &"z".repeat(lease_port::MAX_ID_LEN),
        ] {
            let c = ListCursor::after(SessionId::new(id).unwrap());
            let text = c.encode();
            assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
            assert_eq!(ListCursor::decode(&text).unwrap(), c);
        }
        for bad in [
            "", "s1.", "s1.6", "s1.zz", "s1.6A", "s2.61", "61", "s1.ff", "s1.0a",
        ] {
            let e = ListCursor::decode(bad).unwrap_err();
            assert_eq!(e.kind(), crate::StoreErrorKind::Invalid, "{bad:?}");
        }
    }

    #[test]
    fn limits_outside_the_bounds_are_invalid() {
        assert!(check_list_limit(0).is_err());
        assert!(check_list_limit(MAX_LIST_LIMIT + 1).is_err());
        assert!(check_list_limit(1).is_ok() && check_list_limit(MAX_LIST_LIMIT).is_ok());
    }
}
