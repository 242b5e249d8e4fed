//! The guard a run holds: the newest lease value and token, the loss
//! signal, and the release that dropping or finishing it starts.

use std::sync::Arc;

use lease_port::{FencingToken, Lease, SessionId, WriteFence};
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::lock;
use super::release::{DetachOnDrop, ReleaseFuture, release_holding};
use super::run::{LossReason, Run};
use super::state::{HeldSessionLock, KeeperCore};
use super::writes::{LossSignal, WriteGate, WritePermit, WriteTask};
use crate::KeeperError;

/// One run of a session: holds the in-process lock and (unless the keeper
/// runs unleased) the lease, renewed in the background.
///
/// Watch [`lost`](Self::lost) and stop the run when it fires; pass
/// [`fence`](Self::fence) with every store write, made through
/// [`spawn_write`](Self::spawn_write) (or holding a
/// [`WritePermit`] until it has ended). End the run with
/// [`finish`](Self::finish), or drop the guard: either way the lease is
/// released on a detached task that dropping the caller's future cannot
/// cancel, and the next run of the session in this process starts only
/// after that release has finished.
pub struct LeaseGuard {
    pub(super) core: Arc<KeeperCore>,
    pub(super) run: Arc<Run>,
    pub(super) lease_rx: watch::Receiver<Option<Lease>>,
    pub(super) session_lock: Option<HeldSessionLock>,
    pub(super) handle: Handle,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("session", &self.run.session)
            .field("lease", &self.lease())
            .field("loss", &self.loss())
            .finish()
    }
}

impl LeaseGuard {
    /// The session of this run.
    pub fn session_id(&self) -> &SessionId {
        &self.run.session
    }

    /// The newest lease value (updated by every renewal); `None` when the
    /// keeper runs unleased.
    pub fn lease(&self) -> Option<Lease> {
        self.lease_rx.borrow().clone()
    }

    /// The lease's fencing token; `None` when unleased. A store write
    /// takes [`fence`](Self::fence), which also names the writer.
    pub fn token(&self) -> Option<FencingToken> {
        self.lease_rx.borrow().as_ref().map(Lease::token)
    }

    /// What every store write of this run carries: the lease's token and
    /// this keeper's [`writer`](crate::LeaseKeeper::writer), or
    /// [`WriteFence::Unfenced`] when the run is unleased.
    ///
    /// `session-store`'s `append` takes it as it is.
    pub fn fence(&self) -> WriteFence {
        match self.lease_rx.borrow().as_ref() {
            Some(lease) => WriteFence::new(lease.token(), self.core.writer.clone()),
            None => WriteFence::Unfenced,
        }
    }

