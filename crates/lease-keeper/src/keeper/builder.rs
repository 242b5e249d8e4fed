//! How a keeper is configured: the defaults and [`KeeperBuilder`], which
//! checks the configuration once so the running keeper can trust it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_port::{Clock, OwnerId, SessionLease};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::LeaseKeeper;
use super::state::KeeperCore;
use crate::{KeeperError, KeeperMetrics};

/// Default share of the TTL between renewals.
pub const DEFAULT_RENEW_FRACTION: f64 = 1.0 / 3.0;
/// Default jitter: each renewal interval is scaled by a random factor in
/// `1 ± jitter`.
pub const DEFAULT_JITTER: f64 = 0.1;
/// Default bound on one release call.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on [`LeaseKeeper::shutdown`].
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on waiting for a live run of the same session in this
/// process: none, so a competitor here is refused at once, as one on
/// another process is.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::ZERO;
/// Default bound on waiting, when a run ends, for the writes it started.
pub const DEFAULT_WRITE_WAIT: Duration = Duration::from_secs(5);
/// Default for the most leases renewed in one batch call.
pub const DEFAULT_RENEW_BATCH_LIMIT: usize = 256;

/// Configures a [`LeaseKeeper`]. Made by [`LeaseKeeper::builder`].
pub struct KeeperBuilder {
    pub(super) backend: Arc<dyn SessionLease>,
    pub(super) owner: OwnerId,
    pub(super) ttl: Duration,
    pub(super) renew_fraction: f64,
    pub(super) jitter: f64,
    pub(super) acquire_timeout: Option<Duration>,
    pub(super) release_timeout: Duration,
    pub(super) shutdown_timeout: Duration,
    pub(super) lock_wait: Duration,
    pub(super) write_wait: Duration,
    pub(super) renew_batch_limit: usize,
    pub(super) metrics: Arc<dyn KeeperMetrics>,
    pub(super) allow_unleased: bool,
    pub(super) clock: Arc<dyn Clock>,
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
            .field("write_wait", &self.write_wait)
            .field("renew_batch_limit", &self.renew_batch_limit)
            .field("metrics", &self.metrics)
            .field("clock", &self.clock)
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
    /// `Unavailable`. Default TTL × renew fraction; never more than the TTL
    /// (a lease granted later than that may already have lapsed).
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

    /// Bound on waiting for a live run of the same session in this process
    /// to end. Default zero: the second run is refused at once with
    /// [`Busy`](crate::KeeperErrorKind::Busy), exactly as a run on another
    /// process is refused with `LeasedElsewhere`; set a bound to queue
    /// runs of one session in one process instead. A run whose release has
    /// already begun is always waited for (at most the write wait plus the
    /// release timeout), so a request arriving just after the previous run
    /// answered is not refused.
    pub fn lock_wait(mut self, bound: Duration) -> Self {
        self.lock_wait = bound;
        self
    }

    /// Bound on waiting, when a run ends, for the writes it started
    /// ([`WritePermit`](crate::WritePermit)s still alive). Past it the lease
    /// is not released but left to lapse, and the session's in-process lock
    /// is held until the last write ends. Default 5 s.
    pub fn write_wait(mut self, bound: Duration) -> Self {
        self.write_wait = bound;
        self
    }

    /// Whether a backend answering `Unsupported` (it cannot lease at all)
    /// turns the keeper unleased for good. Default `false`: a keeper built
    /// over a backend must never silently stop fencing, so `Unsupported`
    /// fails the run as [`Unavailable`](crate::KeeperErrorKind::Unavailable)
    /// (retryable, like any backend fault), is reported by
    /// [`LeaseKeeper::backend_fault`], and later runs keep asking the
    /// backend.
    ///
    /// Set `true` only for a process that leases when its deployment can
    /// and otherwise proves by other means that it alone drives its
    /// sessions (a store that accepts unfenced writes only from a single
    /// process, say).
    pub fn allow_unleased(mut self, allow: bool) -> Self {
        self.allow_unleased = allow;
        self
    }

    /// Most leases one batch renewal call carries, for a backend that
    /// renews in batches ([`SessionLease::renews_in_batches`]); more runs
    /// due at once go out in several calls, sent together. Keeps one call
    /// within what a backend's messages may carry. Default
    /// [`DEFAULT_RENEW_BATCH_LIMIT`]; at least 1.
    pub fn renew_batch_limit(mut self, limit: usize) -> Self {
        self.renew_batch_limit = limit;
        self
    }

