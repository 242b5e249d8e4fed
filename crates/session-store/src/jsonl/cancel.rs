//! Cancel requests: `<dir>/.cancel-requests/<stem>`, one small file per
//! session holding the highest run token a cancel was asked for and how
//! many requests were recorded (`TOKEN SERIAL`; a file of an earlier
//! version holds the token alone, serial 0).
//!
//! They live beside the session files, not in them: whoever asks is
//! usually not the run's lease holder, and a session file takes fenced
//! writes only. A request is advice to the holder, never a write to the
//! session, so it needs no fence.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lease_port::{FencingToken, SessionId};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};

use super::{StoreCore, tmp_name};
use crate::{CancelRequest, StoreError};

/// The directory of cancel requests inside a store directory. Listings
/// skip it (its name starts with `.`).
pub const CANCEL_DIR_NAME: &str = ".cancel-requests";

impl StoreCore {
    fn cancel_path(&self, session: &SessionId) -> PathBuf {
        self.dir
            .join(CANCEL_DIR_NAME)
            .join(session_filename::stem(session))
    }

    pub(super) fn read_cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<CancelRequest>, StoreError> {
        #[cfg(test)]
        self.cancel_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.cancel_path(session);
        let mut text = String::new();
        match OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&path)
        {
            Ok(mut file) => file
                .read_to_string(&mut text)
                .map_err(|e| StoreError::io("reading cancel request", &path, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("reading cancel request", &path, e)),
        };
        let bad = || StoreError::corrupt(&path, Some(1), format!("not a cancel request: {text:?}"));
        let mut fields = text.split_ascii_whitespace();
        let run: u64 = fields.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let serial: u64 = match fields.next() {
            Some(n) => n.parse().map_err(|_| bad())?,
            None => 0,
        };
        if fields.next().is_some() {
            return Err(bad());
        }
        Ok(Some(CancelRequest {
            run: FencingToken::new(run),
            serial,
        }))
    }

    /// Raises the recorded token to `run` and counts the request. The
    /// record is replaced whole (written aside, then renamed into place),
    /// so a reader sees the old record or the new one, never a mix; writers
    /// take turns under an exclusive lock on the directory's lock file, so
    /// a request for an earlier run racing one for the live run can neither
    /// lower the token nor lose a count.
    pub(super) fn write_cancel_request(
        &self,
        session: &SessionId,
        run: FencingToken,
    ) -> Result<(), StoreError> {
        let dir = self.dir.join(CANCEL_DIR_NAME);
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(StoreError::io("creating cancel requests", &dir, e)),
        }
        let _turn = self.lock_cancel_requests(&dir)?;
        let recorded = self.read_cancel_request(session)?;
        if recorded.is_some_and(|r| r.run > run) {
            return Ok(());
        }
        let serial = recorded.map_or(0, |r| r.serial).saturating_add(1);
        let tmp = dir.join(tmp_name("cancel"));
        let result = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&tmp)
            .and_then(|mut f| f.write_all(format!("{} {serial}\n", run.get()).as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, self.cancel_path(session)));
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(StoreError::io("recording cancel request", &dir, e));
        }
        Ok(())
    }

    /// The exclusive lock writers of cancel requests take turns under,
    /// tried (never blocked on) until the store's lock timeout: a process
    /// frozen while holding it delays requests, it never hangs them.
    fn lock_cancel_requests(&self, dir: &Path) -> Result<Flock<File>, StoreError> {
        let path = dir.join(CANCEL_LOCK_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&path)
            .map_err(|e| StoreError::io("opening the cancel requests' lock", &path, e))?;
        let deadline = Instant::now() + self.opts.lock_timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(locked) => return Ok(locked),
                Err((back, Errno::EWOULDBLOCK)) => file = back,
                Err((_, e)) => {
                    return Err(StoreError::io(
                        "locking the cancel requests",
                        &path,
                        e.into(),
                    ));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Busy {
                    path,
                    timeout: self.opts.lock_timeout,
                });
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// The lock file inside the cancel requests' directory (no session's
/// record: stems never start with `.`).
const CANCEL_LOCK_NAME: &str = ".lock";
