//! Real `mecated` processes sharing one store directory and leasing from a
//! real etcd (`--session-lease-etcd`), started by `test_services`.

#![cfg(feature = "etcd")]

use std::time::Duration;

use etcdlease::EtcdLease;
use test_services::EtcdServer;

use crate::support::*;

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
    let direct = etcd.client();
    let backend = scenarios::Backend {
        flags: etcd.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-etcd",
        direct: &direct,
    };
    scenarios::competitor_gets_409_naming_the_holder(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let etcd = Etcd::start();
    let direct = etcd.client();
    let backend = scenarios::Backend {
        flags: etcd.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-etcd",
        direct: &direct,
    };
    scenarios::sigkill_mid_run_is_taken_over_with_a_higher_token(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_writes_are_refused() {
    let etcd = Etcd::start();
    let direct = etcd.client();
    let backend = scenarios::Backend {
        flags: etcd.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-etcd",
        direct: &direct,
    };
    scenarios::a_paused_holders_late_writes_are_refused(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_etcd() {
    let etcd = Etcd::start();
    let direct = etcd.client();
    let backend = scenarios::Backend {
        flags: etcd.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-etcd",
        direct: &direct,
    };
    scenarios::a_store_fenced_by_another_authority_refuses_it(&backend).await;
}

/// A cluster with authentication enabled: the user and password file
/// flags let the server lease; a wrong password stops it at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_with_authentication_is_reached_with_a_user_and_password_file() {
    let etcd = Etcd::start();
    let admin = etcdlease::wire::EtcdClient::new(&[etcd.endpoint.as_str()], Duration::from_secs(5))
        .unwrap();
    admin.user_add("root", "root-password").await.unwrap();
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("mecated", "right").await.unwrap();
    admin.role_add("sessions").await.unwrap();
    admin
        .role_grant_prefix("sessions", PREFIX.as_bytes())
        .await
        .unwrap();
    admin.user_grant_role("mecated", "sessions").await.unwrap();
    admin.auth_enable().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (dir.path().join("right"), dir.path().join("wrong"));
    std::fs::write(&right, "right\n").unwrap();
    std::fs::write(&wrong, "wrong\n").unwrap();
    let store = dir.path().join("store");
    let with = |password: &std::path::Path| -> Vec<std::ffi::OsString> {
        let mut flags: Vec<std::ffi::OsString> =
            etcd.flags().iter().map(std::ffi::OsString::from).collect();
        flags.extend(["--session-lease-etcd-user".into(), "mecated".into()]);
        flags.extend(["--session-lease-etcd-password-file".into(), password.into()]);
        flags
    };

    let refused = with(&wrong);
    let refused: Vec<&std::ffi::OsStr> = refused.iter().map(|f| f.as_os_str()).collect();
    let stderr = refused_start(&store, "a", &refused);
    assert!(stderr.contains("mecated"), "{stderr}");
    assert!(stderr.contains("authenticate"), "{stderr}");

    let flags = with(&right);
    let flags: Vec<&str> = flags.iter().map(|f| f.to_str().unwrap()).collect();
    let server = Mecated::start(&store, "a", &flags);
    create(&server, "authed").await;
    let (status, body) = run(&server, "authed", serde_json::json!({"text": "hi"})).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
}

/// A member that speaks only mutual TLS: the CA, certificate and key flags
/// let the server lease over `https://`, the lease visible to a client of
/// the same CA; without a client certificate the server does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_speaking_mutual_tls_is_reached_with_the_ca_certificate_and_key_flags() {
    use lease_port::SessionLease;
    use test_services::pki::Pki;
    let ca = Pki::new("etcd CA");
    let member = ca.issue("etcd");
    let etcd = EtcdServer::start_tls(test_services::EtcdTls {
        cert_pem: member.cert_pem,
        key_pem: member.key_pem,
        client_ca_pem: Some(ca.ca_pem.clone()),
    })
    .expect("etcd starts with mutual TLS");
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");

    let dir = tempfile::tempdir().unwrap();
    let client = ca.issue("mecated");
    let files = [
        ("ca.pem", ca.ca_pem.as_str()),
        ("client.pem", client.cert_pem.as_str()),
        ("client-key.pem", client.key_pem.as_str()),
    ];
    for (name, pem) in files {
        std::fs::write(dir.path().join(name), pem).unwrap();
    }
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let store = dir.path().join("store");
    let mut flags = vec![
        "--session-lease-etcd".to_owned(),
        endpoint.clone(),
        "--session-lease-etcd-prefix".to_owned(),
        PREFIX.to_owned(),
        "--session-lease-ttl".to_owned(),
        TTL.to_owned(),
        "--session-lease-etcd-ca".to_owned(),
        path("ca.pem"),
    ];

    // Trusting the member but with no certificate of its own: refused at
    // the handshake, so the server cannot open its lease authority and
    // says so instead of serving.
    let anonymous: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    let stderr = refused_start(&store, "anonymous", &anonymous);
    assert!(stderr.contains("--session-lease-etcd"), "{stderr}");

    flags.extend([
        "--session-lease-etcd-cert".to_owned(),
        path("client.pem"),
        "--session-lease-etcd-key".to_owned(),
        path("client-key.pem"),
        // Long enough to find the run's lease in etcd while it runs.
        "--echo-delay".to_owned(),
        "5s".to_owned(),
    ]);
    let server = Mecated::start(
        &store,
        "a",
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    create(&server, "tls").await;
    let _slow = run_in_background(&server, "tls", serde_json::json!("slow"));
    let started = wait_for_event(&server, "tls", is_run_started_by("a")).await;
    let direct = EtcdLease::builder([endpoint])
        .prefix(PREFIX)
        .ttl(Duration::from_secs(TTL_SECS))
        .request_timeout(Duration::from_secs(1))
        .tls(
            etcdlease::TlsOptions::default()
                .ca_certificate_pem(ca.ca_pem.clone())
                .client_identity_pem(client.cert_pem.clone(), client.key_pem.clone()),
        )
        .build()
        .unwrap();
    let held = direct
        .current(&lease_port::SessionId::new("tls").unwrap())
        .await
        .unwrap()
        .expect("the run's lease is in etcd");
    assert_eq!(
        Some(held.token().get()),
        started["token"].as_u64(),
        "{started}"
    );
}

/// A password file ending in two newlines (a password `echo`ed into a file
/// an editor then saved) holds one password: the server authenticates with
/// it, as `mecatl-leased` does with the same file — both read it through
/// `lease-backends`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_ending_in_two_newlines_authenticates() {
    let etcd = Etcd::start();
    let admin = etcdlease::wire::EtcdClient::new(&[etcd.endpoint.as_str()], Duration::from_secs(5))
        .unwrap();
    admin.user_add("root", "root-password").await.unwrap();
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("mecated", "right").await.unwrap();
    admin.role_add("sessions").await.unwrap();
    admin
        .role_grant_prefix("sessions", PREFIX.as_bytes())
        .await
        .unwrap();
    admin.user_grant_role("mecated", "sessions").await.unwrap();
    admin.auth_enable().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "right\n\n").unwrap();
    let mut flags = etcd.flags().to_vec();
    flags.extend([
        "--session-lease-etcd-user",
        "mecated",
        "--session-lease-etcd-password-file",
        password.to_str().unwrap(),
    ]);
    let server = Mecated::start(&dir.path().join("store"), "a", &flags);
    create(&server, "authed").await;
    let (status, body) = run(&server, "authed", serde_json::json!({"text": "hi"})).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
}
