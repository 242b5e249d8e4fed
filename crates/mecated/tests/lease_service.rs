//! Real `mecated` processes leasing from a remote lease service: a real
//! tonic server (`grpcdriver::LeaseServer` over an in-memory table) in this
//! test process, reached by every server process over loopback TCP with
//! `--session-lease-url`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use grpcdriver::{GrpcLease, LeaseServer};
use lease_port::{SessionId, SessionLease};
use memlease::MemLease;
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::json;
use support::*;

/// The service's grant; the servers run with `--session-lease-ttl 1s`.
const SERVICE_TTL: Duration = Duration::from_secs(1);

struct Service {
    addr: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Service {
    async fn start() -> Service {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            LeaseServer::new(Arc::new(MemLease::new(SERVICE_TTL)))
                .ttl(SERVICE_TTL)
                .serve(listener, async {
                    let _ = stopped.await;
                }),
        );
        Service { addr, _stop: stop }
    }

    fn flags(&self) -> [&str; 2] {
        ["--session-lease-url", &self.addr]
    }

    fn client(&self) -> GrpcLease {
        GrpcLease::connect(self.addr.clone()).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_competitor_gets_409_naming_the_holder() {
    let service = Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, pending, _) =
        mid_run(dir.path(), &service.flags(), "s", "2s", json!("from a")).await;
    let (status, body) = run(&b, "s", json!("from b")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "session_leased_elsewhere");
    assert!(is_owner(&body["error"]["holder"], &a.owner), "{body}");
    // An explicit --owner gets a per-process suffix over a lease service.
    assert_ne!(body["error"]["holder"], a.owner.as_str(), "{body}");
    // The service agrees on who holds it.
    let held = service
        .client()
        .current(&SessionId::new("s").unwrap())
        .await
        .unwrap()
        .expect("held");
    assert!(is_owner(&json!(held.owner().as_str()), &a.owner));
    assert_eq!(pending.await.unwrap().unwrap()["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let service = Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _pending, started) =
        mid_run(dir.path(), &service.flags(), "k", "20s", json!("x")).await;
    a.signal(Signal::SIGKILL);
    let taken = run_when_free(&b, "k", json!("after the crash")).await;
    assert_eq!(taken["status"], "completed", "{taken}");
    assert!(
        taken["token"].as_u64().unwrap() > started["token"].as_u64().unwrap(),
        "takeover token {} not above {}",
        taken["token"],
        started["token"]
    );
    let log = events(&b, "k").await;
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gaps in {seqs:?}"
    );
    assert_eq!(log.last().unwrap()["payload"]["content"], "after the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_writes_are_refused() {
    let service = Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, a_run, a_started) =
        mid_run(dir.path(), &service.flags(), "p", "6s", json!("from a")).await;
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
        .find(|e| is_run_started_by(&b.owner)(e))
        .expect("B's run is in the log")["seq"]
        .as_u64()
        .unwrap();
    for e in log.iter().filter(|e| e["seq"].as_u64().unwrap() > b_first) {
        assert_eq!(
            e["token"].as_u64().unwrap(),
            b_token,
            "a stale write reached the log: {e}"
        );
    }
    assert!(
        log.iter().all(|e| e["payload"]["content"] != "from a"),
        "A's reply was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_the_service() {
    let service = Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    // First served with the store's own file leases: it is bound to them.
    let files = Mecated::start(dir.path(), "proc-f", &[] as &[&str]);
    create(&files, "s").await;
    drop(files);
    let stderr = refused_start(
        dir.path(),
        "proc-g",
        &[
            std::ffi::OsStr::new("--session-lease-url"),
            std::ffi::OsStr::new(&service.addr),
            std::ffi::OsStr::new("--session-lease-ttl"),
            std::ffi::OsStr::new("1s"),
        ],
    );
    assert!(stderr.contains("--session-lease-url"), "{stderr}");
    assert!(stderr.to_lowercase().contains("authority"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_service_stops_the_server_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let stderr = refused_start(
        dir.path(),
        "proc-u",
        &[
            std::ffi::OsStr::new("--session-lease-url"),
            std::ffi::OsStr::new(&addr),
        ],
    );
    assert!(stderr.contains("lease"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_given_one_owner_id_never_both_hold_a_session() {
    let service = Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        &service.flags()[..],
        &["--session-lease-ttl", "1s", "--echo-delay", "2s"],
    ]
    .concat();
    let a = Mecated::start(dir.path(), "pod-0", &flags);
    let b = Mecated::start(dir.path(), "pod-0", &flags);
    create(&a, "same").await;
    let pending = run_in_background(&a, "same", json!("from a"));
    wait_for_event(&a, "same", is_run_started_by("pod-0")).await;
    let (status, body) = run(&b, "same", json!("from b")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(is_owner(&body["error"]["holder"], "pod-0"), "{body}");
    assert_eq!(pending.await.unwrap().unwrap()["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_granting_less_than_the_lease_ttl_is_refused_at_start() {
    let service = Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    let stderr = refused_start(
        dir.path(),
        "proc-t",
        &[
            std::ffi::OsStr::new("--session-lease-url"),
            std::ffi::OsStr::new(&service.addr),
            std::ffi::OsStr::new("--session-lease-ttl"),
            std::ffi::OsStr::new("5s"),
        ],
    );
    assert!(stderr.contains("--session-lease-ttl"), "{stderr}");
}
