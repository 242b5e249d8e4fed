//! What a write carries to prove its right to change a session: the
//! contract between the leases that grant ownership and the stores that
//! enforce it. It lives here, beside the token, so lease lifecycles and
//! stores speak of one type without depending on each other.

use crate::{FencingToken, Lease, OwnerId};

/// A writer's proof of its right to change a session: its lease's
/// [`FencingToken`] *and* the writer holding that lease.
///
/// A token alone is not enough: two lease authorities (two lease
/// directories, say) both hand out token 1, and a store must not let two
/// writers share a mark. The store binds its high-water mark to the
/// writer that set it and refuses an equal token from anyone else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    token: FencingToken,
    owner: OwnerId,
}

impl Fence {
    /// The fence of `owner` holding a lease with `token`.
    pub fn new(token: FencingToken, owner: OwnerId) -> Self {
        Self { token, owner }
    }

    /// The lease token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The writer: the owner the lease was issued to, or (what the lease
    /// keeper hands out) that owner plus an id of its process incarnation.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }
}

impl From<&Lease> for Fence {
    fn from(lease: &Lease) -> Self {
        Fence::new(lease.token(), lease.owner().clone())
    }
}

/// How a write proves its right to change a session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WriteFence {
    /// The writer's lease token and owner. Refused when the token is below
    /// the session's high-water mark, or equal to it while the mark belongs
    /// to another owner; otherwise accepted, and a higher token raises the
    /// mark and binds it to this owner.
    Fenced(Fence),
    /// No token: the deployment runs unleased. Accepted only by a store
    /// configured to allow it, and only while the session has never
    /// accepted a fenced write.
    Unfenced,
}

impl WriteFence {
    /// The fence of `owner` holding a lease with `token`.
    pub fn new(token: FencingToken, owner: OwnerId) -> Self {
        WriteFence::Fenced(Fence::new(token, owner))
    }
}

impl From<Fence> for WriteFence {
    fn from(fence: Fence) -> Self {
        WriteFence::Fenced(fence)
    }
}

/// The fence of a lease's owner, for code that holds a lease from a
/// backend directly. A run of the lease keeper writes with its guard's
/// `fence()` instead, which names the keeper's writer (the owner plus an
/// id of its incarnation): a run mixing the two would fence itself out, as
/// the store binds its mark to the first writer of a token.
impl From<&Lease> for WriteFence {
    fn from(lease: &Lease) -> Self {
        WriteFence::Fenced(lease.into())
    }
}
