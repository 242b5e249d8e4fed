//! Release: one transaction that deletes the caller's key and guard, each
//! only while it is still the caller's hold (see `txn::release_if_ours`).

use std::time::Instant;

use lease_port::{Lease, LeaseError};

use crate::Inner;
use crate::keys::encode_value;
use crate::txn::{release_if_ours, token_revision};

impl Inner {
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let Some(token) = token_revision(lease.token()) else {
            return Ok(()); // never issued: nothing of ours to remove
        };
        let key = self.keys.session_key(lease.session_id());
        let value = encode_value(lease.session_id(), lease.owner(), self.ttl);
        // Sent, it may land whatever this call learns: a re-acquire by the
        // same owner must then write a new hold, not keep this one. Until
        // etcd answers, the hold stays in the bookkeeping, due for the
        // sweep: a release that fails or is dropped is completed there.
        self.held.releasing(&key, token, Instant::now());
        self.client
            .txn(release_if_ours(
                &key,
                &self.keys.guard_of(&key),
                token,
                &value,
            ))
            .await
            .map_err(|e| e.into_lease_error("release: transaction failed"))?;
        // Answered: etcd holds nothing of this hold any more.
        self.held.forget(&key, token);
        Ok(())
    }
}
