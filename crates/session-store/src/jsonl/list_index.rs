//! The listing index: which sessions are live, shared by the processes of
//! a directory through a log, `<dir>/.session-index`, and kept sorted in
//! memory by each store instance, so that a page is a range of a sorted
//! map instead of a scan of the directory and a look into every file.
//!
//! The log's first line names the boot it was written in; then `+<id>`
//! (live), `-<id>` (not live), `?<id>` (a change is under way, or was cut
//! short: the file decides) and `m <dev> <ino> <ctime>` lines (a marker:
//! the directory's identity and change time after a change). The last line
//! about an id wins.
//!
//! Why a page may believe the log:
//! - Every line about a session is written while its file's `flock` is
//!   held (a new file is locked before it is linked into place), and a
//!   change of liveness is preceded by `?`: whoever dies between a change
//!   and its outcome line leaves `?`, never a stale answer. A page checks
//!   each `?` against the file, under its lock, and records what it found.
//! - Changes of the directory's entries (linking a new file, removing a
//!   reclaimed one, the generation record) happen under
//!   `<dir>/.session-index.lock` held exclusively, followed by a marker, and
//!   only when the log was trusted just before: a change made behind the
//!   log's back (a file copied in or removed by hand, a crash between a
//!   link and its marker, a version of the store that kept no index)
//!   moves the directory's change time, so the last marker no longer
//!   matches, and no later writer marks over it. The change time (`ctime`)
//!   is used rather than the modification time because no program can set
//!   it: a backup put back, even with its times restored, moves it, and a
//!   copy has another inode. The log is then rebuilt from the directory's
//!   names, every id `?`.
//! - A log from another boot may have lost lines a power loss never wrote,
//!   so it is rebuilt too: nothing in the log needs to be synced.
//!
//! Where the directory cannot be written (a read-only store), an index is
//! built in memory from the directory's names, every id `?`, and rebuilt
//! when the directory changes.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use lease_port::SessionId;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::locking::{AttemptError, Wait};
use super::{FILE_SUFFIX, StoreCore, lock, open_flags, tmp_name};
use crate::StoreError;

/// The log of which sessions are live.
pub(super) const INDEX_FILE_NAME: &str = ".session-index";
/// Held by every writer of the log; never replaced, unlike the log.
pub(super) const LOCK_FILE_NAME: &str = ".session-index.lock";
/// A log longer than this many lines beyond twice its ids is rewritten:
/// the log then stays within a few times the live set, and a rewrite
/// happens at most once per this many changes.
#[cfg(not(test))]
const COMPACT_SLACK: u64 = 4096;
/// Small in tests, so that compaction is reached quickly.
#[cfg(test)]
pub(super) const COMPACT_SLACK: u64 = 64;

/// The longest pause between attempts to take the index lock: its holders
/// hold it for a few system calls (a rebuild aside), so a waiter looks
/// again soon rather than lose its turn to a stream of others.
const MAX_PAUSE: Duration = Duration::from_millis(2);

/// What the index knows of a session it lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Live {
    Yes,
    /// Its file decides: a change was under way, or the index was rebuilt.
    Unsure,
}

/// The directory as a marker names it: device, inode, change time (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    dev: u64,
    ino: u64,
    ctime: i128,
}

impl Marker {
    /// The marker's line in the log.
    pub(super) fn line(&self) -> String {
        format!("m {} {} {}\n", self.dev, self.ino, self.ctime)
    }
}

/// What one store instance has read of the log.
#[derive(Debug, Default)]
pub(super) struct ListIndex {
    pub(super) ids: BTreeMap<SessionId, Live>,
    /// The log file read (device, inode), how far, and how many lines.
    file: Option<(u64, u64)>,
    read: u64,
    lines: u64,
    /// The last marker read; `None` until one is.
    marker: Option<Marker>,
    /// Built from the directory without a log (it could not be written):
    /// every id is `Unsure`, and nothing is recorded.
    pub(super) memory_only: bool,
}

/// The index lock, until dropped; `None` where the lock file neither
/// exists nor can be made (a read-only directory that never had an index).
pub(super) type IndexGuard = Option<Flock<File>>;

/// This boot's id: a log written in another boot may have lost lines.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn header() -> String {
    format!("session-index 2 {}\n", boot_id())
}

/// Errors that say the directory cannot be written here.
fn read_only(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
    ) || e.raw_os_error() == Some(Errno::EPERM as i32)
}

/// Test hook: directories whose change time reads as frozen, as a file
/// system whose clock did not tick between two changes leaves it.
#[cfg(test)]
pub(super) static FROZEN: std::sync::Mutex<Vec<(std::path::PathBuf, Marker)>> =
    std::sync::Mutex::new(Vec::new());

