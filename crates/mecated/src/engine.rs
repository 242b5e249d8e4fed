//! The run engine: lease, claim the store, drive the agent, fence every
//! write, release.
//!
//! Nothing here knows about HTTP: operations answer [`EngineError`], and
//! the HTTP edge ([`crate::http`]) decides what status and code a client
//! sees. Events leave the engine as the store holds them
//! ([`StoredEvent`]), so a live stream and a paged read show the same thing.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{KeeperError, KeeperErrorKind, LeaseGuard, LeaseKeeper, LossReason, WriteGate};
use lease_port::{FencingToken, SessionId};
use serde_json::Value;
use session_store::{
    AppendReceipt, ListCursor, Page, SessionPage, SessionStore, StoreError, StoreErrorKind,
    StoredEvent, WriteFence,
};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, field, info, info_span, warn};

use crate::agent::{Agent, AgentError, EventSink, RunLease, SinkError, TranscriptScope, Turn};
use crate::error::error_chain;
use crate::metrics::{Metrics, RunOutcome};
use crate::transcript::{DEFAULT_TRANSCRIPT_CACHE_BYTES, Transcript, TranscriptCache};

mod follow;
mod interrupted;
mod lease_wait;
mod remote_cancel;
mod replicas;
mod resume;
mod store_watch;
mod tails;
mod transcript_read;

pub use follow::{
    FOLLOW_QUIET_CHECK, Follow, FollowEnd, FollowItem, RUN_CUT_OFF, RUN_ENDED, RUN_STARTED,
};
use interrupted::{ClaimFor, ClaimWritten, Claimed};
pub use interrupted::{INTERRUPTED, MAX_SHUTDOWN_RESUMPTIONS, TAKEOVER};
pub use lease_wait::{MAX_RUN_WAIT, RUN_WAIT_RETRY, RUN_WAIT_SAFETY};
use remote_cancel::CancelBaseline;
pub use remote_cancel::{CANCEL_SAFETY_READ, CancelOutcome};
pub use resume::{DEFAULT_RESUME_ATTEMPTS, Resumption, SWEEP_RUNS, SweepReport};

/// Why an engine operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Shutdown began: no new runs or deletions.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The server is draining before it shuts down: the runs in progress
    /// finish, no new one starts here. Nothing was done.
    #[error(
        "this server is draining before it shuts down and starts no new runs: nothing was \
         done; send the run again (another replica takes it)"
    )]
    Draining,
    /// Unleased, and another process holds the store's single-process lock.
    #[error(
        "this deployment runs unleased and another process holds <STORE_DIR>/.mecated.lock: \
         only that process may run or delete sessions"
    )]
    NotExclusive,
    /// The lease keeper refused or failed (held elsewhere, busy, backend
    /// unavailable, shutting down).
    #[error(transparent)]
    Lease(#[from] KeeperError),
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run was claimed (its start is in the log) but its transcript
    /// could not be read, so it ended as failed before its agent saw the
    /// input. Something was done: never "nothing was done, retry".
    #[error(
        "the run was claimed and ended as failed before its input was run (reading the transcript: {0})"
    )]
    FailedAfterClaim(#[source] StoreError),
}

/// The server's state and the run engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    store: Arc<dyn SessionStore>,
    /// The store's last `Rewound` answer, while it lasts (for `/readyz`).
    store_fault: Arc<store_watch::StoreFault>,
    keeper: LeaseKeeper,
    agent: Arc<dyn Agent>,
    /// What the agent asked to be handed, read once: the cache's entries
    /// are shaped by it.
    scope: TranscriptScope,
    metrics: Arc<Metrics>,
    runs: Mutex<HashMap<SessionId, CancellationToken>>,
    /// What runs read of their sessions' transcripts, so the next run of a
    /// session reads only what is new.
    transcripts: TranscriptCache,
    tasks: TaskTracker,
    /// Fires when draining begins (and at the latest when shutdown does):
    /// no new runs from then on.
    draining: CancellationToken,
    shutting_down: CancellationToken,
    leased: bool,
    single_process: bool,
    /// Runs of this process by token, and the lease view for runs
    /// elsewhere.
    replicas: replicas::Replicas,
    /// One reader per followed session, fanned out to its followers.
    tails: tails::Tails,
    /// The turns of runs waiting for a session (`?wait`), by session.
    run_queues: Mutex<HashMap<SessionId, std::sync::Weak<tokio::sync::Mutex<()>>>>,
    /// How many times one interrupted input is run again; 0: never.
    resume_attempts: std::sync::atomic::AtomicU32,
}

