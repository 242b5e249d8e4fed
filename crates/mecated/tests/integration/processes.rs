//! Real processes: the built `mecated` binary started twice on one store
//! directory, driven over HTTP, stopped with real signals.

use std::ffi::OsStr;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_process_gets_409_while_other_sessions_run_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(
        dir.path(),
        "proc-a",
        &["--echo-delay", "3s", "--echo-steps", "6"],
    );
    let b = Mecated::start(
        dir.path(),
        "proc-b",
        &["--echo-delay", "1s", "--echo-steps", "2"],
    );
    create(&a, "chat-1").await;
    create(&b, "chat-2").await;

    let long = run_in_background(&a, "chat-1", json!("slow"));
    wait_for_event(&a, "chat-1", is_run_started_by("proc-a")).await;

    let (status, body) = run(&b, "chat-1", json!("me too")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "session_leased_elsewhere");
    assert_eq!(body["error"]["holder"], "proc-a");

    // A different session runs on B while A's run is still going.
    let (status, other) = run(&b, "chat-2", json!("parallel")).await;
    assert_eq!(status, StatusCode::OK, "{other}");
    assert_eq!(other["status"], "completed");
    assert!(!long.is_finished(), "A's run should still be in progress");

    let done = long.await.unwrap().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let log = events(&a, "chat-1").await;
    let [.., message, end] = &log[..] else {
        panic!("{log:?}")
    };
    assert_eq!(message["payload"]["content"], "slow");
    assert_eq!(end["payload"]["type"], "run_ended");
    assert!(
        log.iter().all(|e| e["payload"]["content"] != "me too"),
        "B wrote to A's session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stream_as_server_sent_events() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(
        dir.path(),
        "proc-a",
        &["--echo-delay", "200ms", "--echo-steps", "2"],
    );
    create(&a, "sse").await;
    let body = client()
        .post(a.url("/v1/sessions/sse/runs"))
        .header("accept", "text/event-stream")
        .json(&json!({"input": {"text": "hi"}}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let kinds: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds, ["event", "event", "event", "event", "end"], "{body}");
    assert!(body.contains(r#""status":"completed""#), "{body}");
    assert!(body.contains(r#""content":{"text":"hi"}"#), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_after_the_ttl_with_a_higher_token() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) = mid_run(dir.path(), &[], "k", "20s", json!("x")).await;
    a.signal(Signal::SIGKILL);
    // The dead holder's lease as recorded, read before anyone can take it:
    // no earlier than `listed_at + expires_in`.
    let listed_at = wall_ms();
    let lease = listed_lease(dir.path(), "k");
    assert_eq!(lease["holder"], "proc-a", "{lease}");
    let dead_until = listed_at + lease["expires_in_ms"].as_u64().expect("a live lease");

    // Until then the session stays the dead holder's: refused, not taken.
    let mut refused_before_expiry = 0;
    let taken = loop {
        let sent_at = wall_ms();
        let (status, body) = run(&b, "k", json!("after the crash")).await;
        if status == StatusCode::OK {
            break body;
        }
        assert_eq!(body["error"]["code"], "session_leased_elsewhere", "{body}");
        if sent_at < dead_until {
            refused_before_expiry += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(taken["status"], "completed", "{taken}");
    assert!(
        taken["token"].as_u64().unwrap() > started["token"].as_u64().unwrap(),
        "takeover token {} not above {}",
        taken["token"],
        started["token"]
    );
    let log = events(&b, "k").await;
    let takeover = log
        .iter()
        .find(|e| e["payload"]["type"] == "run_started" && e["payload"]["owner"] == "proc-b")
        .expect("B's run_started");
    assert!(
        takeover["time_ms"].as_u64().unwrap() >= dead_until,
        "B took the session at {} ms, before the dead holder's lease ran out at {dead_until} ms",
        takeover["time_ms"]
    );
    // B's first attempt followed the kill at once; unless this machine
    // stalled past the whole TTL, it came before the expiry and was refused.
    assert!(
        refused_before_expiry > 0 || wall_ms() > dead_until + 5_000,
        "no attempt was refused while the dead holder's lease was live"
    );
    // The log is intact: every event A wrote, then B's run, in order.
    let log = events(&b, "k").await;
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gaps in {seqs:?}"
    );
    let [.., message, end] = &log[..] else {
        panic!("{log:?}")
    };
    assert_eq!(message["payload"]["content"], "after the crash");
    assert_eq!(end["payload"]["status"], "completed");
    assert!(log.iter().any(|e| e["payload"]["type"] == "progress"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstopped_holder_is_fenced_off_after_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, a_run, a_started) = mid_run(dir.path(), &[], "p", "6s", json!("from a")).await;
    a.signal(Signal::SIGSTOP);

    let b_run = run_when_free(&b, "p", json!("from b")).await;
    assert_eq!(b_run["status"], "completed", "{b_run}");
    let b_token = b_run["token"].as_u64().unwrap();
    assert!(b_token > a_started["token"].as_u64().unwrap());

    a.signal(Signal::SIGCONT);
    let a_result = a_run.await.unwrap().unwrap();
    assert_eq!(a_result["status"], "lease_lost", "{a_result}");

    // Give A every chance to write late, then check it never did.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = events(&b, "p").await;
    let b_first = log
        .iter()
        .find(|e| is_run_started_by("proc-b")(e))
        .expect("B's run is in the log")["seq"]
        .as_u64()
        .unwrap();
    for e in &log {
        if e["seq"].as_u64().unwrap() > b_first {
            assert_eq!(
                e["token"].as_u64().unwrap(),
                b_token,
                "a stale write reached the log: {e}"
            );
        }
    }
    assert!(
        log.iter().all(|e| e["payload"]["content"] != "from a"),
        "A's reply was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_leases_so_the_next_process_acquires_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // A long TTL: if A did not release, B would be refused for a minute.
    let ttl = ["--session-lease-ttl", "60s"];
    // No drain: the run in progress is cancelled at once (`drain` tests
    // the drain).
    let slow = ["--echo-delay", "30s", "--echo-steps", "30"];
    let mut a = Mecated::start(
        dir.path(),
        "proc-a",
        &[&ttl[..], &slow, &["--drain-timeout", "0s"]].concat(),
    );
    let b = Mecated::start(dir.path(), "proc-b", &ttl);
    create(&a, "t").await;
    let a_run = run_in_background(&a, "t", json!("long"));
    wait_for_event(&a, "t", is_run_started_by("proc-a")).await;
    let (status, _) = run(&b, "t", json!("too early")).await;
    assert_eq!(status, StatusCode::CONFLICT);

    a.signal(Signal::SIGTERM);
    assert!(a.wait_exit().success(), "mecated did not exit 0 on SIGTERM");
    let cancelled = a_run.await.unwrap().unwrap();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");

    let (status, body) = run(&b, "t", json!("right after")).await;
    assert_eq!(status, StatusCode::OK, "B had to wait: {body}");
    assert_eq!(body["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_documented_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(dir.path(), "proc-a", &["--max-body-bytes", "1024"]);
    create(&a, "ok").await;
    let c = client();
    let code = |v: &Value| v["error"]["code"].as_str().unwrap_or_default().to_owned();

    let r = c
        .post(a.url("/v1/sessions/ok/runs"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(code(&r.json().await.unwrap()), "invalid");

    let r = c
        .post(a.url("/v1/sessions/ok/runs"))
        .json(&json!({"inputs": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::BAD_REQUEST,
        "unknown field accepted"
    );

    let r = c
        .post(a.url("/v1/sessions/ok/runs"))
        .json(&json!({"input": "x".repeat(4096)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(code(&r.json().await.unwrap()), "invalid");

    let (status, body) = run(&a, "missing", json!("x")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(code(&body), "not_found");

    let r = c
        .get(a.url("/v1/sessions/ok/events?limit=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // A control character in the id is refused.
    let r = c
        .post(a.url("/v1/sessions"))
        .json(&json!({"id": "a\nb"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(code(&r.json().await.unwrap()), "invalid");

    // Path-like ids are just ids: stored under an encoded name inside the
    // store, never outside it.
    let r = c
        .post(a.url("/v1/sessions"))
        .json(&json!({"id": "../../escape"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(!dir.path().parent().unwrap().join("escape").exists());
    let (status, body) = run(&a, "..%2F..%2Fescape", json!("inside")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Nothing was written by the refused requests.
    assert_eq!(events(&a, "ok").await.len(), 0);
    let listed: Value = c
        .get(a.url("/v1/sessions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["../../escape", "ok"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_listing_shows_the_holder_and_token() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(
        dir.path(),
        "proc-a",
        &["--echo-delay", "5s", "--echo-steps", "5"],
    );
    create(&a, "listed").await;
    let _run = run_in_background(&a, "listed", json!("x"));
    let started = wait_for_event(&a, "listed", is_run_started_by("proc-a")).await;
    let out = Command::new(env!("CARGO_BIN_EXE_mecated"))
        .args(["leases", "--json", "--store-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["session"], "listed");
    assert_eq!(lines[0]["holder"], a.owner);
    assert_eq!(lines[0]["state"], "live");
    assert_eq!(lines[0]["token"], started["token"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_openapi_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(dir.path(), "proc-a", &[]);
    let c = client();
    assert_eq!(
        c.get(a.url("/healthz")).send().await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        c.get(a.url("/readyz")).send().await.unwrap().status(),
        StatusCode::OK
    );
    create(&a, "m").await;
    let (status, _) = run(&a, "m", json!("x")).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics(&a).await;
    assert!(
        metrics.contains("mecated_runs_total{outcome=\"completed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mecated_session_lease_acquisitions_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mecated_session_leases_held 0"),
        "{metrics}"
    );
    let spec: Value = c
        .get(a.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(spec["openapi"], "3.1.0");
    for path in [
        "/v1/sessions",
        "/v1/sessions/{id}/runs",
        "/v1/sessions/{id}/events",
    ] {
        assert!(
            spec["paths"][path].is_object(),
            "{path} missing from the OpenAPI document"
        );
    }
    let r = c.get(a.url("/no/such/route")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_needs_the_lease_or_the_single_process_proof() {
    let c = client();
    // Leased: a delete waits for nobody; it takes the lease or gets 409.
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(dir.path(), "proc-a", &["--echo-delay", "5s"]);
    let b = Mecated::start(dir.path(), "proc-b", &[]);
    create(&a, "busy").await;
    create(&a, "idle").await;
    let _run = run_in_background(&a, "busy", json!("x"));
    wait_for_event(&a, "busy", is_run_started_by("proc-a")).await;
    let r = c.delete(b.url("/v1/sessions/busy")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "session_leased_elsewhere");
    let r = c.delete(b.url("/v1/sessions/idle")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, _) = run(&a, "idle", json!("x")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a deleted session ran");

    // Unleased: only the process holding the store's lock may write.
    let dir = tempfile::tempdir().unwrap();
    let first = Mecated::start(dir.path(), "solo-1", &["--no-session-lease"]);
    let second = Mecated::start(dir.path(), "solo-2", &["--no-session-lease"]);
    create(&first, "u1").await;
    create(&first, "u2").await;
    let r = c
        .delete(second.url("/v1/sessions/u1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unleased_not_exclusive");
    let (status, body) = run(&second, "u1", json!("x")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "unleased_not_exclusive");
    let r = c.delete(first.url("/v1/sessions/u2")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // The proven process runs, and its events carry no token.
    let (status, body) = run(&first, "u1", json!("x")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["token"] == 0)
    );
    assert_eq!(
        events(&second, "u1").await.len(),
        3,
        "reads still work on the second (start, message, end)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_runs_across_processes_are_never_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(dir.path(), "proc-a", &[]);
    let b = Mecated::start(dir.path(), "proc-b", &[]);
    create(&a, "hop").await;
    let mut tokens = Vec::new();
    for i in 0..20 {
        // The end of a run is reported only after its lease is released,
        // so the next run, on either process, finds the session free.
        let m = if i % 2 == 0 { &a } else { &b };
        let (status, body) = run(m, "hop", json!(i)).await;
        assert_eq!(status, StatusCode::OK, "run {i} on {}: {body}", m.owner);
        assert_eq!(body["status"], "completed");
        tokens.push(body["token"].as_u64().unwrap());
    }
    assert!(tokens.windows(2).all(|w| w[1] > w[0]), "tokens {tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_hold_the_session() {
    let dir = tempfile::tempdir().unwrap();
    // An agent that writes 5000 events of 1 KB as fast as it can: far more
    // than socket buffers and the stream buffer hold.
    let script = dir.path().join("flood.sh");
    let body = r#"#!/bin/sh
cat > /dev/null
pad=$(printf '%01000d' 0)
i=0
while [ $i -lt 5000 ]; do
  echo "{\"type\":\"blob\",\"pad\":\"$pad\"}"
  i=$((i+1))
done
"#;
    std::fs::write(&script, body).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&script, mode).unwrap();
    let store = dir.path().join("store");
    let command = script.to_str().unwrap();
    let a = Mecated::start(
        &store,
        "proc-a",
        &[
            "--agent",
            "exec",
            "--agent-command",
            command,
            "--store-fsync",
            "never",
        ],
    );
    create(&a, "flood").await;
    // Open the stream and never read it.
    let stalled = client()
        .post(a.url("/v1/sessions/flood/runs"))
        .header("accept", "text/event-stream")
        .json(&json!({"input": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stalled.status(), StatusCode::OK);

    // The run finishes and lets go of its lease regardless.
    let start = Instant::now();
    loop {
        let url = a.url("/metrics");
        let metrics = client()
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains("mecated_runs_total{outcome=\"completed\"} 1")
            && metrics.contains("mecated_session_leases_held 0")
        {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the stalled client held the run: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        events(&a, "flood").await.len(),
        5002,
        "every event is in the log (and the run's end)"
    );
    // The stalled client, reading at last, learns it fell behind.
    let text = stalled.text().await.unwrap();
    assert!(text.contains("event: end"), "no end event");
    assert!(text.contains(r#""lagged":true"#), "lag not reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_cannot_share_an_owner_id() {
    let dir = tempfile::tempdir().unwrap();
    let _a = Mecated::start(dir.path(), "same-owner", &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_mecated"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--owner",
            "same-owner",
            "--store-dir",
        ])
        .arg(dir.path())
        .env("MECATED_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a second process started under the same owner"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already in use"), "{stderr}");
    // A different owner on the same store is fine.
    let _b = Mecated::start(dir.path(), "other-owner", &[]);
}

/// `mecated gc` removes the file of a deleted session and keeps its mark;
/// live sessions and the lease directory are left alone.
#[tokio::test]
async fn gc_reclaims_deleted_sessions_and_keeps_their_marks() {
    use lease_port::{FencingToken, OwnerId, SessionId};
    use session_store::{JsonlOptions, JsonlStore, SessionStore, WriteFence};

    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    let fence = WriteFence::new(FencingToken::new(9), OwnerId::new("w").unwrap());
    let (gone, kept) = (
        SessionId::new("gone").unwrap(),
        SessionId::new("kept").unwrap(),
    );
    for s in [&gone, &kept] {
        store.create(s).await.unwrap();
        store.append(s, fence.clone(), &[json!(1)]).await.unwrap();
    }
    store.delete(&gone, fence.clone()).await.unwrap();
    let leases = dir.path().join(session_store::DEFAULT_LEASE_DIR_NAME);
    std::fs::create_dir(&leases).unwrap();
    std::fs::write(leases.join("lease-file"), "not ours").unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_mecated"))
        .args(["gc", "--older-than", "0s", "--store-dir"])
        .arg(dir.path())
        .env("MECATED_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("reclaimed gone"), "{stdout}");
    // The audit line, at info whatever the log level.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("audit") && stderr.contains(r#"what="gc" session="gone""#),
        "{stderr}"
    );
    assert!(!stderr.contains(r#"session="kept""#), "{stderr}");
    assert!(!store.path_of(&gone).exists());
    assert!(store.path_of(&kept).exists());
    assert!(leases.join("lease-file").exists());

    let fresh = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    assert_eq!(
        fresh.high_water(&gone).await.unwrap(),
        Some(FencingToken::new(9))
    );
    fresh.create(&gone).await.unwrap();
    let stale = WriteFence::new(FencingToken::new(8), OwnerId::new("old").unwrap());
    assert!(fresh.append(&gone, stale, &[json!(2)]).await.is_err());
}

/// The reproduced hole: two lease directories on one store both issue
/// token 1, so their owners would write one session at once. The store is
/// fenced by the authority of the first; the second refuses to start and
/// says which flag to fix, while another spelling of the right directory
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lease_authority_on_one_store_refuses_to_start() {
    let store = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let a = Mecated::start(store.path(), "proc-a", &[]);
    create(&a, "s").await;
    let (status, body) = run(&a, "s", json!("first")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let stderr = refused_start(
        store.path(),
        "proc-b",
        &[
            OsStr::new("--session-lease-dir"),
            elsewhere.path().as_os_str(),
        ],
    );
    assert!(stderr.contains("fenced by lease authority"), "{stderr}");
    assert!(stderr.contains("--session-lease-dir"), "{stderr}");

    let mut same = store.path().join(".session-leases").into_os_string();
    same.push("/");
    let b = Mecated::start(
        store.path(),
        "proc-b",
        &["--session-lease-dir", same.to_str().unwrap()],
    );
    drop(a);
    let taken = run_when_free(&b, "s", json!("second")).await;
    assert_eq!(taken["status"], "completed", "{taken}");
}

/// Opens a connection to `m`, sends a run request for `id`, waits `after`
/// and resets the connection (RST, not FIN), as a client that crashed or
/// was killed mid-request would.
fn reset_mid_request(m: &Mecated, id: &str, after: Duration) {
    use std::io::Write;
    let addr = m.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let body = r#"{"input":"reset"}"#;
    let request = format!(
        "POST /v1/sessions/{id}/runs HTTP/1.1\r\nHost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    std::thread::sleep(after);
    // SO_LINGER 0: closing sends RST and drops whatever was queued.
    nix::sys::socket::setsockopt(
        &stream,
        nix::sys::socket::sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .expect("SO_LINGER");
    drop(stream);
}

/// The reproduced half-start: clients resetting the connection while their
/// run was starting left `run_started` logged and no outcome. Whatever the
/// moment of the reset, a session's log holds no run, or a run that ran to
/// its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_never_half_starts_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(dir.path(), "proc-a", &[]);
    const RUNS: u64 = 40;
    for i in 0..RUNS {
        let id = format!("reset-{i}");
        create(&a, &id).await;
        // From at once to a few milliseconds: before, during and after the
        // claim.
        let after = Duration::from_micros(i * 100);
        let a_ref = &a;
        tokio::task::block_in_place(|| reset_mid_request(a_ref, &id, after));
    }
    let start = Instant::now();
    for i in 0..RUNS {
        let id = format!("reset-{i}");
        loop {
            let log = events(&a, &id).await;
            let started = log.iter().any(|e| e["payload"]["type"] == "run_started");
            let answered = log.iter().any(|e| e["payload"]["type"] == "message");
            if !started || answered {
                break;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "{id}: run_started logged, but the run never ran: {log:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // And nothing is left held: every session runs again at once.
    let (status, body) = run(&a, "reset-0", json!("after")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A store directory put back from an older copy (a backup restored in
/// place while its servers were stopped) is refused at start-up: its
/// generation is below the one its lease directory kept. Once adopted it
/// serves the older state, and tokens go on above everything issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_put_back_from_an_older_copy_is_refused_until_adopted() {
    let root = tempfile::tempdir().unwrap();
    let (store, leases, backup) = (
        root.path().join("store"),
        root.path().join("leases"),
        root.path().join("backup"),
    );
    let lease_flag = [OsStr::new("--session-lease-dir"), leases.as_os_str()];
    let serve = |owner: &str| {
        let child = server_command(&store, owner, &lease_flag)
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start mecated");
        Mecated::listening(child, owner)
    };
    let stop = |mut m: Mecated| {
        m.signal(Signal::SIGTERM);
        assert!(m.wait_exit().success());
    };
    let copy_dir = |from: &std::path::Path, to: &std::path::Path| {
        let status = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", from.display()))
            .arg(to)
            .status()
            .unwrap();
        assert!(status.success());
    };

    let m = serve("a");
    create(&m, "s").await;
    assert_eq!(run(&m, "s", json!("one")).await.0, StatusCode::OK);
    stop(m);
    std::fs::create_dir(&backup).unwrap();
    copy_dir(&store, &backup);

    let m = serve("a");
    for input in ["two", "three"] {
        let (status, body) = run(&m, "s", json!(input)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    stop(m);

    // The backup put back into the same directory (its inode unchanged).
    for entry in std::fs::read_dir(&store).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
    copy_dir(&backup, &store);
    let refused = refused_start(&store, "a", &lease_flag);
    assert!(refused.contains("older than its witness"), "{refused}");
    assert!(refused.contains("mecated adopt-store"), "{refused}");

    let adopted = Command::new(env!("CARGO_BIN_EXE_mecated"))
        .arg("adopt-store")
        .arg("--store-dir")
        .arg(&store)
        .arg("--session-lease-dir")
        .arg(&leases)
        .output()
        .unwrap();
    assert!(adopted.status.success(), "{adopted:?}");

    let m = serve("a");
    let log = events(&m, "s").await;
    let runs = log
        .iter()
        .filter(|e| e["payload"]["type"] == "run_started")
        .count();
    assert_eq!(
        runs, 1,
        "the adopted store holds the backup's one run: {log:?}"
    );
    let (status, body) = run(&m, "s", json!("four")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Above the three tokens issued (file leases reserve ranges of them, so
    // the next one after a restart may be far above).
    wait_for_event(&m, "s", |e| {
        e["payload"]["type"] == "run_started" && e["token"].as_u64() > Some(3)
    })
    .await;
    stop(m);
}

/// `--agent-transcript since-checkpoint` reaches the command: once it has
/// written a checkpoint, it is handed that checkpoint and what follows,
/// not the session's start. And every run's claim holds its input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_agent_reading_since_its_checkpoint_is_handed_only_that() {
    let dir = tempfile::tempdir().unwrap();
    // Replies with how many events it was handed (each has a `type`),
    // and sums up first when asked to.
    let script = dir.path().join("counter.sh");
    let body = r#"#!/bin/sh
req=$(cat)
n=$(printf '%s' "$req" | grep -o '"type":' | wc -l)
case "$req" in *'"input":"checkpoint"'*) echo '{"type":"checkpoint","summary":"so far"}';; esac
echo "{\"type\":\"handed\",\"events\":$n}"
"#;
    std::fs::write(&script, body).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&script, mode).unwrap();
    let m = Mecated::start(
        &dir.path().join("store"),
        "proc-a",
        &[
            "--agent",
            "exec",
            "--agent-command",
            script.to_str().unwrap(),
            "--agent-transcript",
            "since-checkpoint",
        ],
    );
    create(&m, "chat").await;
    let mut handed = Vec::new();
    for input in ["one", "two", "checkpoint", "four", "five"] {
        let (status, body) = run(&m, "chat", json!(input)).await;
        assert_eq!(status, StatusCode::OK, "run {input}: {body}");
        let events = events(&m, "chat").await;
        let reply = events
            .iter()
            .rev()
            .find(|e| e["payload"]["type"] == "handed")
            .unwrap();
        handed.push(reply["payload"]["events"].as_u64().unwrap());
    }
    // Each run adds its claim, its reply and its end; the third also its
    // checkpoint. After it: the checkpoint, the reply, the end and the
    // claim, then three more a run.
    assert_eq!(handed, [1, 4, 7, 4, 7], "events handed per run");
    // Each claim records its run's input: the user's side of every turn
    // is in the session.
    let claimed: Vec<Value> = events(&m, "chat")
        .await
        .iter()
        .filter(|e| e["payload"]["type"] == "run_started")
        .map(|e| e["payload"]["input"].clone())
        .collect();
    assert_eq!(claimed, ["one", "two", "checkpoint", "four", "five"]);
}
