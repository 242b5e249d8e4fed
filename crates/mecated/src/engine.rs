//! The run engine: lease, claim the store, drive the agent, fence every
//! write, release.
//!
//! Nothing here knows about HTTP: operations answer [`EngineError`], and
//! the HTTP edge ([`crate::http`]) decides what status and code a client
//! sees. Events leave the engine as the store holds them
//! ([`StoredEvent`]), so a live stream and a paged read show the same thing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{KeeperError, LeaseGuard, LeaseKeeper};
use lease_port::{FencingToken, SessionId};
use serde_json::{Value, json};
use session_store::{Page, SessionStore, StoreError, StoreErrorKind, StoredEvent, WriteFence};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info_span, warn};

use crate::agent::{Agent, AgentError, EventSink, SinkError, Turn};
use crate::error::error_chain;
use crate::metrics::{Metrics, RunOutcome};

/// Events read per page when loading a transcript.
const TRANSCRIPT_PAGE: usize = 1000;

/// Why an engine operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Shutdown began: no new runs or deletions.
    #[error("the server is shutting down")]
    ShuttingDown,
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
}

/// The server's state and the run engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    store: Arc<dyn SessionStore>,
    keeper: LeaseKeeper,
    agent: Arc<dyn Agent>,
    metrics: Arc<Metrics>,
    runs: Mutex<HashMap<SessionId, CancellationToken>>,
    tasks: TaskTracker,
    shutting_down: CancellationToken,
    leased: bool,
    single_process: bool,
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

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The agent finished and every event was recorded.
    Completed,
    /// The agent failed or an event could not be recorded.
    Failed(String),
    /// Cancelled by a client or by shutdown.
    Cancelled,
    /// The lease was lost (or a write was fenced off): the run stopped.
    LeaseLost(String),
}

