//! The keeper, its builder and the guard of one run.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lease_port::{
    FencingToken, Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease,
};
use tokio::runtime::Handle;
use tokio::sync::{OwnedMutexGuard, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span, warn};

use crate::{KeeperError, KeeperMetrics, NoMetrics, RenewOutcome};

/// Default share of the TTL between renewals.
pub const DEFAULT_RENEW_FRACTION: f64 = 1.0 / 3.0;
/// Default jitter: each renewal interval is scaled by a random factor in
/// `1 ± jitter`.
pub const DEFAULT_JITTER: f64 = 0.1;
/// Default bound on one release call.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on [`LeaseKeeper::shutdown`].
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on waiting for the per-session in-process lock.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(30);

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
    /// [`LeaseKeeper::shutdown`] ended the run and released the lease.
    Shutdown,
}

/// What [`LeaseKeeper::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Runs (guards) that were still open when shutdown began; their loss
    /// signal fired and their leases were released.
    pub ended_runs: usize,
    /// True when every release finished within the shutdown bound.
    pub complete: bool,
}

/// Configures a [`LeaseKeeper`]. Made by [`LeaseKeeper::builder`].
pub struct KeeperBuilder {
    backend: Arc<dyn SessionLease>,
    owner: OwnerId,
    ttl: Duration,
    renew_fraction: f64,
    jitter: f64,
    acquire_timeout: Option<Duration>,
    release_timeout: Duration,
    shutdown_timeout: Duration,
    lock_wait: Duration,
    metrics: Arc<dyn KeeperMetrics>,
}

impl std::fmt::Debug for KeeperBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeeperBuilder")
            .field("owner", &self.owner)
            .field("ttl", &self.ttl)
            .field("renew_fraction", &self.renew_fraction)
            .field("jitter", &self.jitter)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("release_timeout", &self.release_timeout)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("lock_wait", &self.lock_wait)
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

impl KeeperBuilder {
    /// Share of the TTL between renewals, in `(0, 1)`. Default 1/3.
    pub fn renew_fraction(mut self, fraction: f64) -> Self {
        self.renew_fraction = fraction;
        self
    }

    /// Random spread of each renewal interval, in `[0, 0.5]`: the interval
    /// is scaled by a factor drawn from `1 ± jitter`, so many keepers
    /// started together do not renew in lockstep. Default 0.1.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Bound on one acquire call; a call that does not answer in time is
    /// `Unavailable`. Default TTL × renew fraction.
    pub fn acquire_timeout(mut self, bound: Duration) -> Self {
        self.acquire_timeout = Some(bound);
        self
    }

    /// Bound on one release call. Default 5 s.
    pub fn release_timeout(mut self, bound: Duration) -> Self {
        self.release_timeout = bound;
        self
    }

    /// Bound on [`LeaseKeeper::shutdown`]. Default 10 s.
    pub fn shutdown_timeout(mut self, bound: Duration) -> Self {
        self.shutdown_timeout = bound;
        self
    }

    /// Bound on waiting for a run of the same session in this process to
    /// end. Default 30 s.
    pub fn lock_wait(mut self, bound: Duration) -> Self {
        self.lock_wait = bound;
        self
    }