impl StoreCore {
    fn index_path(&self) -> std::path::PathBuf {
        self.dir.join(INDEX_FILE_NAME)
    }

    /// The directory's marker now.
    pub(super) fn dir_marker(&self) -> Result<Marker, StoreError> {
        #[cfg(test)]
        if let Some((_, m)) = lock(&FROZEN).iter().find(|(d, _)| *d == self.dir) {
            return Ok(*m);
        }
        let m = self
            .dir_file
            .metadata()
            .map_err(|e| StoreError::io("inspecting store directory", &self.dir, e))?;
        Ok(Marker {
            dev: m.dev(),
            ino: m.ino(),
            ctime: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }

    /// Takes the index lock, never blocking on an async worker: with
    /// [`Wait::Once`] a taken lock is [`AttemptError::Contended`].
    pub(super) fn lock_index(
        &self,
        exclusive: bool,
        wait: Wait,
    ) -> Result<IndexGuard, AttemptError> {
        let path = self.dir.join(LOCK_FILE_NAME);
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(open_flags())
            .open(&path);
        // A read-only directory: an existing lock file still locks.
        let opened = match opened {
            Err(e) if read_only(&e) => OpenOptions::new()
                .read(true)
                .custom_flags(open_flags())
                .open(&path),
            other => other,
        };
        let mut file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound || read_only(&e) => return Ok(None),
            Err(e) => return Err(StoreError::io("opening the listing index lock", &path, e).into()),
        };
        let arg = if exclusive {
            FlockArg::LockExclusiveNonblock
        } else {
            FlockArg::LockSharedNonblock
        };
        let mut pause = Duration::from_micros(100);
        loop {
            match Flock::lock(file, arg) {
                Ok(l) => return Ok(Some(l)),
                Err((f, Errno::EINTR)) => file = f,
                Err((f, Errno::EWOULDBLOCK)) => {
                    let Wait::Until(deadline) = wait else {
                        return Err(AttemptError::Contended);
                    };
                    let now = Instant::now();
                    if now >= deadline {
                        let timeout = self.opts.lock_timeout;
                        return Err(StoreError::Busy { path, timeout }.into());
                    }
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(MAX_PAUSE);
                    file = f;
                }
                Err((_, errno)) => {
                    let e = StoreError::io("locking the listing index", &path, errno.into());
                    return Err(e.into());
                }
            }
        }
    }

    /// Appends `line` to the log, when there is one: without it the next
    /// listing rebuilds it from the directory anyway. The caller holds the
    /// index lock.
    fn log_index(&self, line: &str) -> Result<(), StoreError> {
        let path = self.index_path();
        let file = OpenOptions::new()
            .append(true)
            .custom_flags(open_flags())
            .open(&path);
        match file {
            // One `write` of a whole line: appends of several processes
            // never interleave within a line.
            Ok(mut f) => f
                .write_all(line.as_bytes())
                .map_err(|e| StoreError::io("writing the listing index", &path, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("opening the listing index", &path, e)),
        }
    }

    /// Records `session` as live (`Some(Live::Yes)`), unsure, or not live
    /// (`None`), under the index lock shared. The caller holds the
    /// session file's lock, so nothing changes the session meanwhile.
    ///
    /// Before a change of liveness `wait` applies and a failure refuses the
    /// change (a change the log would not know of is not made); the
    /// outcome after it and what a page verified are written only when the
    /// lock is free at once, since leaving `?` is always safe.
    pub(super) fn log_session(
        &self,
        session: &SessionId,
        live: Option<Live>,
        wait: Wait,
    ) -> Result<(), AttemptError> {
        #[cfg(test)]
        if self
            .skip_outcomes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(());
        }
        let _shared = self.lock_index(false, wait)?;
        self.log_session_locked(session, live)?;
        Ok(())
    }

    /// Logs `?` for `session` before a change of its liveness, under the
    /// index lock `held` (taken, with the caller's wait, before the session
    /// file's lock), released at once: the change itself may sync, and
    /// the exclusive lock (creations, rebuilds) need not wait for it. When
    /// `held` was used up (the file had to be reopened and this runs
    /// again) the lock is only tried. A failure refuses the change.
    pub(super) fn log_unsure(
        &self,
        session: &SessionId,
        held: &mut Option<IndexGuard>,
    ) -> Result<(), StoreError> {
        let guard = match held.take() {
            Some(guard) => guard,
            None => match self.lock_index(false, Wait::Once) {
                Ok(guard) => guard,
                Err(AttemptError::Store(e)) => return Err(e),
                Err(AttemptError::Contended) => {
                    return Err(StoreError::Busy {
                        path: self.dir.join(LOCK_FILE_NAME),
                        timeout: self.opts.lock_timeout,
                    });
                }
            },
        };
        let logged = self.log_session_locked(session, Some(Live::Unsure));
        drop(guard);
        logged
    }

    /// [`log_session`](Self::log_session) for a caller holding the index
    /// lock exclusively.
    pub(super) fn log_session_locked(
        &self,
        session: &SessionId,
        live: Option<Live>,
    ) -> Result<(), StoreError> {
        let sign = match live {
            Some(Live::Yes) => '+',
            Some(Live::Unsure) => '?',
            None => '-',
        };
        self.log_index(&format!("{sign}{}\n", json(session)))
    }

    /// Whether the log, as this instance has read it, describes the
    /// directory as it is now. Under the index lock.
    pub(super) fn index_trusted(&self, ix: &mut ListIndex) -> Result<bool, StoreError> {
        if ix.memory_only {
            return Ok(ix.marker == Some(self.dir_marker()?));
        }
        Ok(self.catch_up(ix)? && ix.marker == Some(self.dir_marker()?))
    }

    /// Runs `change`, a change of the directory's entries, under the index
    /// lock held exclusively, and marks the log after it when the log was
    /// trusted before it: a change made behind the log's back before this
    /// one stays visible (the marker stays behind).
    pub(super) fn changing_dir<R>(
        &self,
        wait: Wait,
        change: impl FnOnce() -> Result<R, AttemptError>,
    ) -> Result<R, AttemptError> {
        let guard = self.lock_index(true, wait)?;
        let trusted = guard.is_some() && {
            let mut ix = lock(&self.list_index);
            // What this instance built in memory says nothing of the log.
            if ix.memory_only {
                *ix = ListIndex::default();
            }
            self.index_trusted(&mut ix)?
        };
        let changed = change();
        if trusted {
            // A marker not written costs a listing a rebuild.
            let _ = self.log_marker();
        }
        changed
    }

    fn log_marker(&self) -> Result<(), StoreError> {
        self.log_index(&self.dir_marker()?.line())
    }

    /// Brings this instance's index up to date: reads what the log gained
    /// since, compacts a long log, and rebuilds it from the directory (in
    /// memory when the directory cannot be written) when it cannot be
    /// trusted.
    pub(super) fn refresh_index(&self, wait: Wait) -> Result<(), AttemptError> {
        {
            // No lock: the log is read before the directory's marker, and
            // every change of the directory logs its `?` before it is made
            // and its marker after, so a log read that matches the marker
            // is the directory at that instant; one caught mid-change does
            // not match and is looked at again under the lock.
            let mut ix = lock(&self.list_index);
            if self.index_trusted(&mut ix)? {
                let long = ix.lines > 2 * ix.ids.len() as u64 + COMPACT_SLACK;
                if !long || ix.memory_only {
                    return Ok(());
                }
            }
        }
        let exclusive = self.lock_index(true, wait)?;
        let mut ix = lock(&self.list_index);
        // Someone else may have rebuilt it meanwhile.
        if self.index_trusted(&mut ix)? {
            if ix.lines <= 2 * ix.ids.len() as u64 + COMPACT_SLACK || exclusive.is_none() {
                return Ok(());
            }
            let ids = std::mem::take(&mut ix.ids);
            // Compacting only saves reading: when it cannot be written the
            // log read stays good.
            if self.write_log(&mut ix, ids).is_err() {
                *ix = ListIndex::default();
            }
            return Ok(());
        }
        let before = self.dir_marker()?;
        let ids = self.scan_names()?;
        let ids = if exclusive.is_some() {
            match self.write_log(&mut ix, ids) {
                Ok(()) => return Ok(()),
                Err(LogError::ReadOnly(ids)) => ids,
                Err(LogError::Store(e)) => return Err(e.into()),
            }
        } else {
            ids
        };
        in_memory(&mut ix, ids, before);
        Ok(())
    }

    /// Reads the log from where `ix` stopped. False when it cannot be
    /// trusted: missing, from another boot, or with a line that is not a
    /// line of the log. A last line still being written is left for later.
    fn catch_up(&self, ix: &mut ListIndex) -> Result<bool, StoreError> {
        let path = self.index_path();
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(open_flags())
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound || read_only(&e) => return Ok(false),
            Err(e) => return Err(StoreError::io("opening the listing index", &path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting the listing index", &path, e))?;
        let id = (meta.dev(), meta.ino());
        if ix.file != Some(id) || meta.len() < ix.read {
            *ix = ListIndex {
                file: Some(id),
                ..ListIndex::default()
            };
        }
        let mut buf = vec![0u8; (meta.len() - ix.read) as usize];
        file.read_exact_at(&mut buf, ix.read)
            .map_err(|e| StoreError::io("reading the listing index", &path, e))?;
        let ok = apply(ix, &buf);
        if !ok {
            ix.file = None;
        }
        Ok(ok)
    }

    /// Every session file's id in the directory, each `Unsure`.
    fn scan_names(&self) -> Result<BTreeMap<SessionId, Live>, StoreError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
        let mut ids = BTreeMap::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            if name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let Some(stem) = name.strip_suffix(FILE_SUFFIX) else {
                continue;
            };
            if let Some(session) = self.session_named(name, stem) {
                ids.insert(session, Live::Unsure);
            }
        }
        Ok(ids)
    }

    /// Replaces the log with one holding `ids` and the directory's marker
    /// once it is in place, and makes `ix` that log. Under the exclusive
    /// index lock. A directory that cannot be written hands `ids` back.
    fn write_log(
        &self,
        ix: &mut ListIndex,
        ids: BTreeMap<SessionId, Live>,
    ) -> Result<(), LogError> {
        let mut text = header();
        for (id, live) in &ids {
            text.push(if *live == Live::Yes { '+' } else { '?' });
            text.push_str(&json(id));
            text.push('\n');
        }
        let tmp = self.dir.join(tmp_name("index"));
        let path = self.index_path();
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(open_flags())
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            std::fs::rename(&tmp, &path)?;
            Ok::<_, io::Error>(f)
        })();
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                if read_only(&e) {
                    return Err(LogError::ReadOnly(ids));
                }
                return Err(StoreError::io("writing the listing index", &path, e).into());
            }
        };
        let marker = self.dir_marker()?;
        self.log_marker()?;
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting the listing index", &path, e))?;
        *ix = ListIndex {
            lines: ids.len() as u64 + 2,
            ids,
            file: Some((meta.dev(), meta.ino())),
            read: meta.len(),
            marker: Some(marker),
            memory_only: false,
        };
        Ok(())
    }
}

