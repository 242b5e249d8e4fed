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

/// Two servers, each with a token of its own identity on the lease
/// service: each leases under the owner ids its identity admits, with no
/// owner flag that names them, and one cannot take or release the other's
/// sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_server_leases_under_the_owner_ids_its_identity_admits() {
    use grpcdriver::{Identities, IdentityStore, hash_token};
    use lease_port::{OwnerId, SessionId, SessionLease};

    let identities = Identities::parse(&format!(
        "token chat-a chat-a/ {}\ntoken chat-b chat-b/ {}\ntoken ops * {}\n",
        hash_token("token-a"),
        hash_token("token-b"),
        hash_token("token-ops"),
    ))
    .unwrap();
    // Longer than the other tests' TTL: the servers' lease calls get a
    // sixth of it, and a loaded machine must not fail them.
    let ttl = Duration::from_secs(6);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        LeaseServer::new(Arc::new(MemLease::new(ttl)))
            .ttl(ttl)
            .identities(IdentityStore::new(identities))
            .serve(listener, async {
                let _ = stopped.await;
            }),
    );
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let token_file = |name: &str, token: &str| {
        let path = secrets.path().join(name);
        std::fs::write(&path, token).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (a_token, b_token) = (token_file("a", "token-a"), token_file("b", "token-b"));
    let flags = |token: &str| {
        vec![
            "--session-lease-url".to_owned(),
            addr.clone(),
            "--session-lease-token-file".to_owned(),
            token.to_owned(),
            "--session-lease-ttl".to_owned(),
            "6s".to_owned(),
            "--echo-delay".to_owned(),
            "2s".to_owned(),
        ]
    };
    let (a_flags, b_flags) = (flags(&a_token), flags(&b_token));
    fn as_strs(f: &[String]) -> Vec<&str> {
        f.iter().map(String::as_str).collect()
    }
    // `--owner web` is not an owner id either identity admits: each server
    // puts it under its own identity's prefix.
    let a = Mecated::start(dir.path(), "web", &as_strs(&a_flags));
    let b = Mecated::start(dir.path(), "web", &as_strs(&b_flags));
    create(&a, "s").await;
    let pending = run_in_background(&a, "s", json!("from a"));
    let started = wait_for_event(&a, "s", |e| e["payload"]["type"] == "run_started").await;
    let a_owner = started["payload"]["owner"]
        .as_str()
        .expect("an owner")
        .to_owned();
    assert!(a_owner.starts_with("chat-a/web#"), "{started}");

    let (status, body) = run(&b, "s", json!("from b")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["holder"], a_owner.as_str(), "{body}");

    // What the service holds: a's grant, which b's identity could not
    // release even knowing it.
    let ops = GrpcLease::builder(addr.clone())
        .bearer_token("token-ops")
        .build()
        .unwrap();
    let held = ops
        .current(&SessionId::new("s").unwrap())
        .await
        .unwrap()
        .expect("a holds s");
    assert_eq!(held.owner(), &OwnerId::new(&a_owner).unwrap());
    let b_client = GrpcLease::builder(addr.clone())
        .bearer_token("token-b")
        .build()
        .unwrap();
    let e = b_client.release(&held).await.unwrap_err();
    assert_eq!(e.kind(), lease_port::LeaseErrorKind::Invalid, "{e}");
    assert!(ops.current(held.session_id()).await.unwrap().is_some());

    assert_eq!(pending.await.unwrap().unwrap()["status"], "completed");
    let done = run_when_free(&b, "s", json!("from b")).await;
    assert_eq!(done["status"], "completed", "{done}");
    let log = events(&b, "s").await;
    let b_started = log
        .iter()
        .rev()
        .find(|e| e["payload"]["type"] == "run_started")
        .expect("b's run");
    assert!(
        b_started["payload"]["owner"]
            .as_str()
            .unwrap()
            .starts_with("chat-b/web#"),
        "{b_started}"
    );
}