    /// Metrics hooks. Default [`NoMetrics`].
    pub fn metrics(mut self, metrics: Arc<dyn KeeperMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Checks the configuration and builds the keeper. Needs no runtime.
    ///
    /// Errors with [`KeeperErrorKind::Invalid`](crate::KeeperErrorKind::Invalid)
    /// for a zero TTL, a renew fraction outside `(0, 1)` or a jitter
    /// outside `[0, 0.5]`.
    pub fn build(self) -> Result<LeaseKeeper, KeeperError> {
        if self.ttl.is_zero() {
            return Err(KeeperError::invalid("the TTL must be positive"));
        }
        if !(self.renew_fraction > 0.0 && self.renew_fraction < 1.0) {
            return Err(KeeperError::invalid(format!(
                "the renew fraction must lie in (0, 1), not {}",
                self.renew_fraction
            )));
        }
        if !(0.0..=0.5).contains(&self.jitter) {
            return Err(KeeperError::invalid(format!(
                "the jitter must lie in [0, 0.5], not {}",
                self.jitter
            )));
        }
        let interval = self.ttl.mul_f64(self.renew_fraction);
        Ok(LeaseKeeper {
            inner: Arc::new(Inner {
                backend: self.backend,
                owner: self.owner,
                ttl: self.ttl,
                interval,
                jitter: self.jitter,
                acquire_timeout: self.acquire_timeout.unwrap_or(interval),
                release_timeout: self.release_timeout,
                shutdown_timeout: self.shutdown_timeout,
                lock_wait: self.lock_wait,
                metrics: self.metrics,
                unsupported: AtomicBool::new(false),
                locks: Mutex::default(),
                registry: Mutex::default(),
                shutdown: CancellationToken::new(),
                tracker: TaskTracker::new(),
                next_id: AtomicU64::new(0),
                held: AtomicUsize::new(0),
                rng: RandomState::new(),
                pending: Mutex::default(),
                driver_started: AtomicBool::new(false),
            }),
        })
    }
}

type SessionMutex = tokio::sync::Mutex<()>;

#[derive(Default)]
struct Registry {
    shutting_down: bool,
    open: HashMap<u64, Arc<Shared>>,
}

struct Inner {
    backend: Arc<dyn SessionLease>,
    owner: OwnerId,
    ttl: Duration,
    interval: Duration,
    jitter: f64,
    acquire_timeout: Duration,
    release_timeout: Duration,
    shutdown_timeout: Duration,
    lock_wait: Duration,
    metrics: Arc<dyn KeeperMetrics>,
    unsupported: AtomicBool,
    locks: Mutex<HashMap<SessionId, Arc<SessionMutex>>>,
    registry: Mutex<Registry>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    next_id: AtomicU64,
    held: AtomicUsize,
    rng: RandomState,
    /// Leased runs whose renew task is not started yet, with when their
    /// acquisition was sent.
    pending: Mutex<HashMap<u64, (Instant, Arc<Shared>)>>,
    driver_started: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// The next renewal interval: the configured share of the TTL, scaled
    /// by a random factor in `1 ± jitter`.
    fn next_interval(&self) -> Duration {
        if self.jitter == 0.0 {
            return self.interval;
        }
        let draw = self
            .rng
            .hash_one(self.next_id.fetch_add(1, Ordering::Relaxed));
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        self.interval
            .mul_f64(1.0 - self.jitter + 2.0 * self.jitter * unit)
    }

    /// How often the driver looks for runs whose first renewal is near.
    fn driver_tick(&self) -> Duration {
        (self.interval.mul_f64(1.0 - self.jitter) / 4).max(Duration::from_millis(1))
    }

    fn ensure_driver(self: &Arc<Self>, handle: &Handle) {
        if !self.driver_started.swap(true, Ordering::AcqRel) {
            handle.spawn(drive(
                Arc::downgrade(self),
                self.driver_tick(),
                self.shutdown.clone(),
            ));
        }
    }

    fn retry_interval(&self) -> Duration {
        (self.interval / 4).max(Duration::from_millis(1))
    }

    fn session_mutex(&self, session: &SessionId) -> Arc<SessionMutex> {
        lock(&self.locks)
            .entry(session.clone())
            .or_default()
            .clone()
    }

    /// Drops the session's lock entry when nobody holds or waits for it.
    /// Every clone of the entry is made under the map lock, so a count of
    /// one (the map's own) seen under it cannot grow behind our back.
    fn forget_session_mutex(&self, session: &SessionId) {
        let mut locks = lock(&self.locks);
        if locks
            .get(session)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(session);
        }
    }

    fn set_held_gauge(&self, delta_up: bool) {
        let n = if delta_up {
            self.held.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            self.held.fetch_sub(1, Ordering::AcqRel) - 1
        };
        self.metrics.held_leases(n);
    }
}

