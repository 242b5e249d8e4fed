//! What one keeper shares across all its runs — configuration, the
//! per-session in-process locks, the open runs, the runs waiting for their
//! renew task — and the held in-process lock a run carries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_port::{Clock, FencingToken, Lease, OwnerId, SessionId, SessionLease};
use tokio::runtime::Handle;
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::batch::{BatchSchedule, BatchSlot, batch_driver};
use super::lock;
use super::renew::renew_driver;
use super::run::Run;
use crate::KeeperMetrics;

/// The in-process lock of one session, and since when the run holding it
/// has been ending: a competitor is refused at once while the holder runs,
/// but waits for one that is only releasing — its lock is about to be free.
#[derive(Default)]
pub(super) struct SessionSlot {
    pub(super) mutex: Arc<tokio::sync::Mutex<()>>,
    ending_since: Mutex<Option<Instant>>,
    /// Fired whenever the holder begins to end or the lock changes hands,
    /// so every waiter recomputes how long it may wait.
    changed: Notify,
}

impl SessionSlot {
    /// When the holder's release began; `None` while it runs (or nobody
    /// holds the lock).
    pub(super) fn ending_since(&self) -> Option<Instant> {
        *lock(&self.ending_since)
    }

    /// A future that completes at the slot's next change. Enable it before
    /// reading [`ending_since`](Self::ending_since), so a change in between
    /// still wakes it.
    pub(super) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    fn set_ending(&self, since: Option<Instant>) {
        *lock(&self.ending_since) = since;
        self.changed.notify_waiters();
    }
}

/// A caller's hold on a session's slot while it waits for the lock: gives
/// the slot back (and cleans the lock map) however the wait ends, even when
/// the caller's future is dropped.
pub(super) struct SlotClaim {
    core: Arc<KeeperCore>,
    session: SessionId,
    slot: Option<Arc<SessionSlot>>,
}

impl SlotClaim {
    pub(super) fn new(core: &Arc<KeeperCore>, session: &SessionId) -> Self {
        Self {
            slot: Some(core.session_slot(session)),
            core: Arc::clone(core),
            session: session.clone(),
        }
    }

    pub(super) fn slot(&self) -> &Arc<SessionSlot> {
        // Present until `into_held` consumes the claim.
        self.slot.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// The lock was taken: a new run holds it, and competitors are refused.
    pub(super) fn into_held(mut self, guard: OwnedMutexGuard<()>) -> HeldSessionLock {
        let slot = self.slot.take();
        if let Some(slot) = &slot {
            slot.set_ending(None);
        }
        HeldSessionLock {
            guard: Some(guard),
            slot,
            core: Arc::clone(&self.core),
            session: self.session.clone(),
        }
    }
}

impl Drop for SlotClaim {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.core.forget_session_slot(&self.session, slot);
        }
    }
}

/// The runs still open, which shutdown must end, and whether it has begun.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) shutting_down: bool,
    pub(super) open: HashMap<u64, Arc<Run>>,
}

/// What every clone of a [`LeaseKeeper`](super::LeaseKeeper) and every one
/// of its runs share.
pub(super) struct KeeperCore {
    pub(super) backend: Arc<dyn SessionLease>,
    pub(super) owner: OwnerId,
    pub(super) ttl: Duration,
    pub(super) interval: Duration,
    pub(super) jitter: f64,
    pub(super) acquire_timeout: Duration,
    pub(super) release_timeout: Duration,
    pub(super) shutdown_timeout: Duration,
    pub(super) lock_wait: Duration,
    pub(super) write_wait: Duration,
    /// The writer this keeper's fences name: the owner plus an id of this
    /// keeper, unique to it.
    pub(super) writer: OwnerId,
    pub(super) metrics: Arc<dyn KeeperMetrics>,
    pub(super) unsupported: AtomicBool,
    pub(super) allow_unleased: bool,
    /// The backend's last answer when it was a failure (a passing fault,
    /// a timeout, or `Unsupported` refused): what readiness reports.
    /// Cleared by the next successful call.
    pub(super) backend_fault: Mutex<Option<String>>,
    pub(super) locks: Mutex<HashMap<SessionId, Arc<SessionSlot>>>,
    pub(super) registry: Mutex<Registry>,
    pub(super) shutdown: CancellationToken,
    pub(super) tracker: TaskTracker,
    pub(super) next_id: AtomicU64,
    pub(super) held: AtomicUsize,
    /// Draws the renewal jitter.
    pub(super) clock: Arc<dyn Clock>,
    /// Leased runs whose renew task is not started yet, with when their
    /// acquisition was sent.
    pub(super) pending: Mutex<HashMap<u64, (Instant, Arc<Run>)>>,
    pub(super) driver_started: AtomicBool,
    /// The backend renews many leases in one exchange: renewals go out in
    /// batches (`batch` module) instead of one renew task per run.
    pub(super) batched: bool,
    /// Most leases in one `renew_many` call.
    pub(super) batch_limit: usize,
    /// Batched runs waiting for their next renewal.
    pub(super) batch_schedule: Mutex<BatchSchedule>,
    /// Wakes the batch driver when its schedule changed.
    pub(super) batch_wake: Arc<Notify>,
    /// Per session, the highest token of a lease this keeper did not
    /// manage to release (the release failed, or writes kept it from being
    /// tried). The backend may still hold it for us, and a same-owner
    /// acquire would hand the token back; the next run must not write
    /// under the token of a run whose writes might still be about.
    /// Cleared when an acquisition returns a greater token.
    pub(super) unreleased: Mutex<HashMap<SessionId, FencingToken>>,
}

