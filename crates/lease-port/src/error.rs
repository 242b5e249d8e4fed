//! The one error type of the contract, with a kind callers match on.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

use crate::OwnerId;

/// What went wrong, coarse enough to decide what to do next.
///
/// | kind | meaning | what a server does |
/// |---|---|---|
/// | `Held` | another owner holds the session, or the caller lost it | reject with *leased elsewhere* (409) or cancel the run |
/// | `Unsupported` | the backend cannot provide leases at all | stop consulting it for the life of the process |
/// | `Invalid` | the input can never succeed | reject the request (400) |
/// | `Transient` | an infrastructure fault that may pass | retry, or answer 503 |
/// | `Rewound` | the authority's state went back (restored, wiped, failed over to a lagging copy) | refuse until an operator acts; never retry |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseErrorKind {
    /// Held live by another owner, or ownership of the caller's lease was lost.
    Held,
    /// The backend cannot provide leases at all. Never used for a passing fault.
    Unsupported,
    /// Bad input: an id, owner or lease value that can never be accepted.
    Invalid,
    /// An infrastructure fault (I/O, network, timeout); the operation may succeed later.
    Transient,
    /// The authority answered from older state than this client has already
    /// seen (a snapshot restore, a wipe, a failover to a replica that had not
    /// received the newest writes): tokens it hands out now may repeat ones
    /// issued before. Retrying cannot help; an operator must restore the
    /// newer state, or restart the clients to accept the older one.
    Rewound,
}

impl LeaseErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            LeaseErrorKind::Held => "lease held",
            LeaseErrorKind::Unsupported => "leases unsupported",
            LeaseErrorKind::Invalid => "invalid lease input",
            LeaseErrorKind::Transient => "transient lease failure",
            LeaseErrorKind::Rewound => "lease authority state went back",
        }
    }
}

impl fmt::Display for LeaseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// Who holds a session, as far as the backend said.
#[derive(Debug, Default)]
struct HeldBy {
    holder: Option<OwnerId>,
    left: Option<std::time::Duration>,
}

/// The error every [`SessionLease`](crate::SessionLease) operation returns.
///
/// Match on [`kind()`](Self::kind); the underlying cause, when there is one,
/// is kept as [`source()`](std::error::Error::source).
///
/// ```
/// use lease_port::{LeaseError, LeaseErrorKind, OwnerId};
/// let holder = OwnerId::new("replica-2")?;
/// let err = LeaseError::held(Some(holder.clone()));
/// assert_eq!(err.kind(), LeaseErrorKind::Held);
/// assert_eq!(err.holder(), Some(&holder));
///
/// let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "etcd did not answer");
/// let err = LeaseError::transient("renew timed out").with_source(io);
/// assert!(err.is_retryable());
/// assert!(std::error::Error::source(&err).is_some());
/// # Ok::<(), LeaseError>(())
/// ```
#[derive(thiserror::Error)]
#[error("{}", self.render())]
pub struct LeaseError {
    kind: LeaseErrorKind,
    message: Cow<'static, str>,
    /// Boxed: most errors have no holder, and an error travels in every
    /// `Result` of the crates above, so it is kept small.
    held: Option<Box<HeldBy>>,
    #[source]
    source: Option<Source>,
}

impl LeaseError {
    /// An error of `kind` with a human-readable detail.
    pub fn new(kind: LeaseErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: message.into(),
            held: None,
            source: None,
        }
    }

    /// Held elsewhere, or ownership lost; `holder` is the live holder when known.
    pub fn held(holder: Option<OwnerId>) -> Self {
        let message = match &holder {
            Some(h) => Cow::Owned(format!("held by {h}")),
            None => Cow::Borrowed("held by another owner or no longer ours"),
        };
        let mut e = Self::new(LeaseErrorKind::Held, message);
        if let Some(holder) = holder {
            e = e.with_holder(holder);
        }
        e
    }

    /// The backend cannot provide leases at all.
    pub fn unsupported(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(LeaseErrorKind::Unsupported, message)
    }

    /// Bad input.
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(LeaseErrorKind::Invalid, message)
    }

    /// A passing infrastructure fault.
    pub fn transient(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(LeaseErrorKind::Transient, message)
    }

    /// The authority's state is older than what this client already saw.
    pub fn rewound(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(LeaseErrorKind::Rewound, message)
    }

    /// Keeps `source` as the cause of this error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Records the live holder (meaningful for [`LeaseErrorKind::Held`]).
    #[must_use]
    pub fn with_holder(mut self, holder: OwnerId) -> Self {
        self.held.get_or_insert_default().holder = Some(holder);
        self
    }

    /// Records how much longer the holder's lease lives, as the backend
    /// judged when it answered (meaningful for [`LeaseErrorKind::Held`]): a
    /// caller can say when to try again. A holder that keeps renewing
    /// holds on past it.
    #[must_use]
    pub fn with_held_for(mut self, left: std::time::Duration) -> Self {
        self.held.get_or_insert_default().left = Some(left);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> LeaseErrorKind {
        self.kind
    }

    /// The owner holding the session, when the backend knows it.
    pub fn holder(&self) -> Option<&OwnerId> {
        self.held.as_ref().and_then(|h| h.holder.as_ref())
    }

    /// How much longer the holder's lease lives, when the backend said.
    pub fn held_for(&self) -> Option<std::time::Duration> {
        self.held.as_ref().and_then(|h| h.left)
    }

    /// The detail given when the error was made.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True for [`LeaseErrorKind::Transient`]: the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        self.kind == LeaseErrorKind::Transient
    }

    /// The cause is part of the text: a caller that prints only the error
    /// (most do) still sees why.
    fn render(&self) -> String {
        match &self.source {
            Some(source) => format!("{}: {}: {source}", self.kind, self.message),
            None => format!("{}: {}", self.kind, self.message),
        }
    }
}

impl fmt::Debug for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LeaseError");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(h) = self.holder() {
            d.field("holder", h);
        }
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_detail() {
        let err = LeaseError::held(Some(OwnerId::new("b").unwrap()));
        assert_eq!(err.to_string(), "lease held: held by b");
        let err = LeaseError::unsupported("no coordination API");
        assert_eq!(err.to_string(), "leases unsupported: no coordination API");
        assert!(!err.is_retryable());
    }

    #[test]
    fn source_is_kept() {
        let io = std::io::Error::other("disk on fire");
        let err = LeaseError::transient("write failed").with_source(io);
        let src = StdError::source(&err).unwrap();
        assert_eq!(src.to_string(), "disk on fire");
        assert!(format!("{err:?}").contains("disk on fire"));
    }

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<LeaseError>();
    }
}