/// How the process proved, or failed to prove, that it alone serves its
/// store — needed for destructive maintenance when running unleased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusivity {
    /// Runs are leased; maintenance takes the lease like a run.
    Leased,
    /// Unleased, and this process holds the store's exclusive lock.
    ProvenSingleProcess,
    /// Unleased, and another process holds the store's lock.
    Unproven,
}

impl Exclusivity {
    /// Whether the lease keeper may run unleased when its backend says it
    /// cannot lease: only a deployment configured without leases. A leased
    /// server never silently turns unleased.
    pub fn may_run_unleased(self) -> bool {
        self != Exclusivity::Leased
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The agent finished and every event was recorded.
    Completed,
    /// The agent failed or an event could not be recorded.
    Failed(String),
    /// Cancelled by a client, or by shutdown when resumption is off.
    Cancelled,
    /// The lease was lost (or a write was fenced off): the run stopped.
    LeaseLost(String),
    /// Cut off by shutdown with resumption on: no end is recorded (a
    /// `run_cut_off` says why), so the session's next owner ends the run
    /// as `interrupted` and runs its input again.
    Interrupted(String),
}

impl RunStatus {
    /// The wire name of the status.
    pub fn name(&self) -> &'static str {
        match self {
            RunStatus::Completed => "completed",
            RunStatus::Failed(_) => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::LeaseLost(_) => "lease_lost",
            RunStatus::Interrupted(_) => "interrupted",
        }
    }

    /// What went wrong, for the statuses that carry it.
    pub fn error(&self) -> Option<&str> {
        match self {
            RunStatus::Failed(e) | RunStatus::LeaseLost(e) | RunStatus::Interrupted(e) => Some(e),
            RunStatus::Completed | RunStatus::Cancelled => None,
        }
    }
}

/// How a run ended, told once its lease has been released (or lost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// How it ended.
    pub status: RunStatus,
    /// The lease token the run wrote under; `None` when unleased.
    pub token: Option<u64>,
    /// Sequence number of the last event the agent recorded, if any.
    pub last_seq: Option<u64>,
    /// Live forwarding stopped before the end (the client fell behind, or
    /// an event could not be read back for it); every event is in the log.
    pub lagged: bool,
}

impl RunEnd {
    /// The end reported when a run's task vanished without telling one.
    pub fn vanished() -> Self {
        Self {
            status: RunStatus::Failed("the run ended without a result".into()),
            token: None,
            last_seq: None,
            lagged: false,
        }
    }
}

/// Events forwarded to a streaming client before it must keep up: past
/// this many unread events the run stops forwarding to it (the events are
/// in the log regardless) rather than wait for the client.
pub const STREAM_BUFFER: usize = 1024;

/// A started run: its token, its live events, and its end.
#[derive(Debug)]
pub struct StartedRun {
    /// The lease token every event is written under; `None` when unleased.
    pub token: Option<u64>,
    /// Sequence number of the run's first event (its `run_started`).
    pub first_seq: u64,
    /// The run's events as the store holds them. Closes when the run
    /// ends, or early when the client fell more than [`STREAM_BUFFER`]
    /// events behind (the end then says `lagged`).
    pub events: mpsc::Receiver<StoredEvent>,
    /// The end, sent once the run's lease has been released (or lost), so
    /// a client that starts the next run at once is not refused — unless a
    /// write of the run outlived the keeper's write wait: the end is then
    /// sent when the keeper stops waiting, and the session stays busy in
    /// this process (and its lease unreleased) until the write has ended.
    pub end: oneshot::Receiver<RunEnd>,
}

/// A session as [`Engine::describe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session.
    pub id: SessionId,
    /// The highest fencing token its store accepted; `None` when no fenced
    /// write ever was.
    pub high_water: Option<FencingToken>,
}

impl Engine {
    /// Assembles the server state.
    pub fn new(
        store: Arc<dyn SessionStore>,
        keeper: LeaseKeeper,
        agent: Arc<dyn Agent>,
        metrics: Arc<Metrics>,
        exclusivity: Exclusivity,
    ) -> Self {
        let store_fault = Arc::new(store_watch::StoreFault::default());
        let store = Arc::new(store_watch::WatchedStore {
            inner: store,
            fault: Arc::clone(&store_fault),
        });
        Self {
            inner: Arc::new(EngineInner {
                store,
                store_fault,
                keeper,
                scope: agent.transcript_scope(),
                agent,
                metrics,
                runs: Mutex::default(),
                transcripts: TranscriptCache::new(DEFAULT_TRANSCRIPT_CACHE_BYTES),
                tasks: TaskTracker::new(),
                draining: CancellationToken::new(),
                shutting_down: CancellationToken::new(),
                leased: exclusivity == Exclusivity::Leased,
                single_process: exclusivity == Exclusivity::ProvenSingleProcess,
                replicas: replicas::Replicas::default(),
                tails: tails::Tails::default(),
                run_queues: Mutex::default(),
                resume_attempts: std::sync::atomic::AtomicU32::new(0),
            }),
        }
    }

