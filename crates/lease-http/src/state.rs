//! The state a session server's handlers share.

use std::sync::Arc;

use axum::extract::FromRef;
use lease_keeper::LeaseKeeper;
use session_store::SessionStore;

/// What a session server's handlers share: the keeper that leases the
/// sessions and the store that keeps them. [`Leased`](crate::Leased)
/// extracts from it as it is; a state of your own needs only
/// `impl FromRef<YourState> for LeaseKeeper`.
///
/// Cheap to clone. `St` is the store's type, `dyn SessionStore` unless
/// named (`Sessions<JsonlStore>` keeps the JSONL store's own methods in
/// reach).
pub struct Sessions<St: ?Sized = dyn SessionStore> {
    /// Leases a session for each request that writes it.
    pub keeper: LeaseKeeper,
    /// The sessions, every write fenced.
    pub store: Arc<St>,
}

impl<St: ?Sized> Sessions<St> {
    /// The state of a server leasing with `keeper` and storing in `store`.
    pub fn new(keeper: LeaseKeeper, store: Arc<St>) -> Self {
        Self { keeper, store }
    }
}

impl<St: ?Sized> Clone for Sessions<St> {
    fn clone(&self) -> Self {
        Self {
            keeper: self.keeper.clone(),
            store: Arc::clone(&self.store),
        }
    }
}

impl<St: ?Sized> std::fmt::Debug for Sessions<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("keeper", &self.keeper)
            .finish_non_exhaustive()
    }
}

impl<St: ?Sized> FromRef<Sessions<St>> for LeaseKeeper {
    fn from_ref(sessions: &Sessions<St>) -> Self {
        sessions.keeper.clone()
    }
}
