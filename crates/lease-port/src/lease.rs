//! The lease value and its fencing token.

use std::fmt;
use std::time::SystemTime;

use crate::{OwnerId, SessionId};

/// The fencing epoch of a session.
///
/// Every takeover produces a token greater than every token issued before it
/// for that session, so a store that refuses writes carrying a token below
/// the highest it has seen shuts out every earlier owner, however late its
/// writes arrive. Tokens are compared only within one session.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct FencingToken(u64);

impl FencingToken {
    /// The highest floor [`SessionLease::acquire_above`](crate::SessionLease::acquire_above)
    /// accepts (2^62); a greater one is [`Invalid`](crate::LeaseErrorKind::Invalid).
    /// Stores' marks never come near it, and a floor next to `u64::MAX`
    /// would use up a session's tokens for good: one call from a careless
    /// or hostile caller would make every later takeover impossible.
    pub const MAX_FLOOR: FencingToken = FencingToken(1 << 62);

    /// `Ok` for a floor [`acquire_above`](crate::SessionLease::acquire_above)
    /// accepts, else the `Invalid` error every backend answers for it.
    pub fn check_floor(self) -> Result<(), crate::LeaseError> {
        if self > Self::MAX_FLOOR {
            return Err(crate::LeaseError::invalid(format!(
                "token floor {self} is above the highest accepted, {}: no store's mark comes \
                 near it, and tokens above it would soon run out",
                Self::MAX_FLOOR
            )));
        }
        Ok(())
    }

    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value, for storing next to a write.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// One grant of ownership of a session: an immutable value.
///
/// Returned by [`acquire`](crate::SessionLease::acquire) and
/// [`renew`](crate::SessionLease::renew). Keep the newest value: renewing or
/// releasing an older one after a renewal still works (same token), but its
/// [`expiry`](Self::expiry) is stale.
///
/// The expiry is the backend's statement of when the grant lapses, on the
/// backend's clock. A holder must not rely on it alone to decide how long it
/// may act: local deadlines belong on a monotonic clock, and every write must
/// carry the [`token`](Self::token) so the store can refuse a stale owner.
#[derive(Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Lease {
    session_id: SessionId,
    owner: OwnerId,
    token: FencingToken,
    expiry: SystemTime,
}

impl Lease {
    /// Builds a lease value. Backends call this; applications receive leases.
    pub fn new(
        session_id: SessionId,
        owner: OwnerId,
        token: FencingToken,
        expiry: SystemTime,
    ) -> Self {
        Self {
            session_id,
            owner,
            token,
            expiry,
        }
    }

    /// The session this lease protects.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The owner holding it.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The fencing token to attach to every write made under this lease.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the grant lapses unless renewed, on the backend's clock.
    pub fn expiry(&self) -> SystemTime {
        self.expiry
    }

    /// True when `now` is at or past the expiry.
    pub fn is_expired_at(&self, now: SystemTime) -> bool {
        now >= self.expiry
    }

    /// The same grant with another expiry: what a renewal returns.
    #[must_use]
    pub fn with_expiry(&self, expiry: SystemTime) -> Self {
        Self {
            expiry,
            ..self.clone()
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expiry = self
            .expiry
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| format!("unix+{:.3}s", d.as_secs_f64()))
            .unwrap_or_else(|_| "before-epoch".to_owned());
        f.debug_struct("Lease")
            .field("session_id", &self.session_id)
            .field("owner", &self.owner)
            .field("token", &self.token.0)
            .field("expiry", &format_args!("{expiry}"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn expiry_is_exclusive() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let lease = Lease::new(
            SessionId::new("s").unwrap(),
            OwnerId::new("o").unwrap(),
            FencingToken::new(3),
            t,
        );
        assert!(!lease.is_expired_at(t - Duration::from_nanos(1)));
        assert!(lease.is_expired_at(t));
        let renewed = lease.with_expiry(t + Duration::from_secs(5));
        assert_eq!(renewed.token(), lease.token());
        assert_eq!(renewed.owner(), lease.owner());
        assert!(renewed.expiry() > lease.expiry());
    }

    #[test]
    fn tokens_order_numerically() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert!(FencingToken::new(10) > FencingToken::new(9));
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }
}
