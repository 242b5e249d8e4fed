//! A wall clock that a fault injector can step forward and back.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use lease_port::Clock;

use crate::history::{FaultKind, Recorder};

/// The system's wall clock plus an offset that [`step`](Self::step) moves:
/// give it to an in-process lease authority (a `MemLease`, a lease server's
/// backend) to exercise wall-clock jumps while time still flows, so leases
/// expire on their own as well. Clones share the offset.
///
/// [`instant`](Clock::instant) stays the host's monotonic clock: steps move
/// only wall-clock time, as they do on a real host.
///
/// It can also run fast or slow for a while ([`run_at`](Self::run_at)):
/// leases granted meanwhile last less or more real time than their TTL.
#[derive(Debug, Clone, Default)]
pub struct SteppedClock {
    offset_nanos: Arc<AtomicI64>,
    /// Since when, on the monotonic clock, it runs at how many thousandths
    /// of real time; `None` at the normal rate.
    rate: Arc<Mutex<Option<(Instant, u32)>>>,
}

impl SteppedClock {
    /// A clock reading the system's time.
    pub fn new() -> Self {
        Self::default()
    }

    /// Steps the clock by `by`, forward when `forward`, recording the step
    /// as a fault of `target` in `recorder`.
    pub fn step(&self, forward: bool, by: Duration, recorder: &Recorder, target: &str) {
        let kind = if forward {
            FaultKind::ClockForward(by)
        } else {
            FaultKind::ClockBackward(by)
        };
        let fault = recorder.fault(kind, target);
        let nanos = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        let delta = if forward { nanos } else { -nanos };
        self.offset_nanos.fetch_add(delta, Ordering::SeqCst);
        recorder.heal(fault);
    }

    /// Runs the clock at `per_mille` thousandths of real time for `lasting`,
    /// then at the normal rate again, recording it as a fault of `target`.
    /// What it gained or lost meanwhile stays.
    pub async fn run_at(
        &self,
        per_mille: u32,
        lasting: Duration,
        recorder: &Recorder,
        target: &str,
    ) {
        // The fault's record must cover no less of a fast spell and no more
        // of a slow one than really happened, so that no hold the checker
        // derives from it is longer than the backend's.
        let fast = per_mille >= 1000;
        let fault = fast.then(|| recorder.fault(FaultKind::ClockRate(per_mille), target));
        *self.rate_lock() = Some((Instant::now(), per_mille));
        let fault =
            fault.unwrap_or_else(|| recorder.fault(FaultKind::ClockRate(per_mille), target));
        tokio::time::sleep(lasting).await;
        if !fast {
            recorder.heal(fault);
            self.restore_rate();
        } else {
            self.restore_rate();
            recorder.heal(fault);
        }
    }

    fn rate_lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, u32)>> {
        self.rate.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Back to the normal rate, keeping what the spell gained or lost.
    fn restore_rate(&self) {
        let mut rate = self.rate_lock();
        let drift = drift_nanos(*rate);
        // Folded in while the lock is held: a reading in between would see
        // the drift twice or not at all.
        self.offset_nanos.fetch_add(drift, Ordering::SeqCst);
        *rate = None;
    }

    /// How far the clock is from the system's, signed, in nanoseconds.
    pub fn offset_nanos(&self) -> i64 {
        let rate = self.rate_lock();
        self.offset_nanos.load(Ordering::SeqCst) + drift_nanos(*rate)
    }
}

/// What a spell at another rate has gained (positive) or lost so far.
fn drift_nanos(rate: Option<(Instant, u32)>) -> i64 {
    let Some((since, per_mille)) = rate else {
        return 0;
    };
    let elapsed = i128::try_from(since.elapsed().as_nanos()).unwrap_or(i128::MAX / 2000);
    let drift = elapsed * (i128::from(per_mille) - 1000) / 1000;
    i64::try_from(drift).unwrap_or(if drift > 0 { i64::MAX } else { i64::MIN })
}

impl Clock for SteppedClock {
    fn now(&self) -> SystemTime {
        let now = SystemTime::now();
        let offset = self.offset_nanos();
        let by = Duration::from_nanos(offset.unsigned_abs());
        if offset >= 0 {
            now + by
        } else {
            now.checked_sub(by).unwrap_or(SystemTime::UNIX_EPOCH)
        }
    }
}

/// Steps a [`SteppedClock`] forward or back by a random amount up to
/// `max_step`, one step per injected fault.
#[derive(Debug, Clone)]
pub struct ClockStepper {
    clock: SteppedClock,
    max_step: Duration,
    target: String,
}

impl ClockStepper {
    /// Steps `clock`, which belongs to `target` (named in the history), by
    /// up to `max_step` each time.
    pub fn new(clock: SteppedClock, max_step: Duration, target: impl Into<String>) -> Self {
        ClockStepper {
            clock,
            max_step,
            target: target.into(),
        }
    }
}

#[async_trait::async_trait]
impl crate::FaultInjector for ClockStepper {
    async fn inject(&mut self, rng: &mut crate::Rng, recorder: &Recorder) -> Result<(), String> {
        // A third of the faults are spells at another rate: from half to
        // twice real time, for one to four steps' worth of time.
        if rng.below(3) == 0 {
            let per_mille = if rng.below(2) == 0 {
                500 + rng.below(450) as u32
            } else {
                1050 + rng.below(951) as u32
            };
            let lasting = rng.between(self.max_step, self.max_step * 4);
            self.clock
                .run_at(per_mille, lasting, recorder, &self.target)
                .await;
            return Ok(());
        }
        let by = rng.between(self.max_step / 8, self.max_step);
        let forward = rng.below(2) == 0;
        self.clock.step(forward, by, recorder, &self.target);
        Ok(())
    }
}
