//! The keeper: what a server runs around every run of a session.
//!
//! This file holds [`LeaseKeeper`] and how a run starts (the in-process
//! lock, then the backend's acquire); the rest of the lifecycle lives
//! beside it: `builder` (configuration and its defaults), `state` (what
//! the keeper shares across runs), `run` (one run's shared state and its
//! loss signal), `renew` (the renewal driver and each run's renew loop),
//! `batch` (renewals sent together, for a backend that renews in batches),
//! `guard` (the [`LeaseGuard`] a run holds) and `release` (detached
//! release and shutdown).

mod batch;
mod builder;
mod guard;
mod release;
mod renew;
mod run;
mod state;
mod writes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lease_port::{
    FencingToken, Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease, SystemClock,
};
use tokio::runtime::Handle;
use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::{KeeperError, NoMetrics};
pub use builder::{
    DEFAULT_JITTER, DEFAULT_LOCK_WAIT, DEFAULT_RELEASE_TIMEOUT, DEFAULT_RENEW_BATCH_LIMIT,
    DEFAULT_RENEW_FRACTION, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_WRITE_WAIT, KeeperBuilder,
};
pub use guard::LeaseGuard;
pub use release::ShutdownReport;
pub use run::LossReason;
use run::{Run, RunState};
use state::{HeldSessionLock, KeeperCore, SessionSlot, SlotClaim};
use writes::WriteTracker;
pub use writes::{LossSignal, WriteGate, WritePermit, WriteTask};

/// What one acquire call gave.
enum Granted {
    /// A lease, and when the call that granted it was sent.
    Lease(Lease, Instant),
    /// The backend cannot lease at all.
    Unsupported(LeaseError),
}

/// Locks a mutex, ignoring poisoning.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The lease lifecycle around session runs: in-process lock, acquire,
/// renew, cancel on loss, detached release, bounded shutdown.
///
/// Cheap to clone; clones share everything. See the [crate
/// documentation](crate) for the rules it follows.
#[derive(Clone)]
pub struct LeaseKeeper {
    core: Arc<KeeperCore>,
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeeper")
            .field("owner", &self.core.owner)
            .field("ttl", &self.core.ttl)
            .field("held", &self.core.held.load(Ordering::Relaxed))
            .field("unleased", &self.is_unleased())
            .finish_non_exhaustive()
    }
}

