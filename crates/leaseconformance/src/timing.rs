//! The suite's own scheduling delay, measured, so real-time runs on a loaded
//! machine neither flake nor get looser checks.
//!
//! A real-time case plans its time: it sleeps fixed fractions of the TTL and
//! relies on each step landing within a margin of its plan (the narrowest is
//! 0.4 TTL: a lease renewed at ½ TTL must still be live ⅗ TTL later). Time
//! the case spends beyond its planned sleeps — backend calls, a descheduled
//! worker, a stalled machine — eats that margin. The meter counts it; when a
//! case fails after its unplanned time reached [`STALL_FRACTION`] of the TTL,
//! the failure proves nothing about the backend (a step may have run after
//! the instant its assertion assumed) and the case runs again, up to
//! [`ATTEMPTS`] times. A case that passes once passes; a case that fails
//! without a stall fails at once; a case that only ever fails stalled fails
//! too, saying so. Nothing is checked less strictly.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{LeaseFactory, TimeControl};

/// Unplanned time, as a fraction of the TTL, past which a failure is
/// inconclusive: below the narrowest margin in any case's time plan (0.4).
pub const STALL_FRACTION: f64 = 0.3;

/// How many times a case runs before inconclusive failures count.
pub const ATTEMPTS: usize = 5;

#[derive(Debug, Default)]
struct Window {
    /// Real-time TTL of the backend under test; `None` until the case
    /// starts, or when time is manual (a manual clock cannot be late).
    ttl: Option<Duration>,
    start: Option<Instant>,
    planned: Duration,
}

/// What one attempt of a case measured.
#[derive(Debug, Default, Clone)]
pub struct Meter(Arc<Mutex<Window>>);

tokio::task_local! {
    static METER: Meter;
}

impl Meter {
    fn with<R>(&self, f: impl FnOnce(&mut Window) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The case starts now, against `f`'s backend.
    pub fn start<F: LeaseFactory>(&self, f: &F) {
        let ttl = (f.capabilities().time == TimeControl::Real).then(|| f.ttl());
        self.with(|w| {
            *w = Window {
                ttl,
                start: Some(Instant::now()),
                planned: Duration::ZERO,
            }
        });
    }

    /// Unplanned time so far, when the backend is on real time.
    fn unplanned(&self) -> Option<(Duration, Duration)> {
        self.with(|w| {
            let (ttl, start) = (w.ttl?, w.start?);
            Some((start.elapsed().saturating_sub(w.planned), ttl))
        })
    }

    /// True when the current window's unplanned time reached the stall
    /// threshold.
    pub fn overrun(&self) -> bool {
        self.unplanned()
            .is_some_and(|(late, ttl)| late.as_secs_f64() >= ttl.as_secs_f64() * STALL_FRACTION)
    }

    fn describe(&self) -> String {
        match self.unplanned() {
            Some((late, ttl)) => format!("{late:?} of unplanned time with a TTL of {ttl:?}"),
            None => "no real-time window".into(),
        }
    }
}

/// Runs `case` with `meter` as the current task's meter.
pub async fn scoped<T>(meter: Meter, case: impl std::future::Future<Output = T>) -> T {
    METER.scope(meter, case).await
}

/// Lets `by` pass through the factory, counting it as planned.
pub(crate) async fn advance<F: LeaseFactory>(f: &F, by: Duration) {
    let _ = METER.try_with(|m| m.with(|w| w.planned += by));
    f.advance(by).await;
}

/// Starts a new window: what came before no longer counts (each model-check
/// sequence has its own time plan).
pub(crate) fn restart_window() {
    let _ = METER.try_with(|m| {
        m.with(|w| {
            w.start = Some(Instant::now());
            w.planned = Duration::ZERO;
        })
    });
}

/// Whether the current task's window has overrun.
pub(crate) fn overrun() -> bool {
    METER.try_with(Meter::overrun).unwrap_or(false)
}

/// Why a case failed, after [`try_case`]'s retries.
#[derive(Debug)]
pub enum CaseFailure {
    /// The case panicked without a stall: the backend broke a rule.
    Panicked(Box<dyn std::any::Any + Send>),
    /// The case could not finish (its task was cancelled).
    Aborted(String),
    /// Every attempt failed while stalled.
    Inconclusive(String),
}

impl CaseFailure {
    /// The failure as text.
    pub fn message(&self) -> String {
        match self {
            CaseFailure::Panicked(payload) => payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "non-text panic".to_owned()),
            CaseFailure::Aborted(m) | CaseFailure::Inconclusive(m) => m.clone(),
        }
    }
}

/// Runs `attempt` (a case on a fresh factory, given its meter) until it
/// passes; retries only failures the meter marks inconclusive.
pub async fn try_case<Fut>(name: &str, attempt: impl Fn(Meter) -> Fut) -> Result<(), CaseFailure>
where
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut stalled = Vec::new();
    for n in 1..=ATTEMPTS {
        let meter = Meter::default();
        let failure = match tokio::spawn(attempt(meter.clone())).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let failure = match failure.try_into_panic() {
            Ok(payload) => CaseFailure::Panicked(payload),
            Err(e) => return Err(CaseFailure::Aborted(format!("{name}: {e}"))),
        };
        if !meter.overrun() {
            return Err(failure);
        }
        let note = format!(
            "attempt {n}: failed after {} — {}",
            meter.describe(),
            failure.message()
        );
        eprintln!("{name}: inconclusive, running again. {note}");
        stalled.push(note);
    }
    Err(CaseFailure::Inconclusive(format!(
        "{name}: every attempt failed while the machine stalled past the case's timing margin, \
         so the backend was never checked:\n{}",
        stalled.join("\n")
    )))
}

/// [`try_case`] for a test: a failure panics, with the case's own panic
/// when there was one.
pub async fn run_case<Fut>(name: &str, attempt: impl Fn(Meter) -> Fut)
where
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    match try_case(name, attempt).await {
        Ok(()) => {}
        Err(CaseFailure::Panicked(payload)) => std::panic::resume_unwind(payload),
        Err(other) => panic!("{}", other.message()),
    }
}