impl RunStatus {
    /// The wire name of the status.
    pub fn name(&self) -> &'static str {
        match self {
            RunStatus::Completed => "completed",
            RunStatus::Failed(_) => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::LeaseLost(_) => "lease_lost",
        }
    }

    /// What went wrong, for the statuses that carry it.
    pub fn error(&self) -> Option<&str> {
        match self {
            RunStatus::Failed(e) | RunStatus::LeaseLost(e) => Some(e),
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
    /// a client that starts the next run at once is not refused.
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
        Self {
            inner: Arc::new(EngineInner {
                store,
                keeper,
                agent,
                metrics,
                runs: Mutex::default(),
                tasks: TaskTracker::new(),
                shutting_down: CancellationToken::new(),
                leased: exclusivity == Exclusivity::Leased,
                single_process: exclusivity == Exclusivity::ProvenSingleProcess,
            }),
        }
    }

    /// Creates an empty session.
    pub async fn create_session(&self, session: &SessionId) -> Result<(), EngineError> {
        Ok(self.inner.store.create(session).await?)
    }

    /// Every session, sorted.
    pub async fn list_sessions(&self) -> Result<Vec<SessionId>, EngineError> {
        Ok(self.inner.store.list().await?)
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

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, CancellationToken>> {
        self.inner
            .runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn transcript(&self, session: &SessionId) -> Result<Vec<StoredEvent>, StoreError> {
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            let page = self
                .inner
                .store
                .read(session, from, TRANSCRIPT_PAGE)
                .await?;
            events.extend(page.events);
            match page.next_seq {
                Some(next) => from = next,
                None => return Ok(events),
            }
        }
    }

    /// Leases `session` and starts a run of the agent on `input` in the
    /// background. The run belongs to the server: dropping the returned
    /// receiver (a client disconnect) does not stop it.
    pub async fn start_run(
        &self,
        session: SessionId,
        input: Value,
    ) -> Result<StartedRun, EngineError> {
        if self.is_shutting_down() {
            return Err(EngineError::ShuttingDown);
        }
        self.require_exclusive_if_unleased()?;
        // Fail fast on unknown sessions before touching the lease backend.
        self.inner.store.read(&session, 1, 1).await?;
        // A run of this session already in this process: answer at once
        // rather than queue behind it.
        let guard = self
            .inner
            .keeper
            .acquire_within(&session, Duration::ZERO)
            .await?;
        let token = guard.token();
        let fence = WriteFence::from(guard.lease().as_ref());
        // Claim the session in the store before anything else: the first
        // write raises the high-water mark to our token, so from here on no
        // earlier owner can write, whether or not our agent ever emits.
        let started = json!({
            "type": "run_started",
            "owner": self.inner.keeper.owner().as_str(),
            "token": token.map(|t| t.get()),
        });
        let claim = self
            .inner
            .store
            .append(&session, fence, std::slice::from_ref(&started))
            .await;
        let first_seq = match claim {
            Ok(receipt) => receipt.first_seq,
            Err(e) => {
                // Not ours to write: lost between acquire and write. Release
                // (the keeper never releases a value it knows is lost).
                drop(guard);
                return Err(e.into());
            }
        };
        let stored = match self.transcript(&session).await {
            Ok(t) => t,
            Err(e) => {
                drop(guard);
                return Err(e.into());
            }
        };
        let cancel = CancellationToken::new();
        self.runs().insert(session.clone(), cancel.clone());
        let (tx, events) = mpsc::channel(STREAM_BUFFER);
        let (end_tx, end) = oneshot::channel();
        // The claim was just read back with the transcript: forward it as
        // stored. It is there, since our token fences everyone else off.
        let claimed = stored.iter().find(|e| e.seq == first_seq).cloned();
        let lagged = match claimed {
            Some(e) => tx.try_send(e).is_err(),
            None => true,
        };
        let transcript = stored.into_iter().map(|e| e.payload).collect();
        let app = self.clone();
        let span = info_span!("run", session = %session, token = token.map(|t| t.get()));
        let run = Run {
            session,
            guard,
            transcript,
            input,
            cancel,
            tx: (!lagged).then_some(tx),
            lagged,
            end: end_tx,
        };
        self.inner
            .tasks
            .spawn(async move { app.drive(run).await }.instrument(span));
        Ok(StartedRun {
            token: token.map(|t| t.get()),
            first_seq,
            events,
            end,
        })
    }

    async fn drive(&self, run: Run) {
        let Run {
            session,
            guard,
            transcript,
            input,
            cancel,
            tx,
            lagged,
            end,
        } = run;
        let metrics = &self.inner.metrics;
        metrics.run_started();
        let token = guard.token();
        let mut sink = StoreSink {
            store: Arc::clone(&self.inner.store),
            session: session.clone(),
            fence: WriteFence::from(guard.lease().as_ref()),
            lost: guard.loss_token(),
            tx,
            lagged,
            fenced: false,
            last_seq: None,
        };
        let turn = Turn {
            session_id: session.to_string(),
            transcript,
            input,
        };
        let status = tokio::select! {
            // Loss and cancellation win over an agent that is also ready:
            // once the lease is gone nothing more may run.
            biased;
            () = guard.lost() => RunStatus::LeaseLost(
                guard.loss().map(|r| format!("{r:?}")).unwrap_or_else(|| "lease lost".into()),
            ),
            () = cancel.cancelled() => RunStatus::Cancelled,
            result = self.inner.agent.run(turn, &mut sink) => match result {
                Ok(()) => RunStatus::Completed,
                Err(AgentError::Sink(e)) if sink.fenced => RunStatus::LeaseLost(e.0),
                Err(e) => RunStatus::Failed(error_chain(&e)),
            },
        };
        metrics.run_ended(match status {
            RunStatus::Completed => RunOutcome::Completed,
            RunStatus::Failed(_) => RunOutcome::Failed,
            RunStatus::Cancelled => RunOutcome::Cancelled,
            RunStatus::LeaseLost(_) => RunOutcome::LeaseLost,
        });
        if let RunStatus::Failed(e) | RunStatus::LeaseLost(e) = &status {
            warn!(status = status.name(), error = %e, "run ended early");
        }
        // The keeper's per-session lock is still ours (the guard lives), so
        // the entry cannot belong to another run yet.
        self.runs().remove(&session);
        // Release before telling the client the run ended, so its next run
        // finds the session free. Bounded by the keeper's release timeout;
        // a lost lease is never released.
        if let Err(e) = guard.finish().await {
            warn!(error = %error_chain(&e), "releasing the run's lease failed; it lapses at its expiry");
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
        let result = self
            .inner
            .store
            .delete(session, WriteFence::from(guard.lease().as_ref()))
            .await;
        drop(guard);
        result.map_err(Into::into)
    }

    /// Stops taking runs, cancels the ones in progress, waits for them
    /// until `deadline`, then releases every lease still held (the keeper
    /// bounds that by its own shutdown timeout, set from the same budget).
    pub async fn shutdown(&self, deadline: tokio::time::Instant) -> bool {
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

/// Everything a run task owns.
struct Run {
    session: SessionId,
    guard: LeaseGuard,
    transcript: Vec<Value>,
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
    lost: CancellationToken,
    tx: Option<mpsc::Sender<StoredEvent>>,
    lagged: bool,
    fenced: bool,
    last_seq: Option<u64>,
}

#[async_trait]
impl EventSink for StoreSink {
    async fn emit(&mut self, event: Value) -> Result<(), SinkError> {
        // The store's fence is what makes a stale write impossible; this
        // check only stops a run that already knows it lost sooner.
        if self.lost.is_cancelled() {
            self.fenced = true;
            return Err(SinkError("the session lease was lost".into()));
        }
        let receipt = match self
            .store
            .append(
                &self.session,
                self.fence.clone(),
                std::slice::from_ref(&event),
            )
            .await
        {
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
