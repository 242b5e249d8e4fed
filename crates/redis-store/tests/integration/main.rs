//! The Redis store's integration tests, one binary, against real
//! `redis-server`s each test starts for itself: the store contract's
//! suite, `storeconformance`, which every store runs — fencing, unfenced
//! writes, authority binding, paging, racing "processes" (store instances
//! with their own connections), waiting for appends, bad input
//! (`store_conformance`); and what is the Redis store's own: its leases,
//! prefixes and options, and what survives a restart, a crash, a flush or
//! an older snapshot (`store`); waiting through subscriptions
//! (`wait_for_append`); marks lost in a wipe under an outside authority
//! (`wipe_rebind`). They share no process-wide state, so they run as
//! threads of one process.
//!
//! The lease contract is `tests/conformance.rs`, a binary of its own:
//! `cargo xtask conformance` runs it by target name.

mod store;
mod store_conformance;
mod wait_for_append;
mod wipe_rebind;
