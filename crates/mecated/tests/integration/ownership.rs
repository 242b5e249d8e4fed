//! Who owns a run, in-process: a run's writes end before its session is
//! given up, and a claimed run runs to its outcome whatever the client does.
//!
//! The store wrappers here hold chosen appends on a blocking thread, the
//! way a store whose write waits for a file lock or an `fdatasync` does:
//! dropping the caller's future does not stop such a write.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, header};
use flocklease::FlockLease;
use lease_keeper::{KeeperErrorKind, LeaseKeeper};
use lease_port::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use mecated::agent::{Agent, AgentError, EchoAgent, EventSink, Turn};
use mecated::engine::{Engine, EngineError, Exclusivity, RunStatus};
use mecated::metrics::Metrics;
use serde_json::{Value, json};
use session_store::{
    AppendReceipt, FsyncPolicy, JsonlOptions, JsonlStore, Page, SessionStore, StoreError,
    WriteFence,
};
use tokio::sync::mpsc;
use tower::ServiceExt;

/// Upper bound on waiting for something that must happen; reaching it
/// fails the test. Generous: machines are shared.
const PATIENCE: Duration = Duration::from_secs(30);

/// A gate a blocking thread waits at until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// A JSONL store whose first append of an event of type `held` runs on a
/// blocking thread that waits at a gate before writing.
struct GatedStore {
    inner: Arc<JsonlStore>,
    held: &'static str,
    armed: AtomicBool,
    gate: Arc<Gate>,
    /// Told when the held write reaches the gate, then when it has ended
    /// (with whether the store accepted it).
    signals: mpsc::UnboundedSender<Signal>,
}

#[derive(Debug, PartialEq)]
enum Signal {
    Entered,
    Ended { accepted: bool },
}

impl GatedStore {
    /// The append of `events` (after `after`, if given), held at the gate
    /// when it is the armed kind.
    async fn gated_append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: Option<u64>,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        let held = events.first().is_some_and(|e| e["type"] == self.held);
        let (inner, gate, signals) = (
            Arc::clone(&self.inner),
            Arc::clone(&self.gate),
            self.signals.clone(),
        );
        let (session, events) = (session.clone(), events.to_vec());
        let write = async move |inner: Arc<JsonlStore>| match after {
            Some(after) => inner.append_after(&session, fence, after, &events).await,
            None => inner.append(&session, fence, &events).await.map(Some),
        };
        if !(held && self.armed.swap(false, Ordering::SeqCst)) {
            return write(inner).await;
        }
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _ = signals.send(Signal::Entered);
            gate.wait();
            let result = runtime.block_on(write(inner));
            let _ = signals.send(Signal::Ended {
                accepted: matches!(result, Ok(Some(_))),
            });
            result
        })
        .await
        .expect("the blocking write does not panic")
    }
}

#[async_trait]
impl SessionStore for GatedStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        self.inner.create(session).await
    }
    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        self.inner.bind_authority(authority).await
    }
    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.inner.recorded_authority().await
    }
    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        self.gated_append(session, fence, None, events)
            .await
            .map(|r| r.expect("an unconditional append writes"))
    }
    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        self.gated_append(session, fence, Some(after), events).await
    }
    async fn read(&self, session: &SessionId, from: u64, limit: usize) -> Result<Page, StoreError> {
        self.inner.read(session, from, limit).await
    }
    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.inner.list().await
    }
    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        self.inner.delete(session, fence).await
    }
    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        self.inner.high_water(session).await
    }
}

/// The backend of an unleased deployment.
#[derive(Debug)]
struct NoLeases;

#[async_trait]
impl SessionLease for NoLeases {
    async fn acquire(&self, _: &SessionId, _: &OwnerId) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported("unleased"))
    }
    async fn renew(&self, _: &Lease) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported("unleased"))
    }
    async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
        Ok(())
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        Err(LeaseError::unsupported("unleased"))
    }
}

/// File leases whose first acquire waits until the test opens its gate.
#[derive(Debug)]
struct GatedLeases {
    inner: FlockLease,
    armed: AtomicBool,
    gate: tokio::sync::Semaphore,
    entered: mpsc::UnboundedSender<()>,
}

#[async_trait]
impl SessionLease for GatedLeases {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            let _ = self.entered.send(());
            self.gate.acquire().await.expect("never closed").forget();
        }
        self.inner.acquire(session, owner).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inner.release(lease).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.inner.authority().await
    }
}

/// Emits `held` then `done`, each carrying the run's input.
#[derive(Debug)]
struct TwoStepAgent;

#[async_trait]
impl Agent for TwoStepAgent {
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        sink.emit(json!({"type": "held", "input": turn.input}))
            .await?;
        sink.emit(json!({"type": "done", "input": turn.input}))
            .await?;
        Ok(())
    }
}

