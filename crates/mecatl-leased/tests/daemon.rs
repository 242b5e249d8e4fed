//! The daemon as users run it: a real process, reached over gRPC.

use std::process::Stdio;
use std::time::Duration;

use grpcdriver::GrpcLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

struct Daemon {
    child: Child,
    addr: String,
    metrics: Option<String>,
}

impl Daemon {
    async fn start(args: &[&str]) -> Daemon {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mecatl-leased"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("MECATL_LEASED_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start mecatl-leased");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut metrics = None;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("the daemon announces itself")
                .expect("read stdout")
                .expect("the daemon exited before listening");
            if let Some(m) = line.strip_prefix("mecatl-leased metrics on ") {
                metrics = Some(m.to_owned());
            }
            if let Some(addr) = line.strip_prefix("mecatl-leased listening on ") {
                return Daemon {
                    child,
                    addr: addr.to_owned(),
                    metrics,
                };
            }
        }
    }

    fn client(&self) -> GrpcLease {
        GrpcLease::connect(self.addr.clone()).expect("client")
    }

    fn signal(&self, s: Signal) {
        let pid = self.child.id().expect("running");
        kill(Pid::from_raw(i32::try_from(pid).unwrap()), s).expect("signal the daemon");
    }

    async fn wait(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the daemon exits")
            .expect("wait")
    }
}

fn ids() -> (SessionId, OwnerId, OwnerId) {
    (
        SessionId::new("chat/42").unwrap(),
        OwnerId::new("host-a#1").unwrap(),
        OwnerId::new("host-b#1").unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_backed_daemon_keeps_tokens_rising_and_its_authority_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let backend = format!("dir:{}", dir.path().display());
    let (s, a, b) = ids();

    let first = Daemon::start(&["--backend", &backend, "--allow-volatile-lease-dir"]).await;
    let c = first.client();
    let authority = c.authority().await.unwrap();
    let la = c.acquire(&s, &a).await.unwrap();
    let held = c.acquire(&s, &b).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held);
    assert_eq!(held.holder(), Some(&a));
    c.release(&la).await.unwrap();
    first.signal(Signal::SIGKILL);
    first.wait().await;

    let second = Daemon::start(&["--backend", &backend, "--allow-volatile-lease-dir"]).await;
    let c = second.client();
    assert_eq!(
        c.authority().await.unwrap(),
        authority,
        "authority changed across a restart"
    );
    let lb = c.acquire(&s, &b).await.unwrap();
    assert!(
        lb.token() > la.token(),
        "token went back across a restart: {la:?} then {lb:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_daemon_names_a_new_authority_each_start() {
    let first = Daemon::start(&["--backend", "memory"]).await;
    let one = first.client().authority().await.unwrap();
    first.signal(Signal::SIGKILL);
    first.wait().await;
    let second = Daemon::start(&["--backend", "memory"]).await;
    let two = second.client().authority().await.unwrap();
    assert_ne!(
        one, two,
        "tokens restart with a memory backend; the authority must too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_address_without_authentication_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_mecatl-leased"))
        .args(["--listen", "0.0.0.0:0", "--backend", "memory"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without authentication"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_from_a_file_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let daemon = Daemon::start(&[
        "--backend",
        "memory",
        "--bearer-token-file",
        file.to_str().unwrap(),
    ])
    .await;
    let (s, a, _) = ids();
    let anonymous = daemon.client().acquire(&s, &a).await.unwrap_err();
    assert_eq!(anonymous.kind(), LeaseErrorKind::Invalid);
    assert!(anonymous.to_string().contains("credentials"), "{anonymous}");
    let with_token = GrpcLease::builder(daemon.addr.clone())
        .bearer_token("s3cret")
        .build()
        .unwrap();
    with_token.acquire(&s, &a).await.unwrap();
}

