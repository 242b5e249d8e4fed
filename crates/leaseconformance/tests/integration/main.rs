//! The suite's own integration tests, one binary: it catches plausibly
//! broken backends (`broken_backends`), and its real-time cases tell a
//! stall past their timing margin from a failure (`scheduling_delay`).
//! They share no process-wide state, so they run as threads of one
//! process.

mod broken_backends;
mod scheduling_delay;
