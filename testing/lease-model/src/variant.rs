//! The rules as built, and the broken variants the model must catch: the
//! same breakages the fault runs inject into real backends and stores,
//! written as changes to the model.

/// Which rules the model follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The rules as built.
    Correct,
    /// The store writes whatever token a write carries.
    StoreWithoutFencing,
    /// A takeover hands out the previous holder's token again.
    TakeoverKeepsToken,
    /// [`Variant::TakeoverKeepsToken`], and a store that takes the mark's
    /// token from another writer: the writer binding is what stops a
    /// repeated token at the store, and here it is gone.
    RepeatedTokenAcceptedByStore,
    /// The authority answers the renewal of a lost lease as a success.
    RenewOfLostLeaseGranted,
    /// A release frees the session whoever holds it.
    ReleaseFreesOthers,
    /// The keeper counts its lease from when the answer arrived rather
    /// than from when it sent the request.
    LossCountedFromReceipt,
    /// The keeper releases a lease while writes sent under it are still
    /// unanswered.
    ReleaseBeforeWritesSettle,
    /// The store takes tokens from any authority, not only the one it is
    /// bound to.
    StoreIgnoresAuthority,
    /// The keeper counts on a re-acquired token whose release it gave up
    /// waiting for: that release may still be handled after the grant.
    ReacquireTrustsTokenInDoubt,
}

impl Variant {
    /// Every broken variant.
    pub const BROKEN: [Variant; 9] = [
        Variant::StoreWithoutFencing,
        Variant::TakeoverKeepsToken,
        Variant::RepeatedTokenAcceptedByStore,
        Variant::RenewOfLostLeaseGranted,
        Variant::ReleaseFreesOthers,
        Variant::LossCountedFromReceipt,
        Variant::ReleaseBeforeWritesSettle,
        Variant::StoreIgnoresAuthority,
        Variant::ReacquireTrustsTokenInDoubt,
    ];

    /// The bounds that can show this variant's breakage: a store ignoring
    /// authorities needs a process configured with another, and requests
    /// enough for it to pass the first token (the mark's writer binding
    /// refuses an equal one); [`Bounds::SMALL`](crate::Bounds::SMALL) for every other.
    pub fn bounds(self) -> crate::Bounds {
        match self {
            Variant::StoreIgnoresAuthority => crate::Bounds {
                foreign_processes: 1,
                max_ops: 6,
                losses: 0,
                crashes: 0,
                ..crate::Bounds::SMALL
            },
            Variant::ReacquireTrustsTokenInDoubt => crate::Bounds::SMALL_TIMEOUTS,
            _ => crate::Bounds::SMALL,
        }
    }

    /// Whether a history shows the breakage: what the authority and the
    /// store answered is recorded, what a keeper believes is not. A keeper
    /// that counts its lease too long holds past what it was told, which
    /// only a model of the keeper can see. Nor does a history say when a
    /// write landed against when a release was handled, only when each
    /// was answered, nor which authority granted a token.
    pub fn visible_in_histories(self) -> bool {
        !matches!(
            self,
            Variant::LossCountedFromReceipt
                | Variant::ReleaseBeforeWritesSettle
                | Variant::ReacquireTrustsTokenInDoubt
                | Variant::StoreIgnoresAuthority
        )
    }
}
