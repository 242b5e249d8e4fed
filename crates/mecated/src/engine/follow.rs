//! Following a session's log from any replica: the stored events after a
//! position, then each new one as any process appends it, until the run
//! that was live ends.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;

use lease_keeper::LeaseGuard;
use lease_port::{FencingToken, SessionId};
use serde_json::json;
use session_store::StoredEvent;
use tracing::warn;

use super::replicas::LiveRun;
use super::tails::{TailItem, TailReceiver};
use super::{Engine, EngineError, Resumption, RunStatus, tracked_append};
use crate::error::error_chain;

/// Events read per page while following.
pub(super) const FOLLOW_PAGE: usize = 200;

/// How long a follow waits for an append before asking the lease backend
/// whether the run is still there (a run that died without its end event
/// leaves only its lease to lapse).
pub const FOLLOW_QUIET_CHECK: Duration = Duration::from_secs(2);

/// Items a follower is sent ahead of its client before it waits for it.
const FOLLOW_BUFFER: usize = 64;

/// What a follow sends.
#[derive(Debug, Clone, PartialEq)]
pub enum FollowItem {
    /// A stored event, in order. Shared: every follower of a session in
    /// this process is handed the same one.
    Event(Arc<StoredEvent>),
    /// The follow ended; nothing follows.
    End(FollowEnd),
}

/// Why a follow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowEnd {
    /// The run that was live recorded its end (the `run_ended` event just
    /// sent).
    RunEnded,
    /// No run was live: every stored event was sent.
    NoLiveRun,
    /// The run stopped without recording an end (its lease lapsed, or a
    /// later run took the session over); every stored event of it was
    /// sent.
    RunGone,
    /// The store failed while following.
    Failed(String),
}

impl FollowEnd {
    /// The wire name.
    pub fn name(&self) -> &'static str {
        match self {
            FollowEnd::RunEnded => "run_ended",
            FollowEnd::NoLiveRun => "no_live_run",
            FollowEnd::RunGone => "run_gone",
            FollowEnd::Failed(_) => "failed",
        }
    }
}

/// The payload type of the event a run records when it ends.
pub const RUN_ENDED: &str = "run_ended";

/// The payload type of a run's claim, its first event.
pub const RUN_STARTED: &str = "run_started";

/// The payload type of the last event of a run that shutdown cut off with
/// resumption on: not an end (the next owner writes that, and runs the
/// input again), and not counted against the input's attempts, which are
/// for crashes.
pub const RUN_CUT_OFF: &str = "run_cut_off";

/// The run a follow waits to end: its token, and where it started in the
/// log when this process runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Followed {
    live: LiveRun,
    /// Runs without a lease all carry no token (and a holder that
    /// re-acquired its own lease keeps its token): where the run started
    /// tells its end from an earlier run's.
    started_at: Option<u64>,
}

/// Whether `event` ends the followed run (its end, or a later run's start).
fn ends(event: &StoredEvent, followed: Followed) -> Option<FollowEnd> {
    let LiveRun::Run(token) = followed.live else {
        return None;
    };
    let after_start = followed.started_at.is_none_or(|s| event.seq > s);
    match event.payload.get("type").and_then(|t| t.as_str()) {
        Some(RUN_ENDED) if after_start && super::interrupted::run_of_end(event) == token => {
            Some(FollowEnd::RunEnded)
        }
        Some(RUN_STARTED) if event.token > token => Some(FollowEnd::RunGone),
        Some(RUN_STARTED) if followed.started_at.is_some() && after_start => {
            Some(FollowEnd::RunGone)
        }
        _ => None,
    }
}