    /// Bounds the memory kept of transcripts already read (default
    /// [`DEFAULT_TRANSCRIPT_CACHE_BYTES`]); 0 keeps none, so every run reads
    /// its session's whole transcript.
    pub fn with_transcript_cache_bytes(self, bytes: usize) -> Self {
        self.inner.transcripts.set_budget(bytes);
        self
    }

    /// Bytes of transcripts kept for the next runs, and of how many
    /// sessions.
    pub fn transcript_cache_usage(&self) -> (usize, usize) {
        self.inner.transcripts.usage()
    }

    /// Creates an empty session.
    pub async fn create_session(&self, session: &SessionId) -> Result<(), EngineError> {
        Ok(self.inner.store.create(session).await?)
    }

    /// Every session, sorted.
    pub async fn list_sessions(&self) -> Result<Vec<SessionId>, EngineError> {
        Ok(self.inner.store.list().await?)
    }

    /// At most `limit` sessions after `after`, sorted, and where the next
    /// page starts.
    pub async fn list_sessions_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, EngineError> {
        Ok(self.inner.store.list_page(after, limit).await?)
    }

    /// What the store knows of `session`; `NotFound` when it does not exist.
    pub async fn describe(&self, session: &SessionId) -> Result<SessionInfo, EngineError> {
        // `high_water` alone answers `None` for a missing session too.
        self.inner.store.read(session, 1, 1).await?;
        let high_water = self.inner.store.high_water(session).await?;
        Ok(SessionInfo {
            id: session.clone(),
            high_water,
        })
    }

    /// At most `limit` (≥ 1) events of `session` from `from_seq` on.
    pub async fn read_events(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, EngineError> {
        Ok(self.inner.store.read(session, from_seq, limit).await?)
    }

    /// Why the lease backend cannot serve right now (its last call failed),
    /// or `None`. Readiness reports it.
    pub fn lease_backend_fault(&self) -> Option<String> {
        self.inner.keeper.backend_fault()
    }

    /// Records a store failure met outside a store call the engine made
    /// (the server's check of its store directory's generation), so
    /// `/readyz` reports a store that went back at once.
    pub(crate) fn note_store_failure(&self, e: &StoreError) {
        self.inner.store_fault.note(e);
    }

    /// Why the session store refuses to serve, while it does: its state
    /// went back, or it is deployed so that it could lose what it
    /// confirmed (`state_rewound`). Cleared by its next success.
    pub fn store_fault(&self) -> Option<String> {
        self.inner.store_fault.get()
    }

    /// The fence of a run's writes: its lease's token, and this
    /// incarnation (the keeper's writer) as the writer; unfenced when the
    /// run is unleased. Owner ids are often stable across restarts
    /// (`--owner $POD_NAME`), and a backend hands a live lease back to its
    /// owner with the same token; the store refuses an equal token from
    /// another writer, so a second incarnation under one owner id can never
    /// write beside the first under one token.
    fn fence(&self, guard: &LeaseGuard) -> WriteFence {
        guard.fence()
    }

    /// The process metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// True once shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.is_cancelled()
    }

    /// Fires when shutdown begins.
    pub fn shutdown_signal(&self) -> CancellationToken {
        self.inner.shutting_down.clone()
    }

    /// True once draining (or shutdown) began: no new runs start here.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    /// Stops taking runs, and lets the runs in progress go on: new runs
    /// (and runs waiting for their session, `?wait`) are refused as
    /// [`EngineError::Draining`]; reads, follows and cancels keep working.
    /// [`runs_drained`](Self::runs_drained) tells when the last run ended.
    pub fn begin_drain(&self) {
        self.inner.draining.cancel();
        // Run tasks are spawned only by starts that passed the check
        // above; closing lets `wait` end once the last of them has.
        self.inner.tasks.close();
    }

    /// Runs in progress in this process (claimed and not yet ended).
    pub fn runs_in_progress(&self) -> usize {
        self.runs().len()
    }

