//! Real `mecated` processes behind a round-robin proxy, as a load balancer
//! puts them: a run started on one replica is followed, resumed and
//! cancelled through others, and a run that waits for its session starts
//! once the holder releases it.

use std::time::Instant;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::proxy::RoundRobin;
use crate::support::sse::{SseMessage, SseReader, follow_url};
use crate::support::*;

/// Slow runs, so that following and cancelling happen mid-run: 20 steps
/// over 6 s.
const SLOW: &[&str] = &[
    "--echo-delay",
    "6s",
    "--echo-steps",
    "20",
    "--session-lease-ttl",
    "2s",
];

/// A client that opens a new connection for every request, so the proxy
/// decides where each one lands.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn replicas(store: &std::path::Path, n: usize) -> Vec<Mecated> {
    (0..n)
        .map(|i| Mecated::start(store, &format!("replica-{i}"), SLOW))
        .collect()
}

/// Starts a run of `id` through the proxy (landing where the proxy says);
/// its JSON result.
fn run_through(
    proxy: &RoundRobin,
    id: &str,
    query: &str,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let url = proxy.url(&format!("/v1/sessions/{id}/runs{query}"));
    tokio::spawn(async move {
        let r = fresh_client()
            .post(url)
            .json(&json!({ "input": "through the proxy" }))
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    })
}

async fn follow(proxy: &RoundRobin, id: &str, last_event_id: Option<u64>) -> SseReader {
    let url = proxy.url(&format!("/v1/sessions/{id}/events"));
    follow_url(&fresh_client(), url, last_event_id).await
}

fn seq_of(m: &SseMessage) -> u64 {
    let id: u64 =
        m.id.as_deref()
            .expect("an event without id")
            .parse()
            .unwrap();
    assert_eq!(m.data["seq"].as_u64(), Some(id), "id is not the seq: {m:?}");
    id
}

/// Reads events until `n` progress events were seen.
async fn read_progress(stream: &mut SseReader, n: usize, seen: &mut Vec<u64>) {
    let start = Instant::now();
    let mut progress = 0;
    while progress < n {
        let m = stream
            .next()
            .await
            .expect("the stream ended before the run progressed");
        assert_eq!(m.event, "event", "{m:?}");
        seen.push(seq_of(&m));
        if m.data["payload"]["type"] == "progress" {
            progress += 1;
        }
        assert!(start.elapsed() < PATIENCE);
    }
}

