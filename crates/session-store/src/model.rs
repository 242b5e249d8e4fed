//! The store trait and the values it speaks in.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, Lease, OwnerId, SessionId, SessionLease};
use serde_json::Value;

use crate::StoreError;

/// A writer's proof of its right to change a session: its lease token
/// *and* the owner the lease was issued to.
///
/// A token alone is not enough: two lease authorities (two lease
/// directories, say) both hand out token 1, and a store must not let two
/// writers share a mark. The store binds its high-water mark to the
/// writer that set it and refuses an equal token from anyone else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    token: FencingToken,
    owner: OwnerId,
}

impl Fence {
    /// The fence of `owner` holding a lease with `token`.
    pub fn new(token: FencingToken, owner: OwnerId) -> Self {
        Self { token, owner }
    }

    /// The lease token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The owner (one process incarnation) the lease was issued to.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }
}

impl From<&Lease> for Fence {
    fn from(lease: &Lease) -> Self {
        Fence::new(lease.token(), lease.owner().clone())
    }
}

/// How a write proves its right to change a session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WriteFence {
    /// The writer's lease token and owner. Refused when the token is below
    /// the session's high-water mark, or equal to it while the mark belongs
    /// to another owner; otherwise accepted, and a higher token raises the
    /// mark and binds it to this owner.
    Fenced(Fence),
    /// No token: the deployment runs unleased. Accepted only by a store
    /// configured to allow it, and only while the session has never
    /// accepted a fenced write.
    Unfenced,
}

impl WriteFence {
    /// The fence of `owner` holding a lease with `token`.
    pub fn new(token: FencingToken, owner: OwnerId) -> Self {
        WriteFence::Fenced(Fence::new(token, owner))
    }
}

impl From<Fence> for WriteFence {
    fn from(fence: Fence) -> Self {
        WriteFence::Fenced(fence)
    }
}

impl From<&Lease> for WriteFence {
    fn from(lease: &Lease) -> Self {
        WriteFence::Fenced(lease.into())
    }
}

/// `Some(lease)` → [`WriteFence::Fenced`], `None` → [`WriteFence::Unfenced`]:
/// what a lease guard's `lease()` maps to.
impl From<Option<&Lease>> for WriteFence {
    fn from(lease: Option<&Lease>) -> Self {
        lease.map_or(WriteFence::Unfenced, WriteFence::from)
    }
}

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
    /// True when the file ends in a torn (incomplete) line left by a
    /// crash: it was ignored, and the next write to the session removes it.
    pub torn_tail: bool,
}

