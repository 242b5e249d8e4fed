//! The workload: workers that acquire, write, renew and release under
//! faults, every step recorded.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_port::{Clock, Lease, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use serde_json::json;
use session_store::{SessionStore, StoreError, StoreErrorKind, WriteFence};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::history::{
    Ambiguity, FaultKind, History, Invocation, Logged, OpKind, Outcome, Recorder,
};
use crate::rng::Rng;

/// How much work a run does and how it is shaped.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Operations to run in all (a cycle in progress may finish a few more).
    pub ops: u64,
    /// Fixes every choice of every worker and of the fault injector.
    pub seed: u64,
    /// Concurrent workers, each acting as its own owner `w<i>`.
    pub workers: usize,
    /// Sessions they compete for.
    pub sessions: usize,
    /// The backend's TTL: how long a holder pauses, and when it renews.
    pub ttl: Duration,
    /// A call not answered within this is dropped and recorded ambiguous.
    pub call_timeout: Duration,
    /// Chance, in thousandths, that a holder pauses past its TTL before a
    /// write and then writes and renews as if it still held the lease.
    pub pause_per_mille: u32,
    /// Most writes per hold.
    pub max_writes: u32,
    /// Mean time between injected faults.
    pub fault_every: Duration,
    /// How often `on_progress` is called.
    pub progress_every: Duration,
}

impl Workload {
    /// `ops` operations from `seed`, with defaults for a backend with a
    /// short TTL.
    pub fn new(ops: u64, seed: u64) -> Self {
        Workload {
            ops,
            seed,
            workers: 4,
            sessions: 2,
            ttl: Duration::from_millis(200),
            call_timeout: Duration::from_secs(2),
            pause_per_mille: 20,
            max_writes: 6,
            fault_every: Duration::from_millis(300),
            progress_every: Duration::from_secs(5),
        }
    }
}

/// What the workers run against.
#[derive(Clone)]
pub struct Target {
    /// The lease handles; worker `i` uses `leases[i % leases.len()]`. One
    /// shared handle, or one per worker (its own connection, its own file
    /// descriptors).
    pub leases: Vec<Arc<dyn SessionLease>>,
    /// The store: sessions are created in it before the run and read back
    /// from it after.
    pub store: Arc<dyn SessionStore>,
    /// Where the workers' writes go: worker `i` writes through
    /// `writers[i % writers.len()]` (a holder process that writes the store
    /// itself, say); when empty, straight to `store`.
    pub writers: Vec<Arc<dyn Writer>>,
    /// The lease authority's wall clock as the workers can read it: the
    /// time left on a grant is its expiry minus this clock's reading at
    /// invocation.
    pub clock: Arc<dyn Clock>,
}

impl Target {
    /// Workers using `leases` (see [`leases`](Self::leases)) and writing
    /// straight to `store`, with grants timed by `clock`.
    pub fn new(
        leases: Vec<Arc<dyn SessionLease>>,
        store: Arc<dyn SessionStore>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Target {
            leases,
            store,
            writers: Vec::new(),
            clock,
        }
    }
}

/// Appends one event under a fence on a worker's behalf: the store itself,
/// or something standing between the worker and the store (a holder in
/// another process).
#[async_trait]
pub trait Writer: Send + Sync {
    /// Appends `payload` to `session` under `fence`. Only
    /// [`StoreErrorKind::Fenced`] counts as a refusal; any other error
    /// leaves the write's fate unknown.
    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        payload: &serde_json::Value,
    ) -> Result<(), StoreError>;

    /// Called once the workers are done, before the store is read back:
    /// afterwards no write of this writer may land. A writer with work of
    /// its own still running (a holder process finishing a call its
    /// worker gave up on) stops it here.
    async fn settle(&self) {}
}

/// Injects faults into a running target.
#[async_trait]
pub trait FaultInjector: Send {
    /// Injects one fault chosen with `rng`, records it in `recorder`, and
    /// returns once it is healed. An error ends the run.
    async fn inject(&mut self, rng: &mut Rng, recorder: &Recorder) -> Result<(), String>;
}

