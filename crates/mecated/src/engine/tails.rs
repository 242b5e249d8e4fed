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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use lease_port::SessionId;
use session_store::StoredEvent;
use tokio::sync::broadcast;

use super::Engine;
use super::follow::{FOLLOW_PAGE, FOLLOW_QUIET_CHECK};
use super::replicas::LiveRun;
use crate::error::error_chain;

/// Events a tail keeps for followers that have not taken them yet; one
/// further behind reads from the store.
const TAIL_BUFFER: usize = 1024;

/// What a tail broadcasts.
#[derive(Debug, Clone)]
pub(super) enum TailItem {
    /// The next stored event, in order.
    Event(Arc<StoredEvent>),
    /// Nothing was appended for [`FOLLOW_QUIET_CHECK`]; the run live now.
    Quiet(LiveRun),
    /// The store failed; the tail ended.
    Failed(String),
}

/// The tails of this process's followed sessions.
#[derive(Debug, Default)]
pub(super) struct Tails {
    live: Mutex<HashMap<SessionId, Tail>>,
    next_id: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Tail {
    id: u64,
    sender: broadcast::Sender<TailItem>,
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
    pub(super) fn subscribe_tail(
        &self,
        session: &SessionId,
        pos: u64,
    ) -> broadcast::Receiver<TailItem> {
        let tails = &self.inner.tails;
        let mut live = tails.lock();
        if let Some(tail) = live.get(session) {
            return tail.sender.subscribe();
        }
        let (sender, receiver) = broadcast::channel(TAIL_BUFFER);
        let id = tails
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        live.insert(
            session.clone(),
            Tail {
                id,
                sender: sender.clone(),
            },
        );
        drop(live);
        let (engine, session) = (self.clone(), session.clone());
        tokio::spawn(async move { engine.run_tail(&session, id, pos, &sender).await });
        receiver
    }

    /// Reads `session` after `pos` as it grows, until no follower is left
    /// (checked after each append and each quiet period) or the store
    /// fails.
    async fn run_tail(
        &self,
        session: &SessionId,
        id: u64,
        mut pos: u64,
        sender: &broadcast::Sender<TailItem>,
    ) {
        loop {
            {
                // Decided under the map's lock, which subscribing takes
                // too: no follower joins a tail that is ending.
                let mut live = self.inner.tails.lock();
                if sender.receiver_count() == 0 {
                    if live.get(session).is_some_and(|t| t.id == id) {
                        live.remove(session);
                    }
                    return;
                }
            }
            let appended = self
                .inner
                .store
                .wait_for_append(session, pos, FOLLOW_QUIET_CHECK)
                .await;
            let failed = match appended {
                Ok(true) => self.broadcast_new(session, &mut pos, sender).await.err(),
                Ok(false) => {
                    let now = self.live_run(session).await;
                    let _ = sender.send(TailItem::Quiet(now));
                    None
                }
                Err(e) => Some(error_chain(&e)),
            };
            if let Some(error) = failed {
                let mut live = self.inner.tails.lock();
                if live.get(session).is_some_and(|t| t.id == id) {
                    live.remove(session);
                }
                drop(live);
                let _ = sender.send(TailItem::Failed(error));
                return;
            }
        }
    }

    /// Reads and broadcasts every event after `pos`, advancing it.
    async fn broadcast_new(
        &self,
        session: &SessionId,
        pos: &mut u64,
        sender: &broadcast::Sender<TailItem>,
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
                let _ = sender.send(TailItem::Event(Arc::new(event)));
            }
            if page.next_seq.is_none() {
                return Ok(());
            }
        }
    }
}
