//! What the tests share: servers, stores, ids.

use std::time::Duration;

use lease_port::{FencingToken, OwnerId, SessionId};
use pg_session_store::{PgStore, PgStoreBuilder};
use session_store::WriteFence;
use test_services::PostgresServer;

/// Short enough that a stuck statement fails a test quickly.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn server() -> PostgresServer {
    PostgresServer::start().expect("start PostgreSQL")
}

pub(crate) fn builder(url: &str) -> PgStoreBuilder {
    PgStore::builder(url).request_timeout(REQUEST_TIMEOUT)
}

pub(crate) async fn store(url: &str) -> PgStore {
    builder(url).connect().await.expect("connect the store")
}

pub(crate) fn session(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}

pub(crate) fn owner(id: &str) -> OwnerId {
    OwnerId::new(id).unwrap()
}

pub(crate) fn fence(token: u64, writer: &str) -> WriteFence {
    WriteFence::new(FencingToken::new(token), owner(writer))
}

/// The first column of the first row of `sql`, run as the superuser.
pub(crate) fn scalar(server: &PostgresServer, sql: &str) -> Option<String> {
    server.query(sql).expect("query the server")[0][0].clone()
}

/// The next transaction id the server will assign: every write
/// transaction takes one, reads take none.
pub(crate) fn next_xid(server: &PostgresServer) -> u64 {
    scalar(
        server,
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text",
    )
    .and_then(|v| v.parse().ok())
    .expect("a transaction id")
}

/// Statements of the database waiting for a lock.
pub(crate) fn waiting_on_locks(server: &PostgresServer) -> u64 {
    scalar(
        server,
        "SELECT count(*)::text FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
    )
    .and_then(|n| n.parse().ok())
    .unwrap_or(0)
}

/// Returns once `n` statements wait for a lock, so a test stages a race by
/// what the server reports rather than by how long a loaded machine takes.
pub(crate) async fn until_waiting_on_locks(server: &PostgresServer, n: u64) {
    let patience = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while waiting_on_locks(server) < n {
        assert!(
            tokio::time::Instant::now() < patience,
            "{n} statements never waited for a lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
