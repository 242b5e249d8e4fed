//! Starting a run that waits, for a bounded time, for another process to
//! release the session instead of being refused at once.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use lease_keeper::KeeperErrorKind;
use lease_port::SessionId;
use serde_json::Value;
use tokio::time::Instant;

use session_store::StoredEvent;

use super::follow::{FOLLOW_PAGE, RUN_ENDED};
use super::replicas::LiveRun;
use super::tails::TailItem;
use super::{Engine, EngineError, StartedRun};
use crate::lease_view::HolderState;

/// The longest a client may ask a run to wait for its session.
pub const MAX_RUN_WAIT: Duration = Duration::from_secs(60);

/// How often a waiting run tries the lease while the run it waited for
/// releases it: a run records its end before it gives its lease back.
pub const RUN_WAIT_RETRY: Duration = Duration::from_millis(50);

/// How long after a run's end a waiting run keeps trying every
/// [`RUN_WAIT_RETRY`], unless another run has started meanwhile.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// The longest a waiting run goes without trying the lease. A run's end
/// wakes it at once, and a holder that died recording none is tried again
/// when the refusal said its lease expires; this bounds the wait where
/// neither comes (a backend that names no expiry, a lost notification).
pub const RUN_WAIT_SAFETY: Duration = Duration::from_secs(5);

impl Engine {
    /// [`start_run`](Engine::start_run), but while another run (in another
    /// process or this one) holds the session, waits until it is released
    /// or `wait` (at most [`MAX_RUN_WAIT`]) has passed; then answers like
    /// `start_run`.
    ///
    /// The wait follows the session's log, as a follower does (one reader
    /// per session in the process, whatever the number of waiters): a run
    /// records its end before it releases, and that end wakes the waiters.
    /// So a waiter costs an attempt per run that ends, not an attempt per
    /// interval. The waiters of one session in this process take turns, in
    /// the order they came: only the first tries the lease, so a run's end
    /// sets off one attempt here, not one per waiter, and no waiter is
    /// passed over by later ones.
    pub async fn start_run_waiting(
        &self,
        session: SessionId,
        input: Value,
        wait: Duration,
    ) -> Result<StartedRun, EngineError> {
        let started = self
            .start_run_waiting_while(session, input, wait, || true)
            .await?;
        // The gate above never closes.
        started.ok_or(EngineError::Draining)
    }

    /// [`start_run_waiting`](Engine::start_run_waiting), asking `may_start`
    /// before each attempt to start the run: `None`, nothing done, once it
    /// says no. The caller's right to start the run is checked when the
    /// request arrives, and it may be withdrawn while the run waits.
    pub async fn start_run_waiting_while(
        &self,
        session: SessionId,
        input: Value,
        wait: Duration,
        mut may_start: impl FnMut() -> bool,
    ) -> Result<Option<StartedRun>, EngineError> {
        let deadline = Instant::now() + wait.min(MAX_RUN_WAIT);
        let queue = self.run_queue(&session);
        let Ok(_turn) = self
            .unless_draining(tokio::time::timeout_at(deadline, queue.lock()))
            .await?
        else {
            // Out of time before its turn: answered as a run that does
            // not wait.
            if !may_start() {
                return Ok(None);
            }
            return self.start_run(session, input).await.map(Some);
        };
        // Where the end of the run waited for lies, while its release is
        // awaited.
        let mut releasing: Option<(Instant, u64)> = None;
        loop {
            let pos = self.inner.store.last_seq(&session).await?;
            if !may_start() {
                return Ok(None);
            }
            let refusal = match self.start_run(session.clone(), input.clone()).await {
                // Busy: the run holding the session is this process's
                // own, which a load balancer makes as likely as any.
                Err(EngineError::Lease(e))
                    if matches!(
                        e.kind(),
                        KeeperErrorKind::LeasedElsewhere | KeeperErrorKind::Busy
                    ) =>
                {
                    e
                }
                other => return other.map(Some),
            };
            let now = Instant::now();
            if now + RUN_WAIT_RETRY >= deadline {
                return Err(EngineError::Lease(refusal));
            }
            // Nothing logged since the end: its run is still releasing.
            if releasing.is_some_and(|(until, end)| now < until && pos <= end) {
                self.unless_draining(tokio::time::sleep(RUN_WAIT_RETRY))
                    .await?;
                continue;
            }
            // Never less than a retry's pause: a refusal saying the hold
            // ends now would otherwise make the wait end at once, again
            // and again.
            let expiry = refusal.retry_after().unwrap_or(RUN_WAIT_SAFETY);
            let until = deadline.min(now + expiry.clamp(RUN_WAIT_RETRY, RUN_WAIT_SAFETY));
            let ended = self
                .unless_draining(self.wait_for_run_end(&session, pos, until))
                .await?;
            releasing = ended.map(|end| (Instant::now() + RELEASE_GRACE, end));
        }
    }

