//! Who holds a session's lease right now, asked of the lease backend
//! without taking part in it: for a `Retry-After`, for knowing which run
//! of a session is live on another replica, and for the operator page.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use lease_port::{FencingToken, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease};

/// A live hold on a session's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The process holding it.
    pub owner: OwnerId,
    /// Its fencing token: the token of the run it drives.
    pub token: FencingToken,
    /// When the hold lapses unless renewed.
    pub expiry: SystemTime,
}

/// What the lease backend says of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderState {
    /// Held live.
    Held(Holder),
    /// Free, released, or expired.
    Free,
    /// The backend cannot tell (it does not report holders, or failed).
    Unknown,
}

/// Reads lease holders from a backend, through its
/// [`current`](SessionLease::current): one session's record per question,
/// whatever the backend (a file, a key, an object), never a scan.
#[derive(Clone)]
pub struct LeaseView {
    backend: Arc<dyn SessionLease>,
    /// Where file leases live, for diagnostics only: the backend answers
    /// for one session without anyone reading the directory.
    lease_dir: Option<PathBuf>,
}

impl std::fmt::Debug for LeaseView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseView")
            .field("lease_dir", &self.lease_dir)
            .finish_non_exhaustive()
    }
}

impl LeaseView {
    /// A view of `backend`; `lease_dir` when its leases are files there
    /// (shown in diagnostics).
    pub fn new(backend: Arc<dyn SessionLease>, lease_dir: Option<PathBuf>) -> Self {
        Self { backend, lease_dir }
    }

    /// The live holder of `session`'s lease, as the backend sees it now.
    pub async fn holder(&self, session: &SessionId) -> HolderState {
        match self.backend.current(session).await {
            // A report that arrives already expired (a slow answer) shows no
            // live run.
            Ok(Some(lease)) if lease.expiry() > SystemTime::now() => HolderState::Held(Holder {
                owner: lease.owner().clone(),
                token: lease.token(),
                expiry: lease.expiry(),
            }),
            Ok(_) => HolderState::Free,
            Err(e) => unknown(&e),
        }
    }
}

/// A backend that does not report holders says nothing worth logging; any
/// other failure (a damaged record, an unreachable service, a hold whose
/// holder is unknown) leaves the state unknown too, but is worth a line.
fn unknown(e: &LeaseError) -> HolderState {
    if e.kind() != LeaseErrorKind::Unsupported {
        tracing::debug!(error = %e, "cannot read the session's lease holder");
    }
    HolderState::Unknown
}
