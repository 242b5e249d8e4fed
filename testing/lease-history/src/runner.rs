//! The workload: workers that acquire, write, renew and release under
//! faults, every step recorded.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_port::{
    Clock, FencingToken, Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease,
};
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
    /// How a fault injector replaces every client above mid-run, as an
    /// operator restarts every server (clones share it).
    pub restarts: Restarts,
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
            restarts: Restarts::default(),
        }
    }
}

/// One incarnation of the clients a run goes through (see
/// [`Target`] for what each field is).
#[derive(Clone)]
pub struct Clients {
    /// Worker `i` uses `leases[i % leases.len()]`.
    pub leases: Vec<Arc<dyn SessionLease>>,
    /// Where sessions are created and, at the end, read back from.
    pub store: Arc<dyn SessionStore>,
    /// Worker `i` writes through `writers[i % writers.len()]`; when empty,
    /// straight to `store`.
    pub writers: Vec<Arc<dyn Writer>>,
}

/// Restarts of every client of a running workload, for a fault injector:
/// the operator's restart of every server after state went back (to
/// accept it), or a restart around some other change.
///
/// [`restart`](Self::restart) installs new clients of the next epoch:
/// every operation from then on goes through them (each is recorded with
/// its [`epoch`](crate::Op::epoch)), and a worker holding a lease from an
/// earlier epoch drops it unreleased, as a restarted process has lost it,
/// and acquires afresh. Clones share one sequence of epochs; a
/// [`Target`]'s is set to its own clients, epoch 0, when [`run`] starts.
#[derive(Clone, Default)]
pub struct Restarts {
    inner: Arc<RestartsInner>,
}

#[derive(Default)]
struct RestartsInner {
    current: Mutex<Option<Arc<Generation>>>,
    epoch: AtomicU32,
    sessions: Mutex<Vec<SessionId>>,
}

/// Clients of one epoch, and how many operations are running through them.
struct Generation {
    epoch: u32,
    clients: Clients,
    running: AtomicUsize,
}

/// An operation running through a generation's clients.
struct Running<'a>(&'a Generation);