impl Engine {
    /// Records the end of a run in its session's log, under the run's
    /// fence, after every other write of the run and before the lease is
    /// released: followers on any replica end there, and a client waiting
    /// for the session learns it is free. A run that lost its lease cannot
    /// write, and needs not: its successor's start ends the followers.
    pub(super) async fn record_run_end(
        &self,
        guard: &LeaseGuard,
        session: &SessionId,
        status: &RunStatus,
    ) {
        if matches!(status, RunStatus::LeaseLost(_)) {
            return;
        }
        // The agent is gone, but a write it started may still be running
        // (a cancelled run, a store that was down): the end goes after it,
        // or not at all — followers then end when the lease does.
        if !guard.settle_writes().await {
            warn!("the run's writes outlived the write wait; its end is not recorded");
            return;
        }
        let end = match status {
            // Not an end: that is the next owner's, with the run of its
            // input; this says why, so the cut does not count as a crash.
            RunStatus::Interrupted(why) => {
                json!({ "type": RUN_CUT_OFF, "reason": "shutdown", "error": why })
            }
            _ => {
                let mut end = json!({ "type": RUN_ENDED, "status": status.name() });
                if let Some(error) = status.error() {
                    end["error"] = json!(error);
                }
                end
            }
        };
        let write = tracked_append(
            &guard.write_gate(),
            Arc::clone(&self.inner.store),
            session.clone(),
            self.fence(guard),
            vec![end],
        );
        let result = match write {
            Ok(write) => write.await.map(|_| ()).map_err(|e| error_chain(&e)),
            Err(e) => Err(error_chain(&e)),
        };
        if let Err(e) = result {
            warn!(error = %e, "cannot record the run's end; followers end when its lease is gone");
        }
    }

    /// Follows `session` from the event after `after_seq`. `NotFound`
    /// when the session does not exist. The follow makes progress while
    /// it is polled, in the task of whoever reads it (no task of its own:
    /// a thousand followers cost a thousand wake-ups per event, not two
    /// thousand), and stops when it is dropped.
    pub async fn follow(&self, session: SessionId, after_seq: u64) -> Result<Follow, EngineError> {
        self.start_follow(session, after_seq, false).await
    }

    /// Resumes a follow whose stream broke after event `last_seen`, for
    /// the run that event belongs to: if another run took the session
    /// since, the follow sends the rest of the client's own run and ends
    /// with [`FollowEnd::RunGone`] at the other run's start, never taking
    /// that run's end for its own. Otherwise as [`follow`](Self::follow).
    pub async fn resume(&self, session: SessionId, last_seen: u64) -> Result<Follow, EngineError> {
        self.start_follow(session, last_seen, true).await
    }

    async fn start_follow(
        &self,
        session: SessionId,
        after_seq: u64,
        resuming: bool,
    ) -> Result<Follow, EngineError> {
        self.inner.store.read(&session, 1, 1).await?;
        let items = Arc::new(Outbox::default());
        let (tx, engine) = (Arc::clone(&items), self.clone());
        let driver = async move {
            if let Some(end) = engine
                .follow_until_end(&session, after_seq, resuming, &tx)
                .await
            {
                tx.send(FollowItem::End(end)).await;
            }
        };
        Ok(Follow {
            driver: Some(Box::pin(driver)),
            items,
        })
    }

    /// Sends events until the live run ends; the reason.
    async fn follow_until_end(
        &self,
        session: &SessionId,
        after_seq: u64,
        resuming: bool,
        tx: &Outbox,
    ) -> Option<FollowEnd> {
        // Asked before reading, so a run that ends meanwhile has its end
        // event in what is read next.
        let started_at = self.local_run_start(session);
        let live = self.live_run(session).await;
        // A client resuming a broken stream follows the run it was
        // following, not whichever is live now: that run from the last
        // event the client saw, to its end or to the start of any later
        // run (which may carry the same token: an unleased one, or its
        // owner's again).
        let resumed = if resuming {
            match self.run_in_progress_at(session, after_seq).await {
                Ok(resumed) => resumed,
                Err(e) => return Some(e),
            }
        } else {
            None
        };
        let mut followed = match resumed {
            Some(token) => Followed {
                live: LiveRun::Run(token),
                started_at: Some(after_seq),
            },
            None => Followed { live, started_at },
        };
        let mut pos = after_seq;
        // Caught up from the store alone first: a tail started here reads
        // on from where this follower is, not from where it began.
        match self.send_stored(session, &mut pos, followed, tx).await {
            Ok(Some(end)) => return Some(end),
            Ok(None) => {}
            Err(e) => return Some(e),
        }
        if live == LiveRun::None {
            // A resumed run that recorded no end stopped without one. With
            // resumption on, this replica ends it (and runs its input
            // again), and the follow ends at that end; a follower of the
            // session then follows the resumption.
            if resumed.is_some() {
                return Some(self.run_gone(session, &mut pos, followed, tx).await);
            }
            match self.resume_interrupted_for_follower(session).await {
                Some(Resumption::Resumed {
                    token, first_seq, ..
                }) => {
                    followed = Followed {
                        live: LiveRun::Run(token.map(FencingToken::new)),
                        started_at: Some(first_seq),
                    };
                }
                _ => return Some(FollowEnd::NoLiveRun),
            }
        }
        let mut tail = self.subscribe_tail(session, pos);
        loop {
            // Subscribed before this read: an event the tail sent before
            // this follower joined is in what the read finds.
            match self.send_stored(session, &mut pos, followed, tx).await {
                Ok(Some(end)) => return Some(end),
                Ok(None) => {}
                Err(e) => return Some(e),
            }
            match self.take_tail(&mut tail, &mut pos, followed, tx).await {
                FromTail::End(end) => return Some(end),
                FromTail::Gap => continue,
                FromTail::Closed => {
                    tail = self.subscribe_tail(session, pos);
                    continue;
                }
                FromTail::Quiet => {}
            }
            // The run is gone (or another took its place), or the backend
            // still cannot tell and a quiet period is the only sign left:
            // what was recorded meanwhile is sent, then the follow ends.
            return Some(
                match self.send_stored(session, &mut pos, followed, tx).await {
                    Ok(Some(end)) => end,
                    Ok(None) => self.run_gone(session, &mut pos, followed, tx).await,
                    Err(e) => e,
                },
            );
        }
    }

