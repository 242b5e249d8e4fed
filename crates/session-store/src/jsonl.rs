//! The JSONL directory store.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write as _};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use lease_port::{Clock, FencingToken, SessionId, SystemClock};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::Deserialize;
use serde_json::Value;
use tracing::warn;

use crate::{
    AppendReceipt, Page, SessionStore, StoreError, StoreErrorKind, StoredEvent, WriteFence,
};

/// The subdirectory of a store directory where the server keeps file
/// leases (`flocklease`). [`JsonlStore::list`](SessionStore::list) ignores
/// it, like every name starting with `.`.
pub const LEASE_DIR_NAME: &str = ".session-leases";

/// Suffix of session files.
pub const FILE_SUFFIX: &str = ".jsonl";

/// The largest serialised event accepted, by default.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Session files kept open (with their index) by default.
pub const DEFAULT_MAX_OPEN: usize = 1024;

/// How long a call waits for a session's lock by default before giving up
/// with [`StoreErrorKind::Busy`](crate::StoreErrorKind::Busy).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The most bytes of stored lines one page reads by default.
pub const DEFAULT_MAX_PAGE_BYTES: usize = 4 << 20;

/// First and longest pause between attempts to take a contended lock.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(50);

const FORMAT_VERSION: u64 = 1;

/// When appends reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FsyncPolicy {
    /// `fdatasync` after every write, before it is acknowledged (and the
    /// directory after a file is created). Every store call then runs on
    /// tokio's blocking pool.
    Always,
    /// `fdatasync` after a write when at least this long has passed since
    /// the session file's last sync. Writes after the last sync are lost by
    /// a crash (of the machine, not of the process).
    Interval(Duration),
    /// Leave it to the kernel.
    Never,
}

/// Configures a [`JsonlStore`].
#[derive(Debug, Clone)]
pub struct JsonlOptions {
    fsync: FsyncPolicy,
    allow_unfenced: bool,
    cross_process: bool,
    max_event_bytes: usize,
    max_open: usize,
    lock_timeout: Duration,
    max_page_bytes: usize,
    clock: Arc<dyn Clock>,
}

impl Default for JsonlOptions {
    fn default() -> Self {
        Self {
            fsync: FsyncPolicy::Always,
            allow_unfenced: false,
            cross_process: true,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_open: DEFAULT_MAX_OPEN,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            max_page_bytes: DEFAULT_MAX_PAGE_BYTES,
            clock: Arc::new(SystemClock),
        }
    }
}

impl JsonlOptions {
    /// When writes reach the disk. Default [`FsyncPolicy::Always`].
    pub fn fsync(mut self, policy: FsyncPolicy) -> Self {
        self.fsync = policy;
        self
    }

    /// Accept [`WriteFence::Unfenced`] writes (to sessions that never
    /// accepted a fenced one). Default false. Enable it only when the
    /// deployment proves that a single process uses the directory.
    pub fn allow_unfenced(mut self, allow: bool) -> Self {
        self.allow_unfenced = allow;
        self
    }

    /// Take an exclusive `flock` on the session file around every
    /// check-and-append (shared around reads), so several processes can use
    /// one directory. Default true. Turning it off saves two system calls
    /// per operation and is safe only when one process uses the directory.
    pub fn cross_process(mut self, on: bool) -> Self {
        self.cross_process = on;
        self
    }

    /// The largest serialised event accepted. Default 1 MiB.
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// How many session files to keep open with their in-memory index.
    /// Default 1024.
    pub fn max_open(mut self, files: usize) -> Self {
        self.max_open = files.max(1);
        self
    }

    /// How long a call waits for a session that someone else has locked
    /// (another process holding its file lock, or a slow call of this
    /// process while [`cross_process`](Self::cross_process) is on) before
    /// failing with [`StoreErrorKind::Busy`](crate::StoreErrorKind::Busy).
    /// Default 5 s ([`DEFAULT_LOCK_TIMEOUT`]).
    ///
    /// The wait happens on tokio's blocking pool, never on an async worker
    /// thread: a process stopped while holding a session's lock delays only
    /// the calls for that session, and only this long.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The most bytes of stored lines (an event's payload plus about 60
    /// bytes of framing) one [`read`](SessionStore::read) returns, besides
    /// its `limit` on the count. A page always holds at least one event,
    /// however large, so a reader always progresses; `next_seq` says where
    /// the rest starts. Default 4 MiB ([`DEFAULT_MAX_PAGE_BYTES`]).
    pub fn max_page_bytes(mut self, bytes: usize) -> Self {
        self.max_page_bytes = bytes;
        self
    }

