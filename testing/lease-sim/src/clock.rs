//! Simulated time and randomness for the real code: wall clocks read from
//! the simulation's own time, which the fault schedule steps and speeds up
//! or slows down, and random numbers drawn from the run's seed.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use lease_port::Clock;

/// The wall time every simulation starts at (2026-01-01T00:00:00Z): fixed,
/// so a seed replays the same expiries.
const EPOCH: Duration = Duration::from_secs(1_767_225_600);

/// A host's clock. Wall time is the simulation's elapsed time, read from
/// the simulation itself so that every host and the fault schedule agree
/// on it, moved by the steps and rate spells the schedule gives this
/// host. Monotonic time is the simulation's elapsed time too, after one
/// base instant taken when the clock is made: not tokio's, whose paused
/// clock starts from the real instant each host's runtime was built, so
/// that a host restarted (a new runtime) would read instants that differ
/// from the old ones by however long the restart took in real time.
/// Clones share one clock.
#[derive(Debug, Clone)]
pub struct SimClock {
    state: Arc<Mutex<State>>,
    base: Instant,
}

#[derive(Debug)]
struct State {
    /// Simulated time of the last step or change of rate, and the wall
    /// reading then.
    anchor_sim: Duration,
    anchor_wall: Duration,
    /// Wall time per simulated second, in thousandths.
    rate_per_mille: u64,
    /// The simulated time the fault schedule last told this clock: a
    /// reading outside any host (the schedule's own) uses it.
    driver_sim: Duration,
    rng: u64,
}

impl SimClock {
    /// A clock at 2026-01-01T00:00:00Z running at the simulation's rate, drawing its
    /// random numbers from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                anchor_sim: Duration::ZERO,
                anchor_wall: EPOCH,
                rate_per_mille: 1000,
                driver_sim: Duration::ZERO,
                rng: seed,
            })),
            base: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the wall clock by `by` (backwards when `forward` is false), at
    /// simulated time `at`, as an NTP step or an operator would.
    pub fn step(&self, at: Duration, forward: bool, by: Duration) {
        let mut s = self.lock();
        s.reanchor(at);
        s.anchor_wall = if forward {
            s.anchor_wall + by
        } else {
            s.anchor_wall.saturating_sub(by)
        };
    }

    /// From simulated time `at` on, the wall clock runs at `per_mille`
    /// thousandths of the simulation's rate.
    pub fn set_rate(&self, at: Duration, per_mille: u64) {
        let mut s = self.lock();
        s.reanchor(at);
        s.rate_per_mille = per_mille;
    }

    fn wall_at(&self, sim: Duration) -> Duration {
        let s = self.lock();
        s.wall_at(sim)
    }
}

impl State {
    fn wall_at(&self, sim: Duration) -> Duration {
        let since = sim.saturating_sub(self.anchor_sim);
        self.anchor_wall + since * self.rate_per_mille as u32 / 1000
    }

    fn reanchor(&mut self, at: Duration) {
        self.driver_sim = self.driver_sim.max(at);
        self.anchor_wall = self.wall_at(at);
        self.anchor_sim = at;
    }
}

/// The simulation's elapsed time as seen from where the caller runs: a
/// host's, or, outside every host, the last time the schedule gave.
fn sim_now(clock: &SimClock) -> Duration {
    turmoil::sim_elapsed().unwrap_or_else(|| clock.lock().driver_sim)
}

impl Clock for SimClock {
    fn now(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + self.wall_at(sim_now(self))
    }

    fn instant(&self) -> Instant {
        self.base + sim_now(self)
    }

    fn random(&self) -> u64 {
        let mut s = self.lock();
        s.rng = s.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(s.rng)
    }
}

/// A splitmix64 finaliser: consecutive seeds give unrelated numbers.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded random source for the simulation's own choices (the workload,
/// the fault schedule).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A source drawing from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(mix(seed ^ 0x5eed))
    }

    /// The next number.
    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.draw() % n.max(1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// A duration in `[lo, hi)`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_micros() as u64;
        lo + Duration::from_micros(self.below(span.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_rates_move_only_the_wall_clock_from_their_instant() {
        let c = SimClock::new(1);
        let s = Duration::from_secs;
        assert_eq!(c.wall_at(s(10)), EPOCH + s(10));
        c.set_rate(s(10), 1500);
        assert_eq!(c.wall_at(s(20)), EPOCH + s(25));
        c.step(s(20), true, s(5));
        assert_eq!(c.wall_at(s(20)), EPOCH + s(30));
        c.set_rate(s(20), 1000);
        c.step(s(22), false, s(100));
        assert_eq!(c.wall_at(s(22)), EPOCH + s(32) - s(100));
    }

    #[test]
    fn one_seed_draws_one_sequence() {
        let (a, b) = (SimClock::new(7), SimClock::new(7));
        let xs: Vec<u64> = (0..4).map(|_| a.random()).collect();
        let ys: Vec<u64> = (0..4).map(|_| b.random()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs[0], xs[1]);
        assert_ne!(SimClock::new(8).random(), xs[0]);
    }
}
