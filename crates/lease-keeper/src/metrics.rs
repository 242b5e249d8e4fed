//! Hooks a server wires to its metrics system.

use std::fmt::Debug;
use std::time::Duration;

use lease_port::SessionId;
#[cfg(doc)]
use lease_port::SessionLease;

use crate::{KeeperErrorKind, LossReason};

/// How one renewal call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RenewOutcome {
    /// The backend extended the lease.
    Renewed,
    /// A passing fault; the keeper retries until the lease's expiry.
    Transient,
    /// The backend answered `Held`: ownership is lost.
    Held,
    /// The call did not answer before the lease's expiry, or answered with
    /// an error that is neither `Held` nor `Transient`.
    Failed,
}

/// Metrics hooks. Every method has an empty default body, so an
/// implementation overrides only what it records. Called inline on the
/// keeper's tasks: keep them cheap and non-blocking.
pub trait KeeperMetrics: Send + Sync + Debug {
    /// The number of leases this keeper currently holds (a gauge): raised
    /// by every acquisition, lowered by every release or loss.
    fn held_leases(&self, count: usize) {
        let _ = count;
    }

    /// A lease was acquired for `session`.
    fn acquired(&self, session: &SessionId) {
        let _ = session;
    }

    /// An acquisition failed with `kind`.
    fn acquire_failed(&self, session: &SessionId, kind: KeeperErrorKind) {
        let _ = (session, kind);
    }

    /// Ownership of `session` was lost (the guard's loss signal fired).
    fn lost(&self, session: &SessionId, reason: &LossReason) {
        let _ = (session, reason);
    }

    /// One renewal call took `latency` and ended with `outcome`.
    fn renew_latency(&self, latency: Duration, outcome: RenewOutcome) {
        let _ = (latency, outcome);
    }

    /// One batch renewal call ([`SessionLease::renew_many`]) was sent for
    /// `size` leases; only for a backend that renews in batches. Each
    /// lease's outcome is still reported through
    /// [`renew_latency`](Self::renew_latency), with the batch's latency.
    fn renew_batch(&self, size: usize) {
        let _ = size;
    }

    /// A release finished; `ok` is false when the backend failed or timed out.
    fn released(&self, session: &SessionId, ok: bool) {
        let _ = (session, ok);
    }
}

/// The default hooks: record nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetrics;

impl KeeperMetrics for NoMetrics {}
