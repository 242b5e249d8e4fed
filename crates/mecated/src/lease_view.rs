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

/// Reads lease holders from a backend.
#[derive(Clone)]
pub struct LeaseView {
    backend: Arc<dyn SessionLease>,
    /// File leases answer through their directory: the backend itself does
    /// not report holders, but every record is readable there.
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
    /// A view of `backend`; `lease_dir` when its leases are files there.
    pub fn new(backend: Arc<dyn SessionLease>, lease_dir: Option<PathBuf>) -> Self {
        Self { backend, lease_dir }
    }

    /// The live holder of `session`'s lease, as the backend sees it now.
    pub async fn holder(&self, session: &SessionId) -> HolderState {
        match &self.lease_dir {
            Some(dir) => file_holder(dir.clone(), session.clone()).await,
            None => match self.backend.current(session).await {
                Ok(Some(lease)) if lease.expiry() > SystemTime::now() => {
                    HolderState::Held(Holder {
                        owner: lease.owner().clone(),
                        token: lease.token(),
                        expiry: lease.expiry(),
                    })
                }
                Ok(_) => HolderState::Free,
                Err(e) => unknown(&e),
            },
        }
    }
}

fn unknown(e: &LeaseError) -> HolderState {
    if e.kind() != LeaseErrorKind::Unsupported {
        tracing::debug!(error = %e, "cannot read the session's lease holder");
    }
    HolderState::Unknown
}

/// The holder recorded in a lease directory. The directory is listed
/// whole (`flocklease` reads one record only through a listing), on the
/// blocking pool.
async fn file_holder(dir: PathBuf, session: SessionId) -> HolderState {
    let listed = tokio::task::spawn_blocking(move || {
        flocklease::list_leases(&dir, SystemTime::now()).map(|entries| {
            entries.into_iter().find_map(|entry| {
                let info = entry.lease.ok()?;
                (info.session.as_ref() == Some(&session)).then_some(info)
            })
        })
    })
    .await;
    match listed {
        Ok(Ok(Some(info))) => match (info.state, info.owner, info.token, info.expiry) {
            (flocklease::LeaseState::Live, Some(owner), Some(token), Some(expiry)) => {
                HolderState::Held(Holder {
                    owner,
                    token,
                    expiry,
                })
            }
            _ => HolderState::Free,
        },
        Ok(Ok(None)) => HolderState::Free,
        Ok(Err(e)) => unknown(&e),
        Err(_) => HolderState::Unknown,
    }
}
