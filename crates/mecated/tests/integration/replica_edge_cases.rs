//! Edge cases of the multi-replica run features (follow, wait, cancel)
//! with real `mecated` processes: a wait that lands on the holder's own
//! replica, a follow of an unleased session with earlier runs, and more
//! followers than the kernel gives a user inotify instances.

use std::time::Instant;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::sse::{follow_from, payloads_to_end};
use crate::support::*;

/// One unleased server whose runs take `delay`, in three steps.
fn unleased_echo(store: &std::path::Path, delay: &str) -> Mecated {
    Mecated::start(
        store,
        "solo",
        &[
            "--no-session-lease",
            "--echo-delay",
            delay,
            "--echo-steps",
            "3",
        ],
    )
}

/// `?wait=` promises to wait for the session instead of refusing. Behind a
/// load balancer the waiting request lands on the replica that holds the
/// run as often as on any other; there it must wait too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_on_the_holders_own_replica_waits_instead_of_refusing() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(
        dir.path(),
        "holder",
        &["--echo-delay", "2s", "--echo-steps", "4"],
    );
    create(&m, "queued-here").await;
    let first = run_in_background(&m, "queued-here", json!("first"));
    wait_for_event(&m, "queued-here", is_run_started_by("holder")).await;

    let r = client()
        .post(m.url("/v1/sessions/queued-here/runs?wait=30s"))
        .json(&json!({ "input": "second" }))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(
        status,
        StatusCode::OK,
        "a run asked to wait 30 s for a session busy for 2 s was refused: {body}"
    );
    assert_eq!(body["status"], "completed", "{body}");
    let first = first.await.unwrap().unwrap();
    assert_eq!(first["status"], "completed", "{first}");
}

/// A follow ends when *the run that was live* ends. Unleased, runs carry no
/// token, so the end of an earlier, finished run must not be taken for the
/// end of the live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unleased_follow_from_the_start_does_not_end_at_an_earlier_runs_end() {
    let dir = tempfile::tempdir().unwrap();
    let m = unleased_echo(dir.path(), "3s");
    create(&m, "history").await;
    // A finished run: its `run_ended` stays in the log.
    let (status, done) = run(&m, "history", json!("earlier")).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let before = events(&m, "history").await.len();

    // A second run, live while the follow starts.
    let live = run_in_background(&m, "history", json!("live"));
    let start = Instant::now();
    while events(&m, "history").await.len() <= before {
        assert!(start.elapsed() < PATIENCE, "the second run never started");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let mut stream = follow_from(&m, "history", None).await;
    let (payloads, end) = payloads_to_end(&mut stream).await;
    let starts = payloads
        .iter()
        .filter(|p| p["type"] == "run_started")
        .count();
    let ends = payloads.iter().filter(|p| p["type"] == "run_ended").count();
    assert_eq!(
        (starts, ends),
        (2, 2),
        "the follow ended ({end}) before the live run did; it saw {payloads:?}"
    );
    let live = live.await.unwrap().unwrap();
    assert_eq!(live["status"], "completed", "{live}");
}

/// The per-user inotify instance limit, which the JSONL store's waits for
/// appends draw on.
fn inotify_instance_limit() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .expect("a Linux host")
        .trim()
        .parse()
        .unwrap()
}

/// Many clients following one live run (an operator page open in many
/// tabs, a fan-out of dashboards) must all follow it. On the JSONL store
/// each waiting follower holds an inotify instance of its own, and the
/// kernel allows a user few of them (128 by default, shared with every
/// other process of the user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_followers_of_one_live_run_all_follow_it() {
    let followers = inotify_instance_limit() + 8;
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(
        dir.path(),
        "watched",
        &["--echo-delay", "10s", "--echo-steps", "2"],
    );
    create(&m, "popular").await;
    let pending = run_in_background(&m, "popular", json!("slow"));
    let started = wait_for_event(&m, "popular", is_run_started_by("watched")).await;
    let after = started["seq"].as_u64().unwrap();

    let mut streams = Vec::with_capacity(followers);
    for _ in 0..followers {
        streams.push(follow_from(&m, "popular", Some(after)).await);
    }
    // Every follower's first message must be the run's next event, never
    // an end: the run is live and quiet until its first progress step.
    let mut failed = Vec::new();
    for (i, stream) in streams.iter_mut().enumerate() {
        let first = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("a follower heard nothing at all")
            .expect("a follower's stream broke");
        if first.event == "end" {
            failed.push((i, first.data));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {followers} followers of a live run were ended at once; first: {:?}",
        failed.len(),
        failed.first()
    );
    drop(streams);
    let _ = pending.await;
}

