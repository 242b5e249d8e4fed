//! The file-system side: the directory, opening, locking, reading and
//! writing lease files, and the decision taken under the lock.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use lease_port::{Clock, FencingToken, Lease, LeaseError, OwnerId, SessionId};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::LeaseFileError;
use crate::record::{RECORD_LEN, Record};

/// The lease file name of `session`: its safe stem plus `.lease`.
pub(crate) fn file_name(session: &SessionId) -> String {
    let mut name = session_filename::stem(session);
    name.push_str(".lease");
    name
}

pub(crate) struct Store {
    pub(crate) dir: PathBuf,
    dir_fd: OwnedFd,
    dir_id: (u64, u64),
    pub(crate) ttl: Duration,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) lock_timeout: Duration,
    pub(crate) inline_fast_path: bool,
    pub(crate) dir_check_interval: Duration,
    /// When the directory was last verified, in nanoseconds after `epoch`
    /// plus one; 0 before the first check.
    dir_checked: AtomicU64,
    epoch: Instant,
    /// How many tokens one synced reservation covers (≥ 1).
    pub(crate) reservation: u64,
    /// The in-memory file system (tmpfs, ramfs) the directory is on.
    pub(crate) volatile: Option<&'static str>,
    /// This process's clock domain ([`read_clock_domain`]: the boot id
    /// mixed with the time namespace); zero when
    /// unknown, and then expiry is judged on the wall clock.
    pub(crate) boot_id: [u8; 16],
    /// `CLOCK_MONOTONIC` in nanoseconds, read right beside `mono_anchor`:
    /// maps the clock's monotonic readings to a number every process of
    /// this boot shares.
    mono_base: u64,
    mono_anchor: Instant,
    /// The sessions this instance may issue tokens for without a sync: lease
    /// file name → the reservation ceiling this instance wrote there and saw
    /// `fdatasync` confirm. See the crate docs, "Durability".
    armed: Mutex<HashMap<String, u64>>,
    /// Lease file name → the inode whose name this instance made durable
    /// (synced the directory after the file existed).
    named: Mutex<HashMap<String, u64>>,
}

/// The subdirectory of the lease directory holding one lock file per owner
/// id in use ([`FlockLease::lock_owner`](crate::FlockLease::lock_owner)).
pub(crate) const OWNERS_DIR: &str = ".owners";

/// The most sessions an instance keeps armed; past it the set is cleared,
/// which costs each session one more synced reservation and nothing else.
const MAX_ARMED: usize = 65_536;

pub(crate) enum Op {
    /// Acquire with a token above the floor (0 for a plain acquire: every
    /// token is at least 1).
    Acquire(SessionId, OwnerId, u64),
    Renew(Lease),
    Release(Lease),
    /// Reads the live holder; writes nothing.
    Current(SessionId),
}

pub(crate) enum Reply {
    Granted(Lease),
    Released,
    Current(Option<Lease>),
}

impl Op {
    pub(crate) fn session(&self) -> &SessionId {
        match self {
            Op::Acquire(s, _, _) | Op::Current(s) => s,
            Op::Renew(l) | Op::Release(l) => l.session_id(),
        }
    }

    fn creates_file(&self) -> bool {
        matches!(self, Op::Acquire(..))
    }

    /// Only a read: it opens the file read-only and shares the lock with
    /// other readers, so reporting a holder never holds up another reader,
    /// and a writer only for the few microseconds of one `pread`.
    fn reads_only(&self) -> bool {
        matches!(self, Op::Current(..))
    }

    /// The answer when the session's file does not exist: nothing was ever
    /// issued for it.
    fn reply_without_file(&self) -> Result<Reply, LeaseError> {
        match self {
            Op::Release(_) => Ok(Reply::Released),
            Op::Current(_) => Ok(Reply::Current(None)),
            _ => Err(LeaseError::held(None)),
        }
    }
}

/// What to do under the lock, decided from the record read.
pub(crate) struct Plan {
    write: Option<Record>,
    /// fdatasync the file (and the directory, unless this instance knows the
    /// file's name durable) before replying.
    sync: bool,
    /// A new reservation ceiling: once synced, this instance is armed with
    /// it for the file.
    arm: Option<u64>,
    reply: Result<Reply, LeaseError>,
}

impl Plan {
    pub(crate) fn needs_sync(&self) -> bool {
        self.sync
    }
}

