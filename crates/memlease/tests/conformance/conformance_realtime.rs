//! memlease on the system clock: the suite's real-time mode, where expiry is
//! reached by sleeping past a short TTL, as it is for networked backends.

use std::time::Duration;

use leaseconformance::RealTimeFactory;
use memlease::MemLease;

const TTL: Duration = Duration::from_millis(800);

leaseconformance::suite!(async {
    let store = MemLease::new(TTL);
    RealTimeFactory::new(TTL, move || store.clone())
});
