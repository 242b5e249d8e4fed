//! A run's agent sees exactly the transcript its store holds, although the
//! engine keeps what it read for the next run: another process appending
//! between two runs, the session deleted and created again (with or without
//! new events), and a cache too small to keep the session all give the
//! agent the store's events up to its claim, no more, no less.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{KeeperErrorKind, LeaseKeeper};
use lease_port::{OwnerId, SessionId, SessionLease};
use mecated::agent::{Agent, AgentError, EventSink, Turn};
use mecated::engine::{Engine, EngineError, Exclusivity, RunStatus};
use mecated::metrics::Metrics;
use memlease::MemLease;
use serde_json::{Value, json};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};

const TTL: Duration = Duration::from_secs(15);

/// Records the transcript of every run, then replies once.
#[derive(Debug, Default)]
struct Recorder {
    seen: Mutex<Vec<Vec<Value>>>,
}

#[async_trait]
impl Agent for Recorder {
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        self.seen.lock().unwrap().push(turn.transcript.to_vec());
        sink.emit(json!({"type": "message", "content": turn.input}))
            .await?;
        Ok(())
    }
}

struct Process {
    engine: Engine,
    store: Arc<JsonlStore>,
    agent: Arc<Recorder>,
}

/// One server process: its own store instance on `dir` (its own open files
/// and caches), the lease service shared by all.
fn process(dir: &std::path::Path, leases: &MemLease, owner: &str, cache_bytes: usize) -> Process {
    let store =
        Arc::new(JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap());
    let backend: Arc<dyn SessionLease> = Arc::new(leases.clone());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new(owner).unwrap(), TTL)
        .allow_unleased(false)
        .build()
        .unwrap();
    let agent = Arc::new(Recorder::default());
    let engine = Engine::new(
        Arc::clone(&store) as Arc<dyn SessionStore>,
        keeper,
        Arc::clone(&agent) as Arc<dyn Agent>,
        Arc::new(Metrics::default()),
        Exclusivity::Leased,
    )
    .with_transcript_cache_bytes(cache_bytes);
    Process {
        engine,
        store,
        agent,
    }
}

impl Process {
    /// Runs `session` to completion; the transcript its agent was given
    /// and the sequence number of its claim.
    async fn run(&self, session: &SessionId, input: &str) -> (Vec<Value>, u64) {
        // A deletion by another process releases its lease on a task of
        // its own: the session may still be leased there for a moment.
        let mut tries = 0;
        let run = loop {
            match self.engine.start_run(session.clone(), json!(input)).await {
                Ok(run) => break run,
                Err(EngineError::Lease(e))
                    if matches!(
                        e.kind(),
                        KeeperErrorKind::LeasedElsewhere | KeeperErrorKind::Busy
                    ) && tries < 500 =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("run {input:?}: {e}"),
            }
        };
        let claim = run.first_seq;
        let end = run.end.await.unwrap();
        assert_eq!(end.status, RunStatus::Completed);
        let seen = self.agent.seen.lock().unwrap().last().cloned().unwrap();
        (seen, claim)
    }

    /// The store's transcript up to and including event `through`, read
    /// whole.
    async fn stored(&self, session: &SessionId, through: u64) -> Vec<Value> {
        let mut out = Vec::new();
        let mut from = 1;
        loop {
            let page = self.store.read(session, from, 3).await.unwrap();
            out.extend(
                page.events
                    .into_iter()
                    .filter(|e| e.seq <= through)
                    .map(|e| e.payload),
            );
            match page.next_seq {
                Some(n) => from = n,
                None => return out,
            }
        }
    }

    /// Runs `session` and checks its agent saw exactly the store's events
    /// through its claim; returns how many that was.
    async fn run_and_check(&self, session: &SessionId, input: &str) -> usize {
        let (seen, claim) = self.run(session, input).await;
        let stored = self.stored(session, claim).await;
        assert_eq!(
            seen, stored,
            "run {input:?}: the agent's transcript is not the store's"
        );
        assert_eq!(seen.last().unwrap()["type"], "run_started");
        seen.len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_appending_between_runs_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let a = process(dir.path(), &leases, "a", 1 << 20);
    let b = process(dir.path(), &leases, "b", 1 << 20);
    let s = SessionId::new("chat").unwrap();
    a.engine.create_session(&s).await.unwrap();

    assert_eq!(a.run_and_check(&s, "a1").await, 1);
    // Every run leaves its claim, its reply and its end.
    assert_eq!(a.run_and_check(&s, "a2").await, 4);
    assert!(
        a.engine.transcript_cache_usage().1 == 1,
        "a keeps the session"
    );
    // b runs twice in between: a's next run must see both.
    assert_eq!(b.run_and_check(&s, "b1").await, 7);
    assert_eq!(b.run_and_check(&s, "b2").await, 10);
    assert_eq!(a.run_and_check(&s, "a3").await, 13);
    // Nothing in between: a's cache alone plus its own reply.
    assert_eq!(a.run_and_check(&s, "a4").await, 16);
    let inputs: Vec<Value> = a
        .stored(&s, u64::MAX)
        .await
        .iter()
        .filter(|e| e["type"] == "message")
        .map(|e| e["content"].clone())
        .collect();
    assert_eq!(inputs, ["a1", "a2", "b1", "b2", "a3", "a4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_and_created_again_is_read_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let a = process(dir.path(), &leases, "a", 1 << 20);
    let b = process(dir.path(), &leases, "b", 1 << 20);
    let s = SessionId::new("chat").unwrap();
    a.engine.create_session(&s).await.unwrap();
    a.run_and_check(&s, "old 1").await;
    a.run_and_check(&s, "old 2").await;

    // Deleted and created again elsewhere, nothing written since: the new
    // session holds only a's next claim, numbered after the old events.
    b.engine.delete_session(&s).await.unwrap();
    b.engine.create_session(&s).await.unwrap();
    let (seen, claim) = a.run(&s, "new 1").await;
    assert_eq!(seen, a.stored(&s, claim).await);
    assert_eq!(seen.len(), 1, "only the claim: {seen:?}");
    assert!(claim > 4, "sequence numbers are not reused");

    // Deleted and created again, then run elsewhere (as many events as
    // before): still the new session only.
    b.engine.delete_session(&s).await.unwrap();
    b.engine.create_session(&s).await.unwrap();
    b.run_and_check(&s, "other 1").await;
    assert_eq!(a.run_and_check(&s, "new 2").await, 4);
    let seen = a.agent.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(seen[1]["content"], "other 1");

    // Deleted and created again by the same process: read afresh too.
    a.engine.delete_session(&s).await.unwrap();
    a.engine.create_session(&s).await.unwrap();
    assert_eq!(a.run_and_check(&s, "own").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_too_small_for_the_session_keeps_nothing_and_runs_stay_right() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    for budget in [0, 600] {
        let p = process(dir.path(), &leases, &format!("p{budget}"), budget);
        let s = SessionId::new(format!("chat-{budget}")).unwrap();
        p.engine.create_session(&s).await.unwrap();
        for (i, expected) in [1, 4, 7, 10, 13].into_iter().enumerate() {
            assert_eq!(p.run_and_check(&s, &format!("r{i}")).await, expected);
            let (bytes, _) = p.engine.transcript_cache_usage();
            assert!(
                bytes <= budget,
                "{bytes} bytes kept under a budget of {budget}"
            );
        }
        // Past the budget the session is no longer kept at all.
        assert_eq!(p.engine.transcript_cache_usage(), (0, 0), "budget {budget}");
    }
}