    /// Metrics hooks. Default [`NoMetrics`](crate::NoMetrics).
    pub fn metrics(mut self, metrics: Arc<dyn KeeperMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where the keeper draws its randomness: the renewal jitter, and the
    /// nonce of its [`writer`](LeaseKeeper::writer) id. Default
    /// [`SystemClock`](lease_port::SystemClock). A simulation that owns time
    /// passes its own clock, so a schedule replays from its seed; deadlines
    /// stay on [`tokio::time::Instant`], which such a simulation pauses and
    /// advances itself.
    ///
    /// The clock's [`random`](lease_port::Clock::random) must differ
    /// between processes and between incarnations of one process: two
    /// keepers of one owner drawing the same nonce would share a writer id,
    /// and a store would take one's writes for the other's.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checks the configuration and builds the keeper. Needs no runtime.
    ///
    /// Errors with [`KeeperErrorKind::Invalid`](crate::KeeperErrorKind::Invalid)
    /// for a zero TTL, a TTL longer than the backend says it grants
    /// ([`SessionLease::granted_ttl`]: the keeper would act on a lease the
    /// backend already gave to someone else), a renew fraction outside
    /// `(0, 1)`, a jitter outside `[0, 0.5]` or a zero renew batch limit.
    pub fn build(self) -> Result<LeaseKeeper, KeeperError> {
        if self.ttl.is_zero() {
            return Err(KeeperError::invalid("the TTL must be positive"));
        }
        if let Some(granted) = self.backend.granted_ttl()
            && granted < self.ttl
        {
            return Err(KeeperError::invalid(format!(
                "the lease backend grants leases of {granted:?}, shorter than the keeper's TTL \
                 of {:?}: give the keeper a TTL of at most {granted:?}, or the backend a longer one",
                self.ttl
            )));
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
        if self.renew_batch_limit == 0 {
            return Err(KeeperError::invalid(
                "the renew batch limit must be at least 1",
            ));
        }
        let interval = self.ttl.mul_f64(self.renew_fraction);
        // Asked once: a backend's way of renewing does not change while it runs.
        let batched = self.backend.renews_in_batches();
        Ok(LeaseKeeper {
            core: Arc::new(KeeperCore {
                backend: self.backend,
                writer: incarnation_writer(&self.owner, &*self.clock),
                owner: self.owner,
                ttl: self.ttl,
                interval,
                jitter: self.jitter,
                // A lease answered later than its TTL after the call was
                // sent may already have lapsed: never wait longer.
                acquire_timeout: self.acquire_timeout.unwrap_or(interval).min(self.ttl),
                release_timeout: self.release_timeout,
                shutdown_timeout: self.shutdown_timeout,
                lock_wait: self.lock_wait,
                write_wait: self.write_wait,
                metrics: self.metrics,
                unsupported: AtomicBool::new(false),
                allow_unleased: self.allow_unleased,
                backend_fault: Mutex::default(),
                locks: Mutex::default(),
                registry: Mutex::default(),
                shutdown: CancellationToken::new(),
                tracker: TaskTracker::new(),
                next_id: AtomicU64::new(0),
                held: AtomicUsize::new(0),
                clock: self.clock,
                pending: Mutex::default(),
                driver_started: AtomicBool::new(false),
                batched,
                batch_limit: self.renew_batch_limit,
                batch_schedule: Mutex::default(),
                batch_wake: Arc::default(),
                unreleased: Mutex::default(),
            }),
        })
    }
}

/// `owner#<random>`: the owner id extended by an id of this keeper, unique
/// across keepers and process incarnations.
fn incarnation_writer(owner: &OwnerId, clock: &dyn Clock) -> OwnerId {
    let nonce = clock.random();
    // An owner id near the length limit keeps its nonce by giving up its
    // tail: the writer must differ between incarnations, not read nicely.
    let suffix = format!("#{nonce:016x}");
    let mut writer = owner.as_str().to_owned();
    while writer.len() + suffix.len() > lease_port::MAX_ID_LEN {
        writer.pop();
    }
    writer.push_str(&suffix);
    // Never fails: the owner was a valid id, and the suffix is ASCII.
    OwnerId::new(writer).unwrap_or_else(|_| owner.clone())
}
