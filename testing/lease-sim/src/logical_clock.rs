//! The `lease-sim` binary's clock for the real-time reads of the code
//! under simulation (a module of the binary, not of the library).
//!
//! Simulated code keeps its time on the simulation's clocks, but some of
//! the libraries it runs on read the machine's clocks themselves: h2 times
//! out the streams it reset (a call given up on) after a second of real
//! time, on either side of a connection; hyper dates its answers; tokio
//! times its own metrics. Whether a late frame met a remembered stream
//! (ignored) or a forgotten one (answered with a reset, which is traffic
//! and moves every later step) then depended on how fast the machine ran
//! the simulation, and a seed's run diverged on a loaded machine.
//!
//! Once [`enable`]d, every read of the wall or monotonic clock in this
//! process answers from a counter instead: each read is one microsecond
//! after the one before, from a fixed start. The reads come in an order the
//! seed decides, so what they answer does too. The counter starts near
//! zero, so a thread that waits for a deadline taken from it (a futex
//! wait, which the kernel times on the real clock) finds that deadline
//! passed and returns at once rather than sleeping: nothing in a simulated
//! run waits for real time.
//!
//! Only the child that runs one seed (`--one`) enables it; the runner that
//! starts the children and reports throughput keeps the real clocks.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

/// `clock_gettime(2)`'s C signature.
type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> i32;

/// Set once, before the simulation starts, by the process that runs it.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Reads answered from the counter so far.
static READS: AtomicU64 = AtomicU64::new(0);

/// How far each read moves the counter.
const STEP_NANOS: u64 = 1_000;

/// Where the wall clock's counter starts: 2026-01-01T00:00:00Z, the
/// simulation's own epoch.
const WALL_START_SECS: u64 = 1_767_225_600;

/// Where the monotonic clocks' counter starts: one second, ahead of no
/// real deadline.
const MONOTONIC_START_SECS: u64 = 1;

/// From now on, this process's clock reads answer from the counter.
pub(crate) fn enable() {
    ENABLED.store(true, Ordering::SeqCst);
}

/// The monotonic time of the clock underneath, whatever [`enable`] did:
/// to report how long a run took.
pub(crate) fn real_monotonic() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: `now` is a valid, writable timespec for the kernel to fill.
    let done = unsafe { real_clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if done != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// `clock_gettime(2)` for this process: std's `Instant::now` and
/// `SystemTime::now`, and every library's, come here. Clocks other than the
/// wall and monotonic ones (CPU time) are always the kernel's.
///
/// # Safety
///
/// As `clock_gettime(2)`: `tp` is null or valid for writing a `timespec`.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn clock_gettime(
    clock: libc::clockid_t,
    tp: *mut libc::timespec,
) -> i32 {
    let start = match clock {
        libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE => Some(WALL_START_SECS),
        libc::CLOCK_MONOTONIC
        | libc::CLOCK_MONOTONIC_RAW
        | libc::CLOCK_MONOTONIC_COARSE
        | libc::CLOCK_BOOTTIME => Some(MONOTONIC_START_SECS),
        _ => None,
    };
    match start {
        Some(start) if ENABLED.load(Ordering::Relaxed) && !tp.is_null() => {
            let nanos = (READS.fetch_add(1, Ordering::Relaxed) + 1) * STEP_NANOS;
            let now = libc::timespec {
                tv_sec: (start + nanos / 1_000_000_000) as libc::time_t,
                tv_nsec: (nanos % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: the caller passed a non-null `tp` valid for writing,
            // as clock_gettime(2) requires.
            unsafe { tp.write(now) };
            0
        }
        // SAFETY: the caller's arguments, as it gave them, to the call
        // they were meant for.
        _ => unsafe { real_clock_gettime(clock, tp) },
    }
}

/// The `clock_gettime` this process would call without the definition
/// above: the C library's, or that of a library preloaded in front of it
/// (such as libfaketime), so that the clocks stay theirs until [`enable`].
/// The kernel's directly if there is none.
///
/// # Safety
///
/// As `clock_gettime(2)`: `tp` is null or valid for writing a `timespec`.
#[allow(unsafe_code)]
unsafe fn real_clock_gettime(clock: libc::clockid_t, tp: *mut libc::timespec) -> i32 {
    static NEXT: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut next = NEXT.load(Ordering::Acquire);
    if next.is_null() {
        // SAFETY: dlsym(3) with RTLD_NEXT and a NUL-terminated name only
        // looks the name up; two threads doing so at once find the same.
        next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"clock_gettime".as_ptr()) };
        NEXT.store(next, Ordering::Release);
    }
    if next.is_null() {
        // SAFETY: clock_gettime(2) reads `clock` and writes at most one
        // timespec through `tp`, which the caller vouches for; on failure
        // it returns -1 and sets errno, as the caller expects.
        return unsafe { libc::syscall(libc::SYS_clock_gettime, clock, tp) as i32 };
    }
    // SAFETY: the symbol found is the C library's `clock_gettime` (or an
    // interposer's with the same signature), so it has this type.
    let next = unsafe { std::mem::transmute::<*mut libc::c_void, ClockGettime>(next) };
    // SAFETY: the caller's arguments, which it vouches for, to the
    // function they were meant for.
    unsafe { next(clock, tp) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_count_on_once_enabled_and_stay_real_before() {
        let real = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(real.elapsed() >= Duration::from_millis(5));

        enable();
        let a = std::time::Instant::now();
        let b = std::time::Instant::now();
        assert_eq!(b - a, Duration::from_micros(1));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(std::time::Instant::now() - b, Duration::from_micros(1));
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        assert!(wall >= Duration::from_secs(WALL_START_SECS));
        assert!(wall < Duration::from_secs(WALL_START_SECS + 1));
        // The real clock still moves underneath.
        let r0 = real_monotonic();
        std::thread::sleep(Duration::from_millis(5));
        assert!(real_monotonic() - r0 >= Duration::from_millis(5));
    }
}
