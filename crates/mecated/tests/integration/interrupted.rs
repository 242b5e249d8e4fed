//! A run whose process died without recording its end, with real
//! processes: the next owner of the session records that end as
//! `interrupted`, under its own token and before its own claim, exactly
//! once; a session whose runs all ended is claimed as before.

use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

fn kind(e: &Value) -> &str {
    e["payload"]["type"].as_str().unwrap_or_default()
}

/// Every `run_started` of `log` with the one end it has: each run ends
/// exactly once, and before the next run starts.
fn runs_and_ends(log: &[Value]) -> Vec<(Value, Value)> {
    let mut runs = Vec::new();
    let mut open: Option<Value> = None;
    for e in log {
        match kind(e) {
            "run_started" => {
                assert!(
                    open.is_none(),
                    "a run started while another was open: {log:#?}"
                );
                open = Some(e.clone());
            }
            "run_ended" => {
                let start = open
                    .take()
                    .unwrap_or_else(|| panic!("an end of no run: {log:#?}"));
                runs.push((start, e.clone()));
            }
            _ => {}
        }
    }
    assert!(open.is_none(), "the last run has no end: {log:#?}");
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_owner_ends_a_killed_run_as_interrupted_once_before_its_claim() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) = mid_run(dir.path(), &[], "s", "30s", json!("first")).await;
    a.signal(Signal::SIGKILL);
    let second = run_when_free(&b, "s", json!("second")).await;
    assert_eq!(second["status"], "completed", "{second}");
    // And a run after an orderly one: nothing more to close.
    let (status, third) = run(&b, "s", json!("third")).await;
    assert_eq!(status, StatusCode::OK, "{third}");

    let log = events(&b, "s").await;
    assert_gapless(&log);
    let runs = runs_and_ends(&log);
    assert_eq!(runs.len(), 3, "{log:#?}");
    let (first_start, first_end) = &runs[0];
    assert_eq!(first_start, &started);
    assert_eq!(first_end["payload"]["status"], "interrupted", "{first_end}");
    assert_eq!(first_end["payload"]["run_seq"], started["seq"]);
    assert_eq!(first_end["payload"]["run_token"], started["token"]);
    // Written by the next owner, under its token (above the first run's),
    // after a takeover that fenced the first owner out, and right before
    // the next run's claim.
    let (second_start, _) = &runs[1];
    let b_token = second_start["token"].as_u64().unwrap();
    assert!(b_token > started["token"].as_u64().unwrap(), "{log:#?}");
    assert_eq!(first_end["token"], b_token);
    let end_at = log.iter().position(|e| e == first_end).unwrap();
    assert_eq!(kind(&log[end_at - 1]), "takeover", "{log:#?}");
    assert_eq!(log[end_at - 1]["token"], b_token);
    assert!(
        log[..end_at - 1]
            .iter()
            .all(|e| e["token"].as_u64() <= started["token"].as_u64()),
        "{log:#?}"
    );
    assert_eq!(&log[end_at + 1], second_start);
    // Exactly one takeover and one interrupted end in the whole log.
    assert_eq!(log.iter().filter(|e| kind(e) == "takeover").count(), 1);
    assert_eq!(
        log.iter()
            .filter(|e| e["payload"]["status"] == "interrupted")
            .count(),
        1
    );
    // The third run follows the second's end directly.
    let (third_start, _) = &runs[2];
    let second_end_at = log.iter().position(|e| e == &runs[1].1).unwrap();
    assert_eq!(&log[second_end_at + 1], third_start);
}

/// Unleased, a process restarted after a crash ends its predecessor's run
/// (no takeover event: no other process writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unleased_server_restarted_after_a_crash_ends_the_run_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let unleased = ["--no-session-lease", "--echo-delay", "30s"];
    let a = Mecated::start(dir.path(), "proc-a", &unleased);
    create(&a, "s").await;
    let _pending = run_in_background(&a, "s", json!("first"));
    let started = wait_for_event(&a, "s", is_run_started_by("proc-a")).await;
    a.signal(Signal::SIGKILL);
    drop(a);
    let b = Mecated::start(dir.path(), "proc-b", &["--no-session-lease"]);
    let (status, second) = run(&b, "s", json!("second")).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let log = events(&b, "s").await;
    let runs = runs_and_ends(&log);
    assert_eq!(runs.len(), 2, "{log:#?}");
    assert_eq!(runs[0].1["payload"]["status"], "interrupted");
    assert_eq!(runs[0].1["payload"]["run_seq"], started["seq"]);
    assert!(log.iter().all(|e| kind(e) != "takeover"), "{log:#?}");
}

/// A follower of the interrupted run is sent the next owner's `takeover`
/// before the run's end. Its stream breaking right there and resuming from
/// the takeover (`Last-Event-ID`), it still follows the interrupted run to
/// that end, not the new owner's run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_resumed_from_the_takeover_ends_with_the_interrupted_run() {
    use std::sync::Arc;
    use std::time::Duration;

    use lease_keeper::LeaseKeeper;
    use lease_port::{FencingToken, OwnerId, SessionId, SessionLease};
    use mecated::agent::EchoAgent;
    use mecated::engine::{Engine, Exclusivity, FollowEnd, FollowItem};
    use mecated::metrics::Metrics;
    use memlease::MemLease;
    use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

    let dir = tempfile::tempdir().unwrap();
    let options = JsonlOptions::default().fsync(FsyncPolicy::Never);
    let store = Arc::new(JsonlStore::open(dir.path(), options).unwrap());
    let s = SessionId::new("s").unwrap();
    store.create(&s).await.unwrap();
    let a = WriteFence::new(FencingToken::new(5), OwnerId::new("a#1").unwrap());
    let b = WriteFence::new(FencingToken::new(6), OwnerId::new("b#1").unwrap());
    let log = [
        (
            &a,
            json!({"type": "run_started", "owner": "a", "token": 5, "input": "x"}),
        ),
        (&a, json!({"type": "progress", "step": 1, "of": 3})),
        (&b, json!({"type": "takeover", "owner": "b", "token": 6})),
        (
            &b,
            json!({"type": "run_ended", "status": "interrupted", "run_seq": 1, "run_token": 5}),
        ),
        (
            &b,
            json!({"type": "run_started", "owner": "b", "token": 6, "input": "y"}),
        ),
        (&b, json!({"type": "message", "content": "y"})),
        (&b, json!({"type": "run_ended", "status": "completed"})),
    ];
    for (fence, event) in log {
        store.append(&s, fence.clone(), &[event]).await.unwrap();
    }
    let backend: Arc<dyn SessionLease> = Arc::new(MemLease::new(Duration::from_secs(5)));
    let keeper = LeaseKeeper::builder(backend, OwnerId::new("c").unwrap(), Duration::from_secs(5))
        .build()
        .unwrap();
    let engine = Engine::new(
        store,
        keeper,
        Arc::new(EchoAgent::default()),
        Arc::new(Metrics::default()),
        Exclusivity::Leased,
    );
    for last_seen in [2, 3] {
        let mut follow = engine.resume(s.clone(), last_seen).await.unwrap();
        let mut sent = Vec::new();
        let end = loop {
            match tokio::time::timeout(PATIENCE, follow.recv()).await.unwrap() {
                Some(FollowItem::Event(e)) => sent.push(e.seq),
                Some(FollowItem::End(end)) => break end,
                None => panic!("the follow closed without its end"),
            }
        };
        assert_eq!(end, FollowEnd::RunEnded, "from {last_seen}: {sent:?}");
        assert_eq!(sent.last(), Some(&4), "from {last_seen}: {sent:?}");
    }
}
