//! The lease contract against a real `redis-server`, on real time with a
//! short TTL (expiry is Redis's own). Every client is its own `RedisLease`
//! with its own connection; the server keeps an append-only file synced on
//! every write, and the restart cases stop and start it again on the same
//! port and directory, so tokens must come back from the file.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaseconformance::RealTimeFactory;
use redis_session_store::{RedisLease, RedisStore};
use test_services::RedisServer;

const TTL: Duration = Duration::from_millis(1000);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(800);

fn factory() -> RealTimeFactory<RedisLease> {
    let server = Arc::new(Mutex::new(
        RedisServer::start_persistent().expect("start redis-server"),
    ));
    let url = server.lock().unwrap().url();
    RealTimeFactory::new_async(TTL, move || {
        let url = url.clone();
        async move {
            RedisLease::builder(url)
                .ttl(TTL)
                .request_timeout(REQUEST_TIMEOUT)
                .connect()
                .await
                .expect("connect to redis")
        }
    })
    .restart_with(move || {
        // On this worker thread, not a blocking-pool one: the server
        // follows the thread that started it.
        server
            .lock()
            .unwrap()
            .restart()
            .expect("restart redis-server");
        async {}
    })
}

leaseconformance::suite!(async { factory() });

/// The same contract through the leases a store configured with
/// `leases(ttl)` offers, which a server takes from
/// `SessionStore::session_lease`.
mod through_the_store {
    use super::*;
    use session_store::SessionStore;

    fn factory() -> RealTimeFactory<RedisLease> {
        let server = Arc::new(RedisServer::start().expect("start redis-server"));
        RealTimeFactory::new_async(TTL, move || {
            let url = server.url();
            async move {
                let store = RedisStore::builder(url)
                    .prefix("through-store:")
                    .leases(TTL)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await
                    .expect("connect to redis");
                let offered = store.session_lease().expect("configured with leases");
                assert!(offered.renews_in_batches());
                store.lease().cloned().expect("configured with leases")
            }
        })
    }

    leaseconformance::suite!(async { factory() });
}