/// One run's shared state: the renew task, the guard and the release task
/// all see it.
struct Shared {
    id: u64,
    session: SessionId,
    /// Stops the renew task (set by release).
    stop: CancellationToken,
    /// The loss signal handed to the run.
    lost: CancellationToken,
    /// Fires when the release procedure has finished.
    released: CancellationToken,
    state: Mutex<RunState>,
    renew_task: Mutex<Option<JoinHandle<()>>>,
    release_started: AtomicBool,
    /// Whether this run still counts in the held-leases gauge.
    counted: AtomicBool,
    tx: watch::Sender<Option<Lease>>,
}

struct RunState {
    current: Option<Lease>,
    loss: Option<LossReason>,
}

impl Shared {
    fn current(&self) -> Option<Lease> {
        lock(&self.state).current.clone()
    }

    fn uncount(&self, inner: &Inner) {
        if self.counted.swap(false, Ordering::AcqRel) {
            inner.set_held_gauge(false);
        }
    }

    /// Records the loss (the first reason wins) and fires the signal.
    fn lose(&self, inner: &Inner, reason: LossReason) {
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
        self.uncount(inner);
        inner.metrics.lost(&self.session, &reason);
        self.lost.cancel();
    }
}

/// The lease lifecycle around session runs: in-process lock, acquire,
/// renew, cancel on loss, detached release, bounded shutdown.
///
/// Cheap to clone; clones share everything. See the [crate
/// documentation](crate) for the rules it follows.
#[derive(Clone)]
pub struct LeaseKeeper {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeeper")
            .field("owner", &self.inner.owner)
            .field("ttl", &self.inner.ttl)
            .field("held", &self.inner.held.load(Ordering::Relaxed))
            .field("unleased", &self.is_unleased())
            .finish_non_exhaustive()
    }
}

impl LeaseKeeper {
    /// Starts configuring a keeper acquiring leases from `backend` as
    /// `owner`. `ttl` must be the TTL the backend grants (or less): the
    /// keeper never assumes a lease lives longer than `ttl` after the call
    /// that granted or renewed it was sent.
    pub fn builder(backend: Arc<dyn SessionLease>, owner: OwnerId, ttl: Duration) -> KeeperBuilder {
        KeeperBuilder {
            backend,
            owner,
            ttl,
            renew_fraction: DEFAULT_RENEW_FRACTION,
            jitter: DEFAULT_JITTER,
            acquire_timeout: None,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            lock_wait: DEFAULT_LOCK_WAIT,
            metrics: Arc::new(NoMetrics),
        }
    }

