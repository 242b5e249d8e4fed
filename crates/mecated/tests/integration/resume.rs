//! `--resume-interrupted` with real processes: the input of a run whose
//! process was SIGKILLed is run again by the next owner, once however many
//! replicas notice, and not past its attempts.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
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
        let text = client()
            .get(m.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("mecated_resume_sweeps_total 1") {
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
