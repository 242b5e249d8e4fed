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
use mecated::engine::{Engine, Exclusivity};
use mecated::metrics::Metrics;
use memlease::MemLease;
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};
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

    // The same owner id asks again (a restarted process): the backend hands
    // back the live lease with the same token, the store refuses the other
    // writer, and the second incarnation takes the session over with a
    // greater token — never writing under the first one's.
    let mut second_run = second
        .start_run(s.clone(), json!("second"))
        .await
        .expect("the second incarnation takes over");
    let first_token = running.token.expect("leased");
    let second_token = second_run.token.expect("leased");
    assert!(
        second_token > first_token,
        "{second_token} not above {first_token}"
    );
    second_run.events.recv().await.expect("run_started");
    release.add_permits(2);
    let _ = running.end.await;
    let _ = second_run.end.await;

    let store = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    let log = store.read(&s, 1, 100).await.unwrap().events;
    // The second incarnation's first write fences the first one out; it
    // then ends the first one's run, as interrupted, and claims.
    let takeover = log
        .iter()
        .position(|e| e.token.map(|t| t.get()) == Some(second_token))
        .expect("the second incarnation's writes");
    let kinds: Vec<_> = log[takeover..takeover + 3]
        .iter()
        .map(|e| (e.payload["type"].as_str(), e.payload["status"].as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (Some("takeover"), None),
            (Some("run_ended"), Some("interrupted")),
            (Some("run_started"), None)
        ],
        "{log:#?}"
    );
    assert!(
        log[..takeover]
            .iter()
            .all(|e| e.token.map(|t| t.get()) == Some(first_token)),
        "{log:#?}"
    );
    assert!(
        log[takeover..]
            .iter()
            .all(|e| e.token.map(|t| t.get()) == Some(second_token)),
        "the first incarnation wrote after the takeover: {log:#?}"
    );
    let firsts = log
        .iter()
        .filter(|e| e.token.map(|t| t.get()) == Some(first_token))
        .count();
    assert_eq!(
        firsts, 2,
        "the first incarnation's claim and one event: {log:#?}"
    );
}

/// Finishes at once.
#[derive(Debug)]
struct QuickAgent;

#[async_trait]
impl Agent for QuickAgent {
    async fn run(&self, _: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        sink.emit(json!({"type": "done"})).await?;
        Ok(())
    }
}

/// A lease authority that lost its state (a new one in place of the old,
/// issuing tokens from 1 again) meets a store that accepted tokens up to 3:
/// the first run's claim is refused as below the mark, and the server asks
/// once for a token above it instead of failing every run until an
/// operator repairs the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_authority_lost_its_tokens_a_run_resumes_above_the_stores_mark() {
    let dir = tempfile::tempdir().unwrap();
    let s = SessionId::new("s").unwrap();
    let before = process(
        dir.path(),
        &MemLease::new(TTL),
        "pod-1",
        Arc::new(QuickAgent),
    );
    before.create_session(&s).await.unwrap();
    for expected in 1..=3 {
        let run = before.start_run(s.clone(), json!("x")).await.unwrap();
        assert_eq!(run.token, Some(expected));
        run.end.await.unwrap();
    }

    let after = process(
        dir.path(),
        &MemLease::new(TTL),
        "pod-2",
        Arc::new(QuickAgent),
    );
    let run = after.start_run(s.clone(), json!("y")).await.unwrap();
    assert_eq!(run.token, Some(4), "not above the store's mark of 3");
    run.end.await.unwrap();
    // The floor was kept by the authority: the next run needs no retry.
    let run = after.start_run(s.clone(), json!("z")).await.unwrap();
    assert_eq!(run.token, Some(5));
    run.end.await.unwrap();
    let store = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    assert_eq!(
        store.high_water(&s).await.unwrap(),
        Some(lease_port::FencingToken::new(5))
    );
}
