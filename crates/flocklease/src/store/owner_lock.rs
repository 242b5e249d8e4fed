//! Owner locks: one lock file per owner id in use, so two processes never
//! lease under one owner id on one directory
//! ([`FlockLease::lock_owner`](crate::FlockLease::lock_owner)).

use std::fs::File;

use lease_port::{OwnerId, SessionId};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

use super::directory::Directory;
use super::file_lock::lock_failure;
use crate::LeaseFileError;

/// The subdirectory of the lease directory holding one lock file per owner
/// id in use ([`FlockLease::lock_owner`](crate::FlockLease::lock_owner)).
pub(crate) const OWNERS_DIR: &str = ".owners";

/// Takes this owner id's lock in `.owners/` of the opened directory,
/// without waiting. Found through the directory descriptor, so every
/// spelling of the directory's path (a trailing slash, `..`, a symlinked
/// parent) meets the same lock file.
pub(crate) fn lock_owner(dir: &Directory, owner: &OwnerId) -> Result<Flock<File>, LeaseFileError> {
    let owners = dir.file_path(OWNERS_DIR);
    match nix::sys::stat::mkdirat(dir.fd(), OWNERS_DIR, Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(LeaseFileError::io("creating", owners, e)),
    }
    let owners_fd = nix::fcntl::openat(
        dir.fd(),
        OWNERS_DIR,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => LeaseFileError::NotRegular {
            path: owners.clone(),
            what: "not a plain directory",
        },
        e => LeaseFileError::io("opening", owners.clone(), e),
    })?;
    // Owner ids obey the rules of session ids, so the same safe,
    // injective file names apply.
    let stem = SessionId::new(owner.as_str())
        .map(|id| session_filename::stem(&id))
        .map_err(|e| {
            LeaseFileError::io(
                "naming the lock of",
                owners.clone(),
                std::io::Error::other(e),
            )
        })?;
    let name = format!("{stem}.lock");
    let path = owners.join(&name);
    let fd = nix::fcntl::openat(
        &owners_fd,
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .map_err(|e| match e {
        Errno::ELOOP => LeaseFileError::NotRegular {
            path: path.clone(),
            what: "a symbolic link",
        },
        e => LeaseFileError::io("opening", path.clone(), e),
    })?;
    let mut file = File::from(fd);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(locked),
            Err((f, Errno::EINTR)) => file = f,
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(LeaseFileError::OwnerInUse {
                    dir: dir.path().to_path_buf(),
                    owner: owner.to_string(),
                });
            }
            Err((_, e)) => return Err(lock_failure(path, e)),
        }
    }
}