/// Why a log could not be written.
enum LogError {
    /// The directory cannot be written: the ids, to keep in memory.
    ReadOnly(BTreeMap<SessionId, Live>),
    Store(StoreError),
}

impl From<StoreError> for LogError {
    fn from(e: StoreError) -> Self {
        LogError::Store(e)
    }
}

/// Makes `ix` an index of `ids` kept in memory only, good while the
/// directory's marker stays `before` (read before the names were).
fn in_memory(ix: &mut ListIndex, ids: BTreeMap<SessionId, Live>, before: Marker) {
    *ix = ListIndex {
        ids,
        marker: Some(before),
        memory_only: true,
        ..ListIndex::default()
    };
}

fn json(session: &SessionId) -> String {
    serde_json::to_string(session.as_str()).unwrap_or_default()
}

/// Applies the whole lines of `buf` (the log from `ix.read` on) to `ix`.
/// False at anything that is not a line of the log.
fn apply(ix: &mut ListIndex, buf: &[u8]) -> bool {
    let mut at = 0;
    while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(&buf[at..at + nl]) else {
            return false;
        };
        let ok = if ix.read == 0 && at == 0 {
            line.strip_prefix("session-index 2 ")
                .is_some_and(|boot| !boot.is_empty() && boot == boot_id())
        } else if let Some(m) = line.strip_prefix("m ") {
            parse_marker(m).map(|m| ix.marker = Some(m)).is_some()
        } else if let Some(id) = line.strip_prefix('+') {
            parse_id(id)
                .map(|id| ix.ids.insert(id, Live::Yes))
                .is_some()
        } else if let Some(id) = line.strip_prefix('?') {
            parse_id(id)
                .map(|id| ix.ids.insert(id, Live::Unsure))
                .is_some()
        } else if let Some(id) = line.strip_prefix('-') {
            parse_id(id).map(|id| ix.ids.remove(&id)).is_some()
        } else {
            false
        };
        if !ok {
            return false;
        }
        at += nl + 1;
        ix.lines += 1;
    }
    // Nothing whole yet: not even a header.
    if ix.read == 0 && at == 0 {
        return false;
    }
    ix.read += at as u64;
    true
}

fn parse_marker(text: &str) -> Option<Marker> {
    let mut parts = text.split(' ');
    let marker = Marker {
        dev: parts.next()?.parse().ok()?,
        ino: parts.next()?.parse().ok()?,
        ctime: parts.next()?.parse().ok()?,
    };
    parts.next().is_none().then_some(marker)
}

fn parse_id(text: &str) -> Option<SessionId> {
    let id: String = serde_json::from_str(text).ok()?;
    SessionId::new(id).ok()
}