impl LeaseKeeper {
    /// Starts configuring a keeper acquiring leases from `backend` as
    /// `owner`. Build one keeper per owner id and backend in a process: the
    /// in-process lock is per keeper, and a backend hands a live lease back
    /// to its owner, so two keepers under one owner id would both run a
    /// session (their writes are still fenced apart, as their writers
    /// differ, but each would believe it owns the session). `ttl` must be the TTL the backend grants (or less): the
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
            write_wait: DEFAULT_WRITE_WAIT,
            renew_batch_limit: DEFAULT_RENEW_BATCH_LIMIT,
            metrics: Arc::new(NoMetrics),
            allow_unleased: false,
            clock: Arc::new(SystemClock),
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
        &self.core.owner
    }

    /// The writer this keeper's fences name ([`LeaseGuard::fence`]): the
    /// owner followed by `#` and an id of this keeper. Owner ids are often
    /// stable across restarts (a pod name), and a backend hands a live
    /// lease back to its owner under the same token; a store refuses an
    /// equal token from another writer, so a restarted process can never
    /// write beside its previous incarnation under one token.
    pub fn writer(&self) -> &OwnerId {
        &self.core.writer
    }

    /// The TTL the keeper reckons with.
    pub fn ttl(&self) -> Duration {
        self.core.ttl
    }

    /// True once the backend answered `Unsupported`: from then on the
    /// keeper runs every session unleased and never consults it again.
    pub fn is_unleased(&self) -> bool {
        self.core.unsupported.load(Ordering::Acquire)
    }

    /// Why the lease backend's last call failed, while it keeps failing: a
    /// passing fault, a call that timed out, or `Unsupported` from a backend
    /// this keeper may not run without ([`KeeperBuilder::allow_unleased`]).
    /// `None` once a call succeeds again. Servers report it as not ready.
    pub fn backend_fault(&self) -> Option<String> {
        lock(&self.core.backend_fault).clone()
    }

    /// Leases currently held (acquired, not yet lost or released).
    pub fn held_leases(&self) -> usize {
        self.core.held.load(Ordering::Acquire)
    }

    /// Starts a run of `session`: waits (at most the configured lock wait)
    /// for any run of it in this process to end, then acquires its lease.
    /// See [`acquire_within`](Self::acquire_within).
    pub async fn acquire(&self, session: &SessionId) -> Result<LeaseGuard, KeeperError> {
        self.acquire_within(session, self.core.lock_wait).await
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
        self.acquire_traced(session, wait, None).await
    }

    /// [`acquire_within`](Self::acquire_within), with a token above
    /// `floor` ([`SessionLease::acquire_above`]): for a run whose store
    /// refused the token it was granted as below the session's high-water
    /// mark, after the lease authority lost or rewound state. The store's
    /// mark is the floor; a backend that cannot raise its tokens answers
    /// `Rewound`.
    ///
    /// [`SessionLease::acquire_above`]: lease_port::SessionLease::acquire_above
    pub async fn acquire_above_within(
        &self,
        session: &SessionId,
        wait: Duration,
        floor: FencingToken,
    ) -> Result<LeaseGuard, KeeperError> {
        self.acquire_traced(session, wait, Some(floor)).await
    }

    async fn acquire_traced(
        &self,
        session: &SessionId,
        wait: Duration,
        floor: Option<FencingToken>,
    ) -> Result<LeaseGuard, KeeperError> {
        let span = info_span!("lease_keeper.acquire", session = %session, owner = %self.core.owner);
        let result = self
            .acquire_inner(session, wait, floor)
            .instrument(span)
            .await;
        if let Err(e) = &result {
            self.core.metrics.acquire_failed(session, e.kind());
        }
        result
    }

    async fn acquire_inner(
        &self,
        session: &SessionId,
        wait: Duration,
        floor: Option<FencingToken>,
    ) -> Result<LeaseGuard, KeeperError> {
        let core = &self.core;
        if core.shutdown.is_cancelled() {
            return Err(KeeperError::ShuttingDown);
        }
        let claim = SlotClaim::new(core, session);
        let guard = self.lock_session(claim.slot(), session, wait).await?;
        let session_lock = claim.into_held(guard);
        // From here on the held lock travels with the run; every early return
        // drops it and cleans the lock map through `HeldSessionLock`'s drop.

        if core.unsupported.load(Ordering::Acquire) {
            return self.open_run(session, None, None, session_lock);
        }
        let (lease, sent) = match self.call_acquire(session, floor).await? {
            Granted::Lease(lease, sent) => (lease, sent),
            Granted::Unsupported(e) => {
                if !core.unsupported.swap(true, Ordering::AcqRel) {
                    warn!(error = %e, "lease backend does not support leases; running every session unleased from now on");
                }
                return self.open_run(session, None, None, session_lock);
            }
        };
        let (lease, sent) = self.fresh(session, lease, sent).await?;
        self.open_run(session, Some(lease), Some(sent), session_lock)
    }

    /// Takes the session's in-process lock. A run of the session that is
    /// live here is waited for at most `wait` (by default not at all: a
    /// competitor in this process is refused like one elsewhere); one whose
    /// release has begun is waited for until its lock is free, at most the
    /// time its writes and its release may take from when it began —
    /// otherwise a request arriving just after the previous run answered
    /// would be refused for a session nobody is running.
    async fn lock_session(
        &self,
        slot: &Arc<SessionSlot>,
        session: &SessionId,
        wait: Duration,
    ) -> Result<OwnedMutexGuard<()>, KeeperError> {
        let core = &self.core;
        let started = Instant::now();
        let ending_wait = core.write_wait.saturating_add(core.release_timeout);
        loop {
            let changed = slot.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // `None`: no bound representable, wait as long as it takes.
            let live_deadline = started.checked_add(wait);
            let deadline = match slot.ending_since() {
                Some(since) => since
                    .checked_add(ending_wait)
                    .and_then(|end| live_deadline.map(|live| live.max(end))),
                None => live_deadline,
            };
            let refused = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = core.shutdown.cancelled() => return Err(KeeperError::ShuttingDown),
                guard = Arc::clone(&slot.mutex).lock_owned() => return Ok(guard),
                () = &mut changed => {}
                () = refused => {
                    return Err(KeeperError::Busy {
                        session: session.clone(),
                        waited: started.elapsed(),
                        retry_after: core.ttl,
                    });
                }
            }
        }
    }

    /// One acquire call, bounded by the acquire timeout (never more than
    /// the TTL), its answer checked and mapped to keeper errors.
    async fn call_acquire(
        &self,
        session: &SessionId,
        floor: Option<FencingToken>,
    ) -> Result<Granted, KeeperError> {
        let core = &self.core;
        let sent = Instant::now();
        let call = async {
            match floor {
                Some(floor) => {
                    core.backend
                        .acquire_above(session, &core.owner, floor)
                        .await
                }
                None => core.backend.acquire(session, &core.owner).await,
            }
        };
        let answer = timeout(core.acquire_timeout, call).await;
        let lease = match answer {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => {
                return match e.kind() {
                    LeaseErrorKind::Held => Err(KeeperError::LeasedElsewhere {
                        session: session.clone(),
                        holder: e.holder().cloned(),
                        retry_after: e.held_for().unwrap_or(core.ttl),
                        source: e,
                    }),
                    LeaseErrorKind::Unsupported if core.allow_unleased => {
                        core.backend_answered(None);
                        Ok(Granted::Unsupported(e))
                    }
                    LeaseErrorKind::Unsupported | LeaseErrorKind::Transient => {
                        if e.kind() == LeaseErrorKind::Unsupported {
                            warn!(error = %e, "the lease backend says it cannot lease; this keeper may not run unleased, so the run fails");
                        }
                        core.backend_answered(Some(e.to_string()));
                        Err(KeeperError::Unavailable {
                            session: session.clone(),
                            source: e,
                        })
                    }
                    LeaseErrorKind::Rewound => {
                        core.backend_answered(Some(e.to_string()));
                        Err(KeeperError::Rewound {
                            session: session.clone(),
                            source: e,
                        })
                    }
                    _ => Err(KeeperError::Invalid {
                        message: format!("the backend refused session {session}"),
                        source: Some(e),
                    }),
                };
            }
            Err(_) => {
                let e = LeaseError::transient(format!(
                    "acquire did not answer within {:?}",
                    core.acquire_timeout
                ));
                core.backend_answered(Some(e.to_string()));
                return Err(KeeperError::Unavailable {
                    session: session.clone(),
                    source: e,
                });
            }
        };
        core.backend_answered(None);
        if lease.session_id() != session || lease.owner() != &core.owner {
            return Err(KeeperError::invalid(format!(
                "the lease backend granted session {} to {} when asked for session {session} \
                 for {}: it breaks the lease contract",
                lease.session_id(),
                lease.owner(),
                core.owner
            )));
        }
        if let Some(floor) = floor
            && lease.token() <= floor
        {
            // A grant that could never write where its floor came from;
            // it lapses at its expiry.
            return Err(KeeperError::invalid(format!(
                "the backend granted token {} when asked for one above {floor}",
                lease.token()
            )));
        }
        // The lease is reckoned to live `ttl` from when the call was sent;
        // an answer at that moment grants nothing we could use.
        if Instant::now() >= sent + core.ttl {
            return Err(KeeperError::Unavailable {
                session: session.clone(),
                source: LeaseError::transient(format!(
                    "acquire answered after the lease's TTL ({:?}) had passed",
                    core.ttl
                )),
            });
        }
        Ok(Granted::Lease(lease, sent))
    }

    /// Makes sure a run never writes under the token of an earlier run of
    /// this keeper whose lease was not released: the backend may still
    /// hold that lease for us, and a same-owner acquire hands its token
    /// back. Such a grant is released and acquired again; if the backend
    /// still answers a token no greater, the run fails `Unavailable` (the
    /// old lease lapses at its expiry, after which a new token is granted).
    async fn fresh(
        &self,
        session: &SessionId,
        lease: Lease,
        sent: Instant,
    ) -> Result<(Lease, Instant), KeeperError> {
        let core = &self.core;
        let Some(stale) = lock(&core.unreleased).get(session).copied() else {
            return Ok((lease, sent));
        };
        if lease.token() > stale {
            lock(&core.unreleased).remove(session);
            return Ok((lease, sent));
        }
        debug!(session = %session, token = %lease.token(), "re-granted the token of a lease not released; releasing it first");
        let released = timeout(core.release_timeout, core.backend.release(&lease)).await;
        let released = match released {
            Ok(r) => r,
            Err(_) => Err(LeaseError::transient(format!(
                "release did not answer within {:?}",
                core.release_timeout
            ))),
        };
        core.metrics.released(session, released.is_ok());
        if let Err(e) = released {
            return Err(KeeperError::Unavailable {
                session: session.clone(),
                source: e,
            });
        }
        match self.call_acquire(session, None).await? {
            Granted::Lease(lease, sent) if lease.token() > stale => {
                lock(&core.unreleased).remove(session);
                Ok((lease, sent))
            }
            Granted::Lease(lease, _) => {
                // Ours again under the old token: leave it to lapse.
                core.remember_unreleased(&lease);
                Err(KeeperError::Unavailable {
                    session: session.clone(),
                    source: LeaseError::transient(format!(
                        "the backend granted token {} again, not a token above it",
                        lease.token()
                    )),
                })
            }
            Granted::Unsupported(e) => Err(KeeperError::Invalid {
                message: format!(
                    "the backend granted session {session}, then called leases unsupported"
                ),
                source: Some(e),
            }),
        }
    }

    /// Registers a run and, when leased, starts its renew task.
    fn open_run(
        &self,
        session: &SessionId,
        lease: Option<Lease>,
        sent: Option<Instant>,
        session_lock: HeldSessionLock,
    ) -> Result<LeaseGuard, KeeperError> {
        let core = &self.core;
        let (lease_tx, lease_rx) = watch::channel(lease.clone());
        let run = Arc::new(Run {
            id: core.next_id.fetch_add(1, Ordering::Relaxed),
            session: session.clone(),
            stop: CancellationToken::new(),
            lost: CancellationToken::new(),
            released: CancellationToken::new(),
            state: Mutex::new(RunState {
                current: lease.clone(),
                loss: None,
                deadline: lease.as_ref().and(sent).map(|sent| sent + core.ttl),
            }),
            renew_task: Mutex::new(None),
            release_started: AtomicBool::new(false),
            counted: AtomicBool::new(false),
            lease_tx,
            writes: WriteTracker::default(),
            margin: core.effect_margin(),
        });
        let handle = Handle::current();
        let leased = lease.is_some();
        {
            let mut reg = lock(&core.registry);
            if !reg.shutting_down {
                reg.open.insert(run.id, Arc::clone(&run));
            } else {
                drop(reg);
                // Shutdown began while we acquired: give the lease back at
                // once, on a detached task, and refuse the run.
                let guard = LeaseGuard {
                    core: Arc::clone(core),
                    run,
                    lease_rx,
                    session_lock: Some(session_lock),
                    handle,
                };
                drop(guard);
                return Err(KeeperError::ShuttingDown);
            }
        }
        if let (Some(lease), Some(sent)) = (lease, sent) {
            run.counted.store(true, Ordering::Release);
            core.set_held_gauge(true);
            core.metrics.acquired(session);
            debug!(session = %session, token = %lease.token(), "lease acquired");
            // The run's renew task is started by the keeper's driver shortly
            // before its first renewal is due: a run shorter than that
            // never costs a task.
            if core.batched {
                core.reschedule([batch::BatchSlot {
                    run: Arc::clone(&run),
                    deadline: sent + core.ttl,
                    due: sent + core.next_interval(),
                }]);
            } else {
                lock(&core.pending).insert(run.id, (sent, Arc::clone(&run)));
            }
            core.ensure_driver(&handle);
        } else {
            debug_assert!(!leased);
            debug!(session = %session, "running unleased");
        }
        Ok(LeaseGuard {
            core: Arc::clone(core),
            run,
            lease_rx,
            session_lock: Some(session_lock),
            handle,
        })
    }
}
