//! memlease against the behaviour suite, one binary: on a manual clock
//! with the default shards and with one (`conformance`), and on the system
//! clock, where expiry is reached by sleeping past a short TTL
//! (`conformance_realtime`). Every case builds its own backend, so they
//! run as threads of one process. The target is named `conformance`, so
//! `cargo xtask conformance` (which runs each backend's `conformance*`
//! targets) runs all of it.

mod conformance;
mod conformance_realtime;
