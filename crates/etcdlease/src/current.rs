//! Reporting the holder: the session key as stored, and how long its etcd
//! lease has left (see the crate docs, "Reporting the holder").

use std::time::{Duration, SystemTime};

use lease_port::{Lease, LeaseError, SessionId};

use crate::keys::decode_owner;
use crate::txn::token_of;
use crate::wire::messages::RangeRequest;
use crate::{EtcdError, Inner};

impl Inner {
    /// The live holder of `session` (see the crate docs, "Reporting the
    /// holder"): the key as stored, and how long its etcd lease has left.
    pub(crate) async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let read = RangeRequest {
            key: self.keys.session_key(session),
            ..Default::default()
        };
        let answer = self
            .client
            .range(read)
            .await
            .map_err(|e| e.into_lease_error("current: reading the key failed"))?;
        // Gone, guard or not: released, or lapsed and no longer renewed.
        let Some(kv) = answer.kvs.into_iter().next() else {
            return Ok(None);
        };
        let malformed = |detail: String| {
            LeaseError::transient(format!("current: the key of {session} is not one of ours"))
                .with_source(EtcdError::Malformed {
                    call: "Range",
                    detail,
                })
        };
        let holder = decode_owner(&kv.value).ok_or_else(|| {
            malformed(format!(
                "the key of {session} holds a value this crate did not write"
            ))
        })?;
        if kv.lease == 0 {
            return Err(malformed(format!(
                "the key of {session} is on no etcd lease, so it never expires"
            )));
        }
        let sent = SystemTime::now();
        let left = match self.client.lease_time_to_live(kv.lease).await {
            Ok(answer) => answer.ttl,
            Err(e) if e.is_lease_not_found() => return Ok(None),
            Err(e) => return Err(e.into_lease_error("current: reading the etcd lease failed")),
        };
        let Ok(left @ 1..) = u64::try_from(left) else {
            return Ok(None);
        };
        let grace = self.shared.grace();
        // etcd counts from when it served the request and rounds down, so
        // counting from the send gives no later a time than etcd's; a
        // member that knows no deadline yet (just elected) answers more
        // than was ever granted, which is capped. The grace is left out
        // as the holder leaves it out of its own expiry.
        let left = Duration::from_secs(left)
            .min(self.ttl + grace)
            .saturating_sub(grace);
        if left.is_zero() {
            return Ok(None);
        }
        Ok(Some(Lease::new(
            session.clone(),
            holder,
            token_of(kv.mod_revision),
            sent + left,
        )))
    }
}
