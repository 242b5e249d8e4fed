//! Listing the leases in a directory, for operators.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use lease_port::{FencingToken, LeaseError, OwnerId, SessionId};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

use crate::LeaseFileError;
use crate::record::{RECORD_LEN, Record};
use crate::store::clock_domain::from_nanos;
use crate::store::directory::{file_name, is_kind, kind_name, open_dir};

/// The state of one session's lease at the time of listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Held, and the listing time is before the expiry.
    Live,
    /// Held once and never released; the expiry has passed. The next acquire
    /// takes it over (or the holder reclaims it by renewing).
    Expired,
    /// Released, or the file was created and no token issued yet.
    Free,
}

/// One session's lease, as its file records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The session. `None` only for a file created but never written whose
    /// name is a hashed stem (the id of a plain stem is decoded from the name).
    pub session: Option<SessionId>,
    /// The holder (live or expired); `None` when free.
    pub owner: Option<OwnerId>,
    /// The highest token issued for the session; `None` when none was.
    pub token: Option<FencingToken>,
    /// The reservation ceiling: no token above it has been issued, and an
    /// instance that has not reserved it itself issues its first token above
    /// it. Equal to `token` for a version 1 record; `None` when no token was
    /// issued.
    pub reserved: Option<FencingToken>,
    /// When the hold lapses; `None` when free.
    pub expiry: Option<SystemTime>,
    /// Live, expired or free, judged at the listing time.
    pub state: LeaseState,
}

/// One directory entry of a listing.
#[derive(Debug)]
pub struct LeaseEntry {
    /// The entry's file name.
    pub file_name: String,
    /// What its record says, or why it cannot be read.
    pub lease: Result<LeaseInfo, LeaseFileError>,
}

/// The subdirectory in which a store fenced by this directory keeps its
/// generation witness (`session-store`'s `WITNESS_DIR_NAME`): not a lease,
/// left out of listings.
const STORE_WITNESS_DIR: &str = ".store-generations";

/// How long a listing waits for one file's lock before reporting it busy.
const LIST_LOCK_WAIT: Duration = Duration::from_millis(200);

/// Lists every entry of the lease directory `dir`, sorted by file name, with
/// its state judged at `now` (pass `SystemTime::now()`, or the clock the
/// leases run on).
///
/// Blocking; takes a shared file lock on each file while reading it, so it
/// never sees a record half-written. It never creates, changes or removes
/// anything. The owner locks (`.owners`), the authority id (`.authority`)
/// and stores' generation witnesses (`.store-generations`) are left out;
/// other entries that are not lease files (other names, symlinks,
/// directories, damaged records) are listed with the reason in
/// [`LeaseEntry::lease`], so an operator sees everything that would stop a
/// session. The directory itself being missing, a symlink, or not a
/// directory is an error of the whole call.
///
/// Opening and closing these files never disturbs the locks of processes
/// using the directory: `flock` locks belong to the lock holder's own open
/// file description.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use flocklease::{FlockLease, LeaseState, list_leases};
/// use lease_port::{OwnerId, SessionId, SessionLease};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let dir = tempfile::tempdir().unwrap();
/// let leases = FlockLease::builder(dir.path()).ttl(Duration::from_secs(30)).open()?;
/// leases.acquire(&SessionId::new("chat-1")?, &OwnerId::new("replica-a")?).await?;
///
/// let entries = list_leases(dir.path(), SystemTime::now())?;
/// let info = entries[0].lease.as_ref().unwrap();
/// assert_eq!(info.state, LeaseState::Live);
/// assert_eq!(info.owner.as_ref().unwrap().as_str(), "replica-a");
/// # Ok::<(), lease_port::LeaseError>(())
/// # }).unwrap();
/// ```
pub fn list_leases(dir: impl AsRef<Path>, now: SystemTime) -> Result<Vec<LeaseEntry>, LeaseError> {
    let dir = dir.as_ref();
    let (dir_fd, _) = open_dir(dir, false)?;
    let read_dir =
        std::fs::read_dir(dir).map_err(|e| LeaseFileError::io("listing", dir.to_path_buf(), e))?;
    let mut entries = Vec::new();
    for entry in read_dir {
        let entry = entry.map_err(|e| LeaseFileError::io("listing", dir.to_path_buf(), e))?;
        let name = entry.file_name();
        let path = dir.join(&name);
        if name == crate::store::owner_lock::OWNERS_DIR
            || name == crate::AUTHORITY_FILE
            || name == STORE_WITNESS_DIR
            || name == crate::store::boot_epoch::BOOT_EPOCH_FILE
        {
            // The owner locks (`FlockLease::lock_owner`), the directory's
            // authority id, the generations stores record here, and the
            // boot count of unsynced instances, not leases.
            continue;
        }
        let Some(name) = name.to_str().map(str::to_owned) else {
            entries.push(LeaseEntry {
                file_name: name.to_string_lossy().into_owned(),
                lease: Err(LeaseFileError::UnexpectedName { path }),
            });
            continue;
        };
        let lease = inspect_one(&dir_fd, &path, &name, now);
        entries.push(LeaseEntry {
            file_name: name,
            lease,
        });
    }
    entries.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    Ok(entries)
}

