//! `--resume-interrupted` with real processes: the input of a run whose
//! process was SIGKILLed is run again by the next owner, once however many
//! replicas notice, and not past its attempts.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::sse::{follow_from, payloads_to_end};
use crate::support::*;

fn kind(e: &Value) -> &str {
    e["payload"]["type"].as_str().unwrap_or_default()
}

fn interrupted(log: &[Value]) -> Vec<&Value> {
    log.iter()
        .filter(|e| e["payload"]["status"] == "interrupted")
        .collect()
}

fn resumptions(log: &[Value]) -> Vec<&Value> {
    log.iter()
        .filter(|e| kind(e) == "run_started" && !e["payload"]["resumes"].is_null())
        .collect()
}

/// Waits until `m`'s log of `id` satisfies `done`; the log.
async fn wait_for_log(m: &Mecated, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let log = events(m, id).await;
        if done(&log) {
            return log;
        }
        assert!(start.elapsed() < PATIENCE, "never came: {log:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `m` has finished its start-up look for interrupted runs.
async fn wait_for_sweep(m: &Mecated) {
    let start = Instant::now();
    loop {
        if metrics(m).await.contains("mecated_resume_sweeps_total 1") {
            return;
        }
        assert!(start.elapsed() < PATIENCE, "the start-up look never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The resumption of `start` in `log`: right after `start`'s interrupted
/// end, run by `owner`, on `start`'s input, and ended.
fn assert_resumed_once(log: &[Value], start: &Value, attempt: u64) -> Value {
    let ends = interrupted(log);
    assert_eq!(ends.len(), 1, "{log:#?}");
    assert_eq!(ends[0]["payload"]["run_seq"], start["seq"], "{log:#?}");
    assert_eq!(ends[0]["payload"]["resumed"]["attempt"], attempt);
    let resumed = resumptions(log);
    assert_eq!(resumed.len(), 1, "{log:#?}");
    let resumed = resumed[0].clone();
    assert_eq!(
        resumed["seq"].as_u64(),
        ends[0]["seq"].as_u64().map(|s| s + 1),
        "{log:#?}"
    );
    assert_eq!(resumed["payload"]["input"], start["payload"]["input"]);
    assert_eq!(resumed["payload"]["resumes"]["after_seq"], start["seq"]);
    assert_eq!(resumed["payload"]["resumes"]["attempt"], attempt);
    // The resumed run is fenced above the interrupted one.
    assert!(resumed["token"].as_u64() >= start["token"].as_u64());
    resumed
}

/// Replica A is SIGKILLed mid-run while followers of the session wait on
/// B and C, both resuming. Their follows notice the run is gone; exactly
/// one of them ends it and runs its input again, the other finds the end.
/// The start-up looks of B and C are over before the kill, so only the
/// followers can have noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_on_two_replicas_get_a_killed_run_resumed_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let resume = ["--resume-interrupted"];
    let (a, b, _pending, started) = mid_run(dir.path(), &resume, "s", "30s", json!("first")).await;
    let c = Mecated::start(
        dir.path(),
        "proc-c",
        &["--session-lease-ttl", "1s", "--resume-interrupted"],
    );
    wait_for_sweep(&b).await;
    wait_for_sweep(&c).await;
    let mut on_b = follow_from(&b, "s", None).await;
    let mut on_c = follow_from(&c, "s", None).await;
    a.signal(Signal::SIGKILL);
    let (_, b_end) = payloads_to_end(&mut on_b).await;
    let (_, c_end) = payloads_to_end(&mut on_c).await;
    let log = wait_for_log(&b, "s", |log| {
        resumptions(log).first().is_some_and(|r| {
            log.iter()
                .any(|e| kind(e) == "run_ended" && e["seq"].as_u64() > r["seq"].as_u64())
        })
    })
    .await;
    assert_gapless(&log);
    let resumed = assert_resumed_once(&log, &started, 1);
    let owner = resumed["payload"]["owner"].as_str().unwrap();
    assert!(
        owner.contains("proc-b") || owner.contains("proc-c"),
        "{owner}"
    );
    // The winner's follower ends at the end it wrote; the other's at it
    // too, or (when it looked while the winner held the lease and had not
    // written yet) as gone.
    let reasons = [&b_end["reason"], &c_end["reason"]];
    assert!(reasons.contains(&&json!("run_ended")), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| *r == "run_ended" || *r == "run_gone"),
        "{reasons:?}"
    );
    let last = log.last().unwrap();
    assert_eq!(last["payload"]["status"], "completed", "{log:#?}");
    assert_eq!(last["token"], resumed["token"]);
    // Nothing more comes: a later look (a follower on an idle session)
    // finds the run ended.
    let mut again = follow_from(&c, "s", None).await;
    let (_, end) = payloads_to_end(&mut again).await;
    assert_eq!(end["reason"], "no_live_run", "{end}");
    assert_eq!(resumptions(&events(&c, "s").await).len(), 1);
}

/// Unleased, a process restarted after a crash runs its predecessor's
/// interrupted input again from its start-up look, with no client asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resumes_the_run_it_left_without_being_asked() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mecated::start(
        dir.path(),
        "proc-a",
        &["--no-session-lease", "--echo-delay", "30s"],
    );
    create(&a, "s").await;
    let _pending = run_in_background(&a, "s", json!("first"));
    let started = wait_for_event(&a, "s", is_run_started_by("proc-a")).await;
    a.signal(Signal::SIGKILL);
    drop(a);
    let b = Mecated::start(
        dir.path(),
        "proc-b",
        &["--no-session-lease", "--resume-interrupted"],
    );
    let log = wait_for_log(&b, "s", |log| {
        log.last()
            .is_some_and(|e| e["payload"]["status"] == "completed")
    })
    .await;
    let resumed = assert_resumed_once(&log, &started, 1);
    assert!(is_owner(&resumed["payload"]["owner"], "proc-b"));
    assert!(log.iter().all(|e| kind(e) != "takeover"), "{log:#?}");
    // The resumed run's reply is to the recorded input.
    let reply = log
        .iter()
        .find(|e| kind(e) == "message" && e["seq"].as_u64() > resumed["seq"].as_u64())
        .unwrap_or_else(|| panic!("no reply: {log:#?}"));
    assert_eq!(reply["payload"]["content"], "first");
}

/// An input whose run is interrupted again after its resumption is not
/// run a second time with `--resume-max-attempts 1`: its run is only
/// ended, so an input that kills its process cannot go round every
/// replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_interrupted_past_its_attempts_is_only_ended() {
    let dir = tempfile::tempdir().unwrap();
    let slow = ["--no-session-lease", "--echo-delay", "30s"];
    let a = Mecated::start(dir.path(), "proc-a", &slow);
    create(&a, "s").await;
    let _pending = run_in_background(&a, "s", json!("first"));
    let started = wait_for_event(&a, "s", is_run_started_by("proc-a")).await;
    a.signal(Signal::SIGKILL);
    drop(a);
    let once = ["--resume-interrupted", "--resume-max-attempts", "1"];
    let b = Mecated::start(dir.path(), "proc-b", &[&slow[..], &once[..]].concat());
    let log = wait_for_log(&b, "s", |log| !resumptions(log).is_empty()).await;
    assert_resumed_once(&log, &started, 1);
    b.signal(Signal::SIGKILL);
    drop(b);
    let c = Mecated::start(
        dir.path(),
        "proc-c",
        &[&["--no-session-lease"][..], &once[..]].concat(),
    );
    wait_for_sweep(&c).await;
    let log = events(&c, "s").await;
    let ends = interrupted(&log);
    assert_eq!(ends.len(), 2, "{log:#?}");
    assert!(ends[1]["payload"]["resumed"].is_null(), "{log:#?}");
    assert_eq!(resumptions(&log).len(), 1, "{log:#?}");
    assert_eq!(log.last().unwrap(), ends[1], "{log:#?}");
}

