//! What can be wrong with the lease directory or a lease file.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use lease_port::{LeaseError, LeaseErrorKind};

use crate::record::{FORMAT_VERSION, RECORD_LEN};

/// The cause behind a [`LeaseErrorKind::Transient`](lease_port::LeaseErrorKind::Transient)
/// (or, for [`LeaseFileError::LocksUnsupported`],
/// [`Unsupported`](lease_port::LeaseErrorKind::Unsupported)) error of this
/// backend, kept as the error's `source()`.
///
/// Match on it with `err.source().and_then(|s| s.downcast_ref::<LeaseFileError>())`.
/// None of these is ever treated as a free lease: a damaged record stops its
/// session until an operator looks at it (see [`list_leases`](crate::list_leases)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseFileError {
    /// The configured directory is a symbolic link.
    #[error("lease directory {path} is a symbolic link; configure the real directory")]
    DirSymlink {
        /// The configured directory.
        path: PathBuf,
    },
    /// The configured path exists and is not a directory.
    #[error("lease directory {path} exists and is not a directory")]
    NotADirectory {
        /// The configured directory.
        path: PathBuf,
    },
    /// The directory path no longer names the directory opened at start-up
    /// (removed, renamed, or replaced by another directory or a symlink).
    /// Processes opening the path now would not see this process's locks.
    #[error("lease directory {path} was replaced or removed since it was opened ({detail})")]
    DirReplaced {
        /// The configured directory.
        path: PathBuf,
        /// What the path names now.
        detail: String,
    },
    /// Something other than a regular file sits where a lease file belongs.
    #[error("{path} is {what}, not a regular lease file")]
    NotRegular {
        /// The offending path.
        path: PathBuf,
        /// What it is ("a symbolic link", "a directory", …).
        what: &'static str,
    },
    /// A name in the lease directory that this backend never creates.
    #[error("{path} is not a lease file name (the directory should hold only *.lease files)")]
    UnexpectedName {
        /// The offending path.
        path: PathBuf,
    },
    /// Shorter than a record: a torn first write or a truncation.
    #[error("lease file {path} is {len} bytes, a record is {RECORD_LEN}: truncated or torn")]
    Truncated {
        /// The lease file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// Longer than a record: not written by this backend.
    #[error(
        "lease file {path} is {len} bytes, longer than a {RECORD_LEN}-byte record: not a lease file"
    )]
    Oversized {
        /// The lease file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// Does not start with the record magic: some other program's file.
    #[error(
        "lease file {path} does not start with the lease record magic: foreign or overwritten file"
    )]
    Foreign {
        /// The lease file.
        path: PathBuf,
    },
    /// Written by another version of the record layout.
    #[error(
        "lease file {path} has record format version {found}; this build reads versions 1 to {FORMAT_VERSION}"
    )]
    Version {
        /// The lease file.
        path: PathBuf,
        /// The version found.
        found: u16,
    },
    /// The checksum does not match: a torn or corrupted record.
    #[error(
        "lease file {path} fails its checksum (stored {stored:#010x}, computed {computed:#010x}): torn or corrupt record; to go on, repair it with a minimum token at least the highest the session's store has seen (flocklease::repair)"
    )]
    Checksum {
        /// The lease file.
        path: PathBuf,
        /// The checksum stored in the record.
        stored: u32,
        /// The checksum of the bytes read.
        computed: u32,
    },
    /// The checksum matches but the fields are inconsistent.
    #[error("lease file {path} holds a malformed record: {detail}")]
    Malformed {
        /// The lease file.
        path: PathBuf,
        /// Which field is wrong.
        detail: String,
    },
    /// The record is for another session than its file name says (a file
    /// copied or renamed by hand, or a hash collision of long ids).
    #[error("lease file {path} holds the record of session {found:?}, expected {expected:?}")]
    SessionMismatch {
        /// The lease file.
        path: PathBuf,
        /// The session the record names.
        found: String,
        /// The session the file name stands for ("?" when the name is hashed).
        expected: String,
    },
    /// The file lock was not obtained in time: another process holds it far
    /// longer than any critical section takes (stopped, or stuck in I/O).
    #[error("no lock on {path} within {waited:?}: lock file wedged by another process")]
    LockTimeout {
        /// The lease file.
        path: PathBuf,
        /// How long this operation waited.
        waited: Duration,
    },
    /// The file system does not support `flock` at all (found when the
    /// directory is opened; a failing `flock` call later is [`Io`](Self::Io)).
    #[error("the file system of {path} does not support flock")]
    LocksUnsupported {
        /// The lease directory.
        path: PathBuf,
        /// The error `flock` returned.
        #[source]
        source: io::Error,
    },
    /// Another open file description (another process, or another
    /// [`OwnerLock`](crate::OwnerLock) in this one) holds this owner id's lock
    /// in this lease directory.
    #[error("owner id {owner} is already in use on lease directory {dir} by another process")]
    OwnerInUse {
        /// The lease directory.
        dir: PathBuf,
        /// The owner id.
        owner: String,
    },
    /// The directory is on a file system kept in memory (tmpfs, ramfs) and
    /// [`refuse_volatile`](crate::FlockLeaseBuilder::refuse_volatile) was set:
    /// a reboot would lose every token while a store keeps its marks.
    #[error(
        "lease directory {path} is on {fs}, which a reboot empties: tokens would restart below the store's marks; use a directory on a disk"
    )]
    Volatile {
        /// The lease directory.
        path: PathBuf,
        /// The file system type.
        fs: &'static str,
    },
    /// The directory's count of boots, kept for unsynced lease files
    /// ([`Durability::Unsynced`](crate::Durability::Unsynced)), is damaged
    /// or cannot be rebuilt. Tokens cannot be known to rise past a power
    /// loss without it; nothing is issued until it is fixed.
    #[error(
        "{path}: {detail}. It counts this host's boots so that unsynced lease files never \
         repeat a token after a power loss, and the floor of an adopted directory. Repair it \
         with every instance on the directory stopped: `mecated leases adopt` (or \
         flocklease::adopt) writes a count past every token the lease files show and the wall \
         clock's second. Never put back an older copy of it"
    )]
    BootEpoch {
        /// The boot count's file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A system call failed.
    #[error("{op} {path} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl LeaseFileError {
    pub(crate) fn io(op: &'static str, path: PathBuf, e: impl Into<io::Error>) -> Self {
        LeaseFileError::Io {
            op,
            path,
            source: e.into(),
        }
    }
}

impl From<LeaseFileError> for LeaseError {
    /// `LocksUnsupported` becomes `Unsupported`, `OwnerInUse` `Held`, `Volatile` `Invalid`; everything else is
    /// `Transient`. The message repeats the cause so a log line that prints
    /// only the error still names the file.
    fn from(e: LeaseFileError) -> Self {
        let message = e.to_string();
        match e {
            LeaseFileError::LocksUnsupported { .. } => {
                LeaseError::unsupported(message).with_source(e)
            }
            LeaseFileError::Volatile { .. } => LeaseError::invalid(message).with_source(e),
            LeaseFileError::OwnerInUse { .. } => {
                LeaseError::new(LeaseErrorKind::Held, message).with_source(e)
            }
            _ => LeaseError::transient(message).with_source(e),
        }
    }
}