/// Outcome of opening a lease file.
pub(crate) enum Opened {
    File(File),
    Absent,
}

pub(crate) fn kind_name(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFREG => "a regular file",
        _ => "an unknown kind of file",
    }
}

pub(crate) fn is_kind(st: &FileStat, kind: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// Opens (creating with mode 0700 when absent) and checks the lease
/// directory; returns its descriptor and identity.
pub(crate) fn open_dir(path: &Path, create: bool) -> Result<(OwnedFd, (u64, u64)), LeaseFileError> {
    match nix::sys::stat::lstat(path) {
        Ok(st) if is_kind(&st, SFlag::S_IFLNK) => {
            return Err(LeaseFileError::DirSymlink {
                path: path.to_path_buf(),
            });
        }
        Ok(st) if !is_kind(&st, SFlag::S_IFDIR) => {
            return Err(LeaseFileError::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        Ok(_) => {}
        Err(Errno::ENOENT) if create => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| {
                    LeaseFileError::io("creating lease directory", path.to_path_buf(), e)
                })?;
        }
        Err(e) => return Err(LeaseFileError::io("inspecting", path.to_path_buf(), e)),
    }
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP => LeaseFileError::DirSymlink {
            path: path.to_path_buf(),
        },
        Errno::ENOTDIR => LeaseFileError::NotADirectory {
            path: path.to_path_buf(),
        },
        e => LeaseFileError::io("opening lease directory", path.to_path_buf(), e),
    })?;
    let st = nix::sys::stat::fstat(&fd)
        .map_err(|e| LeaseFileError::io("inspecting", path.to_path_buf(), e))?;
    Ok((fd, (st.st_dev, st.st_ino)))
}

/// The name of the in-memory file system `fd` is on (tmpfs, ramfs), or
/// `None` for one that keeps its data across a reboot.
pub(crate) fn volatile_fs(
    path: &Path,
    fd: &OwnedFd,
) -> Result<Option<&'static str>, LeaseFileError> {
    const RAMFS_MAGIC: u32 = 0x8584_58f6;
    let st = nix::sys::statfs::fstatfs(fd)
        .map_err(|e| LeaseFileError::io("inspecting the file system of", path.to_path_buf(), e))?;
    let kind = st.filesystem_type();
    Ok(if kind == nix::sys::statfs::TMPFS_MAGIC {
        Some("tmpfs")
    } else if kind.0 as u32 == RAMFS_MAGIC {
        Some("ramfs")
    } else {
        None
    })
}

/// One pairing of `Instant` and raw `CLOCK_MONOTONIC` per process, so every
/// instance in it maps a monotonic reading to exactly the same number.
fn mono_anchor(dir: &Path) -> Result<(Instant, u64), LeaseFileError> {
    static ANCHOR: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    if let Some(anchor) = ANCHOR.get() {
        return Ok(*anchor);
    }
    let instant = Instant::now();
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_err(|e| LeaseFileError::io("reading the monotonic clock for", dir.to_path_buf(), e))?;
    let raw = u64::try_from(t.tv_sec())
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0));
    Ok(*ANCHOR.get_or_init(|| (instant, raw)))
}

/// The id of this process's monotonic clock: the boot id mixed with the
/// time namespace. Processes share `CLOCK_MONOTONIC` only when both match:
/// a time namespace (`unshare --time`, a CRIU restore) offsets the clock
/// within one boot. All zero when the boot id cannot be read; then every
/// record is judged on the wall clock.
pub(crate) fn read_clock_domain() -> [u8; 16] {
    let mut id = read_boot_id();
    if id == [0; 16] {
        return id;
    }
    // Kernels without time namespaces (before 5.6) have no such link, and
    // all their processes share one monotonic clock per boot.
    if let Some(ns) = time_namespace() {
        for (byte, mix) in id[8..].iter_mut().zip(ns.to_le_bytes()) {
            *byte ^= mix;
        }
    }
    // Namespace inodes are reused once a namespace is gone; its offset
    // tells two namespaces with one inode apart (zero in the initial one).
    if let Some(offset) = monotonic_offset() {
        for (byte, mix) in id[..8].iter_mut().zip(offset.to_le_bytes()) {
            *byte ^= mix;
        }
    }
    id
}