/// A run a client asked to cancel is never run again: its holder, paused
/// when the request came through another replica, dies before it could
/// stop; the replica that ends the run records why and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_before_its_holder_died_is_closed_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let resume = ["--resume-interrupted"];
    let (a, b, _pending, started) = mid_run(dir.path(), &resume, "s", "30s", json!("first")).await;
    wait_for_sweep(&b).await;
    a.signal(Signal::SIGSTOP);
    let r = client()
        .delete(b.url("/v1/sessions/s/runs/current"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    a.signal(Signal::SIGKILL);
    let mut on_b = follow_from(&b, "s", None).await;
    let (_, end) = payloads_to_end(&mut on_b).await;
    assert_eq!(end["reason"], "run_ended", "{end}");
    let log = wait_for_log(&b, "s", |log| !interrupted(log).is_empty()).await;
    let ends = interrupted(&log);
    assert_eq!(ends.len(), 1, "{log:#?}");
    assert_eq!(ends[0]["payload"]["run_seq"], started["seq"]);
    assert!(ends[0]["payload"]["resumed"].is_null(), "{log:#?}");
    let why = ends[0]["payload"]["error"].as_str().unwrap();
    assert!(why.contains("cancel was asked"), "{why}");
    assert!(resumptions(&log).is_empty(), "{log:#?}");
    assert_eq!(log.last().unwrap(), ends[0], "{log:#?}");
}

/// A cancel of a run left open by a dead holder, asked before anyone
/// ended it, keeps its input from running again when a follower later
/// gets the run ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_an_interrupted_run_keeps_it_from_running_again() {
    let dir = tempfile::tempdir().unwrap();
    let resume = ["--resume-interrupted"];
    let (a, b, _pending, started) = mid_run(dir.path(), &resume, "s", "30s", json!("first")).await;
    wait_for_sweep(&b).await;
    a.signal(Signal::SIGKILL);
    drop(a);
    // Past the 1 s lease: the run is open and no longer live.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = client()
        .delete(b.url("/v1/sessions/s/runs/current"))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["live"], false, "{body}");
    assert_eq!(body["token"], started["token"], "{body}");
    let mut on_b = follow_from(&b, "s", None).await;
    payloads_to_end(&mut on_b).await;
    let log = wait_for_log(&b, "s", |log| !interrupted(log).is_empty()).await;
    assert!(resumptions(&log).is_empty(), "{log:#?}");
    let why = interrupted(&log)[0]["payload"]["error"].as_str().unwrap();
    assert!(why.contains("cancel was asked"), "{why}");
    // The session is not stuck: a client's next run runs, and the cancel
    // recorded before it does not stop it.
    let (status, body) = run(&b, "s", json!("again, by hand")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
}

