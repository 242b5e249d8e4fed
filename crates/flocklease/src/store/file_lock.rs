//! `flock` on lease files: one non-blocking attempt, a bounded wait, and the
//! start-up probe that settles whether the file system has locks at all.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::directory::Directory;
use crate::LeaseFileError;

/// One non-blocking attempt on lease file `name` of `dir`, exclusive unless
/// `shared`: `Ok(Err(file))` when another open file description holds a
/// conflicting lock.
pub(crate) fn try_lock(
    dir: &Directory,
    mut file: File,
    name: &str,
    shared: bool,
) -> Result<Result<Flock<File>, File>, LeaseFileError> {
    let mode = if shared {
        FlockArg::LockSharedNonblock
    } else {
        FlockArg::LockExclusiveNonblock
    };
    loop {
        match Flock::lock(file, mode) {
            Ok(locked) => return Ok(Ok(locked)),
            Err((f, Errno::EWOULDBLOCK)) => return Ok(Err(f)),
            Err((f, Errno::EINTR)) => file = f,
            Err((_, e)) => return Err(lock_failure(dir.file_path(name), e)),
        }
    }
}

/// Blocks (this thread only) until the lock is ours or `timeout` passes,
/// polling with a growing back-off. `Ok(None)` when `abandoned` is set
/// first.
pub(crate) fn wait_lock(
    dir: &Directory,
    mut file: File,
    name: &str,
    shared: bool,
    timeout: Duration,
    abandoned: &AtomicBool,
) -> Result<Option<Flock<File>>, LeaseFileError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        if abandoned.load(Ordering::Acquire) {
            return Ok(None);
        }
        file = match try_lock(dir, file, name, shared)? {
            Ok(locked) => return Ok(Some(locked)),
            Err(file) => file,
        };
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(LeaseFileError::LockTimeout {
                path: dir.file_path(name),
                waited,
            });
        }
        // A little jitter keeps pollers from waking in lock-step.
        let jitter = Duration::from_nanos(u64::from(start.elapsed().subsec_nanos() % 50_000));
        std::thread::sleep((pause + jitter).min(timeout - waited));
        pause = (pause * 2).min(Duration::from_millis(4));
    }
}

/// The error for a failed `flock` on a lease file (not `EWOULDBLOCK` or
/// `EINTR`, which the callers handle).
///
/// Always a passing fault (`Transient`): whether the file system supports
/// `flock` at all is settled once, by [`probe_locks`] at start-up.
pub(crate) fn lock_failure(path: PathBuf, e: Errno) -> LeaseFileError {
    LeaseFileError::io("locking", path, e)
}

/// Whether the directory's file system provides `flock` at all: takes and
/// drops a shared lock on the directory itself. Only the answers that mean
/// "never" are [`LeaseFileError::LocksUnsupported`]; anything else (`ENOLCK`,
/// say) is a passing fault.
pub(crate) fn probe_locks(path: &Path, dir_fd: &OwnedFd) -> Result<(), LeaseFileError> {
    let fd = dir_fd
        .try_clone()
        .map_err(|e| LeaseFileError::io("duplicating the descriptor of", path.to_path_buf(), e))?;
    match Flock::lock(fd, FlockArg::LockSharedNonblock) {
        // Dropping the lock unlocks it.
        Ok(_locked) => Ok(()),
        // Someone holds the directory exclusively: locks work.
        Err((_, Errno::EWOULDBLOCK | Errno::EINTR)) => Ok(()),
        Err((_, e @ (Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL))) => {
            Err(LeaseFileError::LocksUnsupported {
                path: path.to_path_buf(),
                source: e.into(),
            })
        }
        Err((_, e)) => Err(LeaseFileError::io("locking", path.to_path_buf(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_port::{LeaseError, LeaseErrorKind};

    /// `ENOLCK` (the kernel out of lock records) and other errors of one
    /// `flock` call are passing faults: `Transient`, never `Unsupported`,
    /// which would turn a leased server unleased.
    #[test]
    fn a_failing_flock_call_is_transient() {
        for e in [
            Errno::ENOLCK,
            Errno::EIO,
            Errno::EBADF,
            Errno::EINVAL,
            Errno::EOPNOTSUPP,
        ] {
            let err = LeaseError::from(lock_failure(PathBuf::from("/l/x.lease"), e));
            assert_eq!(err.kind(), LeaseErrorKind::Transient, "{e}: {err:?}");
        }
    }
}
