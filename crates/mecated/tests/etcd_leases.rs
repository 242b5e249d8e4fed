//! Real `mecated` processes sharing one store directory and leasing from a
//! real etcd (`--session-lease-etcd`), started by `test_services`.

#![cfg(feature = "etcd")]

mod support;

use std::ffi::OsStr;
use std::time::Duration;

use etcdlease::EtcdLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::json;
use support::*;
use test_services::EtcdServer;

/// etcd counts whole seconds and raises anything below its minimum (2 s
/// with default settings) without telling the holder; a TTL above that
/// keeps the servers' renewal schedule what etcd really grants, with a
/// renewal's timeout wide enough for a loaded machine.
const TTL_SECS: u64 = 3;
const TTL: &str = "3s";

/// Not the default prefix, so the flag is exercised and keys of other
/// tests of the same etcd could never mix in.
const PREFIX: &str = "/mecated-tests/leases/";

struct Etcd {
    _server: EtcdServer,
    endpoint: String,
}

impl Etcd {
    fn start() -> Etcd {
        let server = EtcdServer::start().expect("start etcd");
        let endpoint = server.endpoint();
        Etcd {
            _server: server,
            endpoint,
        }
    }

    fn flags(&self) -> [&str; 4] {
        [
            "--session-lease-etcd",
            &self.endpoint,
            "--session-lease-etcd-prefix",
            PREFIX,
        ]
    }

    /// A client of the same leases as the servers, to ask etcd itself.
    fn client(&self) -> EtcdLease {
        EtcdLease::builder([self.endpoint.as_str()])
            .prefix(PREFIX)
            .ttl(Duration::from_secs(TTL_SECS))
            .build()
            .expect("etcd lease client")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_competitor_gets_409_naming_the_holder() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (a, b, pending, _) =
        mid_run_with_ttl(dir.path(), TTL, &etcd.flags(), "s", "4s", json!("from a")).await;

    let (status, body) = run(&b, "s", json!("from b")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "session_leased_elsewhere", "{body}");
    assert!(is_owner(&body["error"]["holder"], &a.owner), "{body}");
    // Over etcd an explicit --owner gets a per-process suffix.
    assert_ne!(body["error"]["holder"], a.owner.as_str(), "{body}");

    // etcd itself holds the session for A: a third party is refused too.
    let refused = etcd
        .client()
        .acquire(
            &SessionId::new("s").unwrap(),
            &OwnerId::new("probe").unwrap(),
        )
        .await
        .expect_err("etcd let a third owner take a held session");
    assert_eq!(refused.kind(), LeaseErrorKind::Held, "{refused}");
    let holder = refused.holder().expect("etcd names the holder");
    assert_eq!(json!(holder.as_str()), body["error"]["holder"], "{refused}");

    assert_eq!(pending.await.unwrap().unwrap()["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) =
        mid_run_with_ttl(dir.path(), TTL, &etcd.flags(), "k", "30s", json!("x")).await;
    a.signal(Signal::SIGKILL);

    // Free only once etcd has expired A's lease (TTL plus its grace).
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
    assert_eq!(log.last().unwrap()["payload"]["content"], "after the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_writes_are_refused() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    // Long enough that A's run is still going when it wakes.
    let (a, b, a_run, a_started) =
        mid_run_with_ttl(dir.path(), TTL, &etcd.flags(), "p", "30s", json!("from a")).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_etcd() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    // First served with the store's own file leases: it is bound to them.
    let files = Mecated::start(dir.path(), "proc-f", &[] as &[&str]);
    create(&files, "s").await;
    drop(files);

    let flags: Vec<&OsStr> = etcd
        .flags()
        .into_iter()
        .chain(["--session-lease-ttl", TTL])
        .map(OsStr::new)
        .collect();
    let stderr = refused_start(dir.path(), "proc-e", &flags);
    assert!(stderr.contains("--session-lease-etcd"), "{stderr}");
    assert!(stderr.to_lowercase().contains("authority"), "{stderr}");
}