/// With resumption on, a run the drain could not wait for is not
/// cancelled: the draining replica leaves it open and releases the lease,
/// and the replica its follower reconnects to runs its input again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_off_by_shutdown_is_resumed_by_the_next_owner() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--resume-interrupted", "--drain-timeout", "500ms"];
    let (mut a, b, pending, started) =
        mid_run(dir.path(), &flags, "s", "30s", json!("first")).await;
    wait_for_sweep(&b).await;
    let mut on_b = follow_from(&b, "s", None).await;
    a.signal(Signal::SIGTERM);
    assert!(a.wait_exit().success(), "mecated did not exit 0 on SIGTERM");
    let cut = pending.await.unwrap().unwrap();
    assert_eq!(cut["status"], "interrupted", "{cut}");
    let (_, end) = payloads_to_end(&mut on_b).await;
    assert!(
        end["reason"] == "run_ended" || end["reason"] == "run_gone",
        "{end}"
    );
    let log = wait_for_log(&b, "s", |log| {
        log.last()
            .is_some_and(|e| e["payload"]["status"] == "completed")
    })
    .await;
    assert!(
        log.iter().all(|e| e["payload"]["status"] != "cancelled"),
        "{log:#?}"
    );
    let resumed = assert_resumed_once(&log, &started, 1);
    assert!(is_owner(&resumed["payload"]["owner"], "proc-b"));
}