/// Storage of session events, every write fenced by the writer's lease
/// token.
///
/// Object-safe: servers hold an `Arc<dyn SessionStore>`. See the [crate
/// documentation](crate) for the rules an implementation keeps.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Creates an empty session. `AlreadyExists` when it exists. Creating
    /// a deleted session again starts it empty but keeps its high-water
    /// mark and never reuses a sequence number.
    async fn create(&self, session: &SessionId) -> Result<(), StoreError>;

    /// Appends `events` (at least one) as one batch: all or nothing.
    ///
    /// Checks `fence` against the session's high-water mark atomically with
    /// the write: a token below it, or equal to it from another owner than
    /// the one the mark belongs to, is refused with [`StoreError::Fenced`]
    /// and nothing is written; an accepted higher token becomes the new
    /// mark, bound to its owner.
    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError>;

    /// Reads at most `limit` (≥ 1) events with `seq >= from_seq`.
    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError>;

    /// Every existing session, sorted.
    async fn list(&self) -> Result<Vec<SessionId>, StoreError>;

    /// At most `limit` (≥ 1) existing sessions, sorted, all after `after`
    /// when given; [`SessionPage::next`] says where the next page starts.
    ///
    /// Paging through a store while sessions are created and deleted
    /// lists every session that exists throughout exactly once: pages are
    /// ranges of ids, and a cursor names the last id a page held, not a
    /// position. A session created or deleted meanwhile may or may not be
    /// listed. An implementation's memory is bounded by the page, not the
    /// store.
    ///
    /// The default pages through [`list`](Self::list), so it reads every
    /// session each time: stores of any size override it.
    async fn list_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        check_list_limit(limit)?;
        let all = self.list().await?;
        let start = after.map_or(0, |c| all.partition_point(|s| s <= c.last()));
        let rest = &all[start..];
        let sessions = rest.iter().take(limit).cloned().collect();
        Ok(SessionPage::new(sessions, rest.len() > limit))
    }

    /// Deletes a session, fenced like an append. The high-water mark
    /// survives, so a stale owner cannot write to a re-created session.
    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError>;

    /// The session's high-water mark: the highest token accepted, `None`
    /// when no fenced write ever was.
    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError>;

    /// Records that tokens of `authority` fence this store, or checks that
    /// they do.
    ///
    /// The first call records the id, once and durably; every later call,
    /// from any process, succeeds only for the same id and otherwise fails
    /// with [`StoreError::AuthorityMismatch`] naming the recorded one. Two
    /// racing first calls record exactly one id: the loser is answered as a
    /// later call. A server calls it at start-up with its lease backend's
    /// [`authority`](SessionLease::authority) before it writes.
    ///
    /// A store written before it recorded an authority (sessions, no
    /// record) is bound by its first call: nothing in its data can name the
    /// authority that fenced it.
    ///
    /// Implementations: a database keeps the id under one key and creates
    /// it with a conditional write (Redis `SET NX`, an etcd transaction on
    /// the key's absence, a Kubernetes object created or found), then
    /// compares.
    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError>;

    /// The authority recorded by [`bind_authority`](Self::bind_authority),
    /// `None` before the first binding.
    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError>;

    /// The store's own lease backend, when it offers one (a database with
    /// conditional writes can). `None` by default: the server then picks a
    /// lease backend itself.
    fn session_lease(&self) -> Option<Arc<dyn SessionLease>> {
        None
    }

    /// Waits until `session` holds an event with `seq > after_seq`, for at
    /// most `timeout`: `true` once it does (possibly at once), `false` when
    /// the time ran out first. Appends by any process count.
    ///
    /// `NotFound` when the session does not exist. Dropping the future
    /// frees everything it holds (a client that disconnects costs
    /// nothing afterwards).
    ///
    /// The default reads the session every [`APPEND_POLL_INTERVAL`]
    /// ([`poll_for_append`]); a store that can be told of appends (a file
    /// watch, a blocking stream read) overrides it to answer as soon as one
    /// lands.
    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        poll_for_append(self, session, after_seq, timeout).await
    }

    /// Records that the run holding `session` under lease token `run`
    /// should stop. Any process may call it; the process running the run
    /// watches [`cancel_request`](Self::cancel_request) and cancels.
    ///
    /// Only ever raises the recorded token, and counts every request for
    /// the recorded token or a later one: a request for an earlier run
    /// never replaces one for a later run, a request names the run it
    /// targets, so a later run (a takeover, whose token is greater) is
    /// never stopped by it, and the count tells a run apart from an earlier
    /// run of the same token (a holder that re-acquired its own live
    /// lease). `Unsupported` by default.
    async fn request_cancel(
        &self,
        session: &SessionId,
        run: FencingToken,
    ) -> Result<(), StoreError> {
        let _ = (session, run);
        Err(StoreError::Unsupported {
            what: "cancel requests",
        })
    }

    /// The latest cancel request recorded for `session`
    /// ([`request_cancel`](Self::request_cancel)), `None` when none was.
    ///
    /// A run holding token `t` reads it before it acquires its lease (its
    /// baseline) and stops once it reads a request with `run >= t` and a
    /// `serial` above the baseline's: requests recorded before the run
    /// began never stop it. `Unsupported` by default.
    async fn cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<CancelRequest>, StoreError> {
        let _ = session;
        Err(StoreError::Unsupported {
            what: "cancel requests",
        })
    }
}

/// The latest cancel request of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRequest {
    /// The highest run token a cancel was requested for.
    pub run: FencingToken,
    /// How many requests were recorded for that token or a later one: it
    /// only grows.
    pub serial: u64,
}

/// How often the default [`SessionStore::wait_for_append`] reads the
/// session: a bound on the delay it adds, and on its cost (one small read
/// per interval per waiter).
pub const APPEND_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// [`SessionStore::wait_for_append`] by reading `session` every
/// [`APPEND_POLL_INTERVAL`] until an event after `after_seq` exists or
/// `timeout` passes. For stores without a way to be told of appends.
pub async fn poll_for_append<S: SessionStore + ?Sized>(
    store: &S,
    session: &SessionId,
    after_seq: u64,
    timeout: Duration,
) -> Result<bool, StoreError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if has_event_after(store, session, after_seq).await? {
            return Ok(true);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        tokio::time::sleep_until(deadline.min(now + APPEND_POLL_INTERVAL)).await;
    }
}

/// Whether `session` holds an event with `seq > after_seq`.
pub(crate) async fn has_event_after<S: SessionStore + ?Sized>(
    store: &S,
    session: &SessionId,
    after_seq: u64,
) -> Result<bool, StoreError> {
    let page = store.read(session, after_seq.saturating_add(1), 1).await?;
    Ok(!page.events.is_empty())
}

/// The most sessions one [`SessionStore::list_page`] call may ask for.
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