/// Where a run stands, for a progress line.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Operations started so far.
    pub ops: u64,
    /// Operations the run aims at.
    pub target: u64,
    /// Faults injected and healed so far.
    pub faults: usize,
    /// Time since the run began.
    pub elapsed: Duration,
}

impl Progress {
    /// Operations per second so far.
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Time left at the rate so far.
    pub fn remaining(&self) -> Duration {
        let left = self.target.saturating_sub(self.ops) as f64;
        Duration::from_secs_f64((left / self.rate().max(1e-9)).min(1e7))
    }
}

/// Why a run could not produce a history.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The store could not be prepared or read back.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A fault could not be injected or healed.
    #[error("fault injection: {0}")]
    Fault(String),
    /// A worker panicked.
    #[error("worker failed: {0}")]
    Worker(String),
    /// Bad workload (no workers, no sessions, no lease handle).
    #[error("invalid workload: {0}")]
    Invalid(&'static str),
}

struct Shared {
    workload: Workload,
    target: Target,
    sessions: Vec<SessionId>,
    recorder: Recorder,
    started: AtomicU64,
}

impl Shared {
    /// Reserves one operation of the budget.
    fn take_op(&self) -> bool {
        self.started.fetch_add(1, Ordering::Relaxed) < self.workload.ops
    }
}

/// Runs `workload` against `target`, with `faults` injected alongside,
/// then reads back what the store kept, and returns the history.
pub async fn run(
    workload: &Workload,
    target: Target,
    faults: Option<Box<dyn FaultInjector>>,
    mut on_progress: Option<&mut (dyn FnMut(&Progress) + Send)>,
) -> Result<History, RunError> {
    if workload.workers == 0 || workload.sessions == 0 {
        return Err(RunError::Invalid(
            "needs at least one worker and one session",
        ));
    }
    if target.leases.is_empty() {
        return Err(RunError::Invalid("needs at least one lease handle"));
    }
    let sessions: Vec<SessionId> = (0..workload.sessions)
        .map(|i| SessionId::new(format!("s{i}")).map_err(|_| RunError::Invalid("session id")))
        .collect::<Result<_, _>>()?;
    for s in &sessions {
        retry(|| async {
            match target.store.create(s).await {
                Err(e) if e.kind() == StoreErrorKind::AlreadyExists => Ok(()),
                other => other,
            }
        })
        .await?;
    }
    let recorder = Recorder::new();
    let shared = Arc::new(Shared {
        workload: workload.clone(),
        target,
        sessions,
        recorder: recorder.clone(),
        started: AtomicU64::new(0),
    });
    let begun = Instant::now();
    let mut workers = JoinSet::new();
    for i in 0..workload.workers {
        workers.spawn(worker(i, Arc::clone(&shared)));
    }
    let done = Arc::new((AtomicBool::new(false), Notify::new()));
    let injector = faults.map(|f| {
        let rng = Rng::new(workload.seed).fork(u64::MAX);
        tokio::spawn(inject_faults(
            f,
            rng,
            recorder.clone(),
            workload.fault_every,
            Arc::clone(&done),
        ))
    });
    let mut ticker = tokio::time::interval(workload.progress_every);
    ticker.tick().await;
    let mut worker_error = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Err(e)) => worker_error = Some(e.to_string()),
                Some(Ok(())) => {}
            },
            _ = ticker.tick() => {
                if let Some(cb) = on_progress.as_mut() {
                    cb(&Progress {
                        ops: shared.started.load(Ordering::Relaxed).min(workload.ops),
                        target: workload.ops,
                        faults: recorder.fault_count(),
                        elapsed: begun.elapsed(),
                    });
                }
            }
        }
    }
    done.0.store(true, Ordering::SeqCst);
    done.1.notify_waiters();
    if let Some(task) = injector {
        task.await
            .map_err(|e| RunError::Fault(e.to_string()))?
            .map_err(RunError::Fault)?;
    }
    if let Some(e) = worker_error {
        return Err(RunError::Worker(e));
    }
    for writer in &shared.target.writers {
        writer.settle().await;
    }
    for s in &shared.sessions {
        let log = retry(|| read_log(&*shared.target.store, s)).await?;
        recorder.store_log(s, log);
    }
    Ok(recorder.history())
}