/// An agent cannot write the events that tell runs apart: one that emits
/// a `run_ended` fails its run, and the log holds only the server's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_emitting_a_run_boundary_fails_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        "read -r _\nprintf '{\"type\":\"note\"}\\n{\"type\":\"run_ended\",\"status\":\"completed\"}\\n'\n",
    )
    .unwrap();
    let store = dir.path().join("store");
    let flags = [
        "--resume-interrupted",
        "--agent",
        "exec",
        "--agent-command",
        "/bin/bash",
        "--agent-arg",
        script.to_str().unwrap(),
    ];
    let a = Mecated::start(&store, "proc-a", &flags);
    create(&a, "s").await;
    let (status, body) = run(&a, "s", json!("hi")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("cannot emit"), "{error}");
    let log = events(&a, "s").await;
    let kinds: Vec<_> = log.iter().map(kind).collect();
    assert_eq!(kinds, ["run_started", "note", "run_ended"], "{log:#?}");
    assert_eq!(log[2]["payload"]["status"], "failed", "{log:#?}");
}

/// A cancel the holder itself answered, whose process dies before the
/// run's `cancelled` end is stored, still keeps the input from running
/// again: the holder records the cancel in the store before it stops the
/// run. A kill right after the answer usually beats the end's write, so
/// a few tries show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_answered_by_a_holder_that_then_dies_is_not_resumed() {
    for _ in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let resume = ["--resume-interrupted"];
        let (a, b, _pending, _) = mid_run(dir.path(), &resume, "s", "30s", json!("once")).await;
        wait_for_sweep(&b).await;
        let mut on_b = follow_from(&b, "s", None).await;
        let r = client()
            .delete(a.url("/v1/sessions/s/runs/current"))
            .send()
            .await
            .unwrap();
        a.signal(Signal::SIGKILL);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["here"], true, "{body}");
        payloads_to_end(&mut on_b).await;
        let log = wait_for_log(&b, "s", |log| {
            log.last().is_some_and(|e| kind(e) == "run_ended")
        })
        .await;
        assert!(
            resumptions(&log).is_empty(),
            "cancelled, yet run again: {log:#?}"
        );
    }
}

/// Unleased, the same: a run cancelled in its process, which dies before
/// the end is stored, is not run again by the restarted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unleased_a_cancelled_run_is_not_resumed_after_a_crash() {
    for _ in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let flags = ["--no-session-lease", "--resume-interrupted"];
        let slow = [&flags[..], &["--echo-delay", "30s", "--echo-steps", "30"]].concat();
        let a = Mecated::start(dir.path(), "proc-a", &slow);
        create(&a, "s").await;
        let _pending = run_in_background(&a, "s", json!("once"));
        wait_for_event(&a, "s", |e| kind(e) == "progress").await;
        let r = client()
            .delete(a.url("/v1/sessions/s/runs/current"))
            .send()
            .await
            .unwrap();
        a.signal(Signal::SIGKILL);
        assert!(r.status().is_success());
        drop(a);
        let b = Mecated::start(dir.path(), "proc-b", &flags);
        wait_for_sweep(&b).await;
        let log = events(&b, "s").await;
        assert!(
            resumptions(&log).is_empty(),
            "cancelled, yet run again: {log:#?}"
        );
    }
}