    /// The clock event timestamps come from. Default the system clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

/// One session file per session in a directory; every write fenced.
///
/// Cheap to clone; clones share the open files and indexes. Any number of
/// processes may open the same directory (with the default
/// [`cross_process`](JsonlOptions::cross_process)).
#[derive(Clone, Debug)]
pub struct JsonlStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    dir_file: File,
    opts: JsonlOptions,
    slots: Mutex<HashMap<SessionId, Arc<Entry>>>,
    /// Session ids read from the headers of files [`list`] found, by file
    /// name, so a listing does not open every file to learn them again.
    ///
    /// [`list`]: SessionStore::list
    names: Mutex<HashMap<String, SessionId>>,
    tmp_counter: AtomicU64,
    /// Test hook: how many of the next data syncs fail.
    #[cfg(test)]
    fail_syncs: std::sync::atomic::AtomicU32,
}

/// An open session: its file name outside the lock, its state inside.
#[derive(Debug)]
struct Entry {
    path: Arc<Path>,
    state: Mutex<Slot>,
}

#[derive(Debug, Default)]
struct Slot {
    file: Option<File>,
    view: View,
}

/// How long a call may wait for a session's locks.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Not at all: on an async worker thread, where a contended lock sends
    /// the call to the blocking pool ([`Fail::Contended`]).
    Once,
    /// Until this instant, retrying with short pauses, then `Busy`.
    Until(Instant),
}

/// A failed attempt: a store error, or a lock someone else holds.
#[derive(Debug)]
enum Fail {
    Store(StoreError),
    /// Only with [`Wait::Once`]; nothing was done.
    Contended,
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Store(e)
    }
}

/// What the store knows of a session file up to `pos`, the end of its
/// last complete line.
#[derive(Debug)]
struct View {
    valid: bool,
    pos: u64,
    lines: u64,
    id: Option<String>,
    live: bool,
    next_seq: u64,
    mark: Option<u64>,
    /// The current incarnation's events.
    events: Vec<Ev>,
    /// Bytes after `pos` with no line end: a torn write.
    torn: u64,
    last_sync: Option<Instant>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            valid: false,
            pos: 0,
            lines: 0,
            id: None,
            live: false,
            next_seq: 1,
            mark: None,
            events: Vec::new(),
            torn: 0,
            last_sync: None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Ev {
    seq: u64,
    off: u64,
    len: u64,
}

#[derive(Deserialize)]
struct Rec {
    t: String,
    #[serde(default)]
    v: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    token: Option<u64>,
}

#[derive(Deserialize)]
struct EventLine {
    seq: u64,
    token: Option<u64>,
    ts: u64,
    payload: Value,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn open_flags() -> i32 {
    (OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).bits()
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn json_str(s: &str) -> String {
    // Serialising a str cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

#[derive(Clone, Copy)]
enum LockMode {
    Shared,
    Exclusive,
}

impl JsonlStore {
    /// Opens (creating it, mode 0700, when missing) the store directory.
    ///
    /// Errors: `Invalid` when `dir` exists but is not a directory (or is a
    /// symbolic link); `Io` when it cannot be created or opened.
    pub fn open(dir: impl Into<PathBuf>, opts: JsonlOptions) -> Result<Self, StoreError> {
        let dir = dir.into();
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => {
                return Err(StoreError::invalid(format!(
                    "{} is not a directory (symbolic links are refused)",
                    dir.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| StoreError::io("creating store directory", &dir, e))?;
            }
            Err(e) => return Err(StoreError::io("inspecting store directory", &dir, e)),
        }
        let dir_file = OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&dir)
            .map_err(|e| StoreError::io("opening store directory", &dir, e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                dir,
                dir_file,
                opts,
                slots: Mutex::default(),
                names: Mutex::default(),
                tmp_counter: AtomicU64::new(0),
                #[cfg(test)]
                fail_syncs: std::sync::atomic::AtomicU32::new(0),
            }),
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Where the server keeps file leases for this store:
    /// `<dir>/.session-leases` ([`LEASE_DIR_NAME`]).
    pub fn lease_dir(&self) -> PathBuf {
        self.inner.dir.join(LEASE_DIR_NAME)
    }

    /// The file holding `session`.
    pub fn path_of(&self, session: &SessionId) -> PathBuf {
        self.inner.path(&session_filename::stem(session))
    }

    /// Runs `f` on the calling (async worker) thread when it finds its
    /// locks free, else on tokio's blocking pool, where it may wait for
    /// them up to [`JsonlOptions::lock_timeout`]. When every write syncs it
    /// always runs on the blocking pool.
    ///
    /// `f` returns [`Fail::Contended`] only before it changed anything, so
    /// running it again is safe.
    async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Inner, Wait) -> Result<R, Fail> + Send + 'static,
    {
        if self.inner.opts.fsync != FsyncPolicy::Always {
            match f(&self.inner, Wait::Once) {
                Ok(r) => return Ok(r),
                Err(Fail::Store(e)) => return Err(e),
                Err(Fail::Contended) => {}
            }
        }
        let inner = Arc::clone(&self.inner);
        let task = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + inner.opts.lock_timeout;
            f(&inner, Wait::Until(deadline))
        });
        match task.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(Fail::Store(e))) => Err(e),
            // `Wait::Until` turns contention into `Busy`; kept total anyway.
            Ok(Err(Fail::Contended)) => Err(StoreError::Busy {
                path: self.inner.dir.clone(),
                timeout: self.inner.opts.lock_timeout,
            }),
            Err(e) => Err(StoreError::io(
                "running a blocking store task",
                &self.inner.dir,
                io::Error::other(e.to_string()),
            )),
        }
    }
}

