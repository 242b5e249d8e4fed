//! Leases over TLS, as the URL asks: against a real PostgreSQL started
//! with `ssl = on` and a certificate of the test's own CA, and one without
//! TLS.

use std::time::Duration;

use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use pglease::PgLease;
use test_services::PostgresServer;
use test_services::pki::Pki;

fn url(server: &PostgresServer, tls: &str) -> String {
    format!(
        "postgres://{}:{}@localhost:{}/postgres?application_name=pglease-tls&{tls}",
        server.user(),
        server.password(),
        server.port()
    )
}

async fn connect(url: String) -> Result<PgLease, lease_port::LeaseError> {
    PgLease::builder(url)
        .ttl(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_granted_over_verified_tls_and_a_foreign_ca_is_refused() {
    let pki = Pki::new("pglease test CA");
    let server = PostgresServer::start_with_tls(&pki.issue("postgres")).expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let foreign = dir.path().join("foreign.pem");
    std::fs::write(&foreign, Pki::new("another CA").ca_pem).unwrap();

    let verified = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    let leases = connect(url(&server, &verified)).await.unwrap();
    let s = SessionId::new("s").unwrap();
    let held = leases
        .acquire(&s, &OwnerId::new("a").unwrap())
        .await
        .unwrap();
    leases.release(&held).await.unwrap();
    let rows = server
        .query(
            "SELECT count(*), bool_and(ssl) FROM pg_stat_activity JOIN pg_stat_ssl USING (pid) \
             WHERE application_name = 'pglease-tls'",
        )
        .unwrap();
    assert_ne!(rows[0][0].as_deref(), Some("0"), "no connection seen");
    assert_eq!(rows[0][1].as_deref(), Some("t"), "a connection without TLS");

    let untrusted = format!("sslmode=verify-full&sslrootcert={}", foreign.display());
    let err = connect(url(&server, &untrusted))
        .await
        .expect_err("connected");
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err}");
    assert!(err.message().contains("is not trusted"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_refuses_require_and_a_bad_mode_is_invalid() {
    let server = PostgresServer::start().expect("PostgreSQL");
    let err = connect(url(&server, "sslmode=require"))
        .await
        .expect_err("connected");
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err}");
    assert!(err.message().contains("does not offer TLS"), "{err}");
    let err = connect(url(&server, "sslmode=verify_full"))
        .await
        .expect_err("connected");
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err}");
    assert!(err.message().contains("sslmode"), "{err}");
    connect(url(&server, "sslmode=prefer")).await.unwrap();
}
