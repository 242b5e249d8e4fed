//! A rolling deploy's SIGTERM, with real processes (and one race, in
//! process): the replica drains. Its run in progress finishes, new runs
//! are refused so that they go to another replica, reads and follows keep
//! working, and the session passes to the other replica as soon as the run
//! releases it.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::sse::{follow_from, payloads_to_end};
use crate::support::*;

/// A lease TTL no test waits out: had a replica not released its session,
/// the other would be refused for a minute.
const LONG_TTL: [&str; 2] = ["--session-lease-ttl", "60s"];

/// Until `/readyz` answers 503 with `body`.
async fn until_not_ready(m: &Mecated, body: &str) {
    let start = Instant::now();
    loop {
        let r = client().get(m.url("/readyz")).send().await.unwrap();
        if r.status() == StatusCode::SERVICE_UNAVAILABLE && r.text().await.unwrap() == body {
            return;
        }
        assert!(start.elapsed() < PATIENCE, "/readyz never said {body:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_drains_it_and_hands_the_session_over_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    // A run of 4 s, in progress when the signal comes.
    let slow = ["--echo-delay", "4s", "--echo-steps", "4"];
    let mut a = Mecated::start(dir.path(), "proc-a", &[&LONG_TTL[..], &slow].concat());
    let b = Mecated::start(dir.path(), "proc-b", &LONG_TTL);
    create(&a, "t").await;
    create(&a, "other").await;
    let a_run = run_in_background(&a, "t", json!("finish me"));
    wait_for_event(&a, "t", is_run_started_by("proc-a")).await;
    let mut follower = follow_from(&a, "t", None).await;
    // Sent to the other replica while the session is held: it waits.
    let b_url = b.url("/v1/sessions/t/runs?wait=50s");
    let b_run = tokio::spawn(async move {
        let r = client()
            .post(b_url)
            .json(&json!({ "input": "next" }))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    });

    a.signal(Signal::SIGTERM);
    until_not_ready(&a, "draining").await;
    // A new run on the draining replica is refused, and told to come back.
    let r = client()
        .post(a.url("/v1/sessions/other/runs"))
        .json(&json!({ "input": "too late" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "draining", "{body}");
    // Reads still work.
    let r = client().get(a.url("/v1/sessions/t")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // The run in progress finishes, as do its followers.
    let done = a_run.await.unwrap().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let (followed, _) = payloads_to_end(&mut follower).await;
    assert!(
        followed
            .iter()
            .any(|p| p["type"] == "run_ended" && p["status"] == "completed"),
        "{followed:?}"
    );
    assert!(
        a.wait_exit().success(),
        "mecated did not exit 0 after draining"
    );

    // The waiting run on the other replica took the session once A's run
    // released it: long before its lease could have expired.
    let (status, next) = b_run.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(next["status"], "completed", "{next}");
    let log = events(&b, "t").await;
    let end_of_a = log
        .iter()
        .position(|e| e["payload"]["type"] == "run_ended")
        .expect("A's run ended in the log");
    let start_of_b = log
        .iter()
        .position(is_run_started_by("proc-b"))
        .expect("B's run is in the log");
    assert!(end_of_a < start_of_b, "{log:?}");
    assert!(
        events(&b, "other").await.is_empty(),
        "the refused run wrote to its session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_on_a_draining_replica_is_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let slow = ["--echo-delay", "60s", "--echo-steps", "30"];
    let mut a = Mecated::start(dir.path(), "proc-a", &[&LONG_TTL[..], &slow].concat());
    let mut b = Mecated::start(dir.path(), "proc-b", &LONG_TTL);
    create(&a, "t").await;
    let a_run = run_in_background(&a, "t", json!("long"));
    wait_for_event(&a, "t", is_run_started_by("proc-a")).await;
    // B waits for the session A holds for the next minute.
    let b_url = b.url("/v1/sessions/t/runs?wait=50s");
    let waiter = tokio::spawn(async move {
        let r = client()
            .post(b_url)
            .json(&json!({ "input": "waiting" }))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter did not wait");

    // B drains: its waiter is answered now, not when A's run ends.
    b.signal(Signal::SIGTERM);
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter was not answered while its replica drained")
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "draining", "{body}");
    assert!(b.wait_exit().success());
    assert!(!a_run.is_finished(), "A's run should still be in progress");

    // A second signal ends a drain: A's run is cancelled, and its lease
    // released.
    a.signal(Signal::SIGTERM);
    until_not_ready(&a, "draining").await;
    a.signal(Signal::SIGTERM);
    let cancelled = a_run.await.unwrap().unwrap();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(a.wait_exit().success());
    let c = Mecated::start(dir.path(), "proc-c", &LONG_TTL);
    let (status, body) = run(&c, "t", json!("right after")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the session was not released: {body}"
    );
}

/// A run start that passed the drain check just before the drain began,
/// and was still reading its session: the drain waits for it, and it is
/// refused as `draining` (nothing claimed) rather than started and then
/// cancelled by the shutdown that follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_in_flight_when_the_drain_begins_is_refused_and_waited_for() {
    use std::sync::Arc;

    use lease_keeper::LeaseKeeper;
    use lease_port::{OwnerId, SessionId, SessionLease};
    use mecated::agent::EchoAgent;
    use mecated::engine::{Engine, EngineError, Exclusivity};
    use mecated::metrics::Metrics;
    use memlease::MemLease;
    use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};

    use crate::support::counting_store::CountingStore;

    let dir = tempfile::tempdir().unwrap();
    let options = JsonlOptions::default().fsync(FsyncPolicy::Never);
    let store = Arc::new(CountingStore::new(
        JsonlStore::open(dir.path(), options).unwrap(),
    ));
    let ttl = Duration::from_secs(5);
    let backend: Arc<dyn SessionLease> = Arc::new(MemLease::new(ttl));
    let keeper = LeaseKeeper::builder(backend, OwnerId::new("p").unwrap(), ttl)
        .build()
        .unwrap();
    let engine = Engine::new(
        Arc::clone(&store) as Arc<dyn SessionStore>,
        keeper,
        Arc::new(EchoAgent::default()),
        Arc::new(Metrics::default()),
        Exclusivity::Leased,
    );
    let s = SessionId::new("s").unwrap();
    engine.create_session(&s).await.unwrap();

    let held = store.hold_next_existence_check();
    let starting = tokio::spawn({
        let (engine, s) = (engine.clone(), s.clone());
        async move { engine.start_run(s, json!("late")).await }
    });
    held.entered.notified().await;
    engine.begin_drain();
    let mut drained = Box::pin(engine.runs_drained());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut drained)
            .await
            .is_err(),
        "counted drained while a start was in flight"
    );
    held.release.notify_one();
    let refused = starting.await.unwrap().unwrap_err();
    assert!(matches!(refused, EngineError::Draining), "{refused}");
    tokio::time::timeout(PATIENCE, drained)
        .await
        .expect("drained once the start was refused");
    let log = store.inner.read(&s, 1, 10).await.unwrap();
    assert!(log.events.is_empty(), "{:?}", log.events);
}
