//! memlease against the whole behaviour suite, on a manual clock.

use std::time::Duration;

use leaseconformance::ManualClockFactory;
use memlease::MemLease;

const TTL: Duration = Duration::from_secs(10);

fn factory(shards: usize) -> ManualClockFactory<MemLease> {
    ManualClockFactory::shared(TTL, |clock| {
        MemLease::builder()
            .ttl(TTL)
            .clock(clock)
            .shards(shards)
            .build()
    })
}

mod sharded {
    leaseconformance::suite!(async { super::factory(memlease::DEFAULT_SHARDS) });
}

/// One shard puts every session behind one lock and one counter: the
/// configuration most likely to leak state between sessions.
mod single_shard {
    leaseconformance::suite!(async { super::factory(1) });
}