/// Reads to the end of a follow: the events' seqs and the end's data.
async fn read_to_end(stream: &mut SseReader, seen: &mut Vec<u64>) -> (Vec<Value>, Value) {
    let mut payloads = Vec::new();
    loop {
        let m = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("the follow never ended")
            .expect("the stream broke before its end");
        if m.event == "end" {
            assert_eq!(m.id, None, "the end carries no id");
            return (payloads, m.data);
        }
        seen.push(seq_of(&m));
        payloads.push(m.data["payload"].clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_followed_and_cancelled_through_other_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let r = replicas(dir.path(), 3);
    let proxy = RoundRobin::start(&[&r[0], &r[1], &r[2]]).await;
    create(&r[0], "chat").await;

    proxy.next_to(0);
    let run = run_through(&proxy, "chat", "");
    wait_for_event(&r[0], "chat", is_run_started_by("replica-0")).await;

    // Followed on replica 1, which does not hold the run.
    proxy.next_to(1);
    let mut stream = follow(&proxy, "chat", None).await;
    let mut seen = Vec::new();
    read_progress(&mut stream, 2, &mut seen).await;

    // Cancelled on replica 2, which does not hold it either.
    proxy.next_to(2);
    let cancel = fresh_client()
        .delete(proxy.url("/v1/sessions/chat/runs/current"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::ACCEPTED);
    let cancel: Value = cancel.json().await.unwrap();
    assert_eq!(cancel["live"], true, "{cancel}");
    assert_eq!(cancel["here"], false, "{cancel}");
    let token = cancel["token"].as_u64().expect("the run's token");

    // The follower sees the run end, cancelled, and the follow end there.
    let (payloads, end) = read_to_end(&mut stream, &mut seen).await;
    assert_eq!(end["reason"], "run_ended", "{end}");
    let last = payloads.last().unwrap();
    assert_eq!(last["type"], "run_ended");
    assert_eq!(last["status"], "cancelled", "{last}");
    assert!(
        payloads.iter().filter(|p| p["type"] == "progress").count() < 18,
        "the run was not stopped early: {payloads:?}"
    );
    let (status, result) = run.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["token"].as_u64(), Some(token));
    assert_eq!(&proxy.landed()[..3], [0, 1, 2], "requests landed elsewhere");

    // The same cancel again: idempotent, nothing live.
    proxy.next_to(1);
    let again: Value = fresh_client()
        .delete(proxy.url("/v1/sessions/chat/runs/current"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["live"], false, "{again}");

    // The request named the cancelled run: a later run is not stopped by
    // it, wherever it runs.
    proxy.next_to(2);
    let (status, later) = run_through(&proxy, "chat", "").await.unwrap();
    assert_eq!(status, StatusCode::OK, "{later}");
    assert_eq!(later["status"], "completed", "{later}");
    assert!(later["token"].as_u64().unwrap() > token);

    let log = events(&r[1], "chat").await;
    assert_gapless(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_resumes_on_another_replica_without_gap_or_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let r = replicas(dir.path(), 3);
    let proxy = RoundRobin::start(&[&r[0], &r[1], &r[2]]).await;
    create(&r[0], "resumed").await;

    proxy.next_to(0);
    let run = run_through(&proxy, "resumed", "");
    wait_for_event(&r[0], "resumed", is_run_started_by("replica-0")).await;

    proxy.next_to(1);
    let mut stream = follow(&proxy, "resumed", None).await;
    let mut seen = Vec::new();
    read_progress(&mut stream, 3, &mut seen).await;
    proxy.cut(1);
    // Whatever was already on its way before the cut still counts; then
    // the stream breaks.
    while let Some(m) = stream.next().await {
        assert_ne!(m.event, "end", "the run ended before the cut");
        seen.push(seq_of(&m));
    }

    proxy.next_to(2);
    let last = *seen.last().unwrap();
    let mut resumed = follow(&proxy, "resumed", Some(last)).await;
    let (_, end) = read_to_end(&mut resumed, &mut seen).await;
    assert_eq!(end["reason"], "run_ended", "{end}");
    let (_, result) = run.await.unwrap();
    assert_eq!(result["status"], "completed", "{result}");

    // Every event of the log exactly once, in order, across both streams.
    let log: Vec<u64> = events(&r[2], "resumed")
        .await
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seen, log, "the streams missed or repeated events");
    assert_eq!(&proxy.landed()[1..3], [1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_starts_once_the_holder_releases() {
    let dir = tempfile::tempdir().unwrap();
    let r = replicas(dir.path(), 2);
    let proxy = RoundRobin::start(&[&r[0], &r[1]]).await;
    create(&r[0], "queued").await;

    proxy.next_to(0);
    let first = run_through(&proxy, "queued", "");
    wait_for_event(&r[0], "queued", is_run_started_by("replica-0")).await;

    // Without waiting: refused, told when to come back.
    proxy.next_to(1);
    let refused = fresh_client()
        .post(proxy.url("/v1/sessions/queued/runs"))
        .json(&json!({ "input": "now" }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "TTL 2 s: {retry_after}");

    // Waiting briefly is not enough: refused at the end of the wait.
    proxy.next_to(1);
    let (status, body) = run_through(&proxy, "queued", "?wait=100ms").await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Waiting long enough: started on replica 1 right after the release.
    proxy.next_to(1);
    let (status, waited) = run_through(&proxy, "queued", "?wait=60s").await.unwrap();
    assert_eq!(status, StatusCode::OK, "{waited}");
    assert_eq!(waited["status"], "completed", "{waited}");
    let (_, first) = first.await.unwrap();
    assert_eq!(
        first["status"], "completed",
        "the waiting run cut the first: {first}"
    );

    let log = events(&r[0], "queued").await;
    let first_end = log
        .iter()
        .find(|e| e["payload"]["type"] == "run_ended")
        .expect("the first run's end");
    let second_start = log
        .iter()
        .rfind(|e| is_run_started_by("replica-1")(e))
        .expect("the waiting run's start");
    assert_eq!(
        second_start["seq"].as_u64().unwrap(),
        first_end["seq"].as_u64().unwrap() + 1,
        "the waiting run did not start right after the first ended"
    );
    assert!(second_start["token"].as_u64() > first_end["token"].as_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_a_session_without_a_live_run_sends_the_log_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(dir.path(), "solo", &[]);
    create(&m, "done").await;
    let (status, _) = run(&m, "done", json!("quick")).await;
    assert_eq!(status, StatusCode::OK);
    let log = events(&m, "done").await;

    let r = client()
        .get(m.url("/v1/sessions/done/events?after=1"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    let mut stream = SseReader::new(r);
    let mut seen = Vec::new();
    let (_, end) = read_to_end(&mut stream, &mut seen).await;
    assert_eq!(end["reason"], "no_live_run", "{end}");
    let expected: Vec<u64> = log
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .skip(1)
        .collect();
    assert_eq!(seen, expected);

    // Bad positions and unknown sessions are refused, not streamed.
    for (path, header, status) in [
        ("/v1/sessions/done/events", "x", StatusCode::BAD_REQUEST),
        ("/v1/sessions/nope/events", "0", StatusCode::NOT_FOUND),
    ] {
        let r = client()
            .get(m.url(path))
            .header("accept", "text/event-stream")
            .header("last-event-id", header)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{path}");
    }
}