    /// Resolves once draining began and no run is in progress or starting
    /// here: every run has ended and given its lease back (or left it to
    /// lapse, when a write outlived the keeper's wait).
    pub async fn runs_drained(&self) {
        self.inner.draining.cancelled().await;
        self.inner.tasks.wait().await;
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, CancellationToken>> {
        self.inner
            .runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Leases `session` and starts a run of the agent on `input` in the
    /// background. The run belongs to the server: dropping the returned
    /// receiver (a client disconnect) does not stop it.
    ///
    /// Dropping this future (a client that resets the connection while the
    /// run starts) does not half-start it either: the lease, the claim and
    /// the run are taken on a task of their own. If the caller is gone
    /// before the session is claimed, the lease is given back and nothing
    /// is logged; once claimed, the run runs to an outcome that is logged
    /// and counted.
    pub async fn start_run(
        &self,
        session: SessionId,
        input: Value,
    ) -> Result<StartedRun, EngineError> {
        // Counted as a run task from before the drain check until the run's
        // task is spawned: a drain that begins meanwhile waits for this
        // start too, rather than count the engine drained while it reads.
        let starting = self.inner.tasks.token();
        self.may_start_runs()?;
        // Fail fast on unknown sessions before touching the lease backend.
        // Nothing is held yet: dropping the caller here leaves nothing.
        self.inner.store.read(&session, 1, 1).await?;
        let (started_tx, started) = oneshot::channel();
        let app = self.clone();
        let span = info_span!("run", session = %session, token = field::Empty);
        self.inner.tasks.spawn(
            async move { app.claim_and_drive(session, input, started_tx).await }.instrument(span),
        );
        drop(starting);
        // The task answers before anything else can end it; it can only
        // vanish unanswered when the runtime drops it on the way down.
        started.await.unwrap_or(Err(EngineError::ShuttingDown))
    }

    /// Takes the session's lease and claims the run in the store: the
    /// lease, its token and the claim's sequence number; `None` when the
    /// client left before anything was claimed (the lease is given back).
    ///
    /// At most two tries: the second only after the store refused the
    /// claim because an earlier incarnation under our owner id wrote under
    /// the very token the backend handed back to us, or because our token
    /// is below the store's mark (the lease authority lost or rewound
    /// state, or someone took over since) — then above the mark.
    async fn claim(
        &self,
        session: &SessionId,
        what: &ClaimFor,
        cancels_before: CancelBaseline,
        started: Option<&oneshot::Sender<Result<StartedRun, EngineError>>>,
    ) -> Result<Option<(LeaseGuard, ClaimWritten)>, EngineError> {
        let mut again: Option<Option<FencingToken>> = None;
        loop {
            // A run of this session already in this process: answer at
            // once rather than queue behind it (on the retry, wait for our
            // own release).
            let guard = match again {
                None => {
                    self.inner
                        .keeper
                        .acquire_within(session, Duration::ZERO)
                        .await?
                }
                Some(floor) => {
                    let wait = self.inner.keeper.ttl();
                    match floor {
                        Some(floor) => {
                            self.inner
                                .keeper
                                .acquire_above_within(session, wait, floor)
                                .await?
                        }
                        None => self.inner.keeper.acquire_within(session, wait).await?,
                    }
                }
            };
            if started.is_some_and(oneshot::Sender::is_closed) {
                // The client went away before anything was claimed: give
                // the session back rather than start a run nobody waits for.
                // (From the claim on, the run is ours whatever the client
                // does.)
                info!("the client left before the run was claimed; not started");
                return Ok(None);
            }
            let token = guard.token();
            Span::current().record("token", token.map(|t| t.get()));
            match self
                .write_claim(session, &guard, what, cancels_before)
                .await
            {
                Ok(written) => return Ok(Some((guard, written))),
                Err(EngineError::Store(StoreError::Fenced {
                    presented,
                    high_water,
                    ..
                })) if again.is_none() && presented <= high_water => {
                    if presented == high_water {
                        // The lease was handed back to our owner id with the
                        // token a previous incarnation (a restarted process)
                        // wrote under. Give it back; the next acquisition is
                        // a takeover with a greater token.
                        info!(%presented, "the store's mark is an earlier incarnation's; acquiring anew");
                        again = Some(None);
                    } else {
                        // Either another process took the session since our
                        // acquire (then the backend answers Held to this),
                        // or the lease authority issues tokens below what
                        // the store accepted: it lost or rewound state. Ask
                        // once for a token above the mark instead of failing
                        // every run until an operator repairs the record.
                        warn!(%presented, %high_water, "the store's mark is above the granted token; acquiring above it");
                        again = Some(Some(high_water));
                    }
                    let _ = guard.finish().await;
                }
                // Not ours to write: lost between acquire and write. The
                // guard is dropped, which releases (the keeper never
                // releases a value it knows is lost).
                Err(e) => return Err(e),
            }
        }
    }

    /// Leases and claims the session, answers `started`, then drives the
    /// run to its end. Runs on a task of the engine's, never on a caller's.
    async fn claim_and_drive(
        &self,
        session: SessionId,
        input: Value,
        started: oneshot::Sender<Result<StartedRun, EngineError>>,
    ) {
        // Cancel requests recorded before this run began are not for it.
        let cancels_before = self.cancel_baseline(&session).await;
        // A drain that began while this start read the session: nothing is
        // claimed yet, so the client is sent elsewhere.
        if self.is_draining() {
            let _ = started.send(Err(if self.is_shutting_down() {
                EngineError::ShuttingDown
            } else {
                EngineError::Draining
            }));
            return;
        }
        let what = ClaimFor::Client(input);
        let (guard, claimed) = match self
            .claim(&session, &what, cancels_before, Some(&started))
            .await
        {
            Ok(Some((guard, ClaimWritten::Run(claimed)))) => (guard, claimed),
            Ok(Some((guard, _))) => {
                // A client's claim always starts its run; nothing else is
                // written for it.
                let _ = guard.finish().await;
                return;
            }
            Ok(None) => return,
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        self.run_claimed(session, guard, claimed, cancels_before, Some(started))
            .await;
    }

    /// Drives a run whose claim is in the log, answering `started` (when a
    /// client waits) once it is under way. From the claim on, the run runs
    /// to an outcome whatever happens to the client.
    async fn run_claimed(
        &self,
        session: SessionId,
        guard: LeaseGuard,
        claimed: Claimed,
        cancels_before: CancelBaseline,
        started: Option<oneshot::Sender<Result<StartedRun, EngineError>>>,
    ) {
        let Claimed {
            first_seq,
            input,
            resumes_token,
            ..
        } = claimed;
        let token = guard.token();
        // A resumption continues the run it resumes: a cancel asked of
        // that run, which its resumer may not have seen, stops it too.
        let watched = resumes_token.or(token);
        let metrics = &self.inner.metrics;
        metrics.run_started();
        let cancel = CancellationToken::new();
        self.runs().insert(session.clone(), cancel.clone());
        let watch =
            watched.map(|t| self.watch_cancel_requests(&session, t, cancels_before, &cancel));
        self.register_local_run(&session, token, first_seq, watch);
        let (tx, events) = mpsc::channel(STREAM_BUFFER);
        let (end_tx, end) = oneshot::channel();
        let mut run = Run {
            session,
            first_seq,
            guard,
            input,
            cancel,
            tx: None,
            lagged: true,
            end: end_tx,
        };
        let transcript = match self.transcript(&run.session, first_seq).await {
            Ok((transcript, claimed)) => {
                // The claim was just read back with the transcript: forward
                // it as stored. It is there, since our token fences everyone
                // else off.
                if let Some(e) = claimed
                    && started.is_some()
                    && tx.try_send(e).is_ok()
                {
                    run.tx = Some(tx);
                    run.lagged = false;
                }
                Ok(transcript)
            }
            Err(e) => {
                // The client hears the store's error; the run, claimed,
                // still ends as a failure that is logged and counted.
                let message = format!("reading the transcript: {}", error_chain(&e));
                if let Some(started) = started {
                    let _ = started.send(Err(EngineError::FailedAfterClaim(e)));
                }
                return self.drive(run, Err(message)).await;
            }
        };
        // The client may be gone by now; the run goes on regardless.
        if let Some(started) = started {
            let _ = started.send(Ok(StartedRun {
                token: token.map(|t| t.get()),
                first_seq,
                events,
                end,
            }));
        }
        self.drive(run, transcript).await;
    }

    /// Drives a claimed run to its end: agent, outcome, release, answer.
    /// A transcript that could not be read (`Err`, why) fails the run: it
    /// is claimed, so it still ends, is counted and released like any
    /// other.
    async fn drive(&self, run: Run, transcript: Result<Transcript, String>) {
        let Run {
            session,
            first_seq,
            guard,
            input,
            cancel,
            tx,
            lagged,
            end,
        } = run;
        let metrics = &self.inner.metrics;
        let token = guard.token();
        let mut sink = StoreSink {
            store: Arc::clone(&self.inner.store),
            session: session.clone(),
            fence: self.fence(&guard),
            gate: guard.write_gate(),
            tx,
            lagged,
            fenced: false,
            last_seq: None,
        };
        let status = match transcript {
            Ok(transcript) => {
                let turn = Turn {
                    session_id: session.to_string(),
                    transcript,
                    input,
                    run: RunLease {
                        run_id: first_seq,
                        token: token.map(|t| t.get()),
                        safe_for: guard.safe_for(),
                    },
                };
                self.run_agent(&guard, &cancel, turn, &mut sink).await
            }
            Err(e) => RunStatus::Failed(e),
        };
        metrics.run_ended(match status {
            RunStatus::Completed => RunOutcome::Completed,
            RunStatus::Failed(_) => RunOutcome::Failed,
            RunStatus::Cancelled => RunOutcome::Cancelled,
            RunStatus::LeaseLost(_) => RunOutcome::LeaseLost,
            RunStatus::Interrupted(_) => RunOutcome::Interrupted,
        });
        match &status {
            RunStatus::Failed(e) | RunStatus::LeaseLost(e) | RunStatus::Interrupted(e) => {
                warn!(status = status.name(), error = %e, "run ended early");
            }
            RunStatus::Completed | RunStatus::Cancelled => {
                info!(status = status.name(), "run ended");
            }
        }
        self.record_run_end(&guard, &session, &status).await;
        // The keeper's per-session lock is still ours (the guard lives), so
        // the entry cannot belong to another run yet.
        self.runs().remove(&session);
        self.unregister_local_run(&session);
        // Release before telling the client the run ended, so its next run
        // finds the session free. The keeper first waits (bounded) for the
        // run's writes still in flight — an agent dropped mid-write leaves
        // its write running — and leaves the lease to lapse, and the
        // session busy here, if they outlive the bound. Then the release,
        // bounded by its own timeout; a lost lease is never released.
        if let Err(e) = guard.finish().await {
            match e.kind() {
                KeeperErrorKind::WritesInFlight => {
                    warn!(error = %error_chain(&e), "the run ended with writes still running");
                }
                _ => {
                    warn!(error = %error_chain(&e), "releasing the run's lease failed; it lapses at its expiry");
                }
            }
        }
        let message = RunEnd {
            status,
            token: token.map(|t| t.get()),
            last_seq: sink.last_seq,
            lagged: sink.lagged,
        };
        drop(sink);
        let _ = end.send(message);
    }

    /// Runs the agent until it ends, the lease is lost or the run is
    /// cancelled.
    async fn run_agent(
        &self,
        guard: &LeaseGuard,
        cancel: &CancellationToken,
        turn: Turn,
        sink: &mut StoreSink,
    ) -> RunStatus {
        // Cancellation: whichever branch wins, the agent's future is
        // dropped at once. A store write it had started is not: each one
        // runs under a write permit of the run (see `tracked_append`), and
        // the release waits for them before the lease or the session is
        // given up.
        tokio::select! {
            // Loss and cancellation win over an agent that is also ready:
            // once the lease is gone nothing more may run.
            biased;
            () = guard.lost() => RunStatus::LeaseLost(
                loss_message(&sink.session, guard.loss().as_ref()),
            ),
            // With resumption on, a run cut off by shutdown is not the
            // client's cancel: it is left open for the next owner to run
            // again, as if this process had died, only sooner.
            () = self.inner.shutting_down.cancelled(), if self.resume_attempts() > 0 => {
                RunStatus::Interrupted(format!(
                    "the server shut down before the run finished; the next owner of session \
                     {} ends it as interrupted and runs its input again",
                    sink.session
                ))
            }
            () = cancel.cancelled() => RunStatus::Cancelled,
            result = self.inner.agent.run(turn, sink) => match result {
                Ok(()) => RunStatus::Completed,
                Err(AgentError::Sink(e)) if sink.fenced => RunStatus::LeaseLost(e.0),
                Err(e) => RunStatus::Failed(error_chain(&e)),
            },
        }
    }

    /// Whether a run may start here now: not draining or shutting down,
    /// and, unleased, the store's only process.
    fn may_start_runs(&self) -> Result<(), EngineError> {
        if self.is_shutting_down() {
            return Err(EngineError::ShuttingDown);
        }
        if self.is_draining() {
            return Err(EngineError::Draining);
        }
        self.require_exclusive_if_unleased()
    }

    /// Unleased, only the process holding the store's exclusive lock may
    /// write: two unleased writers would drive two copies of a session.
    fn require_exclusive_if_unleased(&self) -> Result<(), EngineError> {
        if self.inner.leased || self.inner.single_process {
            return Ok(());
        }
        Err(EngineError::NotExclusive)
    }

    /// Cancels the run of `session` in this process, if any.
    pub fn cancel_run(&self, session: &SessionId) -> bool {
        match self.runs().get(session) {
            Some(cancel) => {
                cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Deletes a session: under its lease when leased; unleased only with
    /// the single-process proof.
    pub async fn delete_session(&self, session: &SessionId) -> Result<(), EngineError> {
        self.require_exclusive_if_unleased()?;
        self.inner.store.read(session, 1, 1).await?;
        let guard = self
            .inner
            .keeper
            .acquire_within(session, Duration::ZERO)
            .await?;
        // Under a write permit, like a run's writes: were this future
        // dropped mid-delete, the delete still ends before the lease is
        // released.
        let permit = guard.begin_write()?;
        let (store, deleted, fence) = (
            Arc::clone(&self.inner.store),
            session.clone(),
            self.fence(&guard),
        );
        let result = Detached::new(async move {
            let result = store.delete(&deleted, fence).await;
            drop(permit);
            result
        })
        .await;
        drop(guard);
        if result.is_ok() {
            self.inner.transcripts.forget(session);
        }
        result.map_err(Into::into)
    }

    /// Stops taking runs, cancels the ones in progress, waits for them
    /// until `deadline`, then releases every lease still held (the keeper
    /// bounds that by its own shutdown timeout, set from the same budget).
    pub async fn shutdown(&self, deadline: tokio::time::Instant) -> bool {
        self.inner.draining.cancel();
        self.inner.shutting_down.cancel();
        for cancel in self.runs().values() {
            cancel.cancel();
        }
        self.inner.tasks.close();
        let runs_done = tokio::time::timeout_at(deadline, self.inner.tasks.wait())
            .await
            .is_ok();
        let report = self.inner.keeper.shutdown().await;
        runs_done && report.complete
    }
}

/// Why a run stopped on losing its lease, for the person reading its end
/// (`error` of a `lease_lost` run): what happened to the session and what
/// to do about the input.
fn loss_message(session: &SessionId, loss: Option<&LossReason>) -> String {
    let why = match loss {
        Some(LossReason::Held {
            holder: Some(holder),
        }) => format!("{holder} took session {session} over"),
        Some(LossReason::Held { holder: None }) => format!(
            "another process took session {session} over, or the lease backend no longer \
             knew this run's lease"
        ),
        Some(LossReason::Expired) => format!(
            "its lease on session {session} expired: renewals failed or went unanswered \
             until then, so another process may have taken the session"
        ),
        Some(LossReason::Rejected { kind }) => {
            format!("the lease backend refused to renew its lease on session {session} ({kind})")
        }
        Some(LossReason::Shutdown) => {
            format!("the server shut down and gave up its lease on session {session}")
        }
        _ => format!("it lost its lease on session {session}"),
    };
    format!(
        "the run stopped because {why}; nothing it wrote after that was recorded. Read the \
         session's events to see how far it got before running the input again"
    )
}

/// Everything a run task owns.
struct Run {
    session: SessionId,
    /// Where its claim is in the session's log: the run's id.
    first_seq: u64,
    guard: LeaseGuard,
    input: Value,
    cancel: CancellationToken,
    /// `None` when the claim could not be forwarded.
    tx: Option<mpsc::Sender<StoredEvent>>,
    lagged: bool,
    end: oneshot::Sender<RunEnd>,
}

/// Appends each event to the store under the run's fence, then forwards it
/// to the client without ever waiting for it.
struct StoreSink {
    store: Arc<dyn SessionStore>,
    session: SessionId,
    fence: WriteFence,
    /// Refuses writes once the run lost its lease or ended.
    gate: WriteGate,
    tx: Option<mpsc::Sender<StoredEvent>>,
    lagged: bool,
    fenced: bool,
    last_seq: Option<u64>,
}

#[async_trait]
impl EventSink for StoreSink {
    async fn emit(&mut self, event: Value) -> Result<(), SinkError> {
        if let Some(reserved) = event
            .get("type")
            .and_then(Value::as_str)
            .filter(|t| [RUN_STARTED, RUN_ENDED, RUN_CUT_OFF, TAKEOVER].contains(t))
        {
            // Runs are told apart by these events alone: one an agent
            // wrote would end a run early, or make an input run again.
            return Err(SinkError(format!(
                "an agent cannot emit an event of type {reserved:?}: the server writes the \
                 events that start, end and take over runs; name the event otherwise"
            )));
        }
        // The store's fence is what makes a stale write impossible; the
        // gate stops a run that already knows it lost sooner, and counts
        // the write so the run's release waits for it.
        let write = match tracked_append(
            &self.gate,
            Arc::clone(&self.store),
            self.session.clone(),
            self.fence.clone(),
            vec![event],
        ) {
            Ok(write) => write,
            Err(e) => {
                self.fenced = true;
                return Err(SinkError(error_chain(&e)));
            }
        };
        let receipt = match write.await {
            Ok(r) => r,
            Err(e) => {
                self.fenced = e.kind() == StoreErrorKind::Fenced;
                return Err(SinkError(error_chain(&e)));
            }
        };
        self.last_seq = Some(receipt.last_seq);
        self.forward(receipt.first_seq).await;
        Ok(())
    }

    fn lease_check(&self) -> Result<Option<Duration>, SinkError> {
        match self.gate.safe_for() {
            Some(left) if left.is_zero() || self.fenced => Err(SinkError(format!(
                "the run's lease on session {} is lost or about to lapse: start no effect \
                 outside the session, another process may own it by the time it lands",
                self.session
            ))),
            left => Ok(left),
        }
    }
}

impl StoreSink {
    /// Forwards event `seq` to the listening client, if any, as the store
    /// holds it: the store stamps the time, so only a read gives the live
    /// stream what a paged read will show.
    async fn forward(&mut self, seq: u64) {
        let Some(tx) = &self.tx else { return };
        // Room first, so nothing is read for a client that is gone or
        // behind.
        let permit = match tx.clone().try_reserve_owned() {
            Ok(permit) => permit,
            // Gone: nobody is listening; the run goes on.
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.tx = None;
                return;
            }
            // Not reading: stop forwarding instead of holding the lease
            // hostage to a slow client.
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stop_forwarding();
                return;
            }
        };
        match self.store.read(&self.session, seq, 1).await {
            Ok(page) => match page.events.into_iter().next() {
                Some(e) if e.seq == seq => {
                    permit.send(e);
                }
                _ => {
                    warn!(
                        seq,
                        "a recorded event was not found to forward; live forwarding stops"
                    );
                    self.stop_forwarding();
                }
            },
            // The event is recorded; only its live copy is missing. The
            // client learns from `lagged` to read the log instead.
            Err(e) => {
                warn!(seq, error = %error_chain(&e), "cannot read back a recorded event; live forwarding stops");
                self.stop_forwarding();
            }
        }
    }

    fn stop_forwarding(&mut self) {
        self.tx = None;
        self.lagged = true;
    }
}

/// Appends one event under a write permit of the run, so the run's release
/// waits for it. The append owns everything it needs and, when its caller
/// stops waiting (a cancelled agent, a dropped request), finishes on a task
/// of its own: dropping the future would not stop a write already running
/// on a blocking thread, so its end is what must be waited for, not the
/// caller's.
fn tracked_append(
    gate: &WriteGate,
    store: Arc<dyn SessionStore>,
    session: SessionId,
    fence: WriteFence,
    events: Vec<Value>,
) -> Result<Detached<Result<AppendReceipt, StoreError>>, KeeperError> {
    tracked(
        gate,
        async move { store.append(&session, fence, &events).await },
    )
}

/// `write` as a [`Detached`] future holding a permit of `gate` until it
/// settles: the keeper gives the lease back only after it.
fn tracked<T: Send + 'static>(
    gate: &WriteGate,
    write: impl Future<Output = T> + Send + 'static,
) -> Result<Detached<T>, KeeperError> {
    let permit = gate.begin()?;
    Ok(Detached::new(async move {
        let result = write.await;
        drop(permit);
        result
    }))
}

type BoxedWrite<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A future its caller drives inline (no task on the common path); dropped
/// before it completes, it hands the rest of itself to a spawned task
/// instead of being cancelled.
struct Detached<T: Send + 'static> {
    fut: Option<BoxedWrite<T>>,
    handle: Handle,
}

impl<T: Send + 'static> Detached<T> {
    /// Must be called within the runtime the rest is to run on.
    fn new(fut: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            fut: Some(Box::pin(fut)),
            handle: Handle::current(),
        }
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else {
            // Polled after completion: a caller bug, never done here.
            return Poll::Pending;
        };
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            this.fut = None;
        }
        out
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            // If the runtime is going down the task is dropped at once, and
            // with it the permit: nothing runs after it anyway.
            self.handle.spawn(fut);
        }
    }
}

