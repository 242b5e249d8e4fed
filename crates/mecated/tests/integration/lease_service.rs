//! Real `mecated` processes leasing from a remote lease service: a real
//! tonic server (`grpcdriver::LeaseServer` over an in-memory table) in this
//! test process, reached by every server process over loopback TCP with
//! `--session-lease-url`.

use std::sync::Arc;
use std::time::Duration;

use grpcdriver::{GrpcLease, LeaseServer};
use memlease::MemLease;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

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
    let direct = service.client();
    let backend = scenarios::Backend {
        flags: service.flags().to_vec(),
        ttl: "1s",
        flag: "--session-lease-url",
        direct: &direct,
    };
    scenarios::competitor_gets_409_naming_the_holder(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let service = Service::start().await;
    let direct = service.client();
    let backend = scenarios::Backend {
        flags: service.flags().to_vec(),
        ttl: "1s",
        flag: "--session-lease-url",
        direct: &direct,
    };
    scenarios::sigkill_mid_run_is_taken_over_with_a_higher_token(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_writes_are_refused() {
    let service = Service::start().await;
    let direct = service.client();
    let backend = scenarios::Backend {
        flags: service.flags().to_vec(),
        ttl: "1s",
        flag: "--session-lease-url",
        direct: &direct,
    };
    scenarios::a_paused_holders_late_writes_are_refused(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_the_service() {
    let service = Service::start().await;
    let direct = service.client();
    let backend = scenarios::Backend {
        flags: service.flags().to_vec(),
        ttl: "1s",
        flag: "--session-lease-url",
        direct: &direct,
    };
    scenarios::a_store_fenced_by_another_authority_refuses_it(&backend).await;
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