fn inspect_one(
    dir_fd: &std::os::fd::OwnedFd,
    path: &Path,
    name: &str,
    now: SystemTime,
) -> Result<LeaseInfo, LeaseFileError> {
    let Some(stem) = name.strip_suffix(".lease") else {
        return Err(LeaseFileError::UnexpectedName {
            path: path.to_path_buf(),
        });
    };
    let fd = nix::fcntl::openat(
        dir_fd,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP => LeaseFileError::NotRegular {
            path: path.to_path_buf(),
            what: "a symbolic link",
        },
        e => LeaseFileError::io("opening", path.to_path_buf(), e),
    })?;
    let st = nix::sys::stat::fstat(&fd)
        .map_err(|e| LeaseFileError::io("inspecting", path.to_path_buf(), e))?;
    if !is_kind(&st, nix::sys::stat::SFlag::S_IFREG) {
        return Err(LeaseFileError::NotRegular {
            path: path.to_path_buf(),
            what: kind_name(&st),
        });
    }
    let mut file = File::from(fd);
    let start = Instant::now();
    let locked = loop {
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(l) => break l,
            Err((f, Errno::EWOULDBLOCK | Errno::EINTR)) if start.elapsed() < LIST_LOCK_WAIT => {
                file = f;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(LeaseFileError::LockTimeout {
                    path: path.to_path_buf(),
                    waited: start.elapsed(),
                });
            }
            Err((_, e)) => return Err(LeaseFileError::io("locking", path.to_path_buf(), e)),
        }
    };
    let mut buf = [0u8; RECORD_LEN + 1];
    let mut len = 0;
    while len < buf.len() {
        match locked.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LeaseFileError::io("reading", path.to_path_buf(), e)),
        }
    }
    drop(locked);
    let Some(record) = Record::decode(path, &buf[..len])? else {
        let session = session_filename::decode(stem).and_then(|s| SessionId::new(s).ok());
        return Ok(LeaseInfo {
            session,
            owner: None,
            token: None,
            reserved: None,
            expiry: None,
            state: LeaseState::Free,
        });
    };
    if file_name(&record.session) != name {
        return Err(LeaseFileError::SessionMismatch {
            path: path.to_path_buf(),
            found: record.session.to_string(),
            expected: session_filename::decode(stem).unwrap_or_else(|| "?".to_owned()),
        });
    }
    let expiry = record
        .owner
        .as_ref()
        .map(|_| from_nanos(record.expiry_nanos));
    let state = match expiry {
        None => LeaseState::Free,
        Some(e) if now < e => LeaseState::Live,
        Some(_) => LeaseState::Expired,
    };
    Ok(LeaseInfo {
        session: Some(record.session),
        owner: record.owner,
        token: Some(FencingToken::new(record.token)),
        reserved: Some(FencingToken::new(record.reserved)),
        expiry,
        state,
    })
}

