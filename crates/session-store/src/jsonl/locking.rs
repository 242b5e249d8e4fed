//! How a call gets hold of a session: the in-process mutex and the
//! cross-process `flock` are only ever *tried* on an async worker; a call
//! that finds them taken moves to tokio's blocking pool and retries there
//! until the lock timeout. This is what keeps a stopped process from
//! stalling the executor.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, TryLockError};
use std::time::{Duration, Instant};

use lease_port::SessionId;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tracing::warn;

use super::cache::FileState;
use super::index::{FileIndex, refresh};
use super::{FsyncPolicy, JsonlStore, StoreCore, lock};
use crate::StoreError;

/// First and longest pause between attempts to take a contended lock.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// How long a call may wait for a session's locks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    /// Not at all: on an async worker thread, where a contended lock sends
    /// the call to the blocking pool ([`AttemptError::Contended`]).
    Once,
    /// Until this instant, retrying with short pauses, then `Busy`.
    Until(Instant),
}

/// A failed attempt: a store error, or a lock someone else holds.
#[derive(Debug)]
pub(super) enum AttemptError {
    Store(StoreError),
    /// Only with [`Wait::Once`]; nothing was done.
    Contended,
}

impl From<StoreError> for AttemptError {
    fn from(e: StoreError) -> Self {
        AttemptError::Store(e)
    }
}

/// How a session file is `flock`ed: shared for reads, exclusive for a
/// check-and-write.
#[derive(Clone, Copy)]
pub(super) enum LockMode {
    Shared,
    Exclusive,
}

impl JsonlStore {
    /// Runs `f` on the calling (async worker) thread when it finds its
    /// locks free, else on tokio's blocking pool, where it may wait for
    /// them up to [`JsonlOptions::lock_timeout`](super::JsonlOptions::lock_timeout). When every write syncs it
    /// always runs on the blocking pool.
    ///
    /// `f` returns [`AttemptError::Contended`] only before it changed anything, so
    /// running it again is safe.
    pub(super) async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&StoreCore, Wait) -> Result<R, AttemptError> + Send + 'static,
    {
        self.core.refuse_if_went_back()?;
        if self.core.opts.fsync != FsyncPolicy::Always {
            match f(&self.core, Wait::Once) {
                Ok(r) => return Ok(r),
                Err(AttemptError::Store(e)) => return Err(e),
                Err(AttemptError::Contended) => {}
            }
        }
        self.run_blocking(f).await
    }

    /// Runs `f` on tokio's blocking pool only, waiting for locks until the
    /// store's deadline: for calls too long for an async worker (a
    /// directory scan) whatever the fsync policy.
    pub(super) async fn run_blocking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&StoreCore, Wait) -> Result<R, AttemptError> + Send + 'static,
    {
        self.core.refuse_if_went_back()?;
        let core = Arc::clone(&self.core);
        let task = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + core.opts.lock_timeout;
            f(&core, Wait::Until(deadline))
        });
        match task.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(AttemptError::Store(e))) => Err(e),
            // `Wait::Until` turns contention into `Busy`; kept total anyway.
            Ok(Err(AttemptError::Contended)) => Err(StoreError::Busy {
                path: self.core.dir.clone(),
                timeout: self.core.opts.lock_timeout,
            }),
            Err(e) => Err(StoreError::io(
                "running a blocking store task",
                &self.core.dir,
                io::Error::other(e.to_string()),
            )),
        }
    }
}

impl StoreCore {
    /// Runs `body` with the session's state locked. `body` returns
    /// [`AttemptError::Contended`] when the file lock is taken; with
    /// [`Wait::Until`] both locks are then tried again after a short pause
    /// (neither held meanwhile) until the deadline, then `Busy`.
    ///
    /// The state's mutex is only ever held for a bounded time by this
    /// process — except while [`cross_process`](super::JsonlOptions::cross_process)
    /// is on, when a holder may be waiting for another process — so without
    /// it a blocking-pool call simply waits for the mutex.
    pub(super) fn with_session<R>(
        &self,
        session: &SessionId,
        wait: Wait,
        mut body: impl FnMut(&mut FileState, &Path) -> Result<R, AttemptError>,
    ) -> Result<R, AttemptError> {
        let open = self.open_session(session);
        let mut pause = FIRST_PAUSE;
        loop {
            let guard = match open.state.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => match wait {
                    Wait::Until(_) if !self.opts.cross_process => Some(lock(&open.state)),
                    _ => None,
                },
            };
            let result = match guard {
                Some(mut state) => body(&mut state, &open.path),
                None => Err(AttemptError::Contended),
            };
            let (Wait::Until(deadline), Err(AttemptError::Contended)) = (wait, &result) else {
                return result;
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(AttemptError::Store(StoreError::Busy {
                    path: open.path.to_path_buf(),
                    timeout: self.opts.lock_timeout,
                }));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Runs `f` with the state's file locked against other processes (when
    /// configured) and the index brought up to date with the file.
    ///
    /// Never waits for the file lock: when another open file description
    /// holds it, returns [`AttemptError::Contended`] without running `f`.
    pub(super) fn locked<R>(
        &self,
        state: &mut FileState,
        path: &Path,
        expect: Option<&SessionId>,
        mode: LockMode,
        f: impl FnOnce(&File, &mut FileIndex) -> Result<R, StoreError>,
    ) -> Result<R, AttemptError> {
        let Some(file) = state.file.take() else {
            return Err(StoreError::io(
                "using session file",
                path,
                io::Error::other("file not open"),
            )
            .into());
        };
        let index = &mut state.index;
        let cross_process = self.opts.cross_process;
        let run = |file: &File, index: &mut FileIndex| -> Result<R, StoreError> {
            // Other processes may have appended (or cut a torn line) since
            // we last looked; alone, the index is current once built.
            if cross_process || !index.valid {
                let size = (&mut &*file)
                    .seek(SeekFrom::End(0))
                    .map_err(|e| StoreError::io("inspecting session file", path, e))?;
                refresh(file, path, size, index, expect)?;
            }
            f(file, index)
        };
        if !self.opts.cross_process {
            if removed(&file) {
                state.index = FileIndex::default();
                return Err(AttemptError::Contended);
            }
            let r = run(&file, index);
            state.file = Some(file);
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
                    state.file = Some(f);
                    return Err(AttemptError::Contended);
                }
                Err((f, errno)) => {
                    state.file = Some(f);
                    let e = StoreError::io("locking session file", path, errno.into());
                    return Err(e.into());
                }
            }
        };
        if removed(&locked) {
            // Reclaimed by someone else since we opened it: forget it and
            // look again by name (nothing was done).
            drop(locked);
            state.index = FileIndex::default();
            return Err(AttemptError::Contended);
        }
        let r = run(&locked, index);
        match locked.unlock() {
            Ok(f) => state.file = Some(f),
            Err((l, errno)) => {
                // Closing the file drops the lock; reopen on next use.
                warn!(path = %path.display(), %errno, "unlocking a session file failed; closing it");
                drop(l);
            }
        }
        Ok(r?)
    }
}

/// True when the open file is no longer linked into the directory (a
/// reclaimed session file): the caller must reopen it by name.
fn removed(file: &File) -> bool {
    file.metadata().is_ok_and(|m| m.nlink() == 0)
}
