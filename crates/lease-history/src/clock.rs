//! A wall clock that a fault injector can step forward and back.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use lease_port::Clock;

use crate::history::{FaultKind, Recorder};

/// The system's wall clock plus an offset that [`step`](Self::step) moves:
/// give it to an in-process lease authority (a `MemLease`, a lease server's
/// backend) to exercise wall-clock jumps while time still flows, so leases
/// expire on their own as well. Clones share the offset.
///
/// [`instant`](Clock::instant) stays the host's monotonic clock: steps move
/// only wall-clock time, as they do on a real host.
#[derive(Debug, Clone, Default)]
pub struct SteppedClock {
    offset_nanos: Arc<AtomicI64>,
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

    /// How far the clock is from the system's, signed, in nanoseconds.
    pub fn offset_nanos(&self) -> i64 {
        self.offset_nanos.load(Ordering::SeqCst)
    }
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
        let by = rng.between(self.max_step / 8, self.max_step);
        let forward = rng.below(2) == 0;
        self.clock.step(forward, by, recorder, &self.target);
        Ok(())
    }
}