struct World {
    _dir: tempfile::TempDir,
    /// Set when the world's leases are gated.
    leases: Option<(Arc<GatedLeases>, mpsc::UnboundedReceiver<()>)>,
    store: Arc<GatedStore>,
    gate: Arc<Gate>,
    signals: mpsc::UnboundedReceiver<Signal>,
    engine: Engine,
    metrics: Arc<Metrics>,
}

const TTL: Duration = Duration::from_secs(15);

/// How a world takes its leases.
#[derive(Clone, Copy, PartialEq)]
enum Leases {
    Files,
    GatedFiles,
    /// Unleased, proven single process.
    None,
}

fn world(leases: Leases, held: &'static str, agent: Arc<dyn Agent>) -> World {
    let leased = leases != Leases::None;
    let dir = tempfile::tempdir().unwrap();
    let inner = Arc::new(
        JsonlStore::open(
            dir.path(),
            JsonlOptions::default()
                .fsync(FsyncPolicy::Never)
                .allow_unfenced(!leased),
        )
        .unwrap(),
    );
    let gate = Arc::new(Gate::default());
    let (tx, signals) = mpsc::unbounded_channel();
    let store = Arc::new(GatedStore {
        inner,
        held,
        armed: AtomicBool::new(true),
        gate: Arc::clone(&gate),
        signals: tx,
    });
    let mut gated = None;
    let (backend, exclusivity): (Arc<dyn SessionLease>, _) = match leases {
        Leases::Files => (file_leases(dir.path()), Exclusivity::Leased),
        Leases::GatedFiles => {
            let (entered, told) = mpsc::unbounded_channel();
            let backend = Arc::new(GatedLeases {
                inner: FlockLease::open(
                    dir.path().join(session_store::DEFAULT_LEASE_DIR_NAME),
                    TTL,
                )
                .unwrap(),
                armed: AtomicBool::new(true),
                gate: tokio::sync::Semaphore::new(0),
                entered,
            });
            gated = Some((Arc::clone(&backend), told));
            (backend as Arc<dyn SessionLease>, Exclusivity::Leased)
        }
        Leases::None => (Arc::new(NoLeases), Exclusivity::ProvenSingleProcess),
    };
    let metrics = Arc::new(Metrics::default());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new("own-a").unwrap(), TTL)
        // Short, so a run whose write is held ends (and says so) soon; the
        // session stays busy until the write ends however long that is.
        .write_wait(Duration::from_millis(100))
        .allow_unleased(exclusivity.may_run_unleased())
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let engine = Engine::new(
        store.clone(),
        keeper,
        agent,
        Arc::clone(&metrics),
        exclusivity,
    );
    World {
        _dir: dir,
        leases: gated,
        store,
        gate,
        signals,
        engine,
        metrics,
    }
}

fn file_leases(store: &Path) -> Arc<FlockLease> {
    Arc::new(FlockLease::open(store.join(session_store::DEFAULT_LEASE_DIR_NAME), TTL).unwrap())
}

fn run_request(id: &str) -> Request<Body> {
    Request::post(format!("/v1/sessions/{id}/runs"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"input": "hi"}).to_string()))
        .unwrap()
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

async fn log(w: &World, session: &SessionId) -> Vec<(u64, Value)> {
    let page = w.store.inner.read(session, 1, 1000).await.unwrap();
    page.events
        .into_iter()
        .map(|e| (e.seq, e.payload))
        .collect()
}

