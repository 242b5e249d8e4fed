//! Validated identifiers: the session a lease protects and the process that holds it.

use std::fmt;
use std::sync::Arc;

use crate::LeaseError;

/// The longest session id or owner id accepted, in bytes.
///
/// Long enough for UUIDs, ULIDs, tenant-prefixed keys and host/pid owner names;
/// short enough that every backend can store it in one small record.
pub const MAX_ID_LEN: usize = 256;

fn validate(what: &'static str, value: &str) -> Result<(), LeaseError> {
    if value.is_empty() {
        return Err(LeaseError::invalid(format!("{what} is empty")));
    }
    if value.len() > MAX_ID_LEN {
        return Err(LeaseError::invalid(format!(
            "{what} is {} bytes long, the limit is {MAX_ID_LEN}",
            value.len()
        )));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(LeaseError::invalid(format!(
            "{what} contains the control character {:?}",
            c
        )));
    }
    Ok(())
}

macro_rules! validated_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `value`: non-empty, at most [`MAX_ID_LEN`] bytes, no control
            /// characters. Anything else is a [`LeaseErrorKind::Invalid`](crate::LeaseErrorKind::Invalid) error.
            pub fn new(value: impl AsRef<str>) -> Result<Self, LeaseError> {
                let value = value.as_ref();
                validate($what, value)?;
                Ok(Self(Arc::from(value)))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = LeaseError;
            fn from_str(s: &str) -> Result<Self, LeaseError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = LeaseError;
            fn try_from(s: String) -> Result<Self, LeaseError> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = LeaseError;
            fn try_from(s: &str) -> Result<Self, LeaseError> {
                Self::new(s)
            }
        }

        #[cfg(feature = "serde")]
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                Self::new(&*s).map_err(serde::de::Error::custom)
            }
        }
    };
}

validated_id!(
    /// The session a lease protects.
    ///
    /// Arbitrary text chosen by the application, so it may contain `/`, `..`,
    /// spaces or non-ASCII characters. Backends must never join it raw into a
    /// path or an object name: they encode or hash it.
    ///
    /// ```
    /// use lease_port::{SessionId, LeaseErrorKind};
    /// let id = SessionId::new("chat/7f3a")?;
    /// assert_eq!(id.as_str(), "chat/7f3a");
    /// assert_eq!(SessionId::new("").unwrap_err().kind(), LeaseErrorKind::Invalid);
    /// # Ok::<(), lease_port::LeaseError>(())
    /// ```
    SessionId,
    "session id"
);

validated_id!(
    /// The identity of a holding process, for example `host-a/pid-4242/x9f1`.
    ///
    /// Two processes must never share an owner id: a backend treats an acquire
    /// by the same owner as a re-acquisition by the live holder.
    OwnerId,
    "owner id"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LeaseErrorKind;

    #[test]
    fn accepts_ordinary_ids() {
        for ok in [
            "a",
            "chat/../etc/passwd",
            "ünïcødé ☕",
            &"x".repeat(MAX_ID_LEN),
        ] {
            assert_eq!(SessionId::new(ok).unwrap().as_str(), ok);
            assert_eq!(OwnerId::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_bad_ids_with_invalid() {
        let long = "x".repeat(MAX_ID_LEN + 1);
        for bad in [
            "",
            "a\nb",
            "\0",
            "tab\there",
            "\u{7f}",
            "\u{9b}",
            long.as_str(),
        ] {
            let err = SessionId::new(bad).unwrap_err();
            assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{bad:?}");
            let err = OwnerId::new(bad).unwrap_err();
            assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{bad:?}");
        }
    }

    #[test]
    fn limit_is_in_bytes_not_chars() {
        let multibyte = "é".repeat(MAX_ID_LEN / 2 + 1);
        assert!(SessionId::new(multibyte).is_err());
    }

    #[cfg(feature = "serde")]
    #[test]
    fn deserialising_validates() {
        let ok: SessionId = serde_json::from_str("\"s-1\"").unwrap();
        assert_eq!(ok.as_str(), "s-1");
        assert!(serde_json::from_str::<SessionId>("\"\"").is_err());
        assert!(serde_json::from_str::<OwnerId>("\"a\\u0000b\"").is_err());
    }
}

validated_id!(
    /// The lease authority a backend's tokens belong to.
    ///
    /// A fencing token is a number that only means something next to the
    /// tokens of the same authority: one lease directory, one etcd prefix,
    /// one Kubernetes namespace, one lease service. Two authorities both
    /// hand out token 1 for a session, so a store fenced by one must never
    /// accept the tokens of another. A store records the authority that
    /// fences it, and a server compares it with its backend's
    /// [`authority`](crate::SessionLease::authority) before writing.
    ///
    /// Stable for the authority's life (across restarts of the backend and
    /// of every client) and distinct between authorities; it names *where*
    /// tokens come from, never *who* holds them.
    ///
    /// ```
    /// use lease_port::AuthorityId;
    /// let a = AuthorityId::new("flock:6a1f0c2e9b")?;
    /// assert_eq!(a.as_str(), "flock:6a1f0c2e9b");
    /// # Ok::<(), lease_port::LeaseError>(())
    /// ```
    AuthorityId,
    "authority id"
);
