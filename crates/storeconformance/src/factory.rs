//! How a store plugs into the suite.

use std::sync::Arc;

use async_trait::async_trait;
use session_store::SessionStore;

/// Hands out clients of one store under test, all sharing its data.
///
/// The suite builds a fresh factory for every case, so a factory owns a
/// fresh, empty store (a temporary directory, a key prefix, a database or
/// a server it started) that no binding of
/// [`bind_authority`](SessionStore::bind_authority) has touched yet, and
/// cleans it up when dropped. Every [`store`](Self::store) must see every
/// other's writes: fencing, racing and waiting are checked across clients,
/// as separate processes would see them.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// A new, independent client of the shared store — in a deployment,
    /// one per process (its own connections, caches and open files). It
    /// refuses unfenced writes, as a store does by default.
    async fn store(&self) -> Arc<dyn SessionStore>;

    /// A client of the same store configured to accept unfenced writes
    /// (for deployments whose lease backend answered `Unsupported`), when
    /// the store can be configured so. `None` by default: the suite then
    /// checks only that unfenced writes are refused.
    async fn unfenced_store(&self) -> Option<Arc<dyn SessionStore>> {
        None
    }

    /// The largest serialised event the store's clients accept, when they
    /// have a limit. `None` by default: the suite then writes no event
    /// over a limit. Configure a small one (a few KiB) to keep the case
    /// cheap.
    fn max_event_bytes(&self) -> Option<usize> {
        None
    }

    /// Whether the store keeps cancel requests
    /// ([`request_cancel`](SessionStore::request_cancel)). `false` by
    /// default: the suite then checks that all three calls answer
    /// `Unsupported`, never half of them.
    fn keeps_cancel_requests(&self) -> bool {
        false
    }
}
