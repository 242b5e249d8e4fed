//! The Redis store's integration tests, one binary, against real
//! `redis-server`s each test starts for itself: the fencing rules, paging,
//! racing "processes" (store instances with their own connections) and
//! what survives a restart or a crash (`store`); waiting for appends
//! (`wait_for_append`); marks lost in a wipe under an outside authority
//! (`wipe_rebind`). They share no process-wide state, so they run as
//! threads of one process.
//!
//! The lease contract is `tests/conformance.rs`, a binary of its own:
//! `cargo xtask conformance` runs it by target name.

mod store;
mod wait_for_append;
mod wipe_rebind;
