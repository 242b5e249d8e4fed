//! A JSONL store that counts what is asked of it: how many reads, how
//! many events they returned, how many waits. Tests compare the counts
//! to what a claim about cost allows. It can also let another writer in
//! just before a read, as a holder paused between two steps would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, SessionId};
use serde_json::Value;
use session_store::{AppendReceipt, JsonlStore, Page, SessionStore, StoreError, WriteFence};
use tokio::sync::Notify;

/// A read held until the test lets it go.
#[derive(Default)]
pub(crate) struct HeldRead {
    /// Notified when the read arrives.
    pub(crate) entered: Notify,
    /// Notify to let it go on.
    pub(crate) release: Notify,
}

pub(crate) struct CountingStore {
    pub(crate) inner: JsonlStore,
    pub(crate) reads: AtomicU64,
    pub(crate) events_read: AtomicU64,
    pub(crate) waits: AtomicU64,
    /// Appended, once, just before the next read of more than one event.
    before_read: Mutex<Option<(WriteFence, Vec<Value>)>>,
    /// Appended, once, just before the next append.
    before_append: Mutex<Option<(WriteFence, Vec<Value>)>>,
    /// Holds, once, the next existence check (a read of event 1 alone).
    held: Mutex<Option<Arc<HeldRead>>>,
}

impl CountingStore {
    pub(crate) fn new(inner: JsonlStore) -> Self {
        Self {
            inner,
            reads: AtomicU64::new(0),
            events_read: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            before_read: Mutex::new(None),
            before_append: Mutex::new(None),
            held: Mutex::new(None),
        }
    }

    /// Appends `events` under `fence` just before the next read of more
    /// than one event (a transcript's, not an existence check's).
    pub(crate) fn append_before_next_read(&self, fence: WriteFence, events: Vec<Value>) {
        *self.before_read.lock().unwrap() = Some((fence, events));
    }

    /// Appends `events` under `fence` just before the next append: a write
    /// an earlier owner sent before its lease ran out, landing late.
    pub(crate) fn append_before_next_append(&self, fence: WriteFence, events: Vec<Value>) {
        *self.before_append.lock().unwrap() = Some((fence, events));
    }

    /// Holds the next existence check (a read of one event from the first,
    /// as a run's start makes) until the test releases it.
    pub(crate) fn hold_next_existence_check(&self) -> Arc<HeldRead> {
        let held = Arc::new(HeldRead::default());
        *self.held.lock().unwrap() = Some(Arc::clone(&held));
        held
    }

    /// Events returned by reads so far.
    pub(crate) fn events_read(&self) -> u64 {
        self.events_read.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl SessionStore for CountingStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        self.inner.create(session).await
    }
    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        self.inner.bind_authority(authority).await
    }
    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.inner.recorded_authority().await
    }
    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        let injected = self.before_append.lock().unwrap().take();
        if let Some((fence, events)) = injected {
            self.inner.append(session, fence, &events).await?;
        }
        self.inner.append(session, fence, events).await
    }
    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        let injected = self.before_append.lock().unwrap().take();
        if let Some((fence, events)) = injected {
            self.inner.append(session, fence, &events).await?;
        }
        self.inner.append_after(session, fence, after, events).await
    }
    async fn read(&self, session: &SessionId, from: u64, limit: usize) -> Result<Page, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let held = match (from, limit) {
            (1, 1) => self.held.lock().unwrap().take(),
            _ => None,
        };
        if let Some(held) = held {
            held.entered.notify_one();
            held.release.notified().await;
        }
        let injected = match limit > 1 {
            true => self.before_read.lock().unwrap().take(),
            false => None,
        };
        if let Some((fence, events)) = injected {
            self.inner.append(session, fence, &events).await?;
        }
        let page = self.inner.read(session, from, limit).await?;
        self.events_read
            .fetch_add(page.events.len() as u64, Ordering::Relaxed);
        Ok(page)
    }
    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.inner.list().await
    }
    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        self.inner.delete(session, fence).await
    }
    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        self.inner.high_water(session).await
    }
    async fn last_seq(&self, session: &SessionId) -> Result<u64, StoreError> {
        self.inner.last_seq(session).await
    }
    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        // The inner store's reads while waiting are its own, not counted.
        self.inner
            .wait_for_append(session, after_seq, timeout)
            .await
    }
}