    /// The end of a follow whose run is gone without an end in the log:
    /// with resumption on, the end this replica records for it as the
    /// session's next owner, and otherwise [`FollowEnd::RunGone`].
    async fn run_gone(
        &self,
        session: &SessionId,
        pos: &mut u64,
        followed: Followed,
        tx: &Outbox,
    ) -> FollowEnd {
        if self
            .resume_interrupted_for_follower(session)
            .await
            .is_some()
        {
            // Whoever ended it (here, or a replica that came first), the
            // end is in the log now, or a later run's start is.
            match self.send_stored(session, pos, followed, tx).await {
                Ok(Some(end)) => return end,
                Ok(None) => {}
                Err(e) => return e,
            }
        }
        FollowEnd::RunGone
    }

    /// Resumes the session's interrupted run for a follower: `None` when
    /// resumption is off, or the run could not be judged (then the
    /// follow ends as it would without).
    async fn resume_interrupted_for_follower(&self, session: &SessionId) -> Option<Resumption> {
        if self.resume_attempts() == 0 {
            return None;
        }
        match self.resume_interrupted(session.clone()).await {
            Ok(Resumption::Off) => None,
            Ok(r) => Some(r),
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot resume the followed session's interrupted run");
                None
            }
        }
    }

    /// Sends the tail's events in order until the follow ends, a quiet
    /// period says the run may be gone, or the follower must read the
    /// store (a gap, or it fell behind the tail's buffer). A quiet period
    /// that finds the followed run still live needs no read: the tail
    /// read everything before it, and this follower took it.
    async fn take_tail(
        &self,
        tail: &mut TailReceiver,
        pos: &mut u64,
        followed: Followed,
        tx: &Outbox,
    ) -> FromTail {
        loop {
            let event = match tail.recv().await {
                TailItem::Event(event) => event,
                TailItem::Quiet(now) if now == followed.live && now != LiveRun::Unknown => {
                    continue;
                }
                TailItem::Quiet(_) => return FromTail::Quiet,
                TailItem::Failed(error) => return FromTail::End(FollowEnd::Failed(error)),
                TailItem::Lagged => return FromTail::Gap,
                TailItem::Closed => return FromTail::Closed,
            };
            if event.seq <= *pos {
                continue;
            }
            if event.seq > pos.saturating_add(1) {
                return FromTail::Gap;
            }
            if let Some(end) = deliver(&event, pos, followed, tx).await {
                return FromTail::End(end);
            }
        }
    }

    /// The token of the run event `seq` belongs to, unless that event
    /// ended it (or there is no such event).
    async fn run_in_progress_at(
        &self,
        session: &SessionId,
        seq: u64,
    ) -> Result<Option<Option<FencingToken>>, FollowEnd> {
        if seq == 0 {
            return Ok(None);
        }
        let page = self
            .inner
            .store
            .read(session, seq, 1)
            .await
            .map_err(|e| FollowEnd::Failed(error_chain(&e)))?;
        let Some(event) = page.events.first().filter(|e| e.seq == seq) else {
            return Ok(None);
        };
        match event.payload.get("type").and_then(|t| t.as_str()) {
            Some(RUN_ENDED) => Ok(None),
            // The next owner's, sent to the followers of the run it is
            // about to end: the run in progress is that earlier one.
            Some(super::TAKEOVER) => self
                .open_run_before(session, seq)
                .await
                .map(|open| open.map(|run| run.token))
                .map_err(|e| FollowEnd::Failed(error_chain(&e))),
            _ => Ok(Some(event.token)),
        }
    }

    /// Sends every stored event after `pos`, advancing it; stops early at
    /// an event that ends `live`.
    async fn send_stored(
        &self,
        session: &SessionId,
        pos: &mut u64,
        followed: Followed,
        tx: &Outbox,
    ) -> Result<Option<FollowEnd>, FollowEnd> {
        loop {
            let page = self
                .inner
                .store
                .read(session, pos.saturating_add(1), FOLLOW_PAGE)
                .await
                .map_err(|e| FollowEnd::Failed(error_chain(&e)))?;
            for event in page.events {
                if let Some(end) = deliver(&Arc::new(event), pos, followed, tx).await {
                    return Ok(Some(end));
                }
            }
            if page.next_seq.is_none() {
                return Ok(None);
            }
        }
    }
}

