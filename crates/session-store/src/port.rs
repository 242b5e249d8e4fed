//! The store trait: what every session store does, and the rules it keeps.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, SessionId, SessionLease};
use serde_json::Value;
use tokio::sync::Notify;

use crate::{
    AppendReceipt, ListCursor, Page, SessionPage, StoreError, WriteFence, check_list_limit,
};

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

    /// Appends `events` as [`append`](Self::append) does, but only onto a
    /// log whose last sequence number is `after`, as
    /// [`last_seq`](Self::last_seq) answers it (numbers go on across a
    /// deletion, so a session created again is not at 0), judged
    /// atomically with the fence: the batch starts at `after + 1` or is
    /// not written. `Ok(None)` when the log has moved
    /// past `after`: nothing was written and the mark is unchanged.
    ///
    /// For a writer that decided what to write from how the log ended at
    /// `after`, and must not write it after events it has not seen (an
    /// earlier owner's write still on its way when it looked).
    ///
    /// The default is `Unsupported`: a caller then raises the mark with a
    /// write of its own before it looks. Every store of this workspace
    /// offers it.
    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        let _ = (session, fence, after, events);
        Err(StoreError::Unsupported {
            what: "appending after a given sequence number",
        })
    }

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

    /// The number of the last event written to `session`, 0 when none
    /// was: the next append's numbers are above it, so a
    /// [`wait_for_append`](Self::wait_for_append) after it wakes on what
    /// comes next. (A session created again empty answers its previous
    /// incarnation's last number, since numbers carry on.) `NotFound` when
    /// the session does not exist.
    ///
    /// The default reads the session to its end, page by page; a store
    /// that keeps the number overrides it.
    async fn last_seq(&self, session: &SessionId) -> Result<u64, StoreError> {
        let (mut last, mut from) = (0, 1);
        loop {
            let page = self.read(session, from, LAST_SEQ_PAGE).await?;
            if let Some(event) = page.events.last() {
                last = event.seq;
            }
            match page.next_seq {
                Some(next) => from = next,
                None => return Ok(last),
            }
        }
    }

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
    #[cfg(feature = "cancel-requests")]
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
    #[cfg(feature = "cancel-requests")]
    async fn cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<crate::CancelRequest>, StoreError> {
        let _ = session;
        Err(StoreError::Unsupported {
            what: "cancel requests",
        })
    }

    /// Waits until `session`'s cancel request counts more than
    /// `after_serial` requests ([`cancel_request`](Self::cancel_request)),
    /// for at most `timeout`: that request once it does (possibly at once),
    /// `None` when the time ran out first. Requests recorded by any process
    /// count.
    ///
    /// A run's holder waits on it with its baseline, so a request sent to
    /// any replica stops the run as soon as the store can tell. The default
    /// reads the request every [`CANCEL_POLL_INTERVAL`]; a store that can
    /// be told of changes overrides it to answer as soon as one lands.
    /// `Unsupported` when the store keeps no cancel requests.
    #[cfg(feature = "cancel-requests")]
    async fn wait_for_cancel_request(
        &self,
        session: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<crate::CancelRequest>, StoreError> {
        poll_for_cancel_request(self, session, after_serial, timeout).await
    }
}

/// Events the default [`SessionStore::last_seq`] reads per page.
const LAST_SEQ_PAGE: usize = 1000;

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
    let found = wait_notified(None, timeout, APPEND_POLL_INTERVAL, || async {
        Ok(has_event_after(store, session, after_seq)
            .await?
            .then_some(()))
    })
    .await?;
    Ok(found.is_some())
}

/// Waits until `check` answers `Some`, for at most `timeout`: it checks at
/// once, then each time `wake` is notified, and at least every `recheck`
/// (so a lost notification delays an answer by at most that). `Ok(None)`
/// when the time ran out first.
///
/// The loop a store that can be told of changes builds its waits on: give
/// it the [`Notify`] that store's listener pulses for the session, and a
/// `check` that reads the store. The notification is armed before each
/// check, so a change landing between the check and the wait still wakes
/// it; with `wake` `None` it polls every `recheck`.
pub async fn wait_notified<T, F, Fut>(
    wake: Option<&Notify>,
    timeout: Duration,
    recheck: Duration,
    mut check: F,
) -> Result<Option<T>, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut notified = std::pin::pin!(wake.map(Notify::notified));
        if let Some(notified) = notified.as_mut().as_pin_mut() {
            notified.enable();
        }
        if let Some(found) = check().await? {
            return Ok(Some(found));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let next = deadline.min(now + recheck);
        match notified.as_pin_mut() {
            Some(notified) => {
                let _woken_or_due = tokio::time::timeout_at(next, notified).await;
            }
            None => tokio::time::sleep_until(next).await,
        }
    }
}

/// How often the default [`SessionStore::wait_for_cancel_request`] reads
/// the session's cancel request.
#[cfg(feature = "cancel-requests")]
pub const CANCEL_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// [`SessionStore::wait_for_cancel_request`] by reading the request every
/// [`CANCEL_POLL_INTERVAL`]. For stores without a way to be told of
/// requests.
#[cfg(feature = "cancel-requests")]
pub async fn poll_for_cancel_request<S: SessionStore + ?Sized>(
    store: &S,
    session: &SessionId,
    after_serial: u64,
    timeout: Duration,
) -> Result<Option<crate::CancelRequest>, StoreError> {
    wait_notified(None, timeout, CANCEL_POLL_INTERVAL, || {
        cancel_request_after(store, session, after_serial)
    })
    .await
}

/// The session's cancel request if its serial is above `after_serial`.
#[cfg(feature = "cancel-requests")]
pub(crate) async fn cancel_request_after<S: SessionStore + ?Sized>(
    store: &S,
    session: &SessionId,
    after_serial: u64,
) -> Result<Option<crate::CancelRequest>, StoreError> {
    Ok(store
        .cancel_request(session)
        .await?
        .filter(|r| r.serial > after_serial))
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