impl Generation {
    fn enter(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::SeqCst);
        Running(self)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Restarts {
    /// The epoch of the clients in use now.
    pub fn epoch(&self) -> u32 {
        self.inner.epoch.load(Ordering::SeqCst)
    }

    /// Installs `clients` as the next epoch's and returns that epoch, once
    /// every operation still running through earlier clients has ended
    /// (they may then be dropped). The run's sessions are created in the
    /// new store first where they are missing. `accepts`: the
    /// [`Rewind`](crate::Rewind) (its index from [`Recorder::rewind`]) that
    /// this restart accepts, recorded as accepted by the new epoch.
    pub async fn restart(
        &self,
        recorder: &Recorder,
        clients: Clients,
        accepts: Option<usize>,
    ) -> Result<u32, String> {
        if clients.leases.is_empty() {
            return Err("a restart needs at least one lease handle".into());
        }
        let sessions = lock(&self.inner.sessions).clone();
        for s in &sessions {
            create(&*clients.store, s)
                .await
                .map_err(|e| format!("create session {s} in the new store: {e}"))?;
        }
        let old = {
            let mut current = lock(&self.inner.current);
            let old = current
                .take()
                .ok_or("a restart before the run began, or after it ended")?;
            let epoch = old.epoch + 1;
            *current = Some(Arc::new(Generation {
                epoch,
                clients,
                running: AtomicUsize::new(0),
            }));
            self.inner.epoch.store(epoch, Ordering::SeqCst);
            recorder.restarted(epoch, accepts);
            old
        };
        // Every call is bounded by the workload's call timeout; a minute
        // is far beyond any.
        let deadline = Instant::now() + Duration::from_secs(60);
        while old.running.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return Err(format!(
                    "operations through the clients of epoch {} still running a minute after the restart",
                    old.epoch
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(old.epoch + 1)
    }

    fn begin(&self, clients: Clients, sessions: &[SessionId]) {
        *lock(&self.inner.sessions) = sessions.to_vec();
        *lock(&self.inner.current) = Some(Arc::new(Generation {
            epoch: 0,
            clients,
            running: AtomicUsize::new(0),
        }));
        self.inner.epoch.store(0, Ordering::SeqCst);
    }

    fn current(&self) -> Option<Arc<Generation>> {
        lock(&self.inner.current).clone()
    }

    fn end(&self) -> Option<Arc<Generation>> {
        lock(&self.inner.current).take()
    }
}

async fn create(store: &dyn SessionStore, session: &SessionId) -> Result<(), StoreError> {
    retry(|| async {
        match store.create(session).await {
            Err(e) if e.kind() == StoreErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    })
    .await
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
    /// Renewals so far, by every worker: every other one is a batch.
    renewals: AtomicU64,
}

impl Shared {
    /// The clients in use now.
    fn generation(&self) -> Option<Arc<Generation>> {
        self.target.restarts.current()
    }
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
        create(&*target.store, s).await?;
    }
    target.restarts.begin(
        Clients {
            leases: target.leases.clone(),
            store: Arc::clone(&target.store),
            writers: target.writers.clone(),
        },
        &sessions,
    );
    let recorder = Recorder::new();
    let shared = Arc::new(Shared {
        workload: workload.clone(),
        target,
        sessions,
        recorder: recorder.clone(),
        started: AtomicU64::new(0),
        renewals: AtomicU64::new(0),
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
    let last = shared
        .target
        .restarts
        .end()
        .ok_or(RunError::Invalid("the run's clients were taken away"))?;
    for writer in &last.clients.writers {
        writer.settle().await;
    }
    for s in &shared.sessions {
        let log = retry(|| read_log(&*last.clients.store, s)).await?;
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
    /// The state went back (or may): refused, and so will the next call be
    /// until the clients are restarted.
    Rewound,
    Unknown,
}

/// How a write ended, for the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Yes,
    /// Refused by the fence; the store's mark, when it said.
    Fenced(Option<u64>),
    Rewound,
    Unknown,
}

impl Written {
    /// The worker must stop acting for the session.
    fn refused(self) -> bool {
        matches!(self, Written::Fenced(_) | Written::Rewound)
    }
}

async fn worker(i: usize, shared: Arc<Shared>) {
    let w = &shared.workload;
    let mut rng = Rng::new(w.seed).fork(i as u64);
    let Ok(owner) = OwnerId::new(format!("w{i}")) else {
        return;
    };
    // A session's mark that refused a fresh grant's first write: the next
    // acquire of it asks for a token above (after a lease authority lost
    // its tokens, as a session server does).
    let mut floors: HashMap<SessionId, u64> = HashMap::new();
    while shared.take_op() {
        let session = &shared.sessions[rng.below(shared.sessions.len() as u64) as usize];
        let Some(generation) = shared.generation() else {
            return;
        };
        let me = Actor {
            worker: i as u32,
            owner: &owner,
            shared: &shared,
            generation: &generation,
        };
        let mut held = match me.acquire(session, floors.remove(session)).await {
            Granted::Yes(held) => held,
            Granted::Rewound => {
                // Refused until the clients restart: no point asking again
                // at once.
                tokio::time::sleep(w.ttl / 2).await;
                continue;
            }
            Granted::Refused | Granted::Unknown => {
                tokio::time::sleep(rng.between(Duration::ZERO, w.ttl / 8)).await;
                continue;
            }
        };
        let writes = 1 + rng.below(u64::from(w.max_writes.max(1)));
        let mut lost = false;
        // The clients were restarted: the lease went with the process that
        // held it, never to be renewed, written under or released.
        let mut abandoned = false;
        let mut first_write = true;
        let mut note_fence = |written: Written, lease: &Lease, first: &mut bool| {
            if let Written::Fenced(Some(mark)) = written
                && *first
                && mark > lease.token().get()
            {
                floors.insert(session.clone(), mark);
            }
            *first = false;
        };
        for _ in 0..writes {
            if me.stale() {
                abandoned = true;
                break;
            }
            if rng.per_mille(w.pause_per_mille) {
                // The stale writer: stops past its TTL, then carries on.
                let pause = shared
                    .recorder
                    .fault(FaultKind::HolderPause, owner.as_str());
                tokio::time::sleep(rng.between(w.ttl * 5 / 4, w.ttl * 2)).await;
                shared.recorder.heal(pause);
                if me.stale() {
                    abandoned = true;
                    break;
                }
                if !shared.take_op() {
                    break;
                }
                let written = me.write(&held.lease).await;
                note_fence(written, &held.lease, &mut first_write);
                let fenced = written.refused();
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
                    Granted::Refused | Granted::Rewound => {
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
            let written = me.write(&held.lease).await;
            note_fence(written, &held.lease, &mut first_write);
            if written.refused() {
                lost = true;
                break;
            }
            let gap = rng.between(Duration::ZERO, w.ttl / 20);
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
        if abandoned || me.stale() {
            continue;
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
    owner: &'a OwnerId,
    shared: &'a Shared,
    generation: &'a Generation,
}

impl Actor<'_> {
    /// The clients were restarted since this actor's were current.
    fn stale(&self) -> bool {
        self.shared.target.restarts.epoch() != self.generation.epoch
    }

    fn leases(&self) -> &dyn SessionLease {
        let leases = &self.generation.clients.leases;
        &*leases[self.worker as usize % leases.len()]
    }

    fn invoke(&self, session: &SessionId, kind: OpKind, lease: Option<&Lease>) -> Invocation {
        self.shared
            .recorder
            .invoke(
                self.worker,
                self.owner,
                session,
                kind,
                lease.map(Lease::token),
            )
            .in_epoch(self.generation.epoch)
    }

    /// Acquires `session`, above `floor` when given.
    async fn acquire(&self, session: &SessionId, floor: Option<u64>) -> Granted {
        let _running = self.generation.enter();
        let inv = self.invoke(session, OpKind::Acquire, None);
        let leases = self.leases();
        match floor {
            Some(floor) => {
                let fut = leases.acquire_above(session, self.owner, FencingToken::new(floor));
                self.granted(inv, fut).await
            }
            None => self.granted(inv, leases.acquire(session, self.owner)).await,
        }
    }

    /// Renews `lease`; every other renewal of the workers is a batch of one
    /// (`renew_many`), so that the faults reach batch renewal too, which
    /// some backends prove otherwise than a single renew (Kubernetes by a
    /// list or a watch of the owner's sessions).
    async fn renew(&self, lease: &Lease) -> Granted {
        let _running = self.generation.enter();
        let inv = self.invoke(lease.session_id(), OpKind::Renew, Some(lease));
        let leases = self.leases();
        if self
            .shared
            .renewals
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(2)
        {
            return self.granted(inv, leases.renew(lease)).await;
        }
        let batch = async move {
            let mut answers = leases.renew_many(std::slice::from_ref(lease)).await;
            match (answers.pop(), answers.is_empty()) {
                (Some(answer), true) => answer,
                _ => Err(LeaseError::invalid(
                    "renew_many answered other than one result for one lease",
                )),
            }
        };
        self.granted(inv, batch).await
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
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Rewound => {
                (Outcome::Rewound, Granted::Rewound)
            }
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Transient => {
                (Outcome::Ambiguous(Ambiguity::Transient), Granted::Unknown)
            }
            Ok(Err(_)) => (Outcome::Ambiguous(Ambiguity::Other), Granted::Unknown),
        };
        self.shared.recorder.complete(inv, outcome);
        granted
    }

    async fn write(&self, lease: &Lease) -> Written {
        let _running = self.generation.enter();
        let inv = self.invoke(lease.session_id(), OpKind::Write, Some(lease));
        let payload = json!({
            "op": inv.id(),
            "owner": self.owner.as_str(),
            "token": lease.token().get(),
        });
        let clients = &self.generation.clients;
        let append = async {
            match clients
                .writers
                .get(self.worker as usize % clients.writers.len().max(1))
            {
                Some(writer) => {
                    writer
                        .append(lease.session_id(), WriteFence::from(lease), &payload)
                        .await
                }
                None => clients
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
                Ok(Ok(())) => (Outcome::Done, Written::Yes),
                Ok(Err(e)) if e.kind() == StoreErrorKind::Fenced => {
                    let mark = match &e {
                        StoreError::Fenced { high_water, .. } => Some(high_water.get()),
                        _ => None,
                    };
                    (Outcome::Fenced, Written::Fenced(mark))
                }
                Ok(Err(e)) if e.kind() == StoreErrorKind::Rewound => {
                    (Outcome::Rewound, Written::Rewound)
                }
                Ok(Err(_)) => (Outcome::Ambiguous(Ambiguity::Other), Written::Unknown),
                Err(_) => (Outcome::Ambiguous(Ambiguity::Timeout), Written::Unknown),
            };
        self.shared.recorder.complete(inv, outcome);
        result
    }

    async fn release(&self, lease: &Lease) {
        let _running = self.generation.enter();
        let inv = self.invoke(lease.session_id(), OpKind::Release, Some(lease));
        let outcome = match tokio::time::timeout(
            self.shared.workload.call_timeout,
            self.leases().release(lease),
        )
        .await
        {
            Ok(Ok(())) => Outcome::Done,
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Rewound => Outcome::Rewound,
            Ok(Err(e)) if e.kind() == LeaseErrorKind::Transient => {
                Outcome::Ambiguous(Ambiguity::Transient)
            }
            Ok(Err(_)) => Outcome::Ambiguous(Ambiguity::Other),
            Err(_) => Outcome::Ambiguous(Ambiguity::Timeout),
        };
        self.shared.recorder.complete(inv, outcome);
    }
}
