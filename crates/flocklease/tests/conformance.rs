//! The lease contract, checked by the shared conformance suite: every client
//! is a separate `FlockLease` instance (its own directory descriptor and its
//! own open file descriptions) on one temporary directory.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use flocklease::FlockLease;
use lease_port::{Clock, ManualClock};
use leaseconformance::{Capabilities, LeaseFactory, TimeControl};

struct FlockFactory {
    dir: tempfile::TempDir,
    clock: ManualClock,
}

const TTL: Duration = Duration::from_secs(10);

impl FlockFactory {
    fn new() -> Self {
        FlockFactory {
            dir: tempfile::tempdir().expect("temporary directory"),
            clock: ManualClock::new(),
        }
    }
}

#[async_trait]
impl LeaseFactory for FlockFactory {
    type Lease = FlockLease;

    async fn client(&self) -> FlockLease {
        FlockLease::builder(self.dir.path())
            .ttl(TTL)
            .clock(Arc::new(self.clock.clone()))
            .open()
            .expect("open the lease directory")
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            time: TimeControl::Manual,
            restart: true,
        }
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// All state is in the directory; the suite drops its clients and makes
    /// new ones, which is what a restarted process does.
    async fn restart(&self) {}
}

leaseconformance::suite!(async { FlockFactory::new() });

/// The same suite with every operation on the blocking pool.
mod offloaded {
    use super::*;

    struct Offloaded(FlockFactory);

    #[async_trait]
    impl LeaseFactory for Offloaded {
        type Lease = FlockLease;
        async fn client(&self) -> FlockLease {
            FlockLease::builder(self.0.dir.path())
                .ttl(TTL)
                .clock(Arc::new(self.0.clock.clone()))
                .inline_fast_path(false)
                .open()
                .expect("open the lease directory")
        }
        fn ttl(&self) -> Duration {
            TTL
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn now(&self) -> SystemTime {
            self.0.now()
        }
        async fn advance(&self, by: Duration) {
            self.0.advance(by).await;
        }
        async fn restart(&self) {}
    }

    leaseconformance::suite!(async { Offloaded(FlockFactory::new()) });
}
