//! The lease contract against a real PostgreSQL server, on real time with a
//! short TTL (expiry is the database's own), directly and through PgBouncer
//! in transaction pooling mode. Every client is its own `PgLease` with its
//! own connections; the restart cases stop and start the server on the
//! same data directory, so tokens must come back from the table.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaseconformance::RealTimeFactory;
use pglease::PgLease;
use test_services::{PgBouncer, PostgresServer};

const TTL: Duration = Duration::from_millis(1000);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(800);

fn client(
    url: String,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = PgLease> + Send>> + Send + Sync + 'static {
    move || {
        let url = url.clone();
        Box::pin(async move {
            PgLease::builder(url)
                .ttl(TTL)
                .request_timeout(REQUEST_TIMEOUT)
                .connect()
                .await
                .expect("connect to PostgreSQL")
        })
    }
}

fn factory() -> RealTimeFactory<PgLease> {
    let server = Arc::new(Mutex::new(
        PostgresServer::start().expect("start PostgreSQL"),
    ));
    let url = server.lock().unwrap().url();
    RealTimeFactory::new_async(TTL, client(url)).restart_with(move || {
        server
            .lock()
            .unwrap()
            .restart()
            .expect("restart PostgreSQL");
        async {}
    })
}

leaseconformance::suite!(async { factory() });

/// The same contract with every statement going through PgBouncer, which
/// may hand each to another server connection.
mod through_pgbouncer {
    use super::*;

    fn factory() -> RealTimeFactory<PgLease> {
        let server = PostgresServer::start().expect("start PostgreSQL");
        let bouncer = PgBouncer::start(&server).expect("start PgBouncer");
        let url = bouncer.url();
        let kept = Arc::new(Mutex::new((server, bouncer)));
        RealTimeFactory::new_async(TTL, client(url)).restart_with(move || {
            kept.lock()
                .unwrap()
                .0
                .restart()
                .expect("restart PostgreSQL");
            async {}
        })
    }

    leaseconformance::suite!(async { factory() });
}