/// Rewrites the lease file of `session` in `dir` as a free record whose
/// next token will exceed `min_token`, and syncs it (and the directory).
/// Returns the token the record now holds: the next acquire issues one
/// above it.
///
/// The repair for a record that cannot be read (a checksum failure left by
/// a power cut under an older format, or corruption): pass as `min_token`
/// at least the highest token the session's store has seen (its fencing
/// mark), so the next owner's writes are accepted and no token is reused.
/// Whatever of the old record can still be read is never gone below: the
/// result is the highest of `min_token`, the record's token and its
/// reservation ceiling. With `min_token == 0` an unreadable record is
/// refused (`Invalid`), never reset. A live hold in a readable record is
/// ended; stop its holder first. Creates the file when absent. A
/// `min_token` above [`FencingToken::MAX_FLOOR`] is refused (`Invalid`).
/// Blocking; waits up to two seconds for the file's lock.
pub fn repair(
    dir: impl AsRef<Path>,
    session: &SessionId,
    min_token: u64,
) -> Result<FencingToken, LeaseError> {
    let dir = dir.as_ref();
    if min_token > FencingToken::MAX_FLOOR.get() {
        // Past it the boot count of unsynced instances, which must lie
        // above every token on disk, would leave the token range.
        return Err(LeaseError::invalid(format!(
            "a minimum token of {min_token} is past {}, the highest floor a lease takes",
            FencingToken::MAX_FLOOR.get()
        )));
    }
    let (dir_fd, _) = open_dir(dir, false)?;
    let name = file_name(session);
    let path = dir.join(&name);
    let fd = nix::fcntl::openat(
        &dir_fd,
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
    let st = nix::sys::stat::fstat(&fd)
        .map_err(|e| LeaseFileError::io("inspecting", path.clone(), e))?;
    if !is_kind(&st, nix::sys::stat::SFlag::S_IFREG) {
        return Err(LeaseFileError::NotRegular {
            path,
            what: kind_name(&st),
        }
        .into());
    }
    let mut file = File::from(fd);
    let start = Instant::now();
    let locked = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((f, Errno::EWOULDBLOCK | Errno::EINTR)) if start.elapsed() < REPAIR_LOCK_WAIT => {
                file = f;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(LeaseFileError::LockTimeout {
                    path,
                    waited: start.elapsed(),
                }
                .into());
            }
            Err((_, e)) => return Err(LeaseFileError::io("locking", path, e).into()),
        }
    };
    let mut buf = vec![0u8; RECORD_LEN + 1];
    let mut len = 0;
    while len < buf.len() {
        match locked.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LeaseFileError::io("reading", path, e).into()),
        }
    }
    let floor = match Record::decode(&path, &buf[..len]) {
        Ok(Some(r)) => r.token.max(r.reserved),
        Ok(None) => 0,
        Err(e) if min_token == 0 => {
            return Err(LeaseError::invalid(format!(
                "{e}: give a minimum token (the store's highest for the session)"
            ))
            .with_source(e));
        }
        Err(_) => 0,
    };
    let token = floor.max(min_token);
    let record = Record {
        session: session.clone(),
        owner: None,
        holder_lost: false,
        token,
        reserved: token,
        expiry_nanos: 0,
        mono_expiry_nanos: 0,
        boot_id: [0; 16],
    };
    let bytes = record.encode();
    locked
        .write_all_at(&bytes, 0)
        .and_then(|()| locked.set_len(RECORD_LEN as u64))
        .and_then(|()| locked.sync_data())
        .map_err(|e| LeaseFileError::io("writing", path.clone(), e))?;
    nix::unistd::fsync(&dir_fd).map_err(|e| LeaseFileError::io("syncing", dir.to_path_buf(), e))?;
    Ok(FencingToken::new(token))
}

/// How long [`repair`] waits for the file's lock.
const REPAIR_LOCK_WAIT: Duration = Duration::from_secs(2);