/// This time namespace's `CLOCK_MONOTONIC` offset, folded into 64 bits,
/// from `/proc/self/timens_offsets` (`monotonic SECS NANOS`).
fn monotonic_offset() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/timens_offsets").ok()?;
    let line = text.lines().find(|l| l.starts_with("monotonic"))?;
    let mut fields = line.split_whitespace().skip(1);
    let secs: i64 = fields.next()?.parse().ok()?;
    let nanos: u64 = fields.next()?.parse().ok()?;
    Some((secs as u64).rotate_left(30) ^ nanos)
}

/// The inode of this process's time namespace (`/proc/self/ns/time` reads
/// `time:[INODE]`).
fn time_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/time").ok()?;
    let text = link.to_str()?;
    text.strip_prefix("time:[")?.strip_suffix(']')?.parse().ok()
}

/// This boot's id, from `/proc/sys/kernel/random/boot_id` (a UUID); all
/// zero when it cannot be read.
fn read_boot_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
        return id;
    };
    let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    if hex.len() != 32 {
        return [0; 16];
    }
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
        id[i] = digit(pair[0]) << 4 | digit(pair[1]);
    }
    id
}

fn to_nanos(t: SystemTime) -> Result<u64, LeaseError> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .ok_or_else(|| {
            LeaseError::invalid("clock reads outside 1970..2554, the range of a lease record")
        })
}

pub(crate) fn from_nanos(n: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(n)
}

impl Store {
    pub(crate) fn new(
        dir: PathBuf,
        ttl: Duration,
        clock: Arc<dyn Clock>,
        lock_timeout: Duration,
        inline_fast_path: bool,
        dir_check_interval: Duration,
        reservation: u64,
    ) -> Result<Self, LeaseFileError> {
        debug_assert!(reservation >= 1);
        let (dir_fd, dir_id) = open_dir(&dir, true)?;
        probe_locks(&dir, &dir_fd)?;
        let (mono_anchor, mono_base) = mono_anchor(&dir)?;
        let volatile = volatile_fs(&dir, &dir_fd)?;
        Ok(Store {
            dir,
            dir_fd,
            dir_id,
            ttl,
            clock,
            lock_timeout,
            inline_fast_path,
            dir_check_interval,
            dir_checked: AtomicU64::new(0),
            epoch: Instant::now(),
            reservation,
            volatile,
            boot_id: read_clock_domain(),
            mono_base,
            mono_anchor,
            armed: Mutex::new(HashMap::new()),
            named: Mutex::new(HashMap::new()),
        })
    }

    /// The clock's monotonic reading as nanoseconds of `CLOCK_MONOTONIC`
    /// (std's `Instant` is that clock on Linux): comparable between
    /// processes of one boot, and immune to wall-clock steps.
    fn mono_nanos(&self) -> u64 {
        let now = self.clock.instant();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match now.checked_duration_since(self.mono_anchor) {
            Some(ahead) => self.mono_base.saturating_add(nanos(ahead)),
            None => self
                .mono_base
                .saturating_sub(nanos(self.mono_anchor.duration_since(now))),
        }
    }

    /// Whether `r`'s expiry is judged on this boot's monotonic clock (it was
    /// written in this boot and time namespace) rather than the wall clock.
    fn judged_on_monotonic(&self, r: &Record) -> bool {
        self.boot_id != [0; 16] && r.boot_id == self.boot_id && r.mono_expiry_nanos != 0
    }

    /// The reservation ceiling this instance last synced on file `name`.
    fn armed_ceiling(&self, name: &str) -> Option<u64> {
        let armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        armed.get(name).copied()
    }

    fn arm(&self, name: &str, ceiling: u64) {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        if armed.len() >= MAX_ARMED && !armed.contains_key(name) {
            armed.clear();
        }
        armed.insert(name.to_owned(), ceiling);
    }

