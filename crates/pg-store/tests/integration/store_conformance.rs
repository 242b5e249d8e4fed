//! The store contract's behaviour suite (`storeconformance`) on the
//! PostgreSQL store, against a real server each case starts for itself:
//! directly, and with every statement going through PgBouncer in
//! transaction pooling mode (which may hand each statement to another
//! server connection, and does not carry `LISTEN`: waiters there fall
//! back to polling). Every client is a `PgStore` of its own with its own
//! connections, as another process has; the suite's unfenced client is
//! one built with `allow_unfenced`.

use std::sync::Arc;

use async_trait::async_trait;
use pg_session_store::PgStore;
use session_store::SessionStore;
use storeconformance::StoreFactory;
use test_services::{PgBouncer, PostgresServer};

use crate::support::REQUEST_TIMEOUT;

/// Small, so the suite's oversized event is cheap.
const MAX_EVENT_BYTES: usize = 4096;

/// The server, the pooler in front of it (when the statements go through
/// one), and the URL the clients use.
struct Postgres {
    url: String,
    _bouncer: Option<PgBouncer>,
    _server: PostgresServer,
}

impl Postgres {
    fn direct() -> Self {
        let server = PostgresServer::start().expect("start PostgreSQL");
        Postgres {
            url: server.url(),
            _bouncer: None,
            _server: server,
        }
    }

    fn through_pgbouncer() -> Self {
        let server = PostgresServer::start().expect("start PostgreSQL");
        let bouncer = PgBouncer::start(&server).expect("start PgBouncer");
        Postgres {
            url: bouncer.url(),
            _bouncer: Some(bouncer),
            _server: server,
        }
    }

    async fn connect(&self, allow_unfenced: bool) -> Arc<dyn SessionStore> {
        let store = PgStore::builder(&self.url)
            .table_prefix("conformance")
            .request_timeout(REQUEST_TIMEOUT)
            .max_event_bytes(MAX_EVENT_BYTES)
            .allow_unfenced(allow_unfenced)
            .connect()
            .await
            .expect("connect to PostgreSQL");
        Arc::new(store)
    }
}

#[async_trait]
impl StoreFactory for Postgres {
    async fn store(&self) -> Arc<dyn SessionStore> {
        self.connect(false).await
    }

    async fn unfenced_store(&self) -> Option<Arc<dyn SessionStore>> {
        Some(self.connect(true).await)
    }

    fn max_event_bytes(&self) -> Option<usize> {
        Some(MAX_EVENT_BYTES)
    }

    fn keeps_cancel_requests(&self) -> bool {
        true
    }
}

storeconformance::suite!(async { Postgres::direct() });

/// The same contract with every statement going through PgBouncer.
mod through_pgbouncer {
    use super::*;

    storeconformance::suite!(async { Postgres::through_pgbouncer() });
}
