//! The trait every backend implements.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId};

/// Temporary, fenced ownership of a session by one process.
///
/// Object-safe: servers hold an `Arc<dyn SessionLease>` chosen at start-up.
/// Every operation may be cancelled by dropping its future; a backend must
/// leave its shared state consistent when that happens (a dropped acquire may
/// or may not have taken the lease, exactly as a lost reply would).
///
/// The rules each method follows are stated on the method and in the crate
/// documentation; `leaseconformance` checks every one of them.
#[async_trait]
pub trait SessionLease: Send + Sync {
    /// Takes the lease on `session` for `owner`.
    ///
    /// Succeeds when the lease is free, expired, or held live by `owner`
    /// itself. A takeover — any acquisition other than the live holder
    /// re-acquiring — returns a token greater than every token ever issued
    /// for `session`. The live holder re-acquiring gets a later expiry and
    /// either its current token or a new, greater one.
    ///
    /// Held live by another owner: [`LeaseErrorKind::Held`](crate::LeaseErrorKind::Held),
    /// naming the holder when the backend knows it.
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError>;

    /// [`acquire`](Self::acquire), with a token greater than `floor`.
    ///
    /// `floor` is what a store says it already accepted for `session` (its
    /// high-water mark). After the authority lost or rewound state its
    /// counter may lag the stores it fences; a token at or below a store's
    /// mark could never write there. A backend that keeps its own token
    /// record raises it above `floor` in the same step as the grant, so
    /// every later takeover stays above it too. The live holder
    /// re-acquiring with a token not above `floor` gets a new, greater one.
    ///
    /// A floor above [`FencingToken::MAX_FLOOR`] is
    /// [`Invalid`](crate::LeaseErrorKind::Invalid), with nothing granted.
    ///
    /// The default calls [`acquire`](Self::acquire) and accepts the grant
    /// only when its token is above `floor`; otherwise it releases the
    /// grant and answers [`LeaseErrorKind::Rewound`](crate::LeaseErrorKind::Rewound):
    /// an authority that cannot raise its tokens must have its state
    /// restored. Backends whose tokens can be raised override it.
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        floor.check_floor()?;
        let lease = self.acquire(session, owner).await?;
        if lease.token() > floor {
            return Ok(lease);
        }
        // Best effort: a release that fails leaves a grant that lapses.
        let _ = self.release(&lease).await;
        Err(LeaseError::rewound(format!(
            "the lease authority issued token {} for session {session}, not above {floor}, \
             which a store already accepted: its token record is older than the store's \
             (restored or wiped), and this backend cannot raise it; restore the authority's \
             newer state",
            lease.token()
        )))
    }

    /// Extends `lease`, returning a value with the same token and a later
    /// expiry. Store the returned value.
    ///
    /// When the caller no longer holds the lease (taken over, released, or
    /// expired and not provably unraced): [`LeaseErrorKind::Held`](crate::LeaseErrorKind::Held).
    /// The caller must then stop acting for the session at once.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError>;

    /// Gives up `lease` so another owner can take the session at once.
    ///
    /// Removes only the caller's own hold (same owner and token). Succeeds
    /// without effect when the lease is unknown, expired and taken, or held
    /// under another token.
    async fn release(&self, lease: &Lease) -> Result<(), LeaseError>;

    /// The authority whose tokens this backend hands out (see
    /// [`AuthorityId`]): the same for every client of one lease directory,
    /// service or namespace, before and after restarts, and different for
    /// any other. Stores compare it with the authority they are fenced by,
    /// so tokens of two authorities never mix in one session.
    ///
    /// May need a round trip (a network backend asks its service); a
    /// passing fault is [`LeaseErrorKind::Transient`](crate::LeaseErrorKind::Transient).
    async fn authority(&self) -> Result<AuthorityId, LeaseError>;

    /// The live grant on `session`, if any: who holds it, under which token,
    /// until when. A snapshot for diagnostics and for telling a refused
    /// caller when to retry; it proves nothing by the time it arrives, so
    /// never act for a session on it — acquire instead.
    ///
    /// Optional. The default answers
    /// [`LeaseErrorKind::Unsupported`](crate::LeaseErrorKind::Unsupported),
    /// which here means only that this backend does not report holders; it
    /// says nothing about whether it can lease (callers of `current` must
    /// not turn that answer into running unleased).
    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let _ = session;
        Err(LeaseError::unsupported(
            "this lease backend does not report current holders",
        ))
    }

    /// Renews several leases together, answering one result per lease, in
    /// the order given. Each result follows [`renew`](Self::renew)'s rules
    /// for its lease; one lease's loss never fails another's renewal.
    ///
    /// The default renews them one after another. A backend that can renew
    /// many leases in one exchange (a batch call, a shared stream, a shared
    /// server-side lease) overrides this and [`renews_in_batches`](Self::renews_in_batches),
    /// so a process holding many sessions pays for one exchange per
    /// renewal period instead of one per session.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.renew(lease).await);
        }
        out
    }

    /// True when [`renew_many`](Self::renew_many) costs fewer exchanges than
    /// renewing one lease at a time. Callers batch renewals only then; the
    /// default is `false`.
    fn renews_in_batches(&self) -> bool {
        false
    }

    /// How long every lease this backend grants lives, at least, counted
    /// from when the call that granted or renewed it was sent; `None` when
    /// the backend cannot say before it grants.
    ///
    /// A caller that times its leases on its own clock (the lease keeper
    /// renews and gives up a lease by its own TTL) compares its TTL with
    /// this once, and refuses a backend that grants less: two owners would
    /// otherwise overlap for the difference. Backends that take their TTL
    /// from their configuration answer it; the default is `None`.
    fn granted_ttl(&self) -> Option<std::time::Duration> {
        None
    }
}

macro_rules! forward {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<T: SessionLease + ?Sized> SessionLease for $ty {
            async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
                (**self).acquire(session, owner).await
            }
            async fn acquire_above(
                &self,
                session: &SessionId,
                owner: &OwnerId,
                floor: FencingToken,
            ) -> Result<Lease, LeaseError> {
                (**self).acquire_above(session, owner, floor).await
            }
            async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
                (**self).renew(lease).await
            }
            async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
                (**self).release(lease).await
            }
            async fn authority(&self) -> Result<AuthorityId, LeaseError> {
                (**self).authority().await
            }
            async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
                (**self).current(session).await
            }
            async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
                (**self).renew_many(leases).await
            }
            fn renews_in_batches(&self) -> bool {
                (**self).renews_in_batches()
            }
            fn granted_ttl(&self) -> Option<std::time::Duration> {
                (**self).granted_ttl()
            }
        }
    )*};
}

forward!(Arc<T>, Box<T>, &T);
