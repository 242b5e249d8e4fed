//! Ending leases: each run's release runs at most once, on a task a client
//! disconnect cannot cancel, and shutdown ends every open run within its
//! bound.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lease_port::LeaseError;
use tokio::runtime::Handle;
use tokio::time::timeout;
use tracing::{Instrument, debug, info_span, warn};

use super::run::{LossReason, Run};
use super::state::{HeldSessionLock, KeeperCore};
use super::{LeaseKeeper, lock};
use crate::KeeperError;

/// What [`LeaseKeeper::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Runs (guards) that were still open when shutdown began; their loss
    /// signal fired and their leases were released.
    pub ended_runs: usize,
    /// True when every release finished within the shutdown bound.
    pub complete: bool,
}

impl LeaseKeeper {
    /// Stops taking runs and ends every open one: fires each guard's loss
    /// signal ([`LossReason::Shutdown`]) and releases every lease still
    /// held, then waits for all releases — including the detached ones of
    /// guards dropped earlier — for at most the shutdown bound.
    ///
    /// Calls waiting for a per-session lock fail with `ShuttingDown`; later
    /// calls too. Calling it again waits again, within the bound.
    pub async fn shutdown(&self) -> ShutdownReport {
        let core = &self.core;
        let mut open: Vec<Arc<Run>> = {
            let mut reg = lock(&core.registry);
            reg.shutting_down = true;
            reg.open.values().cloned().collect()
        };
        // In the order the runs began, not the map's.
        open.sort_by_key(|run| run.id);
        core.shutdown.cancel();
        let span = info_span!("lease_keeper.shutdown", open = open.len());
        let _enter = span.enter();
        for run in &open {
            run.lose(core, LossReason::Shutdown);
            let (core2, run2) = (Arc::clone(core), Arc::clone(run));
            core.tracker
                .spawn(async move { release_run(&core2, &run2).await });
        }
        drop(_enter);
        core.tracker.close();
        let complete = timeout(core.shutdown_timeout, core.tracker.wait())
            .await
            .is_ok();
        if !complete {
            warn!(
                bound = ?core.shutdown_timeout,
                "shutdown bound reached with releases still running"
            );
        }
        ShutdownReport {
            ended_runs: open.len(),
            complete,
        }
    }
}

/// Ends a run's lease: refuses further writes and waits (at most the
/// write wait) for the ones in flight, stops renewing, then releases the
/// newest value unless ownership was lost to `Held` or writes are still
/// running. Runs once per run; later callers wait for the first to finish.
async fn release_run(core: &Arc<KeeperCore>, run: &Arc<Run>) -> Result<(), KeeperError> {
    if run.release_started.swap(true, Ordering::AcqRel) {
        run.released.cancelled().await;
        return Ok(());
    }
    let span = info_span!("lease_keeper.release", session = %run.session);
    let result = async {
        // A write the run started may still be running even though the
        // future that asked for it is gone (a blocking thread, a request on
        // the wire). The lease stays ours — and renewed — until it ends:
        // released earlier, the write could land inside the next run.
        run.writes.close();
        let drained = timeout(core.write_wait, run.writes.drained())
            .await
            .is_ok();
        // Stop renewing. A renewal still in flight is dropped; its outcome
        // cannot matter: the release below names the same token, and a
        // backend that already saw the renewal releases the renewed hold.
        run.stop.cancel();
        lock(&core.pending).remove(&run.id);
        // A batch in flight with this run's lease is not waited for: its
        // answer for the run is ignored once `stop` is cancelled.
        lock(&core.batch_schedule).remove(run.id);
        if let Some(task) = lock(&run.renew_task).take() {
            task.abort();
        }
        let (lease, loss) = {
            let st = lock(&run.state);
            (st.current.clone(), st.loss.clone())
        };
        run.uncount(core);
        let in_flight = || KeeperError::WritesInFlight {
            session: run.session.clone(),
            waited: core.write_wait,
        };
        let result = match (lease, loss) {
            (None, _) if drained => Ok(()),
            (None, _) => Err(in_flight()),
            (Some(lease), Some(LossReason::Held { .. })) => {
                debug!(token = %lease.token(), "ownership was lost; the stale lease is not released");
                if drained { Ok(()) } else { Err(in_flight()) }
            }
            (Some(lease), _) if !drained => {
                // The write may still land; only the lease's expiry (or a
                // takeover's greater token) ends it safely. Not releasing
                // keeps any other owner out until then.
                warn!(token = %lease.token(), bound = ?core.write_wait,
                    "writes still running when the run ended; the lease is left to lapse");
                core.remember_unreleased(&lease);
                Err(in_flight())
            }
            (Some(lease), _) => {
                let answer = timeout(core.release_timeout, core.backend.release(&lease)).await;
                let result = match answer {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(LeaseError::transient(format!(
                        "release did not answer within {:?}",
                        core.release_timeout
                    ))),
                };
                core.metrics.released(&run.session, result.is_ok());
                match result {
                    Ok(()) => {
                        debug!(token = %lease.token(), "lease released");
                        Ok(())
                    }
                    Err(e) => {
                        warn!(error = %e, "release failed; the lease lapses at its expiry");
                        // The backend may still hold it for us: the next
                        // run must not be handed the same token.
                        core.remember_unreleased(&lease);
                        Err(KeeperError::Unavailable {
                            session: run.session.clone(),
                            source: e,
                        })
                    }
                }
            }
        };
        lock(&core.registry).open.remove(&run.id);
        result
    }
    .instrument(span)
    .await;
    run.released.cancel();
    result
}

/// Releases a run's lease, then gives up its in-process lock — once every
/// write of the run has ended, however long past the write wait that is:
/// until then the next run of the session in this process must not start.
pub(super) async fn release_holding(
    core: Arc<KeeperCore>,
    run: Arc<Run>,
    session_lock: HeldSessionLock,
) -> Result<(), KeeperError> {
    session_lock.mark_ending();
    let result = release_run(&core, &run).await;
    if run.writes.is_drained() {
        drop(session_lock);
    } else {
        // Tracked, so shutdown waits for it (within its bound).
        core.tracker.spawn(async move {
            run.writes.drained().await;
            drop(session_lock);
        });
    }
    result
}

type BoxedRelease =
    std::pin::Pin<Box<tokio_util::task::task_tracker::TrackedFuture<ReleaseFuture>>>;

pub(super) type ReleaseFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<(), KeeperError>> + Send>>;

/// A future its caller drives; dropped before completion, it hands the
/// rest of itself to a spawned task instead of being cancelled.
pub(super) struct DetachOnDrop {
    pub(super) fut: Option<BoxedRelease>,
    pub(super) handle: Handle,
}

impl Future for DetachOnDrop {
    type Output = Result<(), KeeperError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else {
            return std::task::Poll::Ready(Ok(()));
        };
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            this.fut = None;
        }
        out
    }
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            self.handle.spawn(fut);
        }
    }
}
