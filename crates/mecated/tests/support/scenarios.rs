//! The ownership scenarios every network lease backend is run through with
//! real server processes: the same assertions, whichever backend leases.

use std::ffi::OsStr;
use std::time::Duration;

use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::json;

use super::*;

/// A lease backend as the servers are pointed at it.
pub(crate) struct Backend<'a> {
    /// The server flags that select it (without the TTL).
    pub(crate) flags: Vec<&'a str>,
    /// `--session-lease-ttl`.
    pub(crate) ttl: &'a str,
    /// The flag a refusal must name.
    pub(crate) flag: &'a str,
    /// A client of the same leases, to ask the backend itself.
    pub(crate) direct: &'a dyn SessionLease,
}

/// A competitor gets 409 naming the holder (with its per-process suffix),
/// and the backend itself refuses a third owner, naming the same holder.
pub(crate) async fn competitor_gets_409_naming_the_holder(backend: &Backend<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, pending, _) = mid_run_with_ttl(
        dir.path(),
        backend.ttl,
        &backend.flags,
        "s",
        "4s",
        json!("from a"),
    )
    .await;

    let (status, body) = run(&b, "s", json!("from b")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "session_leased_elsewhere", "{body}");
    assert!(is_owner(&body["error"]["holder"], &a.owner), "{body}");
    // Over a network backend an explicit --owner gets a per-process suffix.
    assert_ne!(body["error"]["holder"], a.owner.as_str(), "{body}");

    let refused = backend
        .direct
        .acquire(
            &SessionId::new("s").unwrap(),
            &OwnerId::new("probe").unwrap(),
        )
        .await
        .expect_err("the backend let a third owner take a held session");
    assert_eq!(refused.kind(), LeaseErrorKind::Held, "{refused}");
    let holder = refused.holder().expect("the backend names the holder");
    assert_eq!(json!(holder.as_str()), body["error"]["holder"], "{refused}");

    assert_eq!(pending.await.unwrap().unwrap()["status"], "completed");
}

/// The holder killed mid-run: the other process takes the session over,
/// once the lease lapses, with a higher token; the log stays whole.
pub(crate) async fn sigkill_mid_run_is_taken_over_with_a_higher_token(backend: &Backend<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) = mid_run_with_ttl(
        dir.path(),
        backend.ttl,
        &backend.flags,
        "k",
        "30s",
        json!("x"),
    )
    .await;
    a.signal(Signal::SIGKILL);

    let taken = run_when_free(&b, "k", json!("after the crash")).await;
    assert_eq!(taken["status"], "completed", "{taken}");
    let token = taken["token"].as_u64().unwrap();
    assert!(
        token > started["token"].as_u64().unwrap(),
        "takeover token {token} not above {}",
        started["token"]
    );

    let log = events(&b, "k").await;
    assert_gapless(&log);
    let last_start = log
        .iter()
        .rfind(|e| e["payload"]["type"] == "run_started")
        .unwrap();
    assert!(
        is_owner(&last_start["payload"]["owner"], &b.owner),
        "{last_start}"
    );
    assert_eq!(last_start["token"].as_u64(), Some(token), "{last_start}");
    assert_only_token_after_takeover(&log, &b.owner, token);
    assert_eq!(log.last().unwrap()["payload"]["type"], "run_ended");
    assert_eq!(log[log.len() - 2]["payload"]["content"], "after the crash");
}

/// The holder paused past its lease: the other takes over with a higher
/// token, and after it resumes none of its late writes reach the log.
pub(crate) async fn a_paused_holders_late_writes_are_refused(backend: &Backend<'_>) {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that A's run is still going when it wakes.
    let (a, b, a_run, a_started) = mid_run_with_ttl(
        dir.path(),
        backend.ttl,
        &backend.flags,
        "p",
        "30s",
        json!("from a"),
    )
    .await;
    a.signal(Signal::SIGSTOP);

    let b_run = run_when_free(&b, "p", json!("from b")).await;
    assert_eq!(b_run["status"], "completed", "{b_run}");
    let b_token = b_run["token"].as_u64().unwrap();
    assert!(
        b_token > a_started["token"].as_u64().unwrap(),
        "takeover token {b_token} not above {}",
        a_started["token"]
    );

    a.signal(Signal::SIGCONT);
    let a_result = a_run.await.unwrap().unwrap();
    assert_eq!(a_result["status"], "lease_lost", "{a_result}");

    // Give A every chance to write late, then check it never did.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = events(&b, "p").await;
    assert_gapless(&log);
    assert_only_token_after_takeover(&log, &b.owner, b_token);
    assert!(
        log.iter().all(|e| e["payload"]["content"] != "from a"),
        "A's reply was written"
    );
}

/// A store first served with its own file leases is bound to them: a
/// server pointed at it with this backend refuses to start.
pub(crate) async fn a_store_fenced_by_another_authority_refuses_it(backend: &Backend<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let files = Mecated::start(dir.path(), "proc-f", &[] as &[&str]);
    create(&files, "s").await;
    drop(files);

    let flags: Vec<&OsStr> = backend
        .flags
        .iter()
        .copied()
        .chain(["--session-lease-ttl", backend.ttl])
        .map(OsStr::new)
        .collect();
    let stderr = refused_start(dir.path(), "proc-e", &flags);
    assert!(stderr.contains(backend.flag), "{stderr}");
    assert!(stderr.to_lowercase().contains("authority"), "{stderr}");
}