    /// A keeper with every default.
    pub fn new(
        backend: Arc<dyn SessionLease>,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Self, KeeperError> {
        Self::builder(backend, owner, ttl).build()
    }

    /// The owner identity this keeper acquires with.
    pub fn owner(&self) -> &OwnerId {
        &self.inner.owner
    }

    /// The TTL the keeper reckons with.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// True once the backend answered `Unsupported`: from then on the
    /// keeper runs every session unleased and never consults it again.
    pub fn is_unleased(&self) -> bool {
        self.inner.unsupported.load(Ordering::Acquire)
    }

    /// Leases currently held (acquired, not yet lost or released).
    pub fn held_leases(&self) -> usize {
        self.inner.held.load(Ordering::Acquire)
    }

    /// Starts a run of `session`: waits (at most the configured lock wait)
    /// for any run of it in this process to end, then acquires its lease.
    /// See [`acquire_within`](Self::acquire_within).
    pub async fn acquire(&self, session: &SessionId) -> Result<LeaseGuard, KeeperError> {
        self.acquire_within(session, self.inner.lock_wait).await
    }

    /// Starts a run of `session`, waiting at most `wait` for the
    /// per-session in-process lock.
    ///
    /// Cancellable: dropping the future while it waits leaves nothing
    /// behind. Dropping it during the backend call may leave a lease the
    /// backend granted but nobody holds; it lapses after its TTL, exactly
    /// as with a lost reply.
    ///
    /// Errors: `Busy` (lock not free in time), `LeasedElsewhere` (backend
    /// `Held`), `Unavailable` (backend `Transient` or no answer within the
    /// acquire timeout), `ShuttingDown`, `Invalid`.
    pub async fn acquire_within(
        &self,
        session: &SessionId,
        wait: Duration,
    ) -> Result<LeaseGuard, KeeperError> {
        let span =
            info_span!("lease_keeper.acquire", session = %session, owner = %self.inner.owner);
        let result = self.acquire_inner(session, wait).instrument(span).await;
        if let Err(e) = &result {
            self.inner.metrics.acquire_failed(session, e.kind());
        }
        result
    }

    async fn acquire_inner(
        &self,
        session: &SessionId,
        wait: Duration,
    ) -> Result<LeaseGuard, KeeperError> {
        let inner = &self.inner;
        if inner.shutdown.is_cancelled() {
            return Err(KeeperError::ShuttingDown);
        }
        let mutex = inner.session_mutex(session);
        let started = Instant::now();
        let permit = tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => Err(KeeperError::ShuttingDown),
            r = timeout(wait, mutex.lock_owned()) => r.map_err(|_| KeeperError::Busy {
                session: session.clone(),
                waited: started.elapsed(),
            }),
        };
        let permit = match permit {
            Ok(p) => p,
            Err(e) => {
                inner.forget_session_mutex(session);
                return Err(e);
            }
        };
        // From here on the permit travels with the run; every early return
        // drops it and cleans the lock map through `Permit`'s drop.
        let permit = Permit {
            guard: Some(permit),
            inner: Arc::clone(inner),
            session: session.clone(),
        };

        if inner.unsupported.load(Ordering::Acquire) {
            return self.open_run(session, None, None, permit);
        }
        let sent = Instant::now();
        let answer = timeout(
            inner.acquire_timeout,
            inner.backend.acquire(session, &inner.owner),
        )
        .await;
        let lease = match answer {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => match e.kind() {
                LeaseErrorKind::Held => {
                    return Err(KeeperError::LeasedElsewhere {
                        session: session.clone(),
                        holder: e.holder().cloned(),
                        source: e,
                    });
                }
                LeaseErrorKind::Unsupported => {
                    if !inner.unsupported.swap(true, Ordering::AcqRel) {
                        warn!(error = %e, "lease backend does not support leases; running every session unleased from now on");
                    }
                    return self.open_run(session, None, None, permit);
                }
                LeaseErrorKind::Transient => {
                    return Err(KeeperError::Unavailable {
                        session: session.clone(),
                        source: e,
                    });
                }
                _ => {
                    return Err(KeeperError::Invalid {
                        message: format!("the backend refused session {session}"),
                        source: Some(e),
                    });
                }
            },
            Err(_) => {
                return Err(KeeperError::Unavailable {
                    session: session.clone(),
                    source: LeaseError::transient(format!(
                        "acquire did not answer within {:?}",
                        inner.acquire_timeout
                    )),
                });
            }
        };
        if lease.session_id() != session || lease.owner() != &inner.owner {
            return Err(KeeperError::invalid(format!(
                "the backend granted {lease:?} when asked for session {session} as {}",
                inner.owner
            )));
        }
        self.open_run(session, Some(lease), Some(sent), permit)
    }

    /// Registers a run and, when leased, starts its renew task.
    fn open_run(
        &self,
        session: &SessionId,
        lease: Option<Lease>,
        sent: Option<Instant>,
        permit: Permit,
    ) -> Result<LeaseGuard, KeeperError> {
        let inner = &self.inner;
        let (tx, rx) = watch::channel(lease.clone());
        let shared = Arc::new(Shared {
            id: inner.next_id.fetch_add(1, Ordering::Relaxed),
            session: session.clone(),
            stop: CancellationToken::new(),
            lost: CancellationToken::new(),
            released: CancellationToken::new(),
            state: Mutex::new(RunState {
                current: lease.clone(),
                loss: None,
            }),
            renew_task: Mutex::new(None),
            release_started: AtomicBool::new(false),
            counted: AtomicBool::new(false),
            tx,
        });
        let handle = Handle::current();
        let leased = lease.is_some();
        {
            let mut reg = lock(&inner.registry);
            if !reg.shutting_down {
                reg.open.insert(shared.id, Arc::clone(&shared));
            } else {
                drop(reg);
                // Shutdown began while we acquired: give the lease back at
                // once, on a detached task, and refuse the run.
                let guard = LeaseGuard {
                    inner: Arc::clone(inner),
                    shared,
                    rx,
                    permit: Some(permit),
                    handle,
                };
                drop(guard);
                return Err(KeeperError::ShuttingDown);
            }
        }
        if let (Some(lease), Some(sent)) = (lease, sent) {
            shared.counted.store(true, Ordering::Release);
            inner.set_held_gauge(true);
            inner.metrics.acquired(session);
            debug!(session = %session, token = %lease.token(), "lease acquired");
            // The run's renew task is started by the keeper's driver shortly
            // before its first renewal is due: a run shorter than that
            // never costs a task.
            lock(&inner.pending).insert(shared.id, (sent, Arc::clone(&shared)));
            inner.ensure_driver(&handle);
        } else {
            debug_assert!(!leased);
            debug!(session = %session, "running unleased");
        }
        Ok(LeaseGuard {
            inner: Arc::clone(inner),
            shared,
            rx,
            permit: Some(permit),
            handle,
        })
    }