impl KeeperCore {
    /// Records the outcome of a backend call for [`LeaseKeeper::backend_fault`](super::LeaseKeeper::backend_fault).
    pub(super) fn backend_answered(&self, fault: Option<String>) {
        let mut slot = lock(&self.backend_fault);
        if fault.is_some() || slot.is_some() {
            *slot = fault;
        }
    }

    /// What [`LeaseGuard::safe_for`](super::LeaseGuard::safe_for) keeps
    /// back from a lease's remaining time: one renewal interval. An effect
    /// started while time is left then has at least that long to land
    /// before the lease could lapse, and a lease whose renewals stopped
    /// answers zero an interval before its deadline.
    pub(super) fn effect_margin(&self) -> Duration {
        self.interval
    }

    /// The next renewal interval: the configured share of the TTL, scaled
    /// by a random factor in `1 ± jitter`.
    pub(super) fn next_interval(&self) -> Duration {
        if self.jitter == 0.0 {
            return self.interval;
        }
        let draw = self.clock.random();
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        self.interval
            .mul_f64(1.0 - self.jitter + 2.0 * self.jitter * unit)
    }

    /// How often the driver looks for runs whose first renewal is near.
    pub(super) fn driver_tick(&self) -> Duration {
        (self.interval.mul_f64(1.0 - self.jitter) / 4).max(Duration::from_millis(1))
    }

    pub(super) fn ensure_driver(self: &Arc<Self>, handle: &Handle) {
        if self.driver_started.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.batched {
            handle.spawn(batch_driver(
                Arc::downgrade(self),
                self.driver_tick(),
                Arc::clone(&self.batch_wake),
            ));
        } else {
            handle.spawn(renew_driver(
                Arc::downgrade(self),
                self.driver_tick(),
                self.shutdown.clone(),
            ));
        }
    }

    /// How early a batched run may be renewed to join a batch: a quarter
    /// of the renew interval. Batches of one keeper are then at least this
    /// far apart (a few per interval however many runs it holds), and no
    /// run is renewed more than this before its due time.
    pub(super) fn batch_window(&self) -> Duration {
        self.interval / 4
    }

    /// Puts batched runs (back) on the schedule, except those whose release
    /// began: checked under the schedule's lock, which the release takes
    /// after cancelling `stop`, so an ended run is never left on it.
    pub(super) fn reschedule(&self, slots: impl IntoIterator<Item = BatchSlot>) {
        let mut wake = false;
        {
            let mut schedule = lock(&self.batch_schedule);
            for slot in slots {
                if !slot.run.stop.is_cancelled() {
                    wake |= schedule.insert(slot);
                }
            }
        }
        if wake {
            self.batch_wake.notify_one();
        }
    }

    pub(super) fn retry_interval(&self) -> Duration {
        (self.interval / 4).max(Duration::from_millis(1))
    }

    pub(super) fn session_slot(&self, session: &SessionId) -> Arc<SessionSlot> {
        lock(&self.locks)
            .entry(session.clone())
            .or_default()
            .clone()
    }

    /// Gives back a holder's or waiter's `slot`, and drops the session's
    /// entry when nobody else holds or waits for it. Every clone of the
    /// entry is made under the map lock, so a count of one (the map's own)
    /// seen under it cannot grow behind our back.
    pub(super) fn forget_session_slot(&self, session: &SessionId, slot: Arc<SessionSlot>) {
        let mut locks = lock(&self.locks);
        drop(slot);
        if locks
            .get(session)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(session);
        }
    }

    /// Remembers that `lease` may still be held for us at the backend.
    pub(super) fn remember_unreleased(&self, lease: &Lease) {
        let mut unreleased = lock(&self.unreleased);
        let entry = unreleased
            .entry(lease.session_id().clone())
            .or_insert(lease.token());
        *entry = (*entry).max(lease.token());
    }

    pub(super) fn set_held_gauge(&self, delta_up: bool) {
        let n = if delta_up {
            self.held.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            self.held.fetch_sub(1, Ordering::AcqRel) - 1
        };
        self.metrics.held_leases(n);
    }
}

/// The per-session in-process lock, held for the whole run and until the
/// run's release has finished.
pub(super) struct HeldSessionLock {
    pub(super) guard: Option<OwnedMutexGuard<()>>,
    pub(super) slot: Option<Arc<SessionSlot>>,
    pub(super) core: Arc<KeeperCore>,
    pub(super) session: SessionId,
}

impl HeldSessionLock {
    /// The run's release has begun: competitors wait for the lock now.
    /// Called as soon as the release is decided, before it runs, so no
    /// request in between is refused for a run that is over.
    pub(super) fn mark_ending(&self) {
        if let Some(slot) = &self.slot
            && slot.ending_since().is_none()
        {
            slot.set_ending(Some(Instant::now()));
        }
    }
}

impl Drop for HeldSessionLock {
    fn drop(&mut self) {
        drop(self.guard.take());
        if let Some(slot) = self.slot.take() {
            self.core.forget_session_slot(&self.session, slot);
        }
    }
}
