//! Real `mecated` processes sharing one store directory and leasing Lease
//! objects (`--session-lease-k8s-namespace`) from the Kubernetes API
//! emulator, served over real HTTPS in this test process and reached
//! through its kubeconfig.

#![cfg(feature = "k8s")]

mod support;

use std::ffi::OsStr;
use std::time::Duration;

use k8s_emulator::{Emulator, EmulatorConfig};
use k8slease::K8sLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::json;
use support::*;

/// Whole seconds, as `leaseDurationSeconds` counts. Each API request gets
/// a quarter of it, which a loaded machine needs more of than 1 s allows.
const TTL_SECS: u64 = 3;
const TTL: &str = "3s";

const NAMESPACE: &str = "default";

struct Cluster {
    emulator: Emulator,
    kubeconfig: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let emulator = Emulator::start(EmulatorConfig::default())
            .await
            .expect("start the Kubernetes API emulator");
        let kubeconfig = emulator
            .kubeconfig_path()
            .to_str()
            .expect("a UTF-8 kubeconfig path")
            .to_owned();
        Cluster {
            emulator,
            kubeconfig,
        }
    }

    fn flags(&self) -> [&str; 4] {
        [
            "--session-lease-k8s-namespace",
            NAMESPACE,
            "--session-lease-k8s-kubeconfig",
            &self.kubeconfig,
        ]
    }

    /// A client of the same Lease objects as the servers, to ask the API
    /// server itself.
    async fn client(&self) -> K8sLease {
        let client = k8slease::client_from_kubeconfig(self.emulator.kubeconfig_path())
            .await
            .expect("a client from the emulator's kubeconfig");
        K8sLease::builder(client, NAMESPACE)
            .ttl(Duration::from_secs(TTL_SECS))
            .build()
            .expect("Kubernetes lease client")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_competitor_gets_409_naming_the_holder() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, pending, _) = mid_run_with_ttl(
        dir.path(),
        TTL,
        &cluster.flags(),
        "s",
        "4s",
        json!("from a"),
    )
    .await;

    let (status, body) = run(&b, "s", json!("from b")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "session_leased_elsewhere", "{body}");
    assert!(is_owner(&body["error"]["holder"], &a.owner), "{body}");
    // Over Kubernetes leases an explicit --owner gets a per-process suffix.
    assert_ne!(body["error"]["holder"], a.owner.as_str(), "{body}");

    // The Lease object names A: a third party is refused too.
    let refused = cluster
        .client()
        .await
        .acquire(
            &SessionId::new("s").unwrap(),
            &OwnerId::new("probe").unwrap(),
        )
        .await
        .expect_err("a third owner took a held session");
    assert_eq!(refused.kind(), LeaseErrorKind::Held, "{refused}");
    let holder = refused.holder().expect("the Lease names its holder");
    assert_eq!(json!(holder.as_str()), body["error"]["holder"], "{refused}");

    assert_eq!(pending.await.unwrap().unwrap()["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) =
        mid_run_with_ttl(dir.path(), TTL, &cluster.flags(), "k", "30s", json!("x")).await;
    a.signal(Signal::SIGKILL);

    // B never saw the Lease change before: it judges it expired only a TTL
    // after it first observes it unchanged, so it retries until then.
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
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Long enough that A's run is still going when it wakes.
    let (a, b, a_run, a_started) = mid_run_with_ttl(
        dir.path(),
        TTL,
        &cluster.flags(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_kubernetes_leases() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    // First served with the store's own file leases: it is bound to them.
    let files = Mecated::start(dir.path(), "proc-f", &[] as &[&str]);
    create(&files, "s").await;
    drop(files);

    let flags: Vec<&OsStr> = cluster
        .flags()
        .into_iter()
        .chain(["--session-lease-ttl", TTL])
        .map(OsStr::new)
        .collect();
    let stderr = refused_start(dir.path(), "proc-k", &flags);
    assert!(stderr.contains("--session-lease-k8s-namespace"), "{stderr}");
    assert!(stderr.to_lowercase().contains("authority"), "{stderr}");
}
