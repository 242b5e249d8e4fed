//! Every `sslmode` against a real PostgreSQL started with `ssl = on` and a
//! certificate of the test's own CA (for `127.0.0.1` and `localhost`), and
//! against one without TLS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pg_connect::{ConnectError, PgConfig, SslMode, TlsError};
use test_services::PostgresServer;
use test_services::pki::Pki;

const BOUND: Duration = Duration::from_secs(20);

struct Tls {
    server: PostgresServer,
    dir: tempfile::TempDir,
    ca: PathBuf,
    foreign_ca: PathBuf,
    pki: Pki,
}

impl Tls {
    fn start() -> Tls {
        let pki = Pki::new("pg-connect test CA");
        let server = PostgresServer::start_with_tls(&pki.issue("postgres")).expect("PostgreSQL");
        let dir = tempfile::tempdir().unwrap();
        let ca = write(dir.path(), "ca.pem", &pki.ca_pem);
        let foreign_ca = write(dir.path(), "foreign.pem", &Pki::new("another CA").ca_pem);
        Tls {
            server,
            dir,
            ca,
            foreign_ca,
            pki,
        }
    }

    /// `key=value` pairs reaching the server at 127.0.0.1 as `host`, with
    /// `tls` appended.
    fn pairs(&self, host: &str, tls: &str) -> String {
        format!(
            "host={host} hostaddr=127.0.0.1 port={} user={} password={} dbname=postgres {tls}",
            self.server.port(),
            self.server.user(),
            self.server.password()
        )
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn url(server: &PostgresServer, host: &str, query: &str) -> String {
    format!(
        "postgres://{}:{}@{host}:{}/postgres?{query}",
        server.user(),
        server.password(),
        server.port()
    )
}

/// Whether the session runs over TLS, as the server sees it.
async fn over_tls(config: &PgConfig) -> Result<bool, ConnectError> {
    let client = config.connect_driven(BOUND).await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("ask pg_stat_ssl");
    Ok(row.get(0))
}

fn parse(text: &str) -> PgConfig {
    PgConfig::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_succeeds_with_the_right_ca_by_either_name() {
    let mut tls = Tls::start();
    let ca = tls.ca.display().to_string();
    for host in ["127.0.0.1", "localhost"] {
        let config = parse(&url(
            &tls.server,
            host,
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ));
        assert_eq!(config.ssl_mode(), SslMode::VerifyFull);
        assert!(over_tls(&config).await.unwrap(), "{host}: not over TLS");
    }
    // The test server keeps its TLS across a restart.
    tls.server.restart().expect("restart");
    let config = parse(&url(
        &tls.server,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    assert!(over_tls(&config).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_foreign_ca_and_a_wrong_host_name() {
    let tls = Tls::start();
    let foreign = parse(&url(
        &tls.server,
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            tls.foreign_ca.display()
        ),
    ));
    let err = over_tls(&foreign).await.unwrap_err();
    assert!(
        matches!(&err, ConnectError::Tls(TlsError::Untrusted { host, .. }) if host == "127.0.0.1"),
        "{err:?}"
    );
    assert!(err.to_string().contains("not trusted"), "{err}");

    let ca = tls.ca.display();
    let wrong_name = parse(&tls.pairs(
        "db.wrong.invalid",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    ));
    let err = over_tls(&wrong_name).await.unwrap_err();
    assert!(
        matches!(&err, ConnectError::Tls(TlsError::WrongName { host }) if host == "db.wrong.invalid"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("does not name db.wrong.invalid"),
        "{err}"
    );

    // verify-ca checks the chain only: the same name passes, the foreign
    // CA still does not.
    let chain_only = parse(&tls.pairs(
        "db.wrong.invalid",
        &format!("sslmode=verify-ca sslrootcert={ca}"),
    ));
    assert!(over_tls(&chain_only).await.unwrap());
    let foreign_chain = parse(&tls.pairs(
        "db.wrong.invalid",
        &format!("sslmode=verify-ca sslrootcert={}", tls.foreign_ca.display()),
    ));
    let err = over_tls(&foreign_chain).await.unwrap_err();
    assert!(
        matches!(err, ConnectError::Tls(TlsError::Untrusted { .. })),
        "{err:?}"
    );
}

/// `require` encrypts without a CA to check against; given one, it checks
/// the chain (libpq's rule). `prefer` takes TLS when offered, `disable`
/// never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_prefer_and_disable_against_a_tls_server() {
    let tls = Tls::start();
    let on = |query: &str| parse(&url(&tls.server, "127.0.0.1", query));
    assert!(over_tls(&on("sslmode=require")).await.unwrap());
    assert!(over_tls(&on("sslmode=prefer")).await.unwrap());
    assert!(over_tls(&on("")).await.unwrap(), "prefer is the default");
    assert!(!over_tls(&on("sslmode=disable")).await.unwrap());
    let foreign = on(&format!(
        "sslmode=require&sslrootcert={}",
        tls.foreign_ca.display()
    ));
    let err = over_tls(&foreign).await.unwrap_err();
    assert!(
        matches!(err, ConnectError::Tls(TlsError::Untrusted { .. })),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_refuses_require_and_serves_prefer_plain() {
    let server = PostgresServer::start().expect("PostgreSQL");
    let require = parse(&url(&server, "127.0.0.1", "sslmode=require"));
    let err = over_tls(&require).await.unwrap_err();
    assert!(
        matches!(
            &err,
            ConnectError::Tls(TlsError::NotOffered {
                mode: "require",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not offer TLS"), "{err}");
    let prefer = parse(&url(&server, "127.0.0.1", "sslmode=prefer"));
    assert!(!over_tls(&prefer).await.unwrap());
}

/// `sslcert` and `sslkey` are presented: the server, trusting their CA,
/// sees the client's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented() {
    let tls = Tls::start();
    let data = tls.server.data_dir();
    let ca = write(&data, "client-ca.pem", &tls.pki.ca_pem);
    let mut perms = std::fs::metadata(&ca).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    std::fs::set_permissions(&ca, perms).unwrap();
    tls.server
        .query("ALTER SYSTEM SET ssl_ca_file = 'client-ca.pem'")
        .unwrap();
    tls.server.query("SELECT pg_reload_conf()").unwrap();
    let client = tls.pki.issue("app-client");
    let cert = write(tls.dir.path(), "client.pem", &client.cert_pem);
    let key = write(tls.dir.path(), "client.key", &client.key_pem);
    let config = parse(&url(
        &tls.server,
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            tls.ca.display(),
            cert.display(),
            key.display()
        ),
    ));
    let start = std::time::Instant::now();
    let dn = loop {
        let conn = config.connect_driven(BOUND).await.unwrap();
        let row = conn
            .query_one(
                "SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        let dn: Option<String> = row.get(0);
        // The reload reaches new connections a moment later.
        match dn {
            Some(dn) => break dn,
            None if start.elapsed() < BOUND => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None => panic!("the server never saw the client certificate"),
        }
    };
    assert!(dn.contains("CN=app-client"), "{dn}");
}

/// A statement past its deadline is cancelled over TLS: a cancel request
/// is a connection of its own, and under `verify-full` (`require` to
/// tokio-postgres) one without the TLS connector would not be sent at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_is_cancelled_over_tls() {
    let tls = Tls::start();
    let config = parse(&url(
        &tls.server,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", tls.ca.display()),
    ));
    let client = config.connect_driven(BOUND).await.unwrap();
    let slow = client.query("SELECT pg_sleep(60)", &[]);
    tokio::pin!(slow);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut slow)
            .await
            .is_err()
    );
    config.cancel(&client);
    let answer = tokio::time::timeout(BOUND, slow)
        .await
        .expect("cancelled in time");
    let err = answer.expect_err("pg_sleep(60) finished");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err}"
    );
}