    /// `wait`'s output, or [`EngineError::Draining`] as soon as the server
    /// begins to drain: its waiters are answered at once, so they go to a
    /// replica that will still run them. Only waits go through here: a
    /// start in flight is never dropped, since its run may already be
    /// claimed.
    async fn unless_draining<T>(
        &self,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, EngineError> {
        tokio::select! {
            () = self.inner.draining.cancelled() => Err(EngineError::Draining),
            out = wait => Ok(out),
        }
    }

    /// The queue the waiting runs of `session` in this process take turns
    /// in; it goes with the last of them.
    fn run_queue(&self, session: &SessionId) -> Arc<tokio::sync::Mutex<()>> {
        let mut queues = self
            .inner
            .run_queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(queue) = queues.get(session).and_then(Weak::upgrade) {
            return queue;
        }
        // Sessions nobody waits for any more, dropped as the map grows.
        if queues.len() >= 1024 {
            queues.retain(|_, q| q.strong_count() > 0);
        }
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        queues.insert(session.clone(), Arc::downgrade(&queue));
        queue
    }

    /// Waits until a run of `session` records its end after `pos`, or
    /// until `until`: the end's number, or `None` when the time ran out.
    /// A tail that cannot say (the store failed, the waiter fell behind)
    /// answers `pos`, so the caller tries at once.
    async fn wait_for_run_end(&self, session: &SessionId, pos: u64, until: Instant) -> Option<u64> {
        let mut tail = self.subscribe_tail(session, pos);
        // An end the tail read before this waiter joined it.
        if let Ok(Some(end)) = self.run_end_after(session, pos).await {
            return Some(end);
        }
        loop {
            match tokio::time::timeout_at(until, tail.recv()).await {
                Err(_elapsed) => return None,
                Ok(TailItem::Event(event)) => {
                    if is_run_end(&event) {
                        return Some(event.seq);
                    }
                }
                Ok(TailItem::Quiet(LiveRun::None)) => return Some(pos),
                Ok(TailItem::Quiet(_)) => {}
                Ok(TailItem::Failed(_) | TailItem::Lagged | TailItem::Closed) => return Some(pos),
            }
        }
    }

    /// The number of the first run end logged after `pos`.
    async fn run_end_after(
        &self,
        session: &SessionId,
        pos: u64,
    ) -> Result<Option<u64>, EngineError> {
        let mut from = pos.saturating_add(1);
        loop {
            let page = self.inner.store.read(session, from, FOLLOW_PAGE).await?;
            if let Some(end) = page.events.iter().find(|e| is_run_end(e)) {
                return Ok(Some(end.seq));
            }
            match page.next_seq {
                Some(next) => from = next,
                None => return Ok(None),
            }
        }
    }

    /// How long a client refused because `session` is leased elsewhere
    /// should wait before trying again: until the holder's lease expires
    /// when the backend reports it, else one lease TTL. Whole seconds, at
    /// least 1.
    pub async fn retry_after(&self, session: &SessionId) -> u64 {
        let wait = match self.lease_holder(session).await {
            HolderState::Held(h) => h
                .expiry
                .duration_since(SystemTime::now())
                .unwrap_or_default(),
            HolderState::Free | HolderState::Unknown => self.inner.keeper.ttl(),
        };
        // Rounded up, and never 0: a client told to retry at once would
        // only be refused again.
        (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
    }
}

fn is_run_end(event: &StoredEvent) -> bool {
    event.payload.get("type").and_then(|t| t.as_str()) == Some(RUN_ENDED)
}
