//! The sweep: deleting the keys on this client's etcd lease that nobody
//! renews or releases any more (see the crate docs, "One etcd lease per
//! client", and `held_keys`).

use std::time::Instant;

use crate::Inner;
use crate::txn::{delete_if_on, release_if_ours};

impl Inner {
    /// Deletes the keys on this client's etcd lease whose holders stopped
    /// renewing them a TTL and a grace ago, or released them without a
    /// confirmed answer (see `held_keys`). Each delete is conditional on
    /// the key still being on that lease with that value (and revision,
    /// when known), so it never touches a new hold. A key leaves the
    /// bookkeeping only once etcd answered its delete; the others wait for
    /// the next sweep.
    pub(crate) async fn sweep(&self) {
        let Some(sweep) = self.held.sweep(Instant::now()) else {
            return;
        };
        for (key, held) in &sweep.lapsed {
            let delete = match held.token {
                // The hold ended in its holder's view a grace ago, or its
                // holder released it: removed as its release would.
                Some(token) => release_if_ours(key, &self.keys.guard_of(key), token, &held.value),
                // Whether the write landed is unknown: the key goes only if
                // it is still ours, and its guard stays, so another owner
                // waits as for any lapsed hold.
                None => delete_if_on(key, held.lease_id, &held.value),
            };
            match self.client.txn(delete).await {
                // Answered: deleted now, or not this hold's any more.
                Ok(_) => self.held.deleted(key, held.generation),
                // etcd is not answering this client: the rest waits too,
                // rather than each costing the caller a timeout.
                Err(e) if e.is_member_fault() => return,
                Err(_) => {}
            }
        }
    }
}
