//! One reader per followed session in this process, fanned out to every
//! follower of it.
//!
//! A follower catches up from the store on its own (it may start anywhere
//! in the log), then takes new events from its session's tail: one task
//! that waits for appends, reads each new event once and broadcasts it,
//! and asks the lease backend once per quiet period whether the run is
//! still live. A thousand followers of one session thus cost one wait, one
//! read per append and one liveness check per quiet period, not a thousand
//! of each. A follower that falls behind the broadcast's buffer, or sees a
//! gap in the numbers, reads the missing events from the store itself, so
//! every follower receives every event.
//!
//! A quiet period wakes no follower unless it has news for one: the live
//! run changed, the backend cannot tell, or a follower joined since the
//! last one (it has not yet heard the tail's word on the run it follows).
//! Idle followers of a run that goes on thus cost nothing between events;
//! woken every quiet period, ten thousand of them were five thousand task
//! wake-ups a second, each followed by a read of the store.
//!
//! While the run is this process's own and every follower has heard so,
//! the tail itself rests: the run's end here wakes it, as does a follower
//! joining, and only then does it go back to quiet periods. A replica
//! holding the runs its followers follow thus does no periodic work for
//! them at all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lease_port::SessionId;
use session_store::{StoreError, StoredEvent};
use tokio::sync::{Notify, broadcast};

use super::Engine;
use super::follow::{FOLLOW_PAGE, FOLLOW_QUIET_CHECK};
use super::replicas::LiveRun;
use crate::error::error_chain;

/// Events a tail keeps for followers that have not taken them yet; one
/// further behind reads from the store.
const TAIL_BUFFER: usize = 1024;

/// How long a resting tail waits for an append: its run's end and joins
/// wake it, so this bounds only an append the store's watch did not
/// report.
const REST: Duration = Duration::from_secs(30);

/// What a tail broadcasts.
#[derive(Debug, Clone)]
enum Broadcast {
    /// The next stored event, in order.
    Event(Arc<StoredEvent>),
    /// A quiet period that may be news: see [`TailItem::Quiet`].
    Quiet(LiveRun),
    /// The store failed; the tail ended.
    Failed(String),
}

/// What a follower of a tail takes from it.
#[derive(Debug)]
pub(super) enum TailItem {
    /// The next stored event, in order.
    Event(Arc<StoredEvent>),
    /// Nothing was appended for [`FOLLOW_QUIET_CHECK`], and the run live
    /// now is this. Sent after the events before it, and only when it may
    /// be news: see the module's documentation.
    Quiet(LiveRun),
    /// The store failed; the tail ended.
    Failed(String),
    /// Events were dropped before this follower took them: it reads them
    /// from the store.
    Lagged,
    /// The tail ended without a word (its task gone).
    Closed,
}

/// A follower's subscription to its session's tail.
#[derive(Debug)]
pub(super) struct TailReceiver(broadcast::Receiver<Broadcast>);

impl TailReceiver {
    /// The next item, in the order the tail sent them.
    pub(super) async fn recv(&mut self) -> TailItem {
        match self.0.recv().await {
            Ok(Broadcast::Event(event)) => TailItem::Event(event),
            Ok(Broadcast::Quiet(now)) => TailItem::Quiet(now),
            Ok(Broadcast::Failed(error)) => TailItem::Failed(error),
            Err(broadcast::error::RecvError::Lagged(_)) => TailItem::Lagged,
            Err(broadcast::error::RecvError::Closed) => TailItem::Closed,
        }
    }
}

/// The tails of this process's followed sessions.
#[derive(Debug, Default)]
pub(super) struct Tails {
    live: Mutex<HashMap<SessionId, Tail>>,
    next_id: AtomicU64,
}

#[derive(Debug, Clone)]
struct Tail {
    id: u64,
    sender: broadcast::Sender<Broadcast>,
    /// The run the last quiet period that was news said was live.
    told: Arc<Mutex<LiveRun>>,
    /// A follower joined since the last quiet period.
    joined: Arc<AtomicBool>,
    /// Wakes a resting tail.
    wake: Arc<Notify>,
}

impl Tail {
    fn subscribe(&self) -> TailReceiver {
        self.joined.store(true, Ordering::Relaxed);
        self.wake.notify_waiters();
        TailReceiver(self.sender.subscribe())
    }
}

