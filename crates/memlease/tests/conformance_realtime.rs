//! memlease on the system clock: the suite's real-time mode, where expiry is
//! reached by sleeping past a short TTL, as it is for networked backends.

use std::time::Duration;

use leaseconformance::{Capabilities, LeaseFactory, TimeControl};
use memlease::MemLease;

const TTL: Duration = Duration::from_millis(800);

struct RealTime(MemLease);

#[async_trait::async_trait]
impl LeaseFactory for RealTime {
    type Lease = MemLease;

    async fn client(&self) -> MemLease {
        self.0.clone()
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            time: TimeControl::Real,
            restart: false,
        }
    }

    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
}

leaseconformance::suite!(async { RealTime(MemLease::new(TTL)) });