    /// Stops taking runs and ends every open one: fires each guard's loss
    /// signal ([`LossReason::Shutdown`]) and releases every lease still
    /// held, then waits for all releases — including the detached ones of
    /// guards dropped earlier — for at most the shutdown bound.
    ///
    /// Calls waiting for a per-session lock fail with `ShuttingDown`; later
    /// calls too. Calling it again waits again, within the bound.
    pub async fn shutdown(&self) -> ShutdownReport {
        let inner = &self.inner;
        let open: Vec<Arc<Shared>> = {
            let mut reg = lock(&inner.registry);
            reg.shutting_down = true;
            reg.open.values().cloned().collect()
        };
        inner.shutdown.cancel();
        let span = info_span!("lease_keeper.shutdown", open = open.len());
        let _enter = span.enter();
        for shared in &open {
            shared.lose(inner, LossReason::Shutdown);
            let (inner2, shared2) = (Arc::clone(inner), Arc::clone(shared));
            inner
                .tracker
                .spawn(async move { release_run(&inner2, &shared2).await });
        }
        drop(_enter);
        inner.tracker.close();
        let complete = timeout(inner.shutdown_timeout, inner.tracker.wait())
            .await
            .is_ok();
        if !complete {
            warn!(
                bound = ?inner.shutdown_timeout,
                "shutdown bound reached with releases still running"
            );
        }
        ShutdownReport {
            ended_runs: open.len(),
            complete,
        }
    }
}

/// The per-session in-process lock, held for the whole run and until the
/// run's release has finished.
struct Permit {
    guard: Option<OwnedMutexGuard<()>>,
    inner: Arc<Inner>,
    session: SessionId,
}

impl Drop for Permit {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.inner.forget_session_mutex(&self.session);
    }
}

/// Starts each run's renew task at the last driver tick before its first
/// renewal can be due; the task then sleeps until exactly that moment.
async fn drive(inner: std::sync::Weak<Inner>, tick: Duration, shutdown: CancellationToken) {
    let mut at = Instant::now();
    loop {
        at += tick;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = sleep_until(at) => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let earliest = inner.interval.mul_f64(1.0 - inner.jitter);
        let horizon = Instant::now() + tick;
        let due: Vec<(Instant, Arc<Shared>)> = {
            let mut pending = lock(&inner.pending);
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, (sent, _))| *sent + earliest <= horizon)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        for (sent, shared) in due {
            if shared.stop.is_cancelled() {
                continue;
            }
            let span = info_span!("lease_keeper.renew", session = %shared.session);
            let task = tokio::spawn(
                renew_loop(Arc::clone(&inner), Arc::clone(&shared), sent).instrument(span),
            );
            *lock(&shared.renew_task) = Some(task);
        }
    }
}