impl Inner {
    fn path(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}{FILE_SUFFIX}"))
    }

    fn slot(&self, session: &SessionId) -> Arc<Entry> {
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(session) {
            return Arc::clone(s);
        }
        if slots.len() >= self.opts.max_open {
            // Forget idle entries (nobody else holds them). Their files are
            // re-read when next used.
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let s = Arc::new(Entry {
            path: self.path(&session_filename::stem(session)).into(),
            state: Mutex::default(),
        });
        slots.insert(session.clone(), Arc::clone(&s));
        s
    }

    /// Runs `body` with the session's slot locked. `body` returns
    /// [`Fail::Contended`] when the file lock is taken; with
    /// [`Wait::Until`] both locks are then tried again after a short pause
    /// (neither held meanwhile) until the deadline, then `Busy`.
    ///
    /// The slot's mutex is only ever held for a bounded time by this
    /// process — except while [`cross_process`](JsonlOptions::cross_process)
    /// is on, when a holder may be waiting for another process — so without
    /// it a blocking-pool call simply waits for the mutex.
    fn with_slot<R>(
        &self,
        session: &SessionId,
        wait: Wait,
        mut body: impl FnMut(&mut Slot, &Path) -> Result<R, Fail>,
    ) -> Result<R, Fail> {
        let entry = self.slot(session);
        let mut pause = FIRST_PAUSE;
        loop {
            let guard = match entry.state.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => match wait {
                    Wait::Until(_) if !self.opts.cross_process => Some(lock(&entry.state)),
                    _ => None,
                },
            };
            let result = match guard {
                Some(mut slot) => body(&mut slot, &entry.path),
                None => Err(Fail::Contended),
            };
            let (Wait::Until(deadline), Err(Fail::Contended)) = (wait, &result) else {
                return result;
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Fail::Store(StoreError::Busy {
                    path: entry.path.to_path_buf(),
                    timeout: self.opts.lock_timeout,
                }));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    fn now_ms(&self) -> u64 {
        millis(self.opts.clock.now())
    }

    fn open_file(&self, path: &Path) -> Result<Option<File>, StoreError> {
        match OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(open_flags())
            .open(path)
        {
            Ok(f) => {
                let meta = f
                    .metadata()
                    .map_err(|e| StoreError::io("inspecting session file", path, e))?;
                if !meta.file_type().is_file() {
                    return Err(StoreError::corrupt(path, None, "not a regular file"));
                }
                Ok(Some(f))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(Errno::ELOOP as i32) => Err(StoreError::corrupt(
                path,
                None,
                "is a symbolic link; refusing to follow it",
            )),
            Err(e) => Err(StoreError::io("opening session file", path, e)),
        }
    }

    /// Makes sure the slot has its file open; false when it does not exist.
    fn ensure_open(&self, slot: &mut Slot, path: &Path) -> Result<bool, StoreError> {
        if slot.file.is_none() {
            match self.open_file(path)? {
                Some(f) => slot.file = Some(f),
                None => {
                    slot.view = View::default();
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Runs `f` with the slot's file locked against other processes (when
    /// configured) and the view brought up to date with the file.
    ///
    /// Never waits for the file lock: when another open file description
    /// holds it, returns [`Fail::Contended`] without running `f`.
    fn locked<R>(
        &self,
        slot: &mut Slot,
        path: &Path,
        expect: Option<&SessionId>,
        mode: LockMode,
        f: impl FnOnce(&File, &mut View) -> Result<R, StoreError>,
    ) -> Result<R, Fail> {
        let Some(file) = slot.file.take() else {
            return Err(StoreError::io(
                "using session file",
                path,
                io::Error::other("file not open"),
            )
            .into());
        };
        let view = &mut slot.view;
        let cross_process = self.opts.cross_process;
        let run = |file: &File, view: &mut View| -> Result<R, StoreError> {
            // Other processes may have appended (or cut a torn line) since
            // we last looked; alone, the view is current once built.
            if cross_process || !view.valid {
                let size = (&mut &*file)
                    .seek(SeekFrom::End(0))
                    .map_err(|e| StoreError::io("inspecting session file", path, e))?;
                refresh(file, path, size, view, expect)?;
            }
            f(file, view)
        };
        if !self.opts.cross_process {
            let r = run(&file, view);
            slot.file = Some(file);
            return Ok(r?);
        }
        let arg = match mode {
            LockMode::Shared => FlockArg::LockSharedNonblock,
            LockMode::Exclusive => FlockArg::LockExclusiveNonblock,
        };
        let mut file = file;
        let locked = loop {
            match Flock::lock(file, arg) {
                Ok(l) => break l,
                Err((f, Errno::EINTR)) => file = f,
                Err((f, errno)) if errno == Errno::EWOULDBLOCK => {
                    slot.file = Some(f);
                    return Err(Fail::Contended);
                }
                Err((f, errno)) => {
                    slot.file = Some(f);
                    let e = StoreError::io("locking session file", path, errno.into());
                    return Err(e.into());
                }
            }
        };
        let r = run(&locked, view);
        match locked.unlock() {
            Ok(f) => slot.file = Some(f),
            Err((l, errno)) => {
                // Closing the file drops the lock; reopen on next use.
                warn!(path = %path.display(), %errno, "unlocking a session file failed; closing it");
                drop(l);
            }
        }
        Ok(r?)
    }

    /// `fdatasync` when the policy says one is due.
    fn sync_after_write(&self, file: &File, view: &mut View) -> io::Result<()> {
        let due = match self.opts.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Never => false,
            FsyncPolicy::Interval(every) => view.last_sync.is_none_or(|t| t.elapsed() >= every),
        };
        if due {
            #[cfg(test)]
            {
                let fail =
                    self.fail_syncs
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                if fail.is_ok() {
                    return Err(io::Error::other("injected fdatasync failure"));
                }
            }
            file.sync_data()?;
            view.last_sync = Some(Instant::now());
        }
        Ok(())
    }

    /// Removes a torn tail before writing after it; appends with O_APPEND
    /// would otherwise glue a new line onto the torn one.
    fn repair(&self, file: &File, path: &Path, view: &mut View) -> Result<(), StoreError> {
        if view.torn > 0 {
            warn!(path = %path.display(), bytes = view.torn, "removing a torn final line left by a crash");
            file.set_len(view.pos)
                .map_err(|e| StoreError::io("truncating a torn line", path, e))?;
            view.torn = 0;
        }
        Ok(())
    }

    /// Writes `bytes` at the end (`view.pos`, the file locked) and syncs
    /// them as the policy says. The caller advances the view only on
    /// success.
    ///
    /// On failure — of the write, or of the sync after a complete write —
    /// the file is cut back to `view.pos`, so a write reported failed never
    /// appears later, and the view stays in step with the file. Only when
    /// the cut fails too may the bytes remain: the error says so, and the
    /// view is marked for a full re-read so the store follows the file
    /// (sequence numbers are never reused).
    fn write_end(
        &self,
        mut file: &File,
        path: &Path,
        view: &mut View,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let (op, source) = match file.write_all(bytes) {
            Err(e) => ("appending to session file", e),
            Ok(()) => match self.sync_after_write(file, view) {
                Ok(()) => return Ok(()),
                Err(e) => ("syncing session file", e),
            },
        };
        if let Err(cut) = file.set_len(view.pos) {
            warn!(path = %path.display(), %cut, "cannot cut back a failed write; re-reading the file");
            view.valid = false;
            let op = if op == "syncing session file" {
                "syncing session file (the write could not be cut back and may be stored)"
            } else {
                "appending to session file (the partial write could not be cut back)"
            };
            return Err(StoreError::io(op, path, source));
        }
        Err(StoreError::io(op, path, source))
    }

    fn check_fence(
        &self,
        session: &SessionId,
        fence: WriteFence,
        view: &View,
    ) -> Result<Option<u64>, StoreError> {
        match fence {
            WriteFence::Token(t) => {
                if let Some(mark) = view.mark.filter(|&m| t.get() < m) {
                    return Err(StoreError::Fenced {
                        session: session.clone(),
                        presented: t,
                        high_water: FencingToken::new(mark),
                    });
                }
                Ok(Some(t.get()))
            }
            WriteFence::Unfenced => {
                if !self.opts.allow_unfenced || view.mark.is_some() {
                    return Err(StoreError::Unfenced {
                        session: session.clone(),
                        high_water: view.mark.map(FencingToken::new),
                    });
                }
                Ok(None)
            }
        }
    }

    fn create(&self, session: &SessionId, wait: Wait) -> Result<(), Fail> {
        let header = |ts: u64| {
            format!(
                "{{\"t\":\"h\",\"v\":{FORMAT_VERSION},\"id\":{},\"ts\":{ts}}}\n",
                json_str(session.as_str())
            )
        };
        self.with_slot(session, wait, |slot, path| {
            for _ in 0..2 {
                if self.ensure_open(slot, path)? {
                    return self.locked(
                        slot,
                        path,
                        Some(session),
                        LockMode::Exclusive,
                        |file, view| {
                            if view.live {
                                return Err(StoreError::AlreadyExists {
                                    session: session.clone(),
                                });
                            }
                            // Deleted (or never completed): start a new incarnation.
                            self.repair(file, path, view)?;
                            let line = header(self.now_ms());
                            self.write_end(file, path, view, line.as_bytes())?;
                            view.pos += line.len() as u64;
                            view.lines += 1;
                            view.id = Some(session.as_str().to_owned());
                            view.live = true;
                            view.events.clear();
                            Ok(())
                        },
                    );
                }
                if self.create_file(session, path, &header)? {
                    return Ok(());
                }
                // Another process created it meanwhile: look again.
            }
            Err(StoreError::AlreadyExists {
                session: session.clone(),
            }
            .into())
        })
    }

    /// Creates a new session file: writes the header to a private temporary
    /// file and links it into place, so no other process ever sees a file
    /// without its header, and an existing file is never replaced. False
    /// when the file exists.
    fn create_file(
        &self,
        session: &SessionId,
        path: &Path,
        header: &dyn Fn(u64) -> String,
    ) -> Result<bool, StoreError> {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let stem = session_filename::stem(session);
        let tmp = self
            .dir
            .join(format!(".tmp-{stem}-{}-{n}", std::process::id()));
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(open_flags())
                .open(&tmp)
                .map_err(|e| StoreError::io("creating session file", &tmp, e))?;
            f.write_all(header(self.now_ms()).as_bytes())
                .map_err(|e| StoreError::io("writing session header", &tmp, e))?;
            if self.opts.fsync != FsyncPolicy::Never {
                f.sync_data()
                    .map_err(|e| StoreError::io("syncing session file", &tmp, e))?;
            }
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(StoreError::io("linking session file", path, e)),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        let linked = result?;
        if linked && self.opts.fsync != FsyncPolicy::Never {
            // The file is in place (and other processes may already use
            // it), so it is not taken back: the error says what happened.
            self.dir_file.sync_all().map_err(|e| {
                StoreError::io(
                    "syncing store directory after creating the session file (the session exists)",
                    &self.dir,
                    e,
                )
            })?;
        }
        Ok(linked)
    }

    fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        payloads: &[String],
        wait: Wait,
    ) -> Result<AppendReceipt, Fail> {
        self.with_slot(session, wait, |slot, path| {
            if !self.ensure_open(slot, path)? {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                }
                .into());
            }
            self.locked(slot, path, Some(session), LockMode::Exclusive, |file, view| {
                if !view.live {
                    return Err(StoreError::NotFound {
                        session: session.clone(),
                    });
                }
                let token = self.check_fence(session, fence, view)?;
                self.repair(file, path, view)?;
                let ts = self.now_ms();
                let token_text = token.map_or_else(|| "null".to_owned(), |t| t.to_string());
                let total: usize = payloads.iter().map(|p| p.len() + 64).sum();
                let mut buf = String::with_capacity(total);
                let mut spans = Vec::with_capacity(payloads.len());
                let first_seq = view.next_seq;
                for (i, p) in payloads.iter().enumerate() {
                    let start = buf.len();
                    let _ = writeln!(
                        buf,
                        "{{\"t\":\"e\",\"seq\":{},\"token\":{token_text},\"ts\":{ts},\"payload\":{p}}}",
                        first_seq + i as u64
                    );
                    spans.push((start as u64, (buf.len() - start) as u64));
                }
                self.write_end(file, path, view, buf.as_bytes())?;
                for (i, (start, len)) in spans.into_iter().enumerate() {
                    view.events.push(Ev {
                        seq: first_seq + i as u64,
                        off: view.pos + start,
                        len,
                    });
                }
                view.pos += buf.len() as u64;
                view.lines += payloads.len() as u64;
                view.next_seq = first_seq + payloads.len() as u64;
                if let Some(t) = token {
                    view.mark = Some(view.mark.map_or(t, |m| m.max(t)));
                }
                Ok(AppendReceipt {
                    first_seq,
                    last_seq: view.next_seq - 1,
                })
            })
        })
    }

    fn delete(&self, session: &SessionId, fence: WriteFence, wait: Wait) -> Result<(), Fail> {
        self.with_slot(session, wait, |slot, path| {
            if !self.ensure_open(slot, path)? {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                }
                .into());
            }
            self.locked(
                slot,
                path,
                Some(session),
                LockMode::Exclusive,
                |file, view| {
                    if !view.live {
                        return Err(StoreError::NotFound {
                            session: session.clone(),
                        });
                    }
                    let token = self.check_fence(session, fence, view)?;
                    self.repair(file, path, view)?;
                    let token_text = token.map_or_else(|| "null".to_owned(), |t| t.to_string());
                    let line = format!(
                        "{{\"t\":\"d\",\"token\":{token_text},\"ts\":{}}}\n",
                        self.now_ms()
                    );
                    self.write_end(file, path, view, line.as_bytes())?;
                    view.pos += line.len() as u64;
                    view.lines += 1;
                    view.live = false;
                    view.events.clear();
                    if let Some(t) = token {
                        view.mark = Some(view.mark.map_or(t, |m| m.max(t)));
                    }
                    Ok(())
                },
            )
        })
    }

    fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
        wait: Wait,
    ) -> Result<Page, Fail> {
        let budget = self.opts.max_page_bytes as u64;
        self.with_slot(session, wait, |slot, path| {
            if !self.ensure_open(slot, path)? {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                }
                .into());
            }
            self.locked(slot, path, Some(session), LockMode::Shared, |file, view| {
                if !view.live {
                    return Err(StoreError::NotFound {
                        session: session.clone(),
                    });
                }
                let start = view.events.partition_point(|e| e.seq < from_seq);
                let end = page_end(&view.events, start, limit, budget);
                let picked = &view.events[start..end];
                let mut events = Vec::with_capacity(picked.len());
                if let (Some(first), Some(last)) = (picked.first(), picked.last()) {
                    let span = (last.off + last.len - first.off) as usize;
                    let mut buf = vec![0u8; span];
                    file.read_exact_at(&mut buf, first.off)
                        .map_err(|e| StoreError::io("reading session file", path, e))?;
                    for ev in picked {
                        let at = (ev.off - first.off) as usize;
                        let line = &buf[at..at + ev.len as usize - 1];
                        let parsed: EventLine =
                            serde_json::from_slice(line).map_err(|e| StoreError::Corrupt {
                                path: path.to_path_buf(),
                                line: None,
                                message: format!("event {} cannot be parsed", ev.seq),
                                source: Some(e),
                            })?;
                        if parsed.seq != ev.seq {
                            return Err(StoreError::corrupt(
                                path,
                                None,
                                format!("event {} changed under the store", ev.seq),
                            ));
                        }
                        events.push(StoredEvent {
                            seq: parsed.seq,
                            token: parsed.token.map(FencingToken::new),
                            at: UNIX_EPOCH + Duration::from_millis(parsed.ts),
                            payload: parsed.payload,
                        });
                    }
                }
                Ok(Page {
                    events,
                    next_seq: view.events.get(end).map(|e| e.seq),
                    torn_tail: view.torn > 0,
                })
            })
        })
    }

    fn high_water(&self, session: &SessionId, wait: Wait) -> Result<Option<FencingToken>, Fail> {
        self.with_slot(session, wait, |slot, path| {
            if !self.ensure_open(slot, path)? {
                return Ok(None);
            }
            self.locked(slot, path, Some(session), LockMode::Shared, |_, view| {
                Ok(view.mark.map(FencingToken::new))
            })
        })
    }

    /// Every live session. A file that cannot be read as a session (a
    /// stray or damaged `*.jsonl`, one that names another session, one
    /// that cannot be opened) is logged and left out, so one bad file does
    /// not hide the others. A session locked past the deadline fails the
    /// listing with `Busy` (leaving it out would misreport it).
    fn list(&self, wait: Wait) -> Result<Vec<SessionId>, Fail> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            // `.session-leases`, temporary files and anything hidden.
            if name.starts_with('.') {
                continue;
            }
            let Some(stem) = name.strip_suffix(FILE_SUFFIX) else {
                continue;
            };
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if !is_file {
                continue;
            }
            let path = entry.path();
            let session = match self.session_in(name, stem, &path) {
                Ok(Some(session)) => session,
                Ok(None) => continue, // removed meanwhile, or its header is torn
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "listing skips a file that is not a readable session");
                    continue;
                }
            };
            let live = self.with_slot(&session, wait, |slot, path| {
                if !self.ensure_open(slot, path)? {
                    return Ok(false);
                }
                self.locked(slot, path, Some(&session), LockMode::Shared, |_, view| {
                    Ok(view.live)
                })
            });
            match live {
                Ok(true) => out.push(session),
                Ok(false) => {}
                Err(Fail::Store(e)) if e.kind() != StoreErrorKind::Busy => {
                    warn!(path = %path.display(), error = %e, "listing skips a session file it cannot read");
                    lock(&self.names).remove(name);
                }
                Err(e) => return Err(e),
            }
        }
        out.sort();
        Ok(out)
    }

    /// The session a file named `name` holds, from its header (read once,
    /// then remembered).
    fn session_in(
        &self,
        name: &str,
        stem: &str,
        path: &Path,
    ) -> Result<Option<SessionId>, StoreError> {
        if let Some(session) = lock(&self.names).get(name) {
            return Ok(Some(session.clone()));
        }
        let Some(id) = read_header_id(path)? else {
            return Ok(None);
        };
        let session = SessionId::new(&id).map_err(|e| {
            StoreError::corrupt(path, Some(1), format!("stored session id is invalid: {e}"))
        })?;
        if session_filename::stem(&session) != stem {
            return Err(StoreError::corrupt(
                path,
                Some(1),
                "the stored session id does not belong to this file name",
            ));
        }
        lock(&self.names).insert(name.to_owned(), session.clone());
        Ok(Some(session))
    }
}

