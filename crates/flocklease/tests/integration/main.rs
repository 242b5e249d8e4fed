//! flocklease's integration tests that run as threads of one process, each
//! on temporary directories of its own: the file system around the backend
//! (`files`); `current` reads (`current`); `acquire_above` floors
//! (`acquire_above`); durable token reservations (`reservations`); expiry
//! on the monotonic clock (`clock`).
//!
//! Two binaries stand beside it: `tests/conformance.rs`, the behaviour
//! suite, which `cargo xtask conformance` runs by target name; and
//! `tests/holder_processes.rs`, competing OS processes, which re-executes
//! itself as the holders and so has a `main` of its own.

mod acquire_above;
mod clock;
mod current;
mod files;
mod reservations;