    /// Takes this owner id's lock in `.owners/` of the opened directory,
    /// without waiting. Found through the directory descriptor, so every
    /// spelling of the directory's path (a trailing slash, `..`, a symlinked
    /// parent) meets the same lock file.
    pub(crate) fn lock_owner(&self, owner: &OwnerId) -> Result<Flock<File>, LeaseFileError> {
        let owners = self.dir.join(OWNERS_DIR);
        match nix::sys::stat::mkdirat(&self.dir_fd, OWNERS_DIR, Mode::S_IRWXU) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(LeaseFileError::io("creating", owners, e)),
        }
        let owners_fd = nix::fcntl::openat(
            &self.dir_fd,
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
            OFlag::O_RDWR
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NONBLOCK,
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
                        dir: self.dir.clone(),
                        owner: owner.to_string(),
                    });
                }
                Err((_, e)) => return Err(lock_failure(path, e)),
            }
        }
    }

    /// Whether this instance synced the directory after lease file `name`
    /// (inode `ino`) existed.
    fn name_durable(&self, name: &str, ino: u64) -> bool {
        let named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        named.get(name) == Some(&ino)
    }

    fn mark_name_durable(&self, name: &str, ino: u64) {
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if named.len() >= MAX_ARMED && !named.contains_key(name) {
            named.clear();
        }
        named.insert(name.to_owned(), ino);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Opens the lease file `name` inside the directory opened at start-up,
    /// never following a symlink, and checks it is a regular file.
    /// Only `write` opens it for writing; only `create` creates it.
    pub(crate) fn open_file(
        &self,
        name: &str,
        create: bool,
        write: bool,
    ) -> Result<Opened, LeaseFileError> {
        let access = if write {
            OFlag::O_RDWR
        } else {
            OFlag::O_RDONLY
        };
        let mut flags = access | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        if create {
            flags |= OFlag::O_CREAT;
        }
        let fd = match nix::fcntl::openat(&self.dir_fd, name, flags, Mode::S_IRUSR | Mode::S_IWUSR)
        {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if !create => return Ok(Opened::Absent),
            Err(Errno::ELOOP) => {
                return Err(LeaseFileError::NotRegular {
                    path: self.path(name),
                    what: "a symbolic link",
                });
            }
            Err(Errno::EISDIR) => {
                return Err(LeaseFileError::NotRegular {
                    path: self.path(name),
                    what: "a directory",
                });
            }
            Err(Errno::ENXIO) => {
                return Err(LeaseFileError::NotRegular {
                    path: self.path(name),
                    what: "a socket or device",
                });
            }
            Err(e) => return Err(LeaseFileError::io("opening", self.path(name), e)),
        };
        // The file type is checked lazily, in `read`: only a regular file
        // yields a valid record, so the common case needs no fstat.
        Ok(Opened::File(File::from(fd)))
    }

    /// One non-blocking attempt, exclusive unless `shared`: `Ok(Err(file))`
    /// when another open file description holds a conflicting lock.
    pub(crate) fn try_lock(
        &self,
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
                Err((_, e)) => return Err(lock_failure(self.path(name), e)),
            }
        }
    }

    /// Blocks (this thread only) until the lock is ours or the lock timeout
    /// passes, polling with a growing back-off.
    pub(crate) fn wait_lock(
        &self,
        mut file: File,
        name: &str,
        shared: bool,
        abandoned: &AtomicBool,
    ) -> Result<Option<Flock<File>>, LeaseFileError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            if abandoned.load(Ordering::Acquire) {
                return Ok(None);
            }
            file = match self.try_lock(file, name, shared)? {
                Ok(locked) => return Ok(Some(locked)),
                Err(file) => file,
            };
            let waited = start.elapsed();
            if waited >= self.lock_timeout {
                return Err(LeaseFileError::LockTimeout {
                    path: self.path(name),
                    waited,
                });
            }
            // A little jitter keeps pollers from waking in lock-step.
            let jitter = Duration::from_nanos(u64::from(start.elapsed().subsec_nanos() % 50_000));
            std::thread::sleep((pause + jitter).min(self.lock_timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(4));
        }
    }

    /// A new reservation: the token `max(token, ceiling, floor) + 1` — past
    /// every token a lost write could have issued and past `floor` — and a
    /// ceiling `reservation - 1` above it, to be synced before answering
    /// (token, ceiling, sync, arm).
    fn reserve_above(
        &self,
        record: Option<&Record>,
        floor: u64,
    ) -> Result<(u64, u64, bool, Option<u64>), LeaseError> {
        let token = record
            .map_or(0, |r| r.token.max(r.reserved))
            .max(floor)
            .checked_add(1)
            .ok_or_else(|| LeaseError::invalid("fencing tokens exhausted for this session"))?;
        let ceiling = token.saturating_add(self.reservation - 1);
        Ok((token, ceiling, true, Some(ceiling)))
    }

    /// Under the lock: checks the directory still is the one opened, reads
    /// the record, and decides what to write and answer.
    pub(crate) fn plan(&self, file: &File, name: &str, op: &Op) -> Result<Plan, LeaseError> {
        self.check_dir_if_due()?;
        let record = self.read(file, name)?;
        if let Some(r) = &record
            && r.session != *op.session()
        {
            return Err(LeaseFileError::SessionMismatch {
                path: self.path(name),
                found: r.session.to_string(),
                expected: op.session().to_string(),
            }
            .into());
        }
        let now_time = self.clock.now();
        let now = to_nanos(now_time)?;
        let now_mono = self.mono_nanos();
        let expiry = || {
            now_time
                .checked_add(self.ttl)
                .ok_or_else(|| LeaseError::invalid("TTL overflows the clock"))
                .and_then(to_nanos)
        };
        let mono_expiry =
            now_mono.saturating_add(u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX));
        // Live: on this boot's monotonic clock when the record was written in
        // this boot, so wall-clock steps move nothing; on the wall clock only
        // across a reboot (or for records of older versions).
        let left = |r: &Record| {
            let nanos = if self.judged_on_monotonic(r) {
                r.mono_expiry_nanos.saturating_sub(now_mono)
            } else {
                r.expiry_nanos.saturating_sub(now)
            };
            Duration::from_nanos(nanos)
        };
        let live = |r: &Record| !left(r).is_zero();
        let nothing = |reply| Plan {
            write: None,
            sync: false,
            arm: None,
            reply,
        };
        Ok(match op {
            Op::Acquire(session, owner, floor) => {
                // Armed: this instance reserved the current ceiling itself,
                // after any host crash that could have rolled the file back,
                // and saw it synced; so the record's token is the latest
                // issued and every token up to the ceiling is ours to hand
                // out without a sync.
                let armed = |r: &Record| self.armed_ceiling(name) == Some(r.reserved);
                let (token, reserved, sync, arm) = match &record {
                    Some(
                        r @ Record {
                            owner: Some(holder),
                            ..
                        },
                    ) if live(r) => {
                        if holder != owner {
                            return Ok(nothing(Err(LeaseError::held(Some(holder.clone())))));
                        }
                        if r.token > *floor {
                            // The live holder re-acquiring keeps its epoch.
                            // Sync unless the ceiling is known durable: the
                            // token may come from a reservation whose
                            // fdatasync failed.
                            (r.token, r.reserved, !armed(r), None)
                        } else {
                            // Its token is at or below a store's mark: a
                            // new, greater one, reserved past the floor.
                            self.reserve_above(record.as_ref(), *floor)?
                        }
                    }
                    Some(r) if r.holder_lost && live(r) => {
                        return Ok(nothing(Err(LeaseError::held(None))));
                    }
                    Some(r)
                        if r.token < r.reserved
                            && r.token >= *floor
                            && armed(r)
                            && !r.holder_lost =>
                    {
                        (r.token + 1, r.reserved, false, None)
                    }
                    // Not armed, the reservation used up, or a floor above
                    // it: jump past every token a lost write could have
                    // issued and past the floor, and make the new ceiling
                    // durable before answering.
                    _ => self.reserve_above(record.as_ref(), *floor)?,
                };
                let expiry_nanos = expiry()?;
                Plan {
                    write: Some(Record {
                        session: session.clone(),
                        owner: Some(owner.clone()),
                        holder_lost: false,
                        token,
                        reserved,
                        expiry_nanos,
                        mono_expiry_nanos: mono_expiry,
                        boot_id: self.boot_id,
                    }),
                    sync,
                    arm,
                    reply: Ok(Reply::Granted(Lease::new(
                        session.clone(),
                        owner.clone(),
                        FencingToken::new(token),
                        from_nanos(expiry_nanos),
                    ))),
                }
            }
            Op::Renew(lease) => match record {
                // Ours, live or expired: nobody wrote since (the lock proves
                // it), so extending is safe.
                Some(r)
                    if r.owner.as_ref() == Some(lease.owner())
                        && r.token == lease.token().get() =>
                {
                    let expiry_nanos = expiry()?;
                    Plan {
                        write: Some(Record {
                            expiry_nanos,
                            mono_expiry_nanos: mono_expiry,
                            boot_id: self.boot_id,
                            ..r
                        }),
                        sync: false,
                        arm: None,
                        reply: Ok(Reply::Granted(lease.with_expiry(from_nanos(expiry_nanos)))),
                    }
                }
                Some(r) if live(&r) => nothing(Err(LeaseError::held(r.owner))),
                _ => nothing(Err(LeaseError::held(None))),
            },
            // Judged exactly as acquire judges it: reported live here means
            // another owner's acquire would be refused now. The expiry is
            // counted on the clock that judged it, from now, so a wall-clock
            // step since the write does not show in it.
            Op::Current(session) => match record {
                Some(r) if live(&r) => match &r.owner {
                    Some(holder) => nothing(Ok(Reply::Current(Some(Lease::new(
                        session.clone(),
                        holder.clone(),
                        FencingToken::new(r.token),
                        now_time + left(&r),
                    ))))),
                    // Held, but a torn write lost the holder's name: a
                    // lease cannot be reported without one.
                    None => nothing(Err(LeaseError::held(None))),
                },
                _ => nothing(Ok(Reply::Current(None))),
            },
            Op::Release(lease) => match record {
                Some(r)
                    if r.owner.as_ref() == Some(lease.owner())
                        && r.token == lease.token().get() =>
                {
                    Plan {
                        // The token and the ceiling stay: the next grant must
                        // exceed the token.
                        write: Some(Record {
                            owner: None,
                            expiry_nanos: 0,
                            mono_expiry_nanos: 0,
                            ..r
                        }),
                        sync: false,
                        arm: None,
                        reply: Ok(Reply::Released),
                    }
                }
                _ => nothing(Ok(Reply::Released)),
            },
        })
    }

    /// Writes the planned record in place (fdatasync when planned) and
    /// returns the planned answer. The lock is released when `file` drops.
    pub(crate) fn apply(&self, file: &File, name: &str, plan: Plan) -> Result<Reply, LeaseError> {
        if let Some(record) = &plan.write {
            let bytes = record.encode();
            file.write_all_at(&bytes, 0)
                .map_err(|e| LeaseFileError::io("writing", self.path(name), e))?;
            let mut dir_synced = false;
            if plan.sync {
                file.sync_data()
                    .map_err(|e| LeaseFileError::io("syncing", self.path(name), e))?;
                // The name must be durable too, or a power loss takes the
                // file and its tokens away. Whoever created the file may
                // have died (or failed) before syncing the directory, so
                // every synced write syncs it until this instance has done
                // so itself for this file.
                let ino = nix::sys::stat::fstat(file)
                    .map_err(|e| LeaseFileError::io("inspecting", self.path(name), e))?
                    .st_ino;
                if !self.name_durable(name, ino) {
                    nix::unistd::fsync(&self.dir_fd)
                        .map_err(|e| LeaseFileError::io("syncing", self.dir.clone(), e))?;
                    self.mark_name_durable(name, ino);
                    dir_synced = true;
                }
            }
            #[cfg(test)]
            crate::crash_sim::wrote(&self.path(name), &bytes, plan.sync, dir_synced);
            #[cfg(not(test))]
            let _ = dir_synced;
            if let Some(ceiling) = plan.arm {
                // Still under the lock: nobody can have written since.
                self.arm(name, ceiling);
            }
        }
        plan.reply
    }

    fn read(&self, file: &File, name: &str) -> Result<Option<Record>, LeaseFileError> {
        let mut buf = [0u8; RECORD_LEN + 1];
        let mut len = 0;
        let read = loop {
            match file.read_at(&mut buf[len..], len as u64) {
                // A short read of a regular file is its end: a whole record
                // needs no second call to see EOF.
                Ok(n) if len + n == RECORD_LEN => break Ok(len + n),
                Ok(0) => break Ok(len),
                Ok(n) => {
                    len += n;
                    if len == buf.len() {
                        break Ok(len);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let decoded = match read {
            Ok(len) => Record::decode(&self.path(name), &buf[..len]),
            Err(e) => Err(LeaseFileError::io("reading", self.path(name), e)),
        };
        match decoded {
            Ok(Some(record)) => Ok(Some(record)),
            // Empty, unreadable or undecodable: make sure it is a regular
            // file before trusting (or blaming) its contents.
            other => {
                let st = nix::sys::stat::fstat(file)
                    .map_err(|e| LeaseFileError::io("inspecting", self.path(name), e))?;
                if !is_kind(&st, SFlag::S_IFREG) {
                    return Err(LeaseFileError::NotRegular {
                        path: self.path(name),
                        what: kind_name(&st),
                    });
                }
                other
            }
        }
    }

    /// [`check_dir`](Self::check_dir), at most once per check interval.
    fn check_dir_if_due(&self) -> Result<(), LeaseFileError> {
        let now = u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let last = self.dir_checked.load(Ordering::Relaxed);
        let interval = u64::try_from(self.dir_check_interval.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < interval {
            return Ok(());
        }
        self.check_dir()?;
        self.dir_checked.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// The directory path must still name the directory opened at start-up:
    /// processes resolving the path now must meet the same lock files.
    fn check_dir(&self) -> Result<(), LeaseFileError> {
        match nix::sys::stat::lstat(&self.dir) {
            Ok(st) if (st.st_dev, st.st_ino) == self.dir_id => Ok(()),
            Ok(st) => Err(LeaseFileError::DirReplaced {
                path: self.dir.clone(),
                detail: format!("it is now {}", kind_name(&st)),
            }),
            Err(e) => Err(LeaseFileError::DirReplaced {
                path: self.dir.clone(),
                detail: e.desc().to_owned(),
            }),
        }
    }

    /// The whole operation on the calling thread, waiting for the lock as
    /// long as the lock timeout allows.
    pub(crate) fn run_blocking(
        &self,
        op: &Op,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        let name = file_name(op.session());
        let file = match self.open_file(&name, op.creates_file(), !op.reads_only())? {
            Opened::File(f) => f,
            Opened::Absent => return op.reply_without_file(),
        };
        self.wait_plan_apply(file, &name, op, abandoned)
    }

    /// Waits for the lock, decides and writes — unless the caller gave up
    /// first: then nothing is written.
    fn wait_plan_apply(
        &self,
        file: File,
        name: &str,
        op: &Op,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        let Some(locked) = self.wait_lock(file, name, op.reads_only(), abandoned)? else {
            return Err(abandoned_error());
        };
        let plan = self.plan(&locked, name, op)?;
        self.apply_unless_abandoned(&locked, name, plan, abandoned)
    }

    fn apply_unless_abandoned(
        &self,
        file: &File,
        name: &str,
        plan: Plan,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        // Under the lock: a caller that gave up before this point never
        // sees a write land after it stopped waiting.
        if abandoned.load(Ordering::Acquire) {
            return Err(abandoned_error());
        }
        self.apply(file, name, plan)
    }

    /// The fast path: everything up to the point where the thread would have
    /// to wait (for the lock, or for fdatasync). Returns what is left.
    pub(crate) fn run_until_wait(&self, op: &Op) -> Result<Step, LeaseError> {
        let name = file_name(op.session());
        let file = match self.open_file(&name, op.creates_file(), !op.reads_only())? {
            Opened::File(f) => f,
            Opened::Absent => return op.reply_without_file().map(Step::Done),
        };
        let locked = match self.try_lock(file, &name, op.reads_only())? {
            Ok(locked) => locked,
            Err(file) => return Ok(Step::WaitLock(file, name)),
        };
        let plan = self.plan(&locked, &name, op)?;
        if plan.needs_sync() {
            return Ok(Step::Sync(locked, name, plan));
        }
        self.apply(&locked, &name, plan).map(Step::Done)
    }

    /// Finishes what [`run_until_wait`](Self::run_until_wait) left; blocks.
    pub(crate) fn finish(
        &self,
        step: Step,
        op: &Op,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        match step {
            Step::Done(reply) => Ok(reply),
            Step::WaitLock(file, name) => self.wait_plan_apply(file, &name, op, abandoned),
            Step::Sync(locked, name, plan) => {
                self.apply_unless_abandoned(&locked, &name, plan, abandoned)
            }
        }
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

/// What an operation whose caller gave up answers (to nobody).
fn abandoned_error() -> LeaseError {
    LeaseError::transient("lease file operation abandoned by its caller")
}

/// Where the fast path stopped.
pub(crate) enum Step {
    Done(Reply),
    WaitLock(File, String),
    Sync(Flock<File>, String, Plan),
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_port::LeaseErrorKind;

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