/// The end of a page starting at `start`: at most `limit` events and
/// `budget` bytes of lines, but at least one event.
fn page_end(events: &[Ev], start: usize, limit: usize, budget: u64) -> usize {
    let last = events.len().min(start.saturating_add(limit));
    let mut end = start;
    let mut bytes = 0u64;
    while end < last {
        bytes = bytes.saturating_add(events[end].len);
        if end > start && bytes > budget {
            break;
        }
        end += 1;
    }
    end
}

/// The session id in the header of the file at `path`; `None` when the
/// file is gone or its header is incomplete.
fn read_header_id(path: &Path) -> Result<Option<String>, StoreError> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(open_flags())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("opening session file", path, e)),
    };
    // A header is at most a few kilobytes: a 256-byte id escaped, plus fields.
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StoreError::io("reading session header", path, e)),
        }
    }
    let Some(end) = buf[..n].iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    let rec: Rec = serde_json::from_slice(&buf[..end]).map_err(|e| StoreError::Corrupt {
        path: path.to_owned(),
        line: Some(1),
        message: "not a store record".to_owned(),
        source: Some(e),
    })?;
    match (rec.t.as_str(), rec.id) {
        ("h", Some(id)) => Ok(Some(id)),
        _ => Err(StoreError::corrupt(
            path,
            Some(1),
            "the first line is not a header",
        )),
    }
}

