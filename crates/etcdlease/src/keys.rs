//! Where a session's lease lives in etcd, and what its value says.
//!
//! A session's key is `{prefix}s/{id}` with the id percent-encoded: every
//! byte outside `A-Z a-z 0-9 - _ .` (including `%` itself and `/`) becomes
//! `%XX`, so two ids never share a key and no id can reach outside the
//! `s/` directory. The value keeps the original session id and the holder's
//! owner id, so a reader needs nothing but the key.
//!
//! Beside it, `{prefix}g/{id}` is the session's guard: written with the
//! session key by every write that takes the session (so its revision is
//! the token of the hold), attached to no etcd lease, and deleted only by a
//! release. A session key gone while its guard remains is a hold that
//! lapsed without a release (see the crate documentation).

use std::time::Duration;

use lease_port::{LeaseError, OwnerId, SessionId};

/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// First line of every value: a reader that meets another format (a later
/// version, or something else written under the prefix) does not misread it.
const VALUE_FORMAT: &str = "mecatl-etcdlease/2";

const SESSIONS_DIR: &[u8] = b"s/";
const GUARDS_DIR: &[u8] = b"g/";

/// The key layout under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct KeySpace {
    prefix: String,
}

impl KeySpace {
    pub(crate) fn new(prefix: &str) -> Result<Self, LeaseError> {
        if prefix.is_empty() || !prefix.ends_with('/') {
            return Err(LeaseError::invalid(format!(
                "the key prefix {prefix:?} must be non-empty and end with '/'"
            )));
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(LeaseError::invalid(format!(
                "the key prefix is {} bytes long, the limit is {MAX_PREFIX_LEN}",
                prefix.len()
            )));
        }
        if prefix.chars().any(char::is_control) {
            return Err(LeaseError::invalid(
                "the key prefix contains a control character",
            ));
        }
        Ok(KeySpace {
            prefix: prefix.to_owned(),
        })
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn session_key(&self, session: &SessionId) -> Vec<u8> {
        self.key_in(SESSIONS_DIR, session)
    }

    /// The guard of the session whose key is `session_key`.
    pub(crate) fn guard_of(&self, session_key: &[u8]) -> Vec<u8> {
        let mut key = session_key.to_vec();
        let dir = self.prefix.len()..self.prefix.len() + GUARDS_DIR.len();
        if key.get(dir.clone()) == Some(SESSIONS_DIR) {
            key[dir].copy_from_slice(GUARDS_DIR);
        }
        key
    }

    fn key_in(&self, dir: &[u8], session: &SessionId) -> Vec<u8> {
        let id = session.as_str().as_bytes();
        let mut key = Vec::with_capacity(self.prefix.len() + dir.len() + id.len() * 3);
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(dir);
        for &b in id {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                key.push(b);
            } else {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                key.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
            }
        }
        key
    }

    /// The key whose value names this prefix's authority. In a directory
    /// of its own: a prefix may be another prefix's `s/` or `g/`, and no
    /// session or guard key has a `/` after its directory, so no session of
    /// an enclosing prefix can be this key.
    pub(crate) fn authority_key(&self) -> Vec<u8> {
        format!("{}a/authority", self.prefix).into_bytes()
    }
}

/// The value stored under a session's key and its guard: the holder, the
/// session, and the TTL the holder counts on, so another client waits out
/// a lapsed hold for the holder's TTL, not its own.
pub(crate) fn encode_value(session: &SessionId, owner: &OwnerId, ttl: Duration) -> Vec<u8> {
    // Ids hold no control characters, so newlines separate them unambiguously.
    format!("{VALUE_FORMAT}\n{owner}\n{session}\n{}", ttl.as_secs()).into_bytes()
}

/// A stored value's holder and TTL, when it is one of ours.
pub(crate) fn decode_value(value: &[u8]) -> Option<(OwnerId, Duration)> {
    let text = std::str::from_utf8(value).ok()?;
    let mut lines = text.split('\n');
    if lines.next()? != VALUE_FORMAT {
        return None;
    }
    let owner = OwnerId::new(lines.next()?).ok()?;
    SessionId::new(lines.next()?).ok()?;
    let ttl = Duration::from_secs(lines.next()?.parse().ok()?);
    lines.next().is_none().then_some((owner, ttl))
}

/// The holder named by a stored value, when it is one of ours.
pub(crate) fn decode_owner(value: &[u8]) -> Option<OwnerId> {
    decode_value(value).map(|(owner, _)| owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> KeySpace {
        KeySpace::new("/p/").unwrap()
    }

    #[test]
    fn keys_are_injective_and_stay_in_their_directory() {
        let ids = [
            "a", "a/b", "a%2Fb", "a%2fb", "a_2Fb", "../x", "A", "☕", "a b",
        ];
        let keys: std::collections::BTreeSet<Vec<u8>> = ids
            .iter()
            .map(|id| space().session_key(&SessionId::new(id).unwrap()))
            .collect();
        assert_eq!(keys.len(), ids.len());
        for key in keys {
            let rest = key.strip_prefix(b"/p/s/".as_slice()).unwrap();
            assert!(!rest.contains(&b'/'), "{key:?}");
        }
        assert_eq!(
            space().session_key(&SessionId::new("a/b%").unwrap()),
            b"/p/s/a%2Fb%25".to_vec()
        );
    }

    #[test]
    fn guards_sit_beside_session_keys() {
        let id = SessionId::new("a/s/b").unwrap();
        let key = space().session_key(&id);
        assert_eq!(space().guard_of(&key), b"/p/g/a%2Fs%2Fb".to_vec());
        // The prefix itself may contain `s/`: only the directory moves.
        let odd = KeySpace::new("/s/").unwrap();
        let key = odd.session_key(&id);
        assert_eq!(odd.guard_of(&key), b"/s/g/a%2Fs%2Fb".to_vec());
    }

    #[test]
    fn values_round_trip_and_foreign_values_are_not_read() {
        let (s, o) = (
            SessionId::new("chat 1").unwrap(),
            OwnerId::new("host/1").unwrap(),
        );
        let ttl = Duration::from_secs(15);
        assert_eq!(
            decode_value(&encode_value(&s, &o, ttl)),
            Some((o.clone(), ttl))
        );
        assert_eq!(decode_owner(&encode_value(&s, &o, ttl)), Some(o));
        for foreign in [
            &b""[..],
            b"x",
            b"mecatl-etcdlease/2\n",
            b"mecatl-etcdlease/1\no\ns",
            b"mecatl-etcdlease/2\no\ns\nx",
            b"mecatl-etcdlease/2\no\ns\n15\nextra",
            b"\xff\xfe",
            b"other/1\no\ns",
        ] {
            assert_eq!(decode_owner(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn bad_prefixes_are_invalid() {
        for bad in [
            "",
            "no-slash",
            "/a\n/",
            &format!("/{}/", "x".repeat(MAX_PREFIX_LEN)),
        ] {
            let err = KeySpace::new(bad).unwrap_err();
            assert_eq!(err.kind(), lease_port::LeaseErrorKind::Invalid, "{bad:?}");
        }
    }
}