#[cfg(test)]
mod tests {
    use lease_port::{LeaseErrorKind, OwnerId};

    use super::*;

    /// Each way of losing a lease is told as a sentence naming the session
    /// (and the new holder when known), never as the reason's Rust form.
    #[test]
    fn a_lost_lease_is_told_for_people() {
        let s = SessionId::new("chat-7").unwrap();
        let cases = [
            (
                Some(LossReason::Held {
                    holder: Some(OwnerId::new("host-b").unwrap()),
                }),
                "because host-b took session chat-7 over",
            ),
            (
                Some(LossReason::Held { holder: None }),
                "another process took session chat-7 over",
            ),
            (
                Some(LossReason::Expired),
                "its lease on session chat-7 expired",
            ),
            (
                Some(LossReason::Rejected {
                    kind: LeaseErrorKind::Invalid,
                }),
                "refused to renew its lease on session chat-7 (invalid lease input)",
            ),
            (
                Some(LossReason::Shutdown),
                "the server shut down and gave up its lease on session chat-7",
            ),
            (None, "it lost its lease on session chat-7"),
        ];
        for (loss, says) in cases {
            let message = loss_message(&s, loss.as_ref());
            assert!(message.contains(says), "{loss:?}: {message}");
            assert!(message.starts_with("the run stopped because "), "{message}");
            for debug in [
                "Held", "Expired", "Rejected", "Shutdown", "{", "Some(", "None",
            ] {
                assert!(!message.contains(debug), "{loss:?}: {message}");
            }
        }
    }
}