/// Brings `view` up to date with the file of length `size`: reads only
/// what was appended since, unless the file shrank (a torn line removed
/// by another process) or the view is new, when it reads it all.
fn refresh(
    file: &File,
    path: &Path,
    size: u64,
    view: &mut View,
    expect: Option<&SessionId>,
) -> Result<(), StoreError> {
    if !view.valid || size < view.pos {
        let last_sync = view.last_sync;
        *view = View {
            last_sync,
            ..View::default()
        };
        view.valid = true;
    }
    if size == view.pos {
        view.torn = 0;
    } else {
        let mut buf = vec![0u8; (size - view.pos) as usize];
        file.read_exact_at(&mut buf, view.pos)
            .map_err(|e| StoreError::io("reading session file", path, e))?;
        let mut at = 0usize;
        while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
            let line = &buf[at..at + nl];
            let off = view.pos;
            let no = view.lines + 1;
            if let Err(e) = apply(line, off, no, view, path) {
                view.valid = false;
                return Err(e);
            }
            view.lines = no;
            view.pos += nl as u64 + 1;
            at += nl + 1;
        }
        view.torn = (buf.len() - at) as u64;
    }
    if let (Some(expect), Some(id)) = (expect, &view.id) {
        if id != expect.as_str() {
            return Err(StoreError::corrupt(
                path,
                Some(1),
                format!(
                    "the file belongs to session {id:?}, not {:?}",
                    expect.as_str()
                ),
            ));
        }
    }
    Ok(())
}