impl Tails {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Tail>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Engine {
    /// A receiver of `session`'s tail, starting one that reads after
    /// `pos` if none runs. Events it sends may start past `pos + 1` (a
    /// tail started earlier for another follower) or at or before it: the
    /// follower reads the gap from the store, and skips what it has.
    pub(super) fn subscribe_tail(&self, session: &SessionId, pos: u64) -> TailReceiver {
        let tails = &self.inner.tails;
        let mut live = tails.lock();
        if let Some(tail) = live.get(session) {
            return tail.subscribe();
        }
        let tail = Tail {
            id: tails.next_id.fetch_add(1, Ordering::Relaxed),
            sender: broadcast::channel(TAIL_BUFFER).0,
            told: Arc::new(Mutex::new(LiveRun::Unknown)),
            joined: Arc::default(),
            wake: Arc::default(),
        };
        let receiver = tail.subscribe();
        let running = tail.clone();
        live.insert(session.clone(), tail);
        drop(live);
        let (engine, session) = (self.clone(), session.clone());
        tokio::spawn(async move { engine.run_tail(&session, &running, pos).await });
        receiver
    }

    /// Reads `session` after `pos` as it grows, until no follower is left
    /// (checked after each append and each quiet period) or the store
    /// fails.
    async fn run_tail(&self, session: &SessionId, tail: &Tail, mut pos: u64) {
        loop {
            {
                // Decided under the map's lock, which subscribing takes
                // too: no follower joins a tail that is ending.
                let mut live = self.inner.tails.lock();
                if tail.sender.receiver_count() == 0 {
                    if live.get(session).is_some_and(|t| t.id == tail.id) {
                        live.remove(session);
                    }
                    return;
                }
            }
            let Some(appended) = self.wait_for_append(session, tail, pos).await else {
                continue;
            };
            let failed = match appended {
                Ok(true) => self.broadcast_new(session, &mut pos, tail).await.err(),
                Ok(false) => {
                    self.tell_quiet(session, tail).await;
                    None
                }
                Err(e) => Some(error_chain(&e)),
            };
            if let Some(error) = failed {
                let mut live = self.inner.tails.lock();
                if live.get(session).is_some_and(|t| t.id == tail.id) {
                    live.remove(session);
                }
                drop(live);
                let _ = tail.sender.send(Broadcast::Failed(error));
                return;
            }
        }
    }

    /// Waits for an append after `pos` for a quiet period, or rests until
    /// woken when the run is this process's and every follower heard so:
    /// whether one came, or `None` when woken.
    async fn wait_for_append(
        &self,
        session: &SessionId,
        tail: &Tail,
        pos: u64,
    ) -> Option<Result<bool, StoreError>> {
        let store = &self.inner.store;
        // Listening before the check: a wake after it is not missed.
        let woken = tail.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let told = *tail.told.lock().unwrap_or_else(PoisonError::into_inner);
        let own = self.local_run(session).map(LiveRun::Run);
        if tail.joined.load(Ordering::Relaxed) || own.is_none() || own != Some(told) {
            return Some(
                store
                    .wait_for_append(session, pos, FOLLOW_QUIET_CHECK)
                    .await,
            );
        }
        tokio::select! {
            appended = store.wait_for_append(session, pos, REST) => Some(appended),
            () = woken => None,
        }
    }

    /// Wakes `session`'s tail if it rests: this process's run of it ended.
    pub(super) fn wake_tail(&self, session: &SessionId) {
        if let Some(tail) = self.inner.tails.lock().get(session) {
            tail.wake.notify_waiters();
        }
    }

    /// Tells the followers of a quiet period when it is news to any of
    /// them. Joins are taken before the backend is asked, so whoever
    /// joined is told of a run judged after it joined.
    async fn tell_quiet(&self, session: &SessionId, tail: &Tail) {
        let joined = tail.joined.swap(false, Ordering::Relaxed);
        let now = self.live_run(session).await;
        let mut told = tail.told.lock().unwrap_or_else(PoisonError::into_inner);
        // A backend that cannot tell leaves the quiet period as the only
        // sign: every one is news.
        if joined || *told != now || now == LiveRun::Unknown {
            *told = now;
            // No receiver left: the next turn of the loop ends the tail.
            let _ = tail.sender.send(Broadcast::Quiet(now));
        }
    }

    /// Reads and broadcasts every event after `pos`, advancing it.
    async fn broadcast_new(
        &self,
        session: &SessionId,
        pos: &mut u64,
        tail: &Tail,
    ) -> Result<(), String> {
        loop {
            let page = self
                .inner
                .store
                .read(session, pos.saturating_add(1), FOLLOW_PAGE)
                .await
                .map_err(|e| error_chain(&e))?;
            for event in page.events {
                *pos = event.seq;
                // No receiver left: the next turn of the loop ends the tail.
                let _ = tail.sender.send(Broadcast::Event(Arc::new(event)));
            }
            if page.next_seq.is_none() {
                return Ok(());
            }
        }
    }
}
