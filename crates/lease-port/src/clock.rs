//! Time, injectable: wall-clock for lease expiries, monotonic for local deadlines.

use std::fmt::Debug;
use std::time::{Instant, SystemTime};

/// A source of time, and of the randomness that goes with timing.
///
/// [`now`](Clock::now) is wall-clock time, used for lease expiries that other
/// processes must understand. [`instant`](Clock::instant) is monotonic, used
/// for deadlines a process keeps for itself (when to renew, when a lease it
/// holds must be taken as lost): a wall-clock jump must never stretch those.
/// [`random`](Clock::random) feeds jitter and the nonces that tell process
/// incarnations apart; it lives here so that a simulation that owns time
/// owns every other input of a schedule too, and replays it from a seed.
pub trait Clock: Send + Sync + Debug {
    /// Wall-clock time.
    fn now(&self) -> SystemTime;

    /// Monotonic time. Defaults to [`Instant::now`].
    fn instant(&self) -> Instant {
        Instant::now()
    }

    /// A random number, for jitter and nonces, not for secrets. Defaults
    /// to the standard library's randomly keyed hasher, which differs from
    /// call to call and from process to process.
    fn random(&self) -> u64 {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(Instant::now())
    }
}

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Wall-clock time that never steps: read from the system once, when the
/// clock is made, and advanced by the monotonic clock from then on.
///
/// For a process that both grants leases and judges their expiry itself
/// (a lease service over an in-memory table, say): a step of the host's
/// clock (an NTP correction, an operator's `date -s`) must neither expire
/// every grant at once nor stretch them, and with this clock it moves
/// neither. It drifts from the system clock by however much the system
/// clock is stepped or slewed while the process runs; never compare its
/// readings with another process's.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicWallClock {
    wall: SystemTime,
    at: Instant,
}

impl MonotonicWallClock {
    /// Anchored at the system's wall-clock time now.
    pub fn new() -> Self {
        Self::anchored_at(SystemTime::now())
    }

    /// Anchored at `wall`, as if the system clock read it now.
    pub fn anchored_at(wall: SystemTime) -> Self {
        Self {
            wall,
            at: Instant::now(),
        }
    }
}

impl Default for MonotonicWallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicWallClock {
    fn now(&self) -> SystemTime {
        self.wall + self.at.elapsed()
    }
    fn instant(&self) -> Instant {
        Instant::now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
    fn instant(&self) -> Instant {
        (**self).instant()
    }
    fn random(&self) -> u64 {
        (**self).random()
    }
}

#[cfg(feature = "test-util")]
pub use manual::ManualClock;

#[cfg(feature = "test-util")]
mod manual {
    use super::Clock;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::{Duration, Instant, SystemTime};

    /// A clock that moves only when told to; clones share one time.
    ///
    /// Both readings advance together: [`advance`](Self::advance) moves the
    /// wall clock and the monotonic clock by the same amount, and
    /// [`set_wall`](Self::set_wall) jumps the wall clock alone, as an NTP
    /// step would.
    ///
    /// ```
    /// use lease_port::{Clock, ManualClock};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let t0 = clock.now();
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(clock.now(), t0 + Duration::from_secs(5));
    /// ```
    #[derive(Debug, Clone)]
    pub struct ManualClock {
        inner: Arc<Mutex<State>>,
    }

    #[derive(Debug)]
    struct State {
        wall: SystemTime,
        mono: Instant,
    }

    impl ManualClock {
        /// A clock standing at a fixed, recent wall time (2026-01-01T00:00:00Z).
        pub fn new() -> Self {
            Self::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
        }

        /// A clock standing at `wall`.
        pub fn starting_at(wall: SystemTime) -> Self {
            Self {
                inner: Arc::new(Mutex::new(State {
                    wall,
                    mono: Instant::now(),
                })),
            }
        }

        /// Moves both clocks forward by `by`.
        pub fn advance(&self, by: Duration) {
            let mut s = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            s.wall += by;
            s.mono += by;
        }

        /// Sets the wall clock to `wall` (forwards or backwards); the
        /// monotonic clock does not move.
        pub fn set_wall(&self, wall: SystemTime) {
            self.inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .wall = wall;
        }
    }

    impl Default for ManualClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> SystemTime {
            self.inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .wall
        }

        fn instant(&self) -> Instant {
            self.inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .mono
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn clones_share_time_and_wall_jumps_leave_monotonic_alone() {
            let a = ManualClock::new();
            let b = a.clone();
            let (w0, m0) = (a.now(), a.instant());
            b.advance(Duration::from_millis(1500));
            assert_eq!(a.now(), w0 + Duration::from_millis(1500));
            assert_eq!(a.instant(), m0 + Duration::from_millis(1500));
            a.set_wall(w0 - Duration::from_secs(3600));
            assert_eq!(b.now(), w0 - Duration::from_secs(3600));
            assert_eq!(b.instant(), m0 + Duration::from_millis(1500));
        }
    }
}

#[cfg(test)]
mod monotonic_wall_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn it_starts_at_its_anchor_and_moves_with_the_monotonic_clock() {
        let anchor = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = MonotonicWallClock::anchored_at(anchor);
        let first = clock.now();
        assert!(first >= anchor);
        std::thread::sleep(Duration::from_millis(5));
        let second = clock.now();
        assert!(second > first, "it advances");
        // Nothing but the monotonic clock moves it: far from the system
        // clock, it stays where its anchor put it.
        assert!(second < anchor + Duration::from_secs(3600));
    }
}