/// What [`Engine::take_tail`] stopped at.
enum FromTail {
    End(FollowEnd),
    /// A quiet period in which the followed run was not seen live.
    Quiet,
    /// Events are missing before the next one: read them from the store.
    Gap,
    /// The tail ended without a word (its task gone): subscribe again.
    Closed,
}

/// Sends `event`, the one after `pos`, unless it starts a later run;
/// advances `pos`. The end it makes of the followed run, if any.
async fn deliver(
    event: &Arc<StoredEvent>,
    pos: &mut u64,
    followed: Followed,
    tx: &Outbox,
) -> Option<FollowEnd> {
    let end = ends(event, followed);
    if end == Some(FollowEnd::RunGone) {
        // A later run's start is not part of the followed run.
        return end;
    }
    *pos = event.seq;
    tx.send(FollowItem::Event(Arc::clone(event))).await;
    end
}

/// What a follow has read and its reader not yet taken, at most
/// [`FOLLOW_BUFFER`]. The follow and its reader run in one task, so
/// neither wakes the other: a wake-up would only poll that same task once
/// more for every event. The follow waits while the queue is full, and
/// the reader, which takes an item before it waits, polls the follow
/// again each time it asks for the next.
#[derive(Debug, Default)]
struct Outbox(Mutex<VecDeque<FollowItem>>);

impl Outbox {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<FollowItem>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `item` once there is room.
    async fn send(&self, item: FollowItem) {
        let mut item = Some(item);
        std::future::poll_fn(|_| {
            let mut queue = self.queue();
            if queue.len() >= FOLLOW_BUFFER {
                // No waker: the reader polls the follow after each take.
                return Poll::Pending;
            }
            queue.extend(item.take());
            Poll::Ready(())
        })
        .await;
    }

    fn take(&self) -> Option<FollowItem> {
        self.queue().pop_front()
    }
}

/// A follow of a session: its stored events in order, then one
/// [`FollowItem::End`] saying why it ended, then `None`. Read it with
/// [`recv`](Follow::recv) or as a [`Stream`]. It runs only while it is
/// polled, and dropping it stops it: no read or wait of it outlives it.
pub struct Follow {
    /// The follow itself, which queues what it reads in `items`; `None`
    /// once it has sent its end.
    driver: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Queued ahead of the reader, at most [`FOLLOW_BUFFER`]: a reader
    /// that stops reading holds the follow there.
    items: Arc<Outbox>,
}

impl fmt::Debug for Follow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Follow")
            .field("running", &self.driver.is_some())
            .field("queued", &self.items.queue().len())
            .finish()
    }
}

impl Follow {
    /// The next item; `None` after the end.
    pub async fn recv(&mut self) -> Option<FollowItem> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<FollowItem>> {
        // The driver first, so what it can read now is queued before the
        // queue is asked. It is pending either on what it reads (whose
        // wake-up polls this task) or on a full queue, which this take
        // empties by one before the reader comes back.
        if let Some(driver) = self.driver.as_mut()
            && driver.as_mut().poll(cx).is_ready()
        {
            self.driver = None;
        }
        match self.items.take() {
            Some(item) => Poll::Ready(Some(item)),
            None if self.driver.is_none() => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

impl Stream for Follow {
    type Item = FollowItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FollowItem>> {
        self.get_mut().poll_item(cx)
    }
}
