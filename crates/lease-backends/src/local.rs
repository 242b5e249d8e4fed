//! The backends with nothing to reach: memory (one process) and a lease
//! directory (processes on one host).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flocklease::{FlockLease, LeaseFileError};
use lease_port::Clock;
use memlease::MemLease;

use crate::error::{OpenError, OpenErrorKind};

/// Leases in this process alone, judged by `clock`: lost, with their
/// tokens, when the process exits.
pub fn open_memory(ttl: Duration, clock: Arc<dyn Clock>) -> MemLease {
    MemLease::builder().ttl(ttl).clock(clock).build()
}

/// A lease directory shared by the processes of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirLeases {
    /// The directory (created when absent).
    pub dir: PathBuf,
    /// Accept a directory on tmpfs or ramfs. A reboot empties it, and the
    /// tokens it issues then start again below the marks of any store that
    /// outlived the reboot: only for stores that do not outlive one either.
    pub allow_volatile: bool,
}

impl DirLeases {
    /// `file leases in DIR`, for messages.
    pub fn describe(&self) -> String {
        format!("file leases in {}", self.dir.display())
    }

    /// The backend, granting `ttl`, judging expiry by `clock`. A volatile
    /// directory not allowed is [`OpenErrorKind::VolatileDir`]; one allowed
    /// opens, and [`FlockLease::is_volatile`] says so, for the caller to
    /// warn.
    pub fn open(&self, ttl: Duration, clock: Arc<dyn Clock>) -> Result<FlockLease, OpenError> {
        FlockLease::builder(&self.dir)
            .ttl(ttl)
            .clock(clock)
            .refuse_volatile(!self.allow_volatile)
            .open()
            .map_err(|e| {
                let volatile = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<LeaseFileError>())
                    .is_some_and(|s| matches!(s, LeaseFileError::Volatile { .. }));
                if volatile {
                    OpenError::new(OpenErrorKind::VolatileDir, self.describe(), e).at(&self.dir)
                } else {
                    OpenError::new(OpenErrorKind::Backend, self.describe(), e)
                }
            })
    }
}