/// Shutdowns are not crashes: an input cut off by two drains in a row,
/// with `--resume-max-attempts 1`, still runs to its end on the third
/// replica. Each cut is in the log (`run_cut_off`), and each resumption
/// counts the shutdowns it followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdowns_do_not_use_up_the_attempts_meant_for_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--session-lease-ttl",
        "1s",
        "--resume-interrupted",
        "--resume-max-attempts",
        "1",
        "--drain-timeout",
        "300ms",
    ];
    let slow = [&flags[..], &["--echo-delay", "30s", "--echo-steps", "30"]].concat();
    let mut a = Mecated::start(dir.path(), "proc-a", &slow);
    let mut b = Mecated::start(dir.path(), "proc-b", &slow);
    let c = Mecated::start(dir.path(), "proc-c", &flags);
    for m in [&b, &c] {
        wait_for_sweep(m).await;
    }
    create(&a, "s").await;
    let pending = run_in_background(&a, "s", json!("long"));
    wait_for_event(&a, "s", |e| kind(e) == "progress").await;
    let mut on_b = follow_from(&b, "s", None).await;
    a.signal(Signal::SIGTERM);
    assert!(a.wait_exit().success());
    assert_eq!(pending.await.unwrap().unwrap()["status"], "interrupted");
    payloads_to_end(&mut on_b).await;
    wait_for_log(&b, "s", |log| {
        resumptions(log).first().is_some_and(|r| {
            log.iter()
                .any(|e| kind(e) == "progress" && e["seq"].as_u64() > r["seq"].as_u64())
        })
    })
    .await;
    let mut on_c = follow_from(&c, "s", None).await;
    b.signal(Signal::SIGTERM);
    assert!(b.wait_exit().success());
    payloads_to_end(&mut on_c).await;
    let log = wait_for_log(&c, "s", |log| {
        log.last()
            .is_some_and(|e| e["payload"]["status"] == "completed")
    })
    .await;
    let cuts = log.iter().filter(|e| kind(e) == "run_cut_off").count();
    assert_eq!(cuts, 2, "{log:#?}");
    let resumed = resumptions(&log);
    assert_eq!(resumed.len(), 2, "{log:#?}");
    assert_eq!(resumed[1]["payload"]["resumes"]["attempt"], 2);
    assert_eq!(resumed[1]["payload"]["resumes"]["shutdowns"], 2);
    assert!(is_owner(&resumed[1]["payload"]["owner"], "proc-c"));
    let why = interrupted(&log)[0]["payload"]["error"].as_str().unwrap();
    assert!(why.contains("shut down"), "{why}");
}

