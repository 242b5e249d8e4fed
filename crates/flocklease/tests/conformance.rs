//! The lease contract, checked by the shared conformance suite: every client
//! is a separate `FlockLease` instance (its own directory descriptor and its
//! own open file descriptions) on one temporary directory, and a restart is
//! new instances over the same directory, as a restarted process would open.

use std::time::Duration;

use flocklease::FlockLease;
use leaseconformance::ManualClockFactory;

const TTL: Duration = Duration::from_secs(10);

fn factory(inline_fast_path: bool) -> ManualClockFactory<FlockLease> {
    let dir = tempfile::tempdir().expect("temporary directory");
    ManualClockFactory::new(TTL, move |clock| {
        FlockLease::builder(dir.path())
            .ttl(TTL)
            .clock(clock)
            .inline_fast_path(inline_fast_path)
            .open()
            .expect("open the lease directory")
    })
    .restart_by_new_clients()
}

leaseconformance::suite!(async { factory(true) });

/// The same suite with every operation on the blocking pool.
mod offloaded {
    leaseconformance::suite!(async { super::factory(false) });
}
