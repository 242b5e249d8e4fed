//! grpcdriver's integration tests, one binary, each against real tonic
//! servers on loopback ports of its own (`support`): credentials (`auth`);
//! who may act for which owners (`identity`); servers lacking the
//! optional methods (`fallback`); network faults
//! through a TCP proxy (`faults`); token floors and rewound state
//! (`floor`); limits, identity and authority (`hardening`); bad input on
//! the wire (`limits`); grant times counted from the send (`sending`).
//! They share no process-wide state, so they run as threads of one
//! process.
//!
//! The behaviour suite is `tests/conformance.rs`, a binary of its own:
//! `cargo xtask conformance` runs each backend's `conformance*` targets by
//! name.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod fallback;
mod faults;
mod floor;
mod hardening;
mod identity;
mod limits;
mod sending;
