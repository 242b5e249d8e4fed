//! Two incarnations under one owner id never write one session under one
//! token. Owner ids are often stable across restarts (`--owner $POD_NAME`),
//! and a lease backend hands a live lease back to its owner with the same
//! token: the store must tell the incarnations apart, or both would run.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::LeaseKeeper;
use lease_port::{OwnerId, SessionId, SessionLease};
use mecated::agent::{Agent, AgentError, EventSink, Turn};
use mecated::engine::{Engine, EngineError, Exclusivity};
use mecated::metrics::Metrics;
use memlease::MemLease;
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, StoreErrorKind};
use tokio::sync::Semaphore;

const TTL: Duration = Duration::from_secs(15);

/// Emits one event, then waits until told to finish.
#[derive(Debug)]
struct HeldAgent(Arc<Semaphore>);

#[async_trait]
impl Agent for HeldAgent {
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        sink.emit(json!({"type": "working", "input": turn.input}))
            .await?;
        let _ = self.0.acquire().await;
        sink.emit(json!({"type": "done"})).await?;
        Ok(())
    }
}

/// One process: its own store instance on `dir`, the shared lease service.
fn process(dir: &std::path::Path, leases: &MemLease, owner: &str, agent: Arc<dyn Agent>) -> Engine {
    let store = JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap();
    let backend: Arc<dyn SessionLease> = Arc::new(leases.clone());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new(owner).unwrap(), TTL)
        .allow_unleased(false)
        .build()
        .unwrap();
    Engine::new(
        Arc::new(store),
        keeper,
        agent,
        Arc::new(Metrics::default()),
        Exclusivity::Leased,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_incarnation_under_one_owner_id_cannot_write_beside_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let release = Arc::new(Semaphore::new(0));
    let first = process(
        dir.path(),
        &leases,
        "pod-1",
        Arc::new(HeldAgent(release.clone())),
    );
    let second = process(
        dir.path(),
        &leases,
        "pod-1",
        Arc::new(HeldAgent(release.clone())),
    );
    let s = SessionId::new("s").unwrap();
    first.create_session(&s).await.unwrap();

    let mut running = first.start_run(s.clone(), json!("first")).await.unwrap();
    // The first incarnation is working: its claim and first event are in.
    running.events.recv().await.expect("run_started");
    running.events.recv().await.expect("working");

    // The same owner id asks again: the backend hands back the live lease
    // with the same token, and the store must refuse the other writer.
    match second.start_run(s.clone(), json!("second")).await {
        Err(EngineError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Fenced, "{e}"),
        Err(other) => panic!("expected the store to fence the second incarnation, got {other}"),
        Ok(run) => panic!(
            "the second incarnation started a run under token {:?}",
            run.token
        ),
    }
    release.add_permits(2);
    let _ = running.end.await;

    let store = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    let log = store.read(&s, 1, 100).await.unwrap().events;
    let inputs: Vec<_> = log
        .iter()
        .filter(|e| e.payload["type"] == "working")
        .map(|e| e.payload["input"].clone())
        .collect();
    assert_eq!(
        inputs,
        [json!("first")],
        "both incarnations wrote: {log:#?}"
    );
    let claims = log
        .iter()
        .filter(|e| e.payload["type"] == "run_started")
        .count();
    assert_eq!(claims, 1, "{log:#?}");
}
