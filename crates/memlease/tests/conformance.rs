//! memlease against the whole behaviour suite, on a manual clock.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lease_port::{Clock, ManualClock};
use leaseconformance::{Capabilities, LeaseFactory, TimeControl};
use memlease::MemLease;

const TTL: Duration = Duration::from_secs(10);

struct Factory {
    clock: ManualClock,
    store: MemLease,
}

impl Factory {
    fn with_shards(shards: usize) -> Self {
        let clock = ManualClock::new();
        let store = MemLease::builder()
            .ttl(TTL)
            .clock(Arc::new(clock.clone()))
            .shards(shards)
            .build();
        Self { clock, store }
    }
}

#[async_trait::async_trait]
impl LeaseFactory for Factory {
    type Lease = MemLease;

    async fn client(&self) -> MemLease {
        self.store.clone()
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            time: TimeControl::Manual,
            restart: false,
        }
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

mod sharded {
    leaseconformance::suite!(async { super::Factory::with_shards(memlease::DEFAULT_SHARDS) });
}

/// One shard puts every session behind one lock and one counter: the
/// configuration most likely to leak state between sessions.
mod single_shard {
    leaseconformance::suite!(async { super::Factory::with_shards(1) });
}
