//! A run's writes: each store write a run starts holds a [`WritePermit`],
//! and the run gives up its lease and its in-process lock only once every
//! permit has been dropped.
//!
//! Why the keeper counts writes: a write whose caller's future was dropped
//! (a cancelled run, a client disconnect) may still be running — on a
//! blocking thread, or in a request already on the wire. Were the lease
//! released and the next run started meanwhile, that write could land
//! inside the next run: with an unleased run nothing fences it, and with a
//! token equal to the next run's the store cannot tell the two apart. So a
//! permit must live as long as the write itself, not as long as the future
//! that asked for it: move it into whatever finishes the write (a spawned
//! task, or a future that hands itself to a task when dropped).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_port::SessionId;
use tokio::sync::Notify;

use super::lock;
use super::run::Run;
use crate::KeeperError;

/// The count of a run's writes in flight, and whether it still takes new
/// ones. Closed when the run's release begins.
#[derive(Default)]
pub(super) struct WriteTracker {
    state: Mutex<WriteState>,
    idle: Notify,
}

#[derive(Default)]
struct WriteState {
    closed: bool,
    in_flight: usize,
}

impl WriteTracker {
    /// Counts one more write, unless the tracker is closed. Checked and
    /// counted under one lock, so a write either is counted before the
    /// release starts waiting or is refused.
    fn begin(&self) -> bool {
        let mut st = lock(&self.state);
        if st.closed {
            return false;
        }
        st.in_flight += 1;
        true
    }

    fn end(&self) {
        let mut st = lock(&self.state);
        st.in_flight -= 1;
        if st.in_flight == 0 {
            self.idle.notify_waiters();
        }
    }

    /// Refuses every later write.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
    }

    pub(super) fn is_drained(&self) -> bool {
        lock(&self.state).in_flight == 0
    }

    /// Completes once no write is in flight.
    pub(super) async fn drained(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the check, so an `end` between the check
            // and the wait still wakes us.
            notified.as_mut().enable();
            if self.is_drained() {
                return;
            }
            notified.await;
        }
    }
}

/// Starts the writes of one run; cheap to clone, made by
/// [`LeaseGuard::write_gate`](crate::LeaseGuard::write_gate).
///
/// Every store write of the run takes a [`WritePermit`] first and keeps it
/// until the write has ended (accepted or refused). Permits are refused
/// once the run has lost its lease or its release has begun, so no write
/// of a run can start after the next run of its session might have.
#[derive(Clone)]
pub struct WriteGate {
    pub(super) run: Arc<Run>,
}

impl std::fmt::Debug for WriteGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGate")
            .field("session", &self.run.session)
            .finish_non_exhaustive()
    }
}

impl WriteGate {
    /// How long from now the run's lease is safely held, on the monotonic
    /// clock: the time until the keeper would count it lost (a TTL after
    /// the call that last renewed it was sent) less one renewal interval,
    /// so an effect begun now has at least that interval to land. Zero
    /// once the lease is lost or the run's release began; `None` when the
    /// run is unleased, where no lease bounds it.
    ///
    /// Check it before each side effect outside the session's store (a
    /// mail sent, a card charged): the store fences the run's own writes,
    /// nothing fences those. See [`LeaseGuard::safe_for`](super::LeaseGuard::safe_for).
    ///
    /// It holds as the keeper's loss signal does: the backend keeps a
    /// grant at least a TTL from when it was asked (the keeper checks a
    /// granted TTL a backend reports), and this host's monotonic clock runs
    /// no faster than the backend's; the interval kept back absorbs a drift
    /// between the two, not a suspended host (the monotonic clock stops
    /// while the backend's does not).
    pub fn safe_for(&self) -> Option<Duration> {
        self.run.safe_for()
    }

    /// A permit for one write. Errors with
    /// [`RunEnded`](crate::KeeperErrorKind::RunEnded) once the run lost its
    /// lease (or shutdown ended it) or its release has begun.
    pub fn begin(&self) -> Result<WritePermit, KeeperError> {
        // The loss check is a courtesy: loss is detected asynchronously,
        // and the store's fence is what refuses a stale token. Closing is
        // what the release relies on, and that is checked under the lock.
        if self.run.lost.is_cancelled() || !self.run.writes.begin() {
            return Err(KeeperError::RunEnded {
                session: self.run.session.clone(),
            });
        }
        Ok(WritePermit {
            run: Arc::clone(&self.run),
        })
    }

    /// The session the run belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.run.session
    }
}

/// One write in flight. The run's lease is not released, nor its
/// in-process lock given up, while it lives: drop it when the write has
/// ended, and not before — move it into whatever finishes the write.
#[must_use = "the permit counts the write only while it lives"]
pub struct WritePermit {
    run: Arc<Run>,
}

impl std::fmt::Debug for WritePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePermit")
            .field("session", &self.run.session)
            .finish()
    }
}

impl Drop for WritePermit {
    fn drop(&mut self) {
        self.run.writes.end();
    }
}

/// The outcome of a write started by
/// [`LeaseGuard::spawn_write`](crate::LeaseGuard::spawn_write).
///
/// Await it for the write's output. Dropping it does not stop the write.
/// A write that panicked carries its panic over to whoever awaits this.
#[must_use = "dropping it does not stop the write, but loses its outcome"]
pub struct WriteTask<T> {
    task: tokio::task::JoinHandle<T>,
}

impl<T> WriteTask<T> {
    pub(super) fn new(task: tokio::task::JoinHandle<T>) -> Self {
        Self { task }
    }
}

impl<T> std::fmt::Debug for WriteTask<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTask")
            .field("finished", &self.task.is_finished())
            .finish()
    }
}

impl<T> Future for WriteTask<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        std::pin::Pin::new(&mut self.task).poll(cx).map(|joined| {
            joined.unwrap_or_else(|e| match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Nothing aborts a write task: only a runtime shutting down
                // under it can cancel one, and then no outcome exists.
                Err(_) => panic!("the write's task was cancelled by its runtime shutting down"),
            })
        })
    }
}

/// Fires when a run loses ownership (or shutdown ends it): what the run's
/// tasks watch. Cheap to clone; made by
/// [`LeaseGuard::loss_signal`](crate::LeaseGuard::loss_signal).
#[derive(Clone)]
pub struct LossSignal {
    lost: tokio_util::sync::CancellationToken,
}

impl LossSignal {
    pub(super) fn new(lost: tokio_util::sync::CancellationToken) -> Self {
        Self { lost }
    }

    /// True once the run has lost ownership.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes once the run has lost ownership.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.lost.clone().cancelled_owned()
    }
}

impl std::fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossSignal")
            .field("lost", &self.is_lost())
            .finish()
    }
}
