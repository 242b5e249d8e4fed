//! The store over TLS, as the URL asks — its statements and its `LISTEN`
//! connection alike — against a real PostgreSQL started with `ssl = on`
//! and a certificate of the test's own CA, and one without TLS.

use std::time::{Duration, Instant};

use lease_port::SessionId;
use pg_session_store::PgStore;
use serde_json::json;
use session_store::{SessionStore, StoreErrorKind, WriteFence};
use test_services::PostgresServer;
use test_services::pki::Pki;

fn url(server: &PostgresServer, tls: &str) -> String {
    format!(
        "postgres://{}:{}@localhost:{}/postgres?application_name=pg-store-tls&{tls}",
        server.user(),
        server.password(),
        server.port()
    )
}

async fn connect(url: String) -> Result<PgStore, session_store::StoreError> {
    PgStore::builder(url)
        .allow_unfenced(true)
        .request_timeout(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_and_its_listener_speak_verified_tls_and_a_foreign_ca_is_refused() {
    let pki = Pki::new("pg-store test CA");
    let server = PostgresServer::start_with_tls(&pki.issue("postgres")).expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let foreign = dir.path().join("foreign.pem");
    std::fs::write(&foreign, Pki::new("another CA").ca_pem).unwrap();

    let verified = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    let store = connect(url(&server, &verified)).await.unwrap();
    let s = SessionId::new("s").unwrap();
    store.create(&s).await.unwrap();
    // A waiter starts the listener; the notification of the append below
    // reaches it only over its own (TLS) connection.
    let waiting = {
        let store = store.clone();
        let s = s.clone();
        tokio::spawn(async move { store.wait_for_append(&s, 0, Duration::from_secs(30)).await })
    };
    let started = Instant::now();
    while !store.notifications_arrive() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no notification arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store
        .append(&s, WriteFence::Unfenced, &[json!({"over": "tls"})])
        .await
        .unwrap();
    assert!(waiting.await.unwrap().unwrap(), "the waiter was not woken");
    let rows = server
        .query(
            "SELECT count(*), bool_and(ssl) FROM pg_stat_activity JOIN pg_stat_ssl USING (pid) \
             WHERE application_name IN ('pg-store-tls', 'pg-session-store listen')",
        )
        .unwrap();
    assert_ne!(rows[0][0].as_deref(), Some("0"), "no connection seen");
    assert_eq!(rows[0][1].as_deref(), Some("t"), "a connection without TLS");

    let untrusted = format!("sslmode=verify-full&sslrootcert={}", foreign.display());
    let err = connect(url(&server, &untrusted))
        .await
        .expect_err("connected");
    assert!(err.to_string().contains("is not trusted"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_refuses_require_and_a_bad_mode_is_invalid() {
    let server = PostgresServer::start().expect("PostgreSQL");
    let err = connect(url(&server, "sslmode=require"))
        .await
        .expect_err("connected");
    assert!(err.to_string().contains("does not offer TLS"), "{err}");
    let err = connect(url(&server, "sslmode=verify_full"))
        .await
        .expect_err("connected");
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("sslmode"), "{err}");
}
