//! How a backend plugs into the suite.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::SessionLease;

/// How time moves for a backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeControl {
    /// The backend reads an injected clock that [`LeaseFactory::advance`]
    /// moves instantly (for example `lease_port::ManualClock`).
    Manual,
    /// The backend runs on real time; [`LeaseFactory::advance`] sleeps. Use a
    /// short TTL (about a second): the expiry cases sleep past it, and the
    /// cases that must finish within one TTL take a few milliseconds.
    Real,
}

/// What the backend under test can do, so each case asks only what applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// How time moves.
    pub time: TimeControl,
    /// Whether [`LeaseFactory::restart`] restarts the backend's process or
    /// service while keeping its durable state.
    pub restart: bool,
}

/// Hands out clients of one backend that all share one store.
///
/// The suite builds a fresh factory for every case, so a factory owns its
/// store (a temporary directory, a namespace, a service it started) and
/// cleans it up when dropped. Every [`client`](Self::client) must coordinate
/// with every other: contention and takeover are tested across clients, as
/// separate processes would see them.
#[async_trait]
pub trait LeaseFactory: Send + Sync + 'static {
    /// The backend type under test.
    type Lease: SessionLease + 'static;

    /// A new, independent client on the shared store — in a real deployment,
    /// one per process.
    async fn client(&self) -> Self::Lease;

    /// The TTL every client grants.
    fn ttl(&self) -> Duration;

    /// What this backend supports.
    fn capabilities(&self) -> Capabilities;

    /// The backend's current wall-clock time, against which the suite checks
    /// the expiries it is handed. Factories with [`TimeControl::Manual`] must
    /// return their injected clock's reading.
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    /// Lets `by` pass for every client: moves the injected clock, or sleeps.
    async fn advance(&self, by: Duration);

    /// Restarts the backend, keeping its durable state; clients made before
    /// may stop working, and the suite makes new ones. Called only when
    /// [`Capabilities::restart`] is true.
    async fn restart(&self) {
        panic!("restart called on a backend that does not declare Capabilities::restart")
    }
}