fn apply(line: &[u8], off: u64, no: u64, view: &mut View, path: &Path) -> Result<(), StoreError> {
    let rec: Rec = serde_json::from_slice(line).map_err(|e| StoreError::Corrupt {
        path: path.to_owned(),
        line: Some(no),
        message: "not a store record".to_owned(),
        source: Some(e),
    })?;
    let bad = |m: &str| Err(StoreError::corrupt(path, Some(no), m.to_owned()));
    if no == 1 && rec.t != "h" {
        return bad("the first line is not a header");
    }
    match rec.t.as_str() {
        "h" => {
            if rec.v != Some(FORMAT_VERSION) {
                return bad("unsupported format version");
            }
            let Some(id) = rec.id else {
                return bad("header without a session id");
            };
            if view.id.as_ref().is_some_and(|known| *known != id) {
                return bad("a second header names another session");
            }
            view.id = Some(id);
            view.live = true;
            view.events.clear();
        }
        "e" => {
            if !view.live {
                return bad("an event of a deleted session");
            }
            if rec.seq != Some(view.next_seq) {
                return bad("event sequence numbers are not consecutive");
            }
            view.events.push(Ev {
                seq: view.next_seq,
                off,
                len: line.len() as u64 + 1,
            });
            view.next_seq += 1;
            if let Some(t) = rec.token {
                view.mark = Some(view.mark.map_or(t, |m| m.max(t)));
            }
        }
        "d" => {
            if !view.live {
                return bad("a deletion of a deleted session");
            }
            view.live = false;
            view.events.clear();
            if let Some(t) = rec.token {
                view.mark = Some(view.mark.map_or(t, |m| m.max(t)));
            }
        }
        _ => return bad("unknown record type"),
    }
    Ok(())
}

