//! The authority: the cluster's id, the prefix, and a random marker stored
//! once under the prefix (see the crate docs, "Authority").

use std::time::SystemTime;

use lease_port::{AuthorityId, LeaseError};

use crate::Inner;
use crate::txn::{create_or_read, read_kv};

impl Inner {
    pub(crate) async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.authority
            .get_or_try_init(|| async {
                let key = self.keys.authority_key();
                let marker = random_marker();
                let mut answer = self
                    .client
                    .txn(create_or_read(key, marker.clone().into_bytes()))
                    .await
                    .map_err(|e| e.into_lease_error("authority: transaction failed"))?;
                let cluster = answer.header.as_ref().map_or(0, |h| h.cluster_id);
                let stored = if answer.succeeded {
                    marker
                } else {
                    read_kv(&mut answer, 0)
                        .and_then(|kv| String::from_utf8(kv.value).ok())
                        .filter(|m| m.len() <= 64 && m.bytes().all(|b| b.is_ascii_hexdigit()))
                        .ok_or_else(|| {
                            LeaseError::transient("authority: the marker key is unreadable")
                        })?
                };
                AuthorityId::new(format!(
                    "etcd:{cluster:016x}:{stored}:{}",
                    self.keys.prefix()
                ))
            })
            .await
            .cloned()
    }
}

/// 128 random bits as hex, from the standard library's randomly keyed
/// hasher (seeded by the OS), the clock and the process id.
fn random_marker() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = String::with_capacity(32);
    for half in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(half);
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_differ() {
        assert_ne!(random_marker(), random_marker());
        assert_eq!(random_marker().len(), 32);
    }
}
