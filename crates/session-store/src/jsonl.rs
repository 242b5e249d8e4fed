//! The JSONL directory store.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write as _};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use lease_port::{Clock, FencingToken, SessionId, SystemClock};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::Deserialize;
use serde_json::Value;
use tracing::warn;

use crate::{AppendReceipt, Page, SessionStore, StoreError, StoredEvent, WriteFence};

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
    slots: Mutex<HashMap<SessionId, Arc<Mutex<Slot>>>>,
    tmp_counter: AtomicU64,
}

#[derive(Debug)]
struct Slot {
    path: Arc<Path>,
    file: Option<File>,
    view: View,
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
                tmp_counter: AtomicU64::new(0),
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

    /// Runs `f` inline, or on the blocking pool when every write syncs.
    async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Inner) -> Result<R, StoreError> + Send + 'static,
    {
        if self.inner.opts.fsync == FsyncPolicy::Always {
            let inner = Arc::clone(&self.inner);
            match tokio::task::spawn_blocking(move || f(&inner)).await {
                Ok(r) => r,
                Err(e) => Err(StoreError::io(
                    "running a blocking store task",
                    &self.inner.dir,
                    io::Error::other(e.to_string()),
                )),
            }
        } else {
            f(&self.inner)
        }
    }
}

impl Inner {
    fn path(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}{FILE_SUFFIX}"))
    }

    fn slot(&self, session: &SessionId) -> (Arc<Mutex<Slot>>, Arc<Path>) {
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(session) {
            let s = Arc::clone(s);
            drop(slots);
            let path = Arc::clone(&lock(&s).path);
            return (s, path);
        }
        if slots.len() >= self.opts.max_open {
            // Forget idle entries (nobody else holds them). Their files are
            // re-read when next used.
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let path: Arc<Path> = self.path(&session_filename::stem(session)).into();
        let s = Arc::new(Mutex::new(Slot {
            path: Arc::clone(&path),
            file: None,
            view: View::default(),
        }));
        slots.insert(session.clone(), Arc::clone(&s));
        (s, path)
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
    fn locked<R>(
        &self,
        slot: &mut Slot,
        path: &Path,
        expect: Option<&SessionId>,
        mode: LockMode,
        f: impl FnOnce(&File, &mut View) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let Some(file) = slot.file.take() else {
            return Err(StoreError::io(
                "using session file",
                path,
                io::Error::other("file not open"),
            ));
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
            return r;
        }
        let arg = match mode {
            LockMode::Shared => FlockArg::LockShared,
            LockMode::Exclusive => FlockArg::LockExclusive,
        };
        let mut file = file;
        let locked = loop {
            match Flock::lock(file, arg) {
                Ok(l) => break l,
                Err((f, Errno::EINTR)) => file = f,
                Err((f, errno)) => {
                    slot.file = Some(f);
                    return Err(StoreError::io("locking session file", path, errno.into()));
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
        r
    }

    fn sync_after_write(
        &self,
        file: &File,
        path: &Path,
        view: &mut View,
    ) -> Result<(), StoreError> {
        let due = match self.opts.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Never => false,
            FsyncPolicy::Interval(every) => view.last_sync.is_none_or(|t| t.elapsed() >= every),
        };
        if due {
            file.sync_data()
                .map_err(|e| StoreError::io("syncing session file", path, e))?;
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

    /// Writes `bytes` at the end; on failure removes whatever part was
    /// written, so nothing partial remains.
    fn write_end(
        &self,
        mut file: &File,
        path: &Path,
        view: &View,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        if let Err(e) = file.write_all(bytes) {
            let _ = file.set_len(view.pos);
            return Err(StoreError::io("appending to session file", path, e));
        }
        Ok(())
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

    fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        let (slot, path) = self.slot(session);
        let mut slot = lock(&slot);
        let header = |ts: u64| {
            format!(
                "{{\"t\":\"h\",\"v\":{FORMAT_VERSION},\"id\":{},\"ts\":{ts}}}\n",
                json_str(session.as_str())
            )
        };
        for _ in 0..2 {
            if self.ensure_open(&mut slot, &path)? {
                return self.locked(
                    &mut slot,
                    &path,
                    Some(session),
                    LockMode::Exclusive,
                    |file, view| {
                        if view.live {
                            return Err(StoreError::AlreadyExists {
                                session: session.clone(),
                            });
                        }
                        // Deleted (or never completed): start a new incarnation.
                        self.repair(file, &path, view)?;
                        let line = header(self.now_ms());
                        self.write_end(file, &path, view, line.as_bytes())?;
                        self.sync_after_write(file, &path, view)?;
                        view.pos += line.len() as u64;
                        view.lines += 1;
                        view.id = Some(session.as_str().to_owned());
                        view.live = true;
                        view.events.clear();
                        Ok(())
                    },
                );
            }
            // A new file: write the header to a private temporary file and
            // link it into place, so no other process ever sees a file
            // without its header, and an existing file is never replaced.
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
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(StoreError::io("linking session file", &path, e)),
                }
            })();
            let _ = std::fs::remove_file(&tmp);
            if result? {
                if self.opts.fsync != FsyncPolicy::Never {
                    self.dir_file
                        .sync_all()
                        .map_err(|e| StoreError::io("syncing store directory", &self.dir, e))?;
                }
                return Ok(());
            }
            // Another process created it meanwhile: look again.
        }
        Err(StoreError::AlreadyExists {
            session: session.clone(),
        })
    }

    fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        payloads: Vec<String>,
    ) -> Result<AppendReceipt, StoreError> {
        let (slot, path) = self.slot(session);
        let mut slot = lock(&slot);
        if !self.ensure_open(&mut slot, &path)? {
            return Err(StoreError::NotFound {
                session: session.clone(),
            });
        }
        self.locked(&mut slot, &path, Some(session), LockMode::Exclusive, |file, view| {
            if !view.live {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                });
            }
            let token = self.check_fence(session, fence, view)?;
            self.repair(file, &path, view)?;
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
            self.write_end(file, &path, view, buf.as_bytes())?;
            self.sync_after_write(file, &path, view)?;
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
    }

    fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let (slot, path) = self.slot(session);
        let mut slot = lock(&slot);
        if !self.ensure_open(&mut slot, &path)? {
            return Err(StoreError::NotFound {
                session: session.clone(),
            });
        }
        self.locked(
            &mut slot,
            &path,
            Some(session),
            LockMode::Exclusive,
            |file, view| {
                if !view.live {
                    return Err(StoreError::NotFound {
                        session: session.clone(),
                    });
                }
                let token = self.check_fence(session, fence, view)?;
                self.repair(file, &path, view)?;
                let token_text = token.map_or_else(|| "null".to_owned(), |t| t.to_string());
                let line = format!(
                    "{{\"t\":\"d\",\"token\":{token_text},\"ts\":{}}}\n",
                    self.now_ms()
                );
                self.write_end(file, &path, view, line.as_bytes())?;
                self.sync_after_write(file, &path, view)?;
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
    }

    fn read(&self, session: &SessionId, from_seq: u64, limit: usize) -> Result<Page, StoreError> {
        let (slot, path) = self.slot(session);
        let mut slot = lock(&slot);
        if !self.ensure_open(&mut slot, &path)? {
            return Err(StoreError::NotFound {
                session: session.clone(),
            });
        }
        self.locked(
            &mut slot,
            &path,
            Some(session),
            LockMode::Shared,
            |file, view| {
                if !view.live {
                    return Err(StoreError::NotFound {
                        session: session.clone(),
                    });
                }
                let start = view.events.partition_point(|e| e.seq < from_seq);
                let end = view.events.len().min(start.saturating_add(limit));
                let picked = &view.events[start..end];
                let mut events = Vec::with_capacity(picked.len());
                if let (Some(first), Some(last)) = (picked.first(), picked.last()) {
                    let span = (last.off + last.len - first.off) as usize;
                    let mut buf = vec![0u8; span];
                    file.read_exact_at(&mut buf, first.off)
                        .map_err(|e| StoreError::io("reading session file", &path, e))?;
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
                                &path,
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
            },
        )
    }

    fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        let (slot, path) = self.slot(session);
        let mut slot = lock(&slot);
        if !self.ensure_open(&mut slot, &path)? {
            return Ok(None);
        }
        self.locked(
            &mut slot,
            &path,
            Some(session),
            LockMode::Shared,
            |_, view| Ok(view.mark.map(FencingToken::new)),
        )
    }

    fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
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
            let Some(id) = read_header_id(&path)? else {
                continue; // removed meanwhile, or its header is torn
            };
            let session = SessionId::new(&id).map_err(|e| {
                StoreError::corrupt(&path, Some(1), format!("stored session id is invalid: {e}"))
            })?;
            if session_filename::stem(&session) != stem {
                return Err(StoreError::corrupt(
                    &path,
                    Some(1),
                    "the stored session id does not belong to this file name",
                ));
            }
            let (slot, path) = self.slot(&session);
            let mut slot = lock(&slot);
            if !self.ensure_open(&mut slot, &path)? {
                continue;
            }
            let live = self.locked(
                &mut slot,
                &path,
                Some(&session),
                LockMode::Shared,
                |_, view| Ok(view.live),
            )?;
            if !live {
                continue;
            }
            out.push(session);
        }
        out.sort();
        Ok(out)
    }
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
        self.run(move |inner| inner.create(&session)).await
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        let payloads = validate_batch(events, self.inner.opts.max_event_bytes)?;
        let session = session.clone();
        self.run(move |inner| inner.append(&session, fence, payloads))
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
        self.run(move |inner| inner.read(&session, from_seq, limit))
            .await
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.run(|inner| inner.list()).await
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let session = session.clone();
        self.run(move |inner| inner.delete(&session, fence)).await
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        let session = session.clone();
        self.run(move |inner| inner.high_water(&session)).await
    }
}