fn validate_batch(events: &[Value], max: usize) -> Result<Vec<String>, StoreError> {
    if events.is_empty() {
        return Err(StoreError::invalid("an append needs at least one event"));
    }
    events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            let text = serde_json::to_string(ev)
                .map_err(|e| StoreError::invalid(format!("event {i} cannot be serialised: {e}")))?;
            if text.len() > max {
                return Err(StoreError::invalid(format!(
                    "event {i} is {} bytes serialised, the limit is {max}",
                    text.len()
                )));
            }
            Ok(text)
        })
        .collect()
}

#[async_trait]
impl SessionStore for JsonlStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        let session = session.clone();
        self.run(move |inner, wait| inner.create(&session, wait))
            .await
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        let payloads = validate_batch(events, self.inner.opts.max_event_bytes)?;
        let session = session.clone();
        self.run(move |inner, wait| inner.append(&session, fence, &payloads, wait))
            .await
    }

    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError> {
        if limit == 0 {
            return Err(StoreError::invalid("a page needs a limit of at least 1"));
        }
        let session = session.clone();
        self.run(move |inner, wait| inner.read(&session, from_seq, limit, wait))
            .await
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.run(|inner, wait| inner.list(wait)).await
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let session = session.clone();
        self.run(move |inner, wait| inner.delete(&session, fence, wait))
            .await
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        let session = session.clone();
        self.run(move |inner, wait| inner.high_water(&session, wait))
            .await
    }
}