async fn renew_loop(inner: Arc<Inner>, shared: Arc<Shared>, sent: Instant) {
    // Local deadlines live on the monotonic clock (tokio's): the lease is
    // taken to live `ttl` from when the call that granted or last renewed
    // it was *sent*.
    let mut deadline = sent + inner.ttl;
    let mut next = sent + inner.next_interval();
    loop {
        tokio::select! {
            biased;
            () = shared.stop.cancelled() => return,
            () = sleep_until(next.min(deadline)) => {}
        }
        if Instant::now() >= deadline {
            shared.lose(&inner, LossReason::Expired);
            return;
        }
        let Some(current) = shared.current() else {
            return;
        };
        let t0 = Instant::now();
        let answer = tokio::select! {
            biased;
            () = shared.stop.cancelled() => return,
            r = timeout_at(deadline, inner.backend.renew(&current)) => r,
        };
        let latency = t0.elapsed();
        match answer {
            Ok(Ok(renewed)) => {
                inner.metrics.renew_latency(latency, RenewOutcome::Renewed);
                if renewed.token() != current.token() || renewed.owner() != current.owner() {
                    warn!(
                        ?renewed,
                        "renew changed the token or owner; treating as loss"
                    );
                    shared.lose(
                        &inner,
                        LossReason::Rejected {
                            kind: LeaseErrorKind::Invalid,
                        },
                    );
                    return;
                }
                lock(&shared.state).current = Some(renewed.clone());
                shared.tx.send_replace(Some(renewed));
                deadline = t0 + inner.ttl;
                next = t0 + inner.next_interval();
            }
            Ok(Err(e)) => match e.kind() {
                LeaseErrorKind::Held => {
                    inner.metrics.renew_latency(latency, RenewOutcome::Held);
                    shared.lose(
                        &inner,
                        LossReason::Held {
                            holder: e.holder().cloned(),
                        },
                    );
                    return;
                }
                LeaseErrorKind::Transient => {
                    inner
                        .metrics
                        .renew_latency(latency, RenewOutcome::Transient);
                    debug!(error = %e, "renew failed transiently; retrying until the lease's expiry");
                    next = Instant::now() + inner.retry_interval();
                }
                kind => {
                    inner.metrics.renew_latency(latency, RenewOutcome::Failed);
                    if kind == LeaseErrorKind::Unsupported
                        && !inner.unsupported.swap(true, Ordering::AcqRel)
                    {
                        warn!(error = %e, "lease backend does not support leases; later runs go unleased");
                    }
                    shared.lose(&inner, LossReason::Rejected { kind });
                    return;
                }
            },
            Err(_) => {
                inner.metrics.renew_latency(latency, RenewOutcome::Failed);
                shared.lose(&inner, LossReason::Expired);
                return;
            }
        }
    }
}

/// Ends a run's lease: stops renewing, then releases the newest value
/// unless ownership was lost to `Held`. Runs once per run; later callers
/// wait for the first to finish.
async fn release_run(inner: &Arc<Inner>, shared: &Arc<Shared>) -> Result<(), KeeperError> {
    if shared.release_started.swap(true, Ordering::AcqRel) {
        shared.released.cancelled().await;
        return Ok(());
    }
    let span = info_span!("lease_keeper.release", session = %shared.session);
    let result = async {
        // Stop renewing. A renewal still in flight is dropped; its outcome
        // cannot matter: the release below names the same token, and a
        // backend that already saw the renewal releases the renewed hold.
        shared.stop.cancel();
        lock(&inner.pending).remove(&shared.id);
        if let Some(task) = lock(&shared.renew_task).take() {
            task.abort();
        }
        let (lease, loss) = {
            let st = lock(&shared.state);
            (st.current.clone(), st.loss.clone())
        };
        shared.uncount(inner);
        let result = match (lease, loss) {
            (None, _) => Ok(()),
            (Some(lease), Some(LossReason::Held { .. })) => {
                debug!(token = %lease.token(), "ownership was lost; the stale lease is not released");
                Ok(())
            }
            (Some(lease), _) => {
                let answer = timeout(inner.release_timeout, inner.backend.release(&lease)).await;
                let result = match answer {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(LeaseError::transient(format!(
                        "release did not answer within {:?}",
                        inner.release_timeout
                    ))),
                };
                inner.metrics.released(&shared.session, result.is_ok());
                match result {
                    Ok(()) => {
                        debug!(token = %lease.token(), "lease released");
                        Ok(())
                    }
                    Err(e) => {
                        warn!(error = %e, "release failed; the lease lapses at its expiry");
                        Err(KeeperError::Unavailable {
                            session: shared.session.clone(),
                            source: e,
                        })
                    }
                }
            }
        };
        lock(&inner.registry).open.remove(&shared.id);
        result
    }
    .instrument(span)
    .await;
    shared.released.cancel();
    result
}

