//! One run's state, seen by its guard, its renew task and its release, and
//! the loss signal that tells the run to stop.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lease_port::{Lease, LeaseErrorKind, OwnerId, SessionId};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::lock;
use super::state::KeeperCore;
use super::writes::WriteTracker;

/// Why a guard's loss signal fired.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Renew answered `Held`: another owner took the session, or the
    /// backend no longer knows the lease. The stale value is never released.
    Held {
        /// The new holder, when the backend named it.
        holder: Option<OwnerId>,
    },
    /// Renewals kept failing transiently (or did not answer) until the
    /// lease's expiry, measured on the monotonic clock from when the last
    /// successful renewal (or the acquisition) was sent.
    Expired,
    /// Renew answered with an error that is neither `Held` nor `Transient`
    /// (`Invalid`, or `Unsupported` from a backend that granted the lease).
    Rejected {
        /// The backend's error kind.
        kind: LeaseErrorKind,
    },
    /// [`LeaseKeeper::shutdown`](super::LeaseKeeper::shutdown) ended the run and released the lease.
    Shutdown,
}

/// One run's state, shared by the run's guard, its renew task and its
/// release.
pub(super) struct Run {
    pub(super) id: u64,
    pub(super) session: SessionId,
    /// Stops the renew task (set by release).
    pub(super) stop: CancellationToken,
    /// The loss signal handed to the run.
    pub(super) lost: CancellationToken,
    /// Fires when the release procedure has finished.
    pub(super) released: CancellationToken,
    pub(super) state: Mutex<RunState>,
    pub(super) renew_task: Mutex<Option<JoinHandle<()>>>,
    pub(super) release_started: AtomicBool,
    /// Whether this run still counts in the held-leases gauge.
    pub(super) counted: AtomicBool,
    pub(super) lease_tx: watch::Sender<Option<Lease>>,
    /// The run's writes in flight; closed when its release begins.
    pub(super) writes: WriteTracker,
    /// What [`safe_for`](Self::safe_for) keeps back from the time left
    /// ([`KeeperCore::effect_margin`]).
    pub(super) margin: Duration,
}

/// The part of a run that changes: its newest lease value and, once lost,
/// why.
pub(super) struct RunState {
    pub(super) current: Option<Lease>,
    pub(super) loss: Option<LossReason>,
    /// When the lease is taken to run out, on the monotonic clock: `ttl`
    /// after the call that granted or last renewed it was sent. `None`
    /// when unleased.
    pub(super) deadline: Option<Instant>,
}

impl Run {
    pub(super) fn current(&self) -> Option<Lease> {
        lock(&self.state).current.clone()
    }

    /// Stores a renewed value and shows it to the run, unless the run has
    /// ended meanwhile: its release began, or it lost its lease (other than
    /// to shutdown, which keeps renewing while its writes drain). Returns
    /// whether the value was stored.
    ///
    /// Checked under the state lock because the release cancels `stop`
    /// before it reads the value to release: a renewal answered late either
    /// lands before that read or not at all, and never brings an ended run
    /// back to life.
    pub(super) fn store_renewed(&self, renewed: Lease) -> bool {
        let mut st = lock(&self.state);
        let ended = self.stop.is_cancelled()
            || st
                .loss
                .as_ref()
                .is_some_and(|reason| *reason != LossReason::Shutdown);
        if ended {
            return false;
        }
        st.current = Some(renewed.clone());
        self.lease_tx.send_replace(Some(renewed));
        true
    }

    /// Moves the deadline on after a renewal sent at `sent`; never back (a
    /// late answer to an earlier call).
    pub(super) fn renewed_at(&self, core: &KeeperCore, sent: Instant) {
        let mut st = lock(&self.state);
        let deadline = sent + core.ttl;
        if st.deadline.is_none_or(|d| d < deadline) {
            st.deadline = Some(deadline);
        }
    }

    /// How long from now the lease is safely held: until its deadline less
    /// the margin; zero once lost, released or within the margin, `None`
    /// when unleased.
    pub(super) fn safe_for(&self) -> Option<Duration> {
        let st = lock(&self.state);
        let deadline = st.deadline?;
        if st.loss.is_some() || self.stop.is_cancelled() {
            return Some(Duration::ZERO);
        }
        let safe_until = deadline.checked_sub(self.margin).unwrap_or(deadline);
        Some(safe_until.saturating_duration_since(Instant::now()))
    }

    pub(super) fn uncount(&self, core: &KeeperCore) {
        if self.counted.swap(false, Ordering::AcqRel) {
            core.set_held_gauge(false);
        }
    }

    /// Records the loss (the first reason wins) and fires the signal.
    pub(super) fn lose(&self, core: &KeeperCore, reason: LossReason) {
        {
            let mut st = lock(&self.state);
            if st.loss.is_some() {
                return;
            }
            st.loss = Some(reason.clone());
        }
        match &reason {
            LossReason::Shutdown => debug!(session = %self.session, "run ended by shutdown"),
            other => {
                warn!(session = %self.session, reason = ?other, "lease lost; cancelling the run")
            }
        }
        self.uncount(core);
        core.metrics.lost(&self.session, &reason);
        self.lost.cancel();
    }
}