/// A store that was just restarted or partitioned may need a moment.
async fn retry<T, F, Fut>(mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Err(e) if attempt < 40 && !matches!(e.kind(), StoreErrorKind::Invalid) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

async fn read_log(
    store: &dyn SessionStore,
    session: &SessionId,
) -> Result<Vec<Logged>, StoreError> {
    let mut log = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read(session, from, 1000).await?;
        for e in &page.events {
            let op = e
                .payload
                .get("op")
                .and_then(|v| v.as_u64())
                .unwrap_or(u64::MAX);
            log.push(Logged { seq: e.seq, op });
        }
        match page.next_seq {
            Some(next) => from = next,
            None => return Ok(log),
        }
    }
}

async fn inject_faults(
    mut faults: Box<dyn FaultInjector>,
    mut rng: Rng,
    recorder: Recorder,
    every: Duration,
    done: Arc<(AtomicBool, Notify)>,
) -> Result<(), String> {
    loop {
        let wait = rng.between(every / 2, every * 3 / 2);
        let notified = done.1.notified();
        if done.0.load(Ordering::SeqCst) {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = notified => return Ok(()),
        }
        faults.inject(&mut rng, &recorder).await?;
    }
}

/// A lease held by a worker and when, on its monotonic clock, it must be
/// taken as lost.
struct Held {
    lease: Lease,
    deadline: Instant,
}

enum Granted {
    Yes(Held),
    Refused,
    Unknown,
}

async fn worker(i: usize, shared: Arc<Shared>) {
    let w = &shared.workload;
    let mut rng = Rng::new(w.seed).fork(i as u64);
    let Ok(owner) = OwnerId::new(format!("w{i}")) else {
        return;
    };
    let me = Actor {
        worker: i as u32,
        owner,
        shared: &shared,
        leases: &*shared.target.leases[i % shared.target.leases.len()],
    };
    while shared.take_op() {
        let session = &shared.sessions[rng.below(shared.sessions.len() as u64) as usize];
        let Granted::Yes(mut held) = me.acquire(session).await else {
            tokio::time::sleep(rng.between(Duration::ZERO, w.ttl / 8)).await;
            continue;
        };
        let writes = 1 + rng.below(u64::from(w.max_writes.max(1)));
        let mut lost = false;
        for _ in 0..writes {
            if rng.per_mille(w.pause_per_mille) {
                // The stale writer: stops past its TTL, then carries on.
                let pause = shared
                    .recorder
                    .fault(FaultKind::HolderPause, me.owner.as_str());
                tokio::time::sleep(rng.between(w.ttl * 5 / 4, w.ttl * 2)).await;
                shared.recorder.heal(pause);
                if !shared.take_op() {
                    break;
                }
                let fenced = me.write(&held.lease).await == Some(false);
                if !shared.take_op() {
                    break;
                }
                match me.renew(&held.lease).await {
                    Granted::Yes(h) if !fenced => held = h,
                    _ => {
                        lost = true;
                        break;
                    }
                }
                continue;
            }
            if Instant::now() + w.ttl / 2 >= held.deadline {
                if !shared.take_op() {
                    break;
                }
                match me.renew(&held.lease).await {
                    Granted::Yes(h) => held = h,
                    Granted::Refused => {
                        lost = true;
                        break;
                    }
                    Granted::Unknown => {}
                }
            }
            if Instant::now() >= held.deadline {
                lost = true;
                break;
            }
            if !shared.take_op() {
                break;
            }
            if me.write(&held.lease).await == Some(false) {
                lost = true;
                break;
            }
            let gap = rng.between(Duration::ZERO, w.ttl / 20);
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
        // Part of the cycle even when the budget is spent: a hold left to
        // expire would only slow the last takeovers. After a loss, half
        // the time, the release comes anyway, stale, as a detached release
        // racing a takeover does.
        if !lost || rng.below(2) == 0 {
            me.release(&held.lease).await;
        }
    }
}

struct Actor<'a> {
    worker: u32,
    owner: OwnerId,
    shared: &'a Shared,
    leases: &'a dyn SessionLease,
}

