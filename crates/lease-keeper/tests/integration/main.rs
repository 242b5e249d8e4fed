//! The keeper's integration tests, one binary: the lifecycle rules
//! (`lifecycle`) and batch renewal (`batch_renewal`), each against memlease
//! with the backend's wall time on a `ManualClock` and the keeper's
//! monotonic time on tokio's paused clock. Every test has a runtime and
//! clocks of its own and nothing else is process-wide, so they run as
//! threads of one process.

mod batch_renewal;
mod fenced_writes;
mod in_process_lock;
mod lifecycle;