/// Waits (bounded by [`PATIENCE`]) until `check` holds.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < PATIENCE, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts a run, retrying while the session is busy in this process.
async fn start_when_free(w: &World, session: &SessionId, input: Value) -> u64 {
    let start = tokio::time::Instant::now();
    loop {
        match w.engine.start_run(session.clone(), input.clone()).await {
            Ok(run) => {
                let end = run.end.await.unwrap();
                assert_eq!(end.status, RunStatus::Completed, "{end:?}");
                return run.first_seq;
            }
            Err(EngineError::Lease(e)) if e.kind() == KeeperErrorKind::Busy => {
                assert!(start.elapsed() < PATIENCE, "the session stayed busy");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("start_run: {e}"),
        }
    }
}

/// A cancelled run's write still on a blocking thread must not land inside
/// the next run — the session is not given up until it has ended — nor
/// after the cancelled run's own recorded end.
async fn cancelled_runs_write_never_lands_inside_the_next_run(leases: Leases) {
    let mut w = world(leases, "held", Arc::new(TwoStepAgent));
    let s = sid("s");
    w.engine.create_session(&s).await.unwrap();

    let first = w.engine.start_run(s.clone(), json!("one")).await.unwrap();
    assert_eq!(w.signals.recv().await, Some(Signal::Entered));
    assert!(w.engine.cancel_run(&s));
    let end = first.end.await.unwrap();
    assert_eq!(end.status, RunStatus::Cancelled);

    // The cancelled run's write is still in flight: the session is not free.
    let next = w.engine.start_run(s.clone(), json!("two")).await;
    let next_was_busy =
        matches!(&next, Err(EngineError::Lease(e)) if e.kind() == KeeperErrorKind::Busy);
    let next_first_seq = match next {
        Ok(run) => Some((run.first_seq, run.end)),
        Err(_) => None,
    };

    w.gate.open();
    let Some(Signal::Ended { .. }) = w.signals.recv().await else {
        panic!("the held write ended");
    };
    let next_started = match next_first_seq {
        Some((seq, end)) => {
            let _ = end.await;
            seq
        }
        None => start_when_free(&w, &s, json!("two")).await,
    };

    let events = log(&w, &s).await;
    let late: Vec<_> = events
        .iter()
        .filter(|(seq, e)| *seq > next_started && e["input"] == "one")
        .collect();
    assert!(
        late.is_empty(),
        "run one's write landed inside run two (started at {next_started}): {events:?}"
    );
    // Run one's end, when recorded at all, comes after everything run one
    // wrote: a follower that stops there has seen the whole run.
    let run_one: Vec<_> = events
        .iter()
        .filter(|(seq, _)| *seq < next_started)
        .collect();
    if let Some(end) = run_one.iter().position(|(_, e)| e["type"] == "run_ended") {
        assert_eq!(
            end,
            run_one.len() - 1,
            "run one's write landed after its recorded end: {events:?}"
        );
    }
    assert!(
        next_was_busy,
        "the next run started while the cancelled run's write was in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unleased_cancelled_runs_write_never_lands_inside_the_next_run() {
    cancelled_runs_write_never_lands_inside_the_next_run(Leases::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_cancelled_runs_write_never_lands_inside_the_next_run() {
    cancelled_runs_write_never_lands_inside_the_next_run(Leases::Files).await;
}

/// A client that goes away while its run is being claimed does not leave
/// the run half-started: the claimed run runs to an outcome, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_during_the_claim_does_not_half_start_the_run() {
    let mut w = world(Leases::Files, "run_started", Arc::new(EchoAgent::default()));
    let s = sid("s");
    w.engine.create_session(&s).await.unwrap();
    let router = mecated::http::router(w.engine.clone(), 1 << 20);

    let handler = tokio::spawn(router.oneshot(run_request("s")));
    assert_eq!(w.signals.recv().await, Some(Signal::Entered));
    // The client resets the connection: the server drops the handler.
    handler.abort();
    assert!(handler.await.unwrap_err().is_cancelled());
    w.gate.open();
    assert_eq!(
        w.signals.recv().await,
        Some(Signal::Ended { accepted: true })
    );

    let completed = "mecated_runs_total{outcome=\"completed\"} 1\n";
    eventually("the claimed run ends and is counted", async || {
        w.metrics.render().contains(completed)
    })
    .await;
    let events = log(&w, &s).await;
    let types: Vec<&Value> = events.iter().map(|(_, e)| &e["type"]).collect();
    assert_eq!(
        types,
        [
            &json!("run_started"),
            &json!("message"),
            &json!("run_ended")
        ],
        "{events:?}"
    );
    // And the run gave the session back.
    start_when_free(&w, &s, json!("again")).await;
}

/// A client that goes away before its run is claimed leaves nothing: no
/// claim in the log, no run counted, and the lease given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_before_the_claim_starts_nothing() {
    let mut w = world(Leases::GatedFiles, "none", Arc::new(EchoAgent::default()));
    let s = sid("s");
    w.engine.create_session(&s).await.unwrap();
    let router = mecated::http::router(w.engine.clone(), 1 << 20);

    let handler = tokio::spawn(router.oneshot(run_request("s")));
    let (leases, mut entered) = w.leases.take().unwrap();
    assert_eq!(entered.recv().await, Some(()));
    handler.abort();
    assert!(handler.await.unwrap_err().is_cancelled());
    // The acquire now succeeds, for a client that is gone.
    leases.gate.add_permits(1);

    let seq = start_when_free(&w, &s, json!("later")).await;
    assert_eq!(seq, 1, "the abandoned start logged nothing");
    let rendered = w.metrics.render();
    assert!(
        rendered.contains("mecated_runs_total{outcome=\"completed\"} 1\n"),
        "{rendered}"
    );
    assert!(
        rendered.contains("mecated_runs_total{outcome=\"failed\"} 0\n"),
        "{rendered}"
    );
}