/// Unleased, a cancel of an interrupted run that the start-up look has
/// not reached yet (it runs at most 64 resumed runs at once) is recorded
/// (under token 0, unleased runs having none): once the look gets to it,
/// it only ends the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unleased_a_cancel_of_a_run_waiting_for_the_start_up_look_holds() {
    const N: usize = 66;
    let dir = tempfile::tempdir().unwrap();
    let slow = [
        "--no-session-lease",
        "--echo-delay",
        "60s",
        "--echo-steps",
        "60",
    ];
    let a = Mecated::start(dir.path(), "proc-a", &slow);
    let mut pending = Vec::new();
    for i in 0..N {
        let id = format!("s{i:03}");
        create(&a, &id).await;
        pending.push(run_in_background(&a, &id, json!(format!("input {i}"))));
    }
    for i in 0..N {
        wait_for_event(&a, &format!("s{i:03}"), |e| kind(e) == "progress").await;
    }
    a.signal(Signal::SIGKILL);
    drop(a);
    let flags = [
        "--no-session-lease",
        "--resume-interrupted",
        "--echo-delay",
        "60s",
        "--echo-steps",
        "60",
    ];
    let b = Mecated::start(dir.path(), "proc-b", &flags);
    // Wait for the look to have 64 runs going.
    let start = Instant::now();
    while !metrics(&b).await.contains("mecated_runs_resumed_total 64") {
        assert!(start.elapsed() < PATIENCE, "{}", metrics(&b).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut waiting = Vec::new();
    let mut running = Vec::new();
    for i in 0..N {
        let id = format!("s{i:03}");
        if resumptions(&events(&b, &id).await).is_empty() {
            waiting.push(id);
        } else {
            running.push(id);
        }
    }
    assert!(!waiting.is_empty());
    let victim = waiting[0].clone();
    let r = client()
        .delete(b.url(&format!("/v1/sessions/{victim}/runs/current")))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert!(status.is_success());
    // Free a permit of the look: cancel one resumed run here.
    for id in &running[..waiting.len()] {
        let r = client()
            .delete(b.url(&format!("/v1/sessions/{id}/runs/current")))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let start = Instant::now();
    let log = loop {
        let log = events(&b, &victim).await;
        if log.iter().any(|e| e["payload"]["status"] == "interrupted") {
            break log;
        }
        assert!(start.elapsed() < PATIENCE, "never ended: {log:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        resumptions(&log).is_empty(),
        "cancelled (answered {status} {body}), yet run again: {log:#?}"
    );
}

/// A cancel of the interrupted run R1 (token T1) that lands after R2, its
/// resumption, claimed (what a cancel that read the log before R2's batch
/// records) is R2's cancel too: R2 watches from T1, and if R2's process
/// dies before its watch acts, the next owner judges R2 by the token of
/// the run it resumed, and does not run the input a third time. The late
/// request is written into the JSONL store by hand (the race's outcome),
/// while R2's process is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancel_of_the_resumed_run_holds_when_its_resumer_dies() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--session-lease-ttl", "1s", "--resume-interrupted"];
    let slow = [&flags[..], &["--echo-delay", "30s", "--echo-steps", "30"]].concat();
    let a = Mecated::start(dir.path(), "proc-a", &slow);
    let b = Mecated::start(dir.path(), "proc-b", &slow);
    let c = Mecated::start(dir.path(), "proc-c", &flags);
    wait_for_sweep(&b).await;
    wait_for_sweep(&c).await;
    create(&a, "s").await;
    let _pending = run_in_background(&a, "s", json!("once"));
    let started = wait_for_event(&a, "s", is_run_started_by("proc-a")).await;
    wait_for_event(&a, "s", |e| kind(e) == "progress").await;
    let t1 = started["token"].as_u64().unwrap();
    let mut on_b = follow_from(&b, "s", None).await;
    a.signal(Signal::SIGKILL);
    payloads_to_end(&mut on_b).await;
    let r2 = wait_for_event(&b, "s", |e| {
        kind(e) == "run_started" && !e["payload"]["resumes"].is_null()
    })
    .await;
    wait_for_event(&b, "s", |e| {
        kind(e) == "progress" && e["seq"].as_u64() > r2["seq"].as_u64()
    })
    .await;
    b.signal(Signal::SIGSTOP);
    let requests = dir.path().join(".cancel-requests");
    std::fs::create_dir_all(&requests).unwrap();
    let path = requests.join("s");
    let serial = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| {
            t.split_whitespace()
                .nth(1)
                .map(|s| s.parse::<u64>().unwrap())
        })
        .unwrap_or(0);
    let tmp = requests.join(".review-tmp");
    std::fs::write(&tmp, format!("{t1} {}\n", serial + 1)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    b.signal(Signal::SIGKILL);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut on_c = follow_from(&c, "s", None).await;
    payloads_to_end(&mut on_c).await;
    let start = Instant::now();
    let log = loop {
        let log = events(&c, "s").await;
        let ends = log
            .iter()
            .filter(|e| e["payload"]["status"] == "interrupted")
            .count();
        if ends >= 2 {
            break log;
        }
        assert!(start.elapsed() < PATIENCE, "{log:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let again = resumptions(&log);
    assert_eq!(
        again.len(),
        1,
        "cancelled while R2 ran, yet run a third time: {:#?}",
        again.last().map(|r| &r["payload"])
    );
}
