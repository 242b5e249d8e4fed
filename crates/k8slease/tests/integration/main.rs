//! k8slease's integration tests, one binary, each against a Kubernetes API
//! emulator of its own (`support`): expiry judged under clock skew
//! (`clock_skew`); a thousand sessions at once over a bounded number of
//! connections (`connections`); fifty clients contending for one session
//! (`contention`); lost replies, server faults, outside edits and missing
//! RBAC verbs (`faults`); token floors (`floor`); API requests per
//! operation (`requests`); Lease storage that went back (`rewind`); many
//! sessions on one owner lease (`scale`) and the watch that proves them
//! (`watch`). They
//! share no process-wide state, so they run as threads of one process.
//!
//! The behaviour suite is `tests/conformance.rs`, a binary of its own:
//! `cargo xtask conformance` runs it by target name, against a real
//! cluster too (the kubeconfig named in its environment).

#[path = "../support/mod.rs"]
mod support;

mod clock_skew;
mod connections;
mod contention;
mod faults;
mod floor;
mod requests;
mod rewind;
mod scale;
mod watch;
