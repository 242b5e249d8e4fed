//! Session ids to Lease object names: valid, collision-free, recognisable.

use lease_port::SessionId;
use sha2::{Digest, Sha256};

/// Names of objects whose session id is used as it is.
const READABLE_PREFIX: &str = "mecatl-s-";
/// Names of objects whose session id is hashed.
const HASHED_PREFIX: &str = "mecatl-h-";
/// The object naming the lease authority; its prefix differs from both
/// session prefixes at the eighth character, so no session maps onto it.
pub(crate) const AUTHORITY_OBJECT: &str = "mecatl-authority";

/// Session ids longer than this are hashed, which keeps readable names short
/// enough for `kubectl get` columns and far below the 253-character limit.
const READABLE_MAX: usize = 63;

/// The name of the Lease object that holds `session`'s lease.
///
/// Ids made only of lower-case ASCII letters, digits and inner hyphens (at
/// most 63 bytes) keep their text: `chat-42` becomes `mecatl-s-chat-42`.
/// Every other id becomes `mecatl-h-` followed by the hex SHA-256 of its
/// bytes. The two prefixes never overlap and each mapping is one-to-one (the
/// readable one trivially, the hashed one up to SHA-256 collisions), so two
/// ids never share an object. The original id is kept on the object in the
/// `mecatl.dev/session-id` annotation and checked on every read.
///
/// ```
/// use lease_port::SessionId;
/// assert_eq!(k8slease::object_name(&SessionId::new("chat-42")?), "mecatl-s-chat-42");
/// let hashed = k8slease::object_name(&SessionId::new("Chat/42")?);
/// assert!(hashed.starts_with("mecatl-h-") && hashed.len() == 9 + 64);
/// # Ok::<(), lease_port::LeaseError>(())
/// ```
pub fn object_name(session: &SessionId) -> String {
    let id = session.as_str();
    if is_readable(id) {
        return format!("{READABLE_PREFIX}{id}");
    }
    let digest = Sha256::digest(id.as_bytes());
    let mut name = String::with_capacity(HASHED_PREFIX.len() + 64);
    name.push_str(HASHED_PREFIX);
    for byte in digest {
        name.push(char::from(HEX[usize::from(byte >> 4)]));
        name.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    name
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// True when `id` can be part of a DNS-1123 subdomain name as it is.
fn is_readable(id: &str) -> bool {
    let bytes = id.as_bytes();
    let inner_ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let edge_ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= READABLE_MAX
        && bytes.iter().all(inner_ok)
        && bytes.first().is_some_and(edge_ok)
        && bytes.last().is_some_and(edge_ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn name(id: &str) -> String {
        object_name(&SessionId::new(id).unwrap())
    }

    /// Kubernetes' DNS-1123 subdomain rule, which Lease names must meet.
    fn is_dns_subdomain(n: &str) -> bool {
        n.len() <= 253
            && n.split('.').all(|label| {
                let b = label.as_bytes();
                !b.is_empty()
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                    && b[0] != b'-'
                    && b[b.len() - 1] != b'-'
            })
    }

    #[test]
    fn readable_ids_keep_their_text() {
        assert_eq!(name("chat-42"), "mecatl-s-chat-42");
        assert_eq!(name("a"), "mecatl-s-a");
    }

    #[test]
    fn every_name_is_valid_and_distinct() {
        let long = "y".repeat(lease_port::MAX_ID_LEN);
        let ids = [
            "chat-42",
            "Chat-42",
            "chat/42",
            "chat%2f42",
            "chat_2f42",
            "chat/../42",
            "-chat",
            "chat-",
            "chat.42",
            "h-abc",
            "authority",
            "ünïcødé ☕",
            "a b",
            &"x".repeat(63),
            &"x".repeat(64),
            long.as_str(),
        ];
        let mut seen = HashSet::new();
        for id in ids {
            let n = name(id);
            assert!(is_dns_subdomain(&n), "{id:?} -> {n:?} is not a valid name");
            assert_ne!(n, AUTHORITY_OBJECT, "{id:?} maps onto the authority object");
            assert!(seen.insert(n.clone()), "{id:?} -> {n:?} collides");
        }
        assert!(name(&"x".repeat(64)).starts_with(HASHED_PREFIX));
        assert!(name("chat/42").starts_with(HASHED_PREFIX));
    }

    #[test]
    fn hashed_names_are_stable() {
        // Other processes and later releases must find the same object.
        let digest = Sha256::digest(b"chat/42");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(name("chat/42"), format!("mecatl-h-{hex}"));
    }
}