/// A client whose run stream broke resumes with `Last-Event-ID` on another
/// replica after its run's holder died and another client's run took the
/// session: it gets the rest of its own run and the end the next owner
/// recorded for it (`interrupted`), never the other run's start or events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_follow_stays_with_its_own_run_after_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) = mid_run(dir.path(), &[], "resumed", "4s", json!("first")).await;
    // What the client saw before its stream broke: up to the first progress.
    let seen = events(&a, "resumed")
        .await
        .into_iter()
        .find(|e| e["payload"]["type"] == "progress")
        .and_then(|e| e["seq"].as_u64())
        .expect("a progress event");
    a.signal(nix::sys::signal::Signal::SIGKILL);
    let second = run_when_free(&b, "resumed", json!("second")).await;
    assert_eq!(second["status"], "completed", "{second}");

    let mut stream = follow_from(&b, "resumed", Some(seen)).await;
    let (payloads, end) = payloads_to_end(&mut stream).await;
    assert_eq!(end["reason"], "run_ended", "{end} after {payloads:?}");
    let token = started["token"].as_u64().unwrap();
    let [.., takeover, ended] = &payloads[..] else {
        panic!("{payloads:?}")
    };
    assert_eq!(takeover["type"], "takeover", "{payloads:?}");
    assert_eq!(ended["type"], "run_ended", "{payloads:?}");
    assert_eq!(ended["status"], "interrupted", "{payloads:?}");
    assert_eq!(ended["run_token"], token, "{payloads:?}");
    for p in &payloads {
        assert_ne!(
            p["type"], "run_started",
            "another run's start was sent: {payloads:?}"
        );
        assert_ne!(
            p["content"], "second",
            "the other run's message was sent: {payloads:?}"
        );
    }
    // Everything the first run stored after what the client saw, in order,
    // then its end.
    let log = events(&b, "resumed").await;
    let rest: Vec<Value> = log
        .iter()
        .filter(|e| e["seq"].as_u64() > Some(seen) && e["token"].as_u64() == Some(token))
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(payloads[..payloads.len() - 2], rest[..]);
}

/// Unleased, every run carries no token: a follow resumed from an event of
/// a finished run ends at that run's own end, not at the live run's, and
/// sends none of the live run's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unleased_resumed_follow_ends_at_its_own_runs_end() {
    let dir = tempfile::tempdir().unwrap();
    let m = unleased_echo(dir.path(), "2s");
    create(&m, "mine").await;
    let (status, first) = run(&m, "mine", json!("earlier")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let log = events(&m, "mine").await;
    let seen = log
        .iter()
        .find(|e| e["payload"]["type"] == "progress")
        .and_then(|e| e["seq"].as_u64())
        .unwrap();
    let first_end = log.last().unwrap()["seq"].as_u64().unwrap();
    let _live = run_in_background(&m, "mine", json!("live"));
    wait_for_event(&m, "mine", |e| {
        e["payload"]["type"] == "run_started" && e["seq"].as_u64() > Some(first_end)
    })
    .await;

    let mut stream = follow_from(&m, "mine", Some(seen)).await;
    let (payloads, end) = payloads_to_end(&mut stream).await;
    assert_eq!(end["reason"], "run_ended", "{end} after {payloads:?}");
    let expected: Vec<Value> = log
        .iter()
        .filter(|e| e["seq"].as_u64() > Some(seen))
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(payloads, expected, "exactly the rest of the earlier run");
}

/// A position past the log's end would wait for events that were never
/// stored and miss every one before it: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_from_past_the_logs_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(dir.path(), "solo", &[]);
    create(&m, "short").await;
    let (status, _) = run(&m, "short", json!("one")).await;
    assert_eq!(status, StatusCode::OK);
    let last = events(&m, "short").await.last().unwrap()["seq"]
        .as_u64()
        .unwrap();
    for (header, query) in [(Some(last + 1), ""), (None, "?after=9999")] {
        let mut req = client()
            .get(m.url(&format!("/v1/sessions/short/events{query}")))
            .header("accept", "text/event-stream");
        if let Some(h) = header {
            req = req.header("last-event-id", h.to_string());
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{header:?} {query}: {body}"
        );
        assert_eq!(body["error"]["code"], "invalid", "{body}");
    }
    // The last event itself is a fine place to resume from.
    let mut stream = follow_from(&m, "short", Some(last)).await;
    let (payloads, end) = payloads_to_end(&mut stream).await;
    assert!(payloads.is_empty(), "{payloads:?}");
    assert_eq!(end["reason"], "no_live_run", "{end}");
}