/// One run of a session: holds the in-process lock and (unless the keeper
/// runs unleased) the lease, renewed in the background.
///
/// Watch [`lost`](Self::lost) and stop the run when it fires; tag every
/// store write with [`token`](Self::token). End the run with
/// [`finish`](Self::finish), or drop the guard: either way the lease is
/// released on a detached task that dropping the caller's future cannot
/// cancel, and the next run of the session in this process starts only
/// after that release has finished.
pub struct LeaseGuard {
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    rx: watch::Receiver<Option<Lease>>,
    permit: Option<Permit>,
    handle: Handle,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("session", &self.shared.session)
            .field("lease", &self.lease())
            .field("loss", &self.loss())
            .finish()
    }
}

impl LeaseGuard {
    /// The session of this run.
    pub fn session_id(&self) -> &SessionId {
        &self.shared.session
    }

    /// The newest lease value (updated by every renewal); `None` when the
    /// keeper runs unleased.
    pub fn lease(&self) -> Option<Lease> {
        self.rx.borrow().clone()
    }

    /// The fencing token to attach to every write; `None` when unleased
    /// (the store must then be told the write is unfenced).
    pub fn token(&self) -> Option<FencingToken> {
        self.rx.borrow().as_ref().map(Lease::token)
    }

    /// True when the run holds a lease; false when the backend answered
    /// `Unsupported` and the keeper runs unleased.
    pub fn is_leased(&self) -> bool {
        self.rx.borrow().is_some()
    }

    /// A receiver that sees every renewed lease value.
    pub fn watch(&self) -> watch::Receiver<Option<Lease>> {
        self.rx.clone()
    }

    /// A future that completes when ownership is lost (or shutdown ended
    /// the run). Never completes for an unleased run unless shutdown ends it.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.shared.lost.clone().cancelled_owned()
    }

    /// A cancellation token that fires on loss, to hand to the run's tasks.
    /// Cancelling it yourself affects nothing but its own children.
    pub fn loss_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// True once the loss signal has fired.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Why the loss signal fired, once it has.
    pub fn loss(&self) -> Option<LossReason> {
        lock(&self.shared.state).loss.clone()
    }

    /// Ends the run: releases the lease (unless lost to `Held`) and waits
    /// for the release, which runs on a detached task bounded by the
    /// release timeout. Dropping this future does not cancel the release.
    ///
    /// Errors with `Unavailable` when the backend failed or timed out; the
    /// lease then lapses at its expiry.
    pub async fn finish(mut self) -> Result<(), KeeperError> {
        match self.permit.take() {
            // Driven inline by the caller (no task hop on the common path);
            // if the caller's future is dropped first, the rest of the
            // release continues on a spawned task.
            Some(permit) => {
                Detached {
                    fut: Some(Box::pin(self.inner.tracker.track_future(
                        Box::pin(release_holding(
                            Arc::clone(&self.inner),
                            Arc::clone(&self.shared),
                            permit,
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
        if let Some(permit) = self.permit.take() {
            self.inner.tracker.spawn_on(
                release_holding(Arc::clone(&self.inner), Arc::clone(&self.shared), permit),
                &self.handle,
            );
        }
    }
}

/// Releases a run's lease, then gives up its in-process lock.
async fn release_holding(
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    permit: Permit,
) -> Result<(), KeeperError> {
    let result = release_run(&inner, &shared).await;
    drop(permit);
    result
}

type BoxedRelease =
    std::pin::Pin<Box<tokio_util::task::task_tracker::TrackedFuture<ReleaseFuture>>>;
type ReleaseFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), KeeperError>> + Send>>;

/// A future its caller drives; dropped before completion, it hands the
/// rest of itself to a spawned task instead of being cancelled.
struct Detached {
    fut: Option<BoxedRelease>,
    handle: Handle,
}

impl Future for Detached {
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

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            self.handle.spawn(fut);
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.spawn_release();
    }
}