/// The theft this guards against, through the daemon: client x, which
/// learns y's grant, can neither release it nor take y's session; the
/// identities file is then rotated without a restart, and a broken
/// rewrite of it keeps the identities in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_acts_only_for_its_own_owners_and_the_identities_reload() {
    use grpcdriver::hash_token;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("identities");
    let write = |text: String| {
        // A new file renamed into place, as a Secret volume or an editor
        // swaps it: the reader never sees half of it.
        let tmp = dir.path().join("identities.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    write(format!(
        "# the daemon's clients\ntoken x x/ {}\ntoken y y/ {}\n",
        hash_token("token-x"),
        hash_token("token-y")
    ));
    let daemon = Daemon::start(&[
        "--backend",
        "memory",
        "--identities-file",
        file.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .await;
    let as_client = |token: &str| {
        GrpcLease::builder(daemon.addr.clone())
            .bearer_token(token)
            .build()
            .unwrap()
    };
    let (x, y) = (as_client("token-x"), as_client("token-y"));
    let s = SessionId::new("chat/7").unwrap();
    let y_owner = y
        .who_am_i()
        .await
        .unwrap()
        .expect("the daemon answers WhoAmI")
        .owner_id("host-b/1")
        .unwrap();
    let held = y.acquire(&s, &y_owner).await.unwrap();

    let stolen = x.acquire(&s, &y_owner).await.unwrap_err();
    assert_eq!(stolen.kind(), LeaseErrorKind::Invalid, "{stolen}");
    assert!(
        stolen.message().contains("may not act for owner"),
        "{stolen}"
    );
    let seen = x.current(&s).await.unwrap().expect("y holds it");
    let e = x.release(&seen).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    let e = x
        .acquire(&s, &OwnerId::new("x/host-a/1").unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Held, "{e}");
    let held = y.renew(&held).await.expect("y still holds its lease");

    let metrics = daemon.metrics.clone().expect("metrics address");
    let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
    for expected in [
        "mecatl_lease_client_denied_total{client=\"x\",method=\"Acquire\"} 1",
        "mecatl_lease_client_denied_total{client=\"x\",method=\"Release\"} 1",
        "mecatl_lease_client_calls_total{client=\"y\",method=\"Renew\"} 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }

    // Rotation: y gets a new token, the old one is dropped. No restart.
    write(format!(
        "token x x/ {}\ntoken y y/ {}\n",
        hash_token("token-x"),
        hash_token("token-y2")
    ));
    let y2 = as_client("token-y2");
    let renewed = eventually(|| async { y2.renew(&held).await.ok() }).await;
    assert_eq!(renewed.token(), held.token());
    let e = y.renew(&held).await.unwrap_err();
    assert!(e.message().contains("refused the credentials"), "{e}");

    // A broken rewrite is refused and changes nothing.
    write("token y y/ the-token-itself\n".to_owned());
    daemon.signal(Signal::SIGHUP);
    tokio::time::sleep(Duration::from_secs(3)).await;
    y2.renew(&held).await.expect("the identities in force stay");
    x.who_am_i().await.expect("x is still known");
}

/// Asks `f` until it answers, for at most 30 s.
async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_calls_and_sigterm_exits_cleanly() {
    let daemon = Daemon::start(&["--backend", "memory", "--metrics-listen", "127.0.0.1:0"]).await;
    let (s, a, b) = ids();
    let c = daemon.client();
    let lease = c.acquire(&s, &a).await.unwrap();
    c.acquire(&s, &b).await.unwrap_err();
    c.renew_many(std::slice::from_ref(&lease))
        .await
        .pop()
        .unwrap()
        .unwrap();
    let text = reqwest::get(daemon.metrics.clone().expect("metrics address"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for expected in [
        "mecatl_lease_calls_total{method=\"Acquire\",code=\"Ok\"} 1",
        "mecatl_lease_calls_total{method=\"Acquire\",code=\"FailedPrecondition\"} 1",
        "mecatl_lease_calls_total{method=\"KeepAlive\",code=\"Ok\"} 1",
        "mecatl_lease_keepalive_streams 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    drop(c);
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait().await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_over_one_etcd_share_holds_tokens_and_authority() {
    let etcd = test_services::EtcdServer::start().expect("etcd is installed");
    let backend = format!("etcd:{}", etcd.endpoint());
    let one = Daemon::start(&["--backend", &backend, "--ttl", "5s"]).await;
    let two = Daemon::start(&["--backend", &backend, "--ttl", "5s"]).await;
    let (c1, c2) = (one.client(), two.client());
    assert_eq!(c1.authority().await.unwrap(), c2.authority().await.unwrap());
    let (s, a, b) = ids();
    let la = c1.acquire(&s, &a).await.unwrap();
    let held = c2.acquire(&s, &b).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held, "{held}");
    assert_eq!(held.holder(), Some(&a));
    // One replica dies; the other serves the same leases.
    one.signal(Signal::SIGKILL);
    one.wait().await;
    let renewed = c2
        .renew(&la)
        .await
        .expect("the lease lives in etcd, not in the replica");
    assert_eq!(renewed.token(), la.token());
    c2.release(&renewed).await.unwrap();
    let lb = c2.acquire(&s, &b).await.unwrap();
    assert!(lb.token() > la.token(), "{la:?} then {lb:?}");
}

/// A cluster with authentication enabled, reached with the spellings the
/// daemon shipped with (`--etcd-prefix`, `--etcd-user`,
/// `--etcd-password-file`, now aliases of `--session-lease-etcd-…`) and a
/// password file ending in two newlines: one password, the one `mecated`
/// reads from the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_with_authentication_is_reached_with_the_old_spellings() {
    const PREFIX: &str = "/daemon-tests/leases/";
    let etcd = test_services::EtcdServer::start().expect("etcd is installed");
    let endpoint = etcd.endpoint();
    let admin =
        etcdlease::wire::EtcdClient::new(&[endpoint.as_str()], Duration::from_secs(5)).unwrap();
    admin.user_add("root", "root-password").await.unwrap();
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("leased", "right").await.unwrap();
    admin.role_add("leases").await.unwrap();
    admin
        .role_grant_prefix("leases", PREFIX.as_bytes())
        .await
        .unwrap();
    admin.user_grant_role("leased", "leases").await.unwrap();
    admin.auth_enable().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "right\n\n").unwrap();
    let backend = format!("etcd:{endpoint}");
    let daemon = Daemon::start(&[
        "--backend",
        &backend,
        "--ttl",
        "5s",
        "--etcd-prefix",
        PREFIX,
        "--etcd-user",
        "leased",
        "--etcd-password-file",
        password.to_str().unwrap(),
    ])
    .await;
    let c = daemon.client();
    let (s, a, b) = ids();
    let la = c.acquire(&s, &a).await.unwrap();
    let held = c.acquire(&s, &b).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held, "{held}");
    c.release(&la).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_over_kubernetes_leases_serves_them() {
    let emulator = k8s_emulator::Emulator::start(k8s_emulator::EmulatorConfig::default())
        .await
        .expect("the emulator starts");
    let kubeconfig = emulator.kubeconfig_path().to_str().unwrap().to_owned();
    let daemon = Daemon::start(&["--backend", "k8s:default", "--kubeconfig", &kubeconfig]).await;
    let c = daemon.client();
    let (s, a, b) = ids();
    let la = c.acquire(&s, &a).await.unwrap();
    let held = c.acquire(&s, &b).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held, "{held}");
    c.release(&la).await.unwrap();
    let lb = c.acquire(&s, &b).await.unwrap();
    assert!(lb.token() > la.token(), "{la:?} then {lb:?}");
    assert!(
        c.authority()
            .await
            .unwrap()
            .as_str()
            .starts_with("k8s:default:")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_over_redis_keeps_tokens_rising_across_its_restart() {
    let redis = test_services::RedisServer::start_persistent().expect("redis-server is installed");
    let backend = format!("redis:{}", redis.url());
    let (s, a, b) = ids();
    let first = Daemon::start(&["--backend", &backend, "--ttl", "5s"]).await;
    let c = first.client();
    let authority = c.authority().await.unwrap();
    let la = c.acquire(&s, &a).await.unwrap();
    assert_eq!(
        c.acquire(&s, &b).await.unwrap_err().kind(),
        LeaseErrorKind::Held
    );
    c.release(&la).await.unwrap();
    first.signal(Signal::SIGKILL);
    first.wait().await;
    let second = Daemon::start(&["--backend", &backend, "--ttl", "5s"]).await;
    let c = second.client();
    assert_eq!(c.authority().await.unwrap(), authority);
    let lb = c.acquire(&s, &b).await.unwrap();
    assert!(lb.token() > la.token(), "{la:?} then {lb:?}");
}

/// Stateless replicas over one PostgreSQL, reached through PgBouncer in
/// transaction mode with the password read from a file (the URL carries
/// none): they share holds, tokens and the authority, and one dying
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_over_one_postgres_share_holds_tokens_and_authority() {
    let server = test_services::PostgresServer::start().expect("postgresql is installed");
    let bouncer = test_services::PgBouncer::start(&server).expect("pgbouncer is installed");
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("pg-password");
    std::fs::write(&password, format!("{}\n", server.password())).unwrap();
    let url = format!("postgres://{}@{}/postgres", server.user(), bouncer.addr());
    let backend = format!("postgres:{url}");
    let password = password.to_str().unwrap();
    let args = [
        "--backend",
        &backend,
        "--ttl",
        "5s",
        "--session-lease-postgres-password-file",
        password,
    ];
    let one = Daemon::start(&args).await;
    let two = Daemon::start(&args).await;
    let (c1, c2) = (one.client(), two.client());
    assert_eq!(c1.authority().await.unwrap(), c2.authority().await.unwrap());
    let (s, a, b) = ids();
    let la = c1.acquire(&s, &a).await.unwrap();
    let held = c2.acquire(&s, &b).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held, "{held}");
    one.signal(Signal::SIGKILL);
    one.wait().await;
    let renewed = c2
        .renew(&la)
        .await
        .expect("the lease lives in the database, not in the replica");
    c2.release(&renewed).await.unwrap();
    let lb = c2.acquire(&s, &b).await.unwrap();
    assert!(lb.token() > la.token(), "{la:?} then {lb:?}");
}
