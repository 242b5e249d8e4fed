//! The lease authority of one Redis database and prefix: a random id
//! created once, by whichever client asks first, and kept under the prefix.

use std::io::Read as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// A fresh id, unique with overwhelming probability: the system's random
/// bytes when it has them, mixed with the time, the process, a counter and
/// the place the id is for (so two databases asked in the same instant by
/// the same process still differ).
pub(crate) fn fresh_authority_id(place: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hash = Sha256::new();
    let mut random = [0u8; 32];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut random);
    }
    hash.update(random);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    hash.update(now.as_nanos().to_le_bytes());
    hash.update(std::process::id().to_le_bytes());
    hash.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    hash.update(place.as_bytes());
    let digest = hash.finalize();
    let mut id = String::from("redis:");
    for b in &digest[..16] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_differ_and_are_valid_authority_ids() {
        let a = fresh_authority_id("x");
        let b = fresh_authority_id("x");
        assert_ne!(a, b);
        assert!(lease_port::AuthorityId::new(&a).is_ok());
        assert_eq!(a.len(), "redis:".len() + 32);
    }
}