impl Actor<'_> {
    fn invoke(&self, session: &SessionId, kind: OpKind, lease: Option<&Lease>) -> Invocation {
        self.shared.recorder.invoke(
            self.worker,
            &self.owner,
            session,
            kind,
            lease.map(Lease::token),
        )
    }

    async fn acquire(&self, session: &SessionId) -> Granted {
        let inv = self.invoke(session, OpKind::Acquire, None);
        let fut = self.leases.acquire(session, &self.owner);
        self.granted(inv, fut).await
    }

    async fn renew(&self, lease: &Lease) -> Granted {
        let inv = self.invoke(lease.session_id(), OpKind::Renew, Some(lease));
        let fut = self.leases.renew(lease);
        self.granted(inv, fut).await
    }

    async fn granted(
        &self,
        inv: Invocation,
        fut: impl Future<Output = Result<Lease, lease_port::LeaseError>>,
    ) -> Granted {
        let w = &self.shared.workload;
        // Read after invocation: the grant is counted from no later than
        // the backend's own reading, so the time left is never overstated.
        let now = self.shared.target.clock.now();
        let (outcome, granted) = match tokio::time::timeout(w.call_timeout, fut).await {
            Err(_) => (Outcome::Ambiguous(Ambiguity::Timeout), Granted::Unknown),
            Ok(Ok(lease)) => {
                let valid_for = lease
                    .expiry()
                    .duration_since(now)
                    .unwrap_or(Duration::ZERO)
                    .min(w.ttl);
                let token = lease.token().get();
                let deadline = inv.instant() + valid_for;
                (
                    Outcome::Granted { token, valid_for },
                    Granted::Yes(Held { lease, deadline }),
                )
            }
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Held => (Outcome::Held, Granted::Refused),
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Transient => {
                (Outcome::Ambiguous(Ambiguity::Transient), Granted::Unknown)
            }
            Ok(Err(_)) => (Outcome::Ambiguous(Ambiguity::Other), Granted::Unknown),
        };
        self.shared.recorder.complete(inv, outcome);
        granted
    }

    /// `Some(true)` written, `Some(false)` fenced, `None` unknown.
    async fn write(&self, lease: &Lease) -> Option<bool> {
        let inv = self.invoke(lease.session_id(), OpKind::Write, Some(lease));
        let payload = json!({
            "op": inv.id(),
            "owner": self.owner.as_str(),
            "token": lease.token().get(),
        });
        let target = &self.shared.target;
        let append = async {
            match target
                .writers
                .get(self.worker as usize % target.writers.len().max(1))
            {
                Some(writer) => {
                    writer
                        .append(lease.session_id(), WriteFence::from(lease), &payload)
                        .await
                }
                None => target
                    .store
                    .append(
                        lease.session_id(),
                        WriteFence::from(lease),
                        std::slice::from_ref(&payload),
                    )
                    .await
                    .map(drop),
            }
        };
        let (outcome, result) =
            match tokio::time::timeout(self.shared.workload.call_timeout, append).await {
                Ok(Ok(())) => (Outcome::Done, Some(true)),
                Ok(Err(e)) if e.kind() == StoreErrorKind::Fenced => (Outcome::Fenced, Some(false)),
                Ok(Err(_)) => (Outcome::Ambiguous(Ambiguity::Other), None),
                Err(_) => (Outcome::Ambiguous(Ambiguity::Timeout), None),
            };
        self.shared.recorder.complete(inv, outcome);
        result
    }

    async fn release(&self, lease: &Lease) {
        let inv = self.invoke(lease.session_id(), OpKind::Release, Some(lease));
        let outcome = match tokio::time::timeout(
            self.shared.workload.call_timeout,
            self.leases.release(lease),
        )
        .await
        {
            Ok(Ok(())) => Outcome::Done,
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Transient => {
                Outcome::Ambiguous(Ambiguity::Transient)
            }
            Ok(Err(_)) => Outcome::Ambiguous(Ambiguity::Other),
            Err(_) => Outcome::Ambiguous(Ambiguity::Timeout),
        };
        self.shared.recorder.complete(inv, outcome);
    }
}
