//! The `lease-sim` binary's clock for the real-time reads of the code
//! under simulation (a module of the binary, not of the library).
//!
//! Simulated code keeps its time on the simulation's clocks, but some of
//! the libraries it runs on read the machine's clocks themselves: h2
//! forgets the streams it reset (a call given up on) after a second, on
//! either side of a connection; hyper dates its answers; tokio times its
//! own metrics. Whether a late frame met a remembered stream (ignored) or
//! a forgotten one (answered with a reset, which is traffic and moves
//! every later step) then depended on how fast the machine ran the
//! simulation, and a seed's run diverged on a loaded machine.
//!
//! Once [`enable`]d, the wall and monotonic clocks of this process
//! (`CLOCK_REALTIME`, `CLOCK_MONOTONIC` and their coarse, raw and boot-time
//! kinds, which is what std's `SystemTime` and `Instant` read) answer from
//! the simulation's time instead: the elapsed time the step loop last
//! gave ([`at_simulated`], through `Config::on_step`), from fixed starts,
//! and one nanosecond more for each read within a step, so that readings
//! never repeat or go back. The reads come in an order the seed decides,
//! so what they answer does too, and a library's second is a simulated
//! second, as it would be on a real machine.
//!
//! The monotonic start is one second. A thread waiting for a deadline
//! taken from it (a futex or condition-variable wait, which the kernel
//! times on its real clock) finds it passed and returns at once, as long
//! as the machine has been up longer than the run has simulated; no such
//! wait happens in a run today (it is one thread, which parks only with a
//! zero timeout). Other clocks (CPU time, `CLOCK_TAI`, alarms) and reads
//! that bypass `clock_gettime` (`gettimeofday`, `time`, raw syscalls)
//! stay real; nothing in a run uses them today.
//!
//! Only the child that runs one seed (`--one`) enables it; the runner that
//! starts the children and reports throughput keeps the real clocks, and
//! so does this process until [`enable`].

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

/// `clock_gettime(2)`'s C signature.
type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> i32;

/// Set once, before the simulation starts, by the process that runs it.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Simulated nanoseconds at the step under way.
static STEP_NANOS: AtomicU64 = AtomicU64::new(0);

/// Simulated nanoseconds of the last reading answered.
static LAST_NANOS: AtomicU64 = AtomicU64::new(0);

/// The `clock_gettime` underneath, found by [`enable`] or the first read.
static NEXT: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Where the wall clock starts: 2026-01-01T00:00:00Z, the simulation's
/// own epoch.
const WALL_START_SECS: u64 = 1_767_225_600;

/// Where the monotonic clocks start.
const MONOTONIC_START_SECS: u64 = 1;

/// From now on, this process's wall and monotonic clocks answer from the
/// simulation's time.
pub(crate) fn enable() {
    next_clock_gettime();
    ENABLED.store(true, Ordering::SeqCst);
}

/// The step loop's report of the simulation's elapsed time
/// (`Config::on_step`).
pub(crate) fn at_simulated(elapsed: Duration) {
    let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    STEP_NANOS.fetch_max(nanos, Ordering::SeqCst);
}

/// The monotonic time of the clock underneath, whatever [`enable`] did:
/// to report how long a run took.
pub(crate) fn real_monotonic() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: `now` is a valid, writable timespec for the call to fill.
    let done = unsafe { real_clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if done != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The next reading, in simulated nanoseconds: the step's time, or one
/// nanosecond past the last reading if that is later.
fn next_reading() -> u64 {
    let step = STEP_NANOS.load(Ordering::SeqCst);
    let mut last = LAST_NANOS.load(Ordering::SeqCst);
    loop {
        let next = step.max(last.saturating_add(1));
        match LAST_NANOS.compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// `clock_gettime(2)` for this process: std's `Instant::now` and
/// `SystemTime::now`, and every library's, come here.
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
        Some(start) if ENABLED.load(Ordering::SeqCst) && !tp.is_null() => {
            let nanos = next_reading();
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
/// (such as libfaketime); null if there is none.
fn next_clock_gettime() -> *mut libc::c_void {
    let mut next = NEXT.load(Ordering::Acquire);
    if next.is_null() {
        #[allow(unsafe_code)]
        // SAFETY: dlsym(3) with RTLD_NEXT and a NUL-terminated name only
        // looks the name up (reading no clock); two threads doing so at
        // once find the same.
        let found = unsafe { libc::dlsym(libc::RTLD_NEXT, c"clock_gettime".as_ptr()) };
        next = found;
        NEXT.store(next, Ordering::Release);
    }
    next
}

/// The clock underneath this process's: see [`next_clock_gettime`]; the
/// kernel's directly if there is none.
///
/// # Safety
///
/// As `clock_gettime(2)`: `tp` is null or valid for writing a `timespec`.
#[allow(unsafe_code)]
unsafe fn real_clock_gettime(clock: libc::clockid_t, tp: *mut libc::timespec) -> i32 {
    let next = next_clock_gettime();
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
