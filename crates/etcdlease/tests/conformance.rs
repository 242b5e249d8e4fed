//! The lease contract, checked by the shared conformance suite against a
//! real single-member etcd started for each case: every client is a
//! separate `EtcdLease` (its own connection and etcd lease), time is real
//! with a 4 s TTL, and a restart stops etcd and starts it again from its
//! data directory, so tokens and the authority are checked across it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcdlease::EtcdLease;
use leaseconformance::RealTimeFactory;
use test_services::EtcdServer;

/// etcd keeps keys a grace (1 s) longer than leases report and checks for
/// expired leases every 500 ms: the suite's takeovers after 1.5 TTL
/// need the TTL well above that.
const TTL: Duration = Duration::from_secs(4);

async fn factory() -> RealTimeFactory<EtcdLease> {
    // Started on this runtime worker (never in `block_in_place` or the
    // blocking pool, whose threads come and go): the server dies with the
    // thread that started it.
    let server = EtcdServer::start().expect("start etcd");
    let endpoint = server.endpoint();
    let server = Arc::new(Mutex::new(server));
    RealTimeFactory::new(TTL, move || {
        EtcdLease::builder([endpoint.clone()])
            .prefix("/conformance/")
            .ttl(TTL)
            .request_timeout(Duration::from_secs(1))
            .build()
            .expect("a valid configuration")
    })
    .restart_with(move || {
        let server = Arc::clone(&server);
        async move {
            server
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .restart()
                .expect("restart etcd")
        }
    })
}

leaseconformance::suite!(factory());