#[cfg(test)]
mod tests {
    //! Failures the integration tests cannot cause: a failing `fdatasync`.

    use std::sync::atomic::Ordering;

    use lease_port::{FencingToken, SessionId};
    use serde_json::json;

    use super::{FsyncPolicy, JsonlOptions, JsonlStore};
    use crate::{SessionStore, StoreErrorKind, WriteFence};

    fn tok(t: u64) -> WriteFence {
        WriteFence::Token(FencingToken::new(t))
    }

    async fn seqs(store: &JsonlStore, s: &SessionId) -> Vec<(u64, serde_json::Value)> {
        let page = store.read(s, 1, 100).await.unwrap();
        page.events
            .into_iter()
            .map(|e| (e.seq, e.payload))
            .collect()
    }

    /// A failed sync after a complete write: the write is reported failed,
    /// so it must not appear, and the next one must take its place — with
    /// and without cross-process refreshes of the view.
    #[tokio::test]
    async fn a_write_whose_sync_failed_is_cut_back_and_never_appears() {
        for cross_process in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let opts = JsonlOptions::default()
                .fsync(FsyncPolicy::Always)
                .cross_process(cross_process);
            let store = JsonlStore::open(dir.path(), opts).unwrap();
            let s = SessionId::new("s").unwrap();
            store.create(&s).await.unwrap();
            store.append(&s, tok(1), &[json!(1)]).await.unwrap();
            let fail_next_sync = || store.inner.fail_syncs.store(1, Ordering::Relaxed);

            // Append.
            fail_next_sync();
            let err = store
                .append(&s, tok(2), &[json!("lost"), json!("lost too")])
                .await
                .unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Io);
            let r = store.append(&s, tok(1), &[json!(2)]).await.unwrap();
            assert_eq!((r.first_seq, r.last_seq), (2, 2));
            // The failed write's token did not raise the mark.
            assert_eq!(
                store.high_water(&s).await.unwrap(),
                Some(FencingToken::new(1))
            );

            // Delete.
            fail_next_sync();
            let err = store.delete(&s, tok(1)).await.unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Io);
            store.append(&s, tok(1), &[json!(3)]).await.unwrap();
            let want = vec![(1, json!(1)), (2, json!(2)), (3, json!(3))];
            assert_eq!(seqs(&store, &s).await, want);

            // Re-creating a deleted session.
            store.delete(&s, tok(1)).await.unwrap();
            fail_next_sync();
            let err = store.create(&s).await.unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Io);
            assert_eq!(
                store.read(&s, 1, 1).await.unwrap_err().kind(),
                StoreErrorKind::NotFound
            );
            store.create(&s).await.unwrap();
            let r = store.append(&s, tok(1), &[json!(4)]).await.unwrap();
            assert_eq!(r.first_seq, 4);

            // Another store reading the file sees exactly what succeeded.
            let fresh = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
            assert_eq!(seqs(&fresh, &s).await, vec![(4, json!(4))]);
            let text = std::fs::read_to_string(store.path_of(&s)).unwrap();
            assert!(!text.contains("lost"), "{text}");
            assert_eq!(
                text.lines().filter(|l| l.contains("\"t\":\"h\"")).count(),
                2
            );
            assert_eq!(
                text.lines().filter(|l| l.contains("\"t\":\"d\"")).count(),
                1
            );
        }
    }
}