    /// Runs one store write on a task of its own, holding a
    /// [`WritePermit`] until it has ended, and gives back its outcome.
    ///
    /// `write` is handed this run's [`fence`](Self::fence). Dropping the
    /// returned [`WriteTask`] (a client disconnecting, a `select!` taking
    /// another branch) does not stop the write: it runs to its end, and the
    /// run's release, and the next run of the session in this process, wait
    /// for it. That is the point: a write dropped half-way may still land,
    /// and must not land inside the next owner's run. Errors with
    /// [`RunEnded`](crate::KeeperErrorKind::RunEnded), starting nothing,
    /// once the run lost its lease or began its release.
    ///
    /// The keeper's [`shutdown`](crate::LeaseKeeper::shutdown) waits for
    /// these tasks within its bound.
    pub fn spawn_write<F, Fut, T>(&self, write: F) -> Result<WriteTask<T>, KeeperError>
    where
        F: FnOnce(WriteFence) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self.begin_write()?;
        let write = write(self.fence());
        let task = self.core.tracker.spawn_on(
            async move {
                let out = write.await;
                drop(permit);
                out
            },
            &self.handle,
        );
        Ok(WriteTask::new(task))
    }

    /// How long from now the lease is safely held (see
    /// [`WriteGate::safe_for`]): zero once lost, `None` when unleased.
    pub fn safe_for(&self) -> Option<std::time::Duration> {
        self.run.safe_for()
    }

    /// True when the run holds a lease; false when the backend answered
    /// `Unsupported` and the keeper runs unleased.
    pub fn is_leased(&self) -> bool {
        self.lease_rx.borrow().is_some()
    }

    /// A receiver that sees every renewed lease value.
    pub fn watch(&self) -> watch::Receiver<Option<Lease>> {
        self.lease_rx.clone()
    }

    /// A future that completes when ownership is lost (or shutdown ended
    /// the run). Never completes for an unleased run unless shutdown ends it.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.run.lost.clone().cancelled_owned()
    }

    /// The loss signal, to hand to the run's tasks: cheap to clone, and
    /// it outlives the guard.
    pub fn loss_signal(&self) -> LossSignal {
        LossSignal::new(self.run.lost.clone())
    }

    /// True once the loss signal has fired.
    pub fn is_lost(&self) -> bool {
        self.run.lost.is_cancelled()
    }

    /// Starts the run's writes: take a [`WritePermit`] from it before each
    /// store write and keep it until the write has ended. Clone it into the
    /// run's tasks.
    pub fn write_gate(&self) -> WriteGate {
        WriteGate {
            run: Arc::clone(&self.run),
        }
    }

    /// Waits, at most the keeper's write wait
    /// ([`KeeperBuilder::write_wait`](crate::KeeperBuilder::write_wait)),
    /// until none of the run's writes is in flight; true when none is.
    ///
    /// Call it once the run has stopped starting writes, before a write
    /// that must come after all of them — the record of the run's end, say.
    /// A write whose caller was dropped (a cancelled run) may still be
    /// running, and would otherwise land after that record.
    pub async fn settle_writes(&self) -> bool {
        tokio::time::timeout(self.core.write_wait, self.run.writes.drained())
            .await
            .is_ok()
    }

    /// A permit for one write; see [`WriteGate::begin`].
    pub fn begin_write(&self) -> Result<WritePermit, KeeperError> {
        self.write_gate().begin()
    }

    /// Why the loss signal fired, once it has.
    pub fn loss(&self) -> Option<LossReason> {
        lock(&self.run.state).loss.clone()
    }

    /// Ends the run: refuses further writes, waits for the ones in flight
    /// (at most the write wait), then releases the lease (unless lost to
    /// `Held`), bounded by the release timeout. The release runs on a
    /// detached task: dropping this future does not cancel it.
    ///
    /// Errors with `Unavailable` when the backend failed or timed out, and
    /// with `WritesInFlight` when writes outlived the write wait; either way
    /// the lease lapses at its expiry and the next run of the session in
    /// this process gets a greater token.
    pub async fn finish(mut self) -> Result<(), KeeperError> {
        match self.session_lock.take() {
            // Driven inline by the caller (no task hop on the common path);
            // if the caller's future is dropped first, the rest of the
            // release continues on a spawned task.
            Some(session_lock) => {
                session_lock.mark_ending();
                DetachOnDrop {
                    fut: Some(Box::pin(self.core.tracker.track_future(
                        Box::pin(release_holding(
                            Arc::clone(&self.core),
                            Arc::clone(&self.run),
                            session_lock,
                        )) as ReleaseFuture,
                    ))),
                    handle: self.handle.clone(),
                }
                .await
            }
            None => Ok(()),
        }
    }

    fn spawn_release(&mut self) {
        if let Some(session_lock) = self.session_lock.take() {
            // Before the task runs: a request arriving in between must find
            // the run ending, not live.
            session_lock.mark_ending();
            self.core.tracker.spawn_on(
                release_holding(Arc::clone(&self.core), Arc::clone(&self.run), session_lock),
                &self.handle,
            );
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.spawn_release();
    }
}
