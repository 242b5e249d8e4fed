//! Reclaiming the files of deleted sessions, and the graveyard that keeps
//! what fencing needs of them.
//!
//! A deleted session's file holds its high-water mark; removing the file
//! must not forget it, or a stale owner could write into the session once
//! it is created again. So before a file is removed, its mark (token and
//! writer) and next sequence number are appended to `<dir>/.graveyard` —
//! one framed line per reclaimed file, synced — and a session file made
//! again later starts from them (its header carries them over).
//!
//! Removal is safe against other processes: the file is removed while its
//! exclusive `flock` is held, after checking that it is still deleted, and
//! every other call re-checks after locking that the file it holds open is
//! still linked (`fstat` link count), reopening by name when it is not.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use lease_port::SessionId;
use nix::fcntl::{Flock, FlockArg};
use tracing::warn;

use super::format::{Grave, Record, grave_line, push_commit};
use super::index::{FileIndex, Mark, commits, stored_beyond};
use super::locking::{AttemptError, LockMode, Wait};
use super::{FILE_SUFFIX, JsonlStore, STAGING_DIR_NAME, StoreCore, lock, open_flags};
use crate::{StoreError, StoreErrorKind};

/// The graveyard's name in the store directory.
pub const GRAVEYARD_FILE_NAME: &str = ".graveyard";

/// Temporary files younger than this are never removed (a creation may be
/// using them), whatever the age asked for.
const MIN_TEMPORARY_AGE: Duration = Duration::from_secs(3600);

/// What [`JsonlStore::reclaim_deleted`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReclaimReport {
    /// Sessions whose files were removed (their marks kept), sorted.
    pub reclaimed: Vec<SessionId>,
    /// Deleted sessions left alone because someone held them locked; a
    /// later run takes them. Sorted.
    pub busy: Vec<SessionId>,
    /// Bytes of session files removed.
    pub bytes: u64,
    /// Temporary files left by interrupted creations (older than the age
    /// asked for, and than an hour) removed.
    pub temporary_files: usize,
}

impl JsonlStore {
    /// Removes the files of sessions deleted at least `older_than` ago (by
    /// the store's clock and the deletion record's time), keeping their
    /// high-water marks, writers and next sequence numbers in the
    /// graveyard ([`GRAVEYARD_FILE_NAME`]); a session created again starts
    /// from them, so it never accepts an old token nor reuses a sequence
    /// number. Also removes temporary files left by interrupted creations.
    ///
    /// Safe while servers use the directory with
    /// [`cross_process`](super::JsonlOptions::cross_process) on (the
    /// default): each file is removed under its exclusive lock, and a
    /// session locked by someone else is left for a later run
    /// ([`ReclaimReport::busy`]). Files that cannot be read as sessions are
    /// logged and left alone. Lease files are not touched.
    pub async fn reclaim_deleted(&self, older_than: Duration) -> Result<ReclaimReport, StoreError> {
        self.blocking(move |core| core.reclaim_deleted(older_than))
            .await
    }
}

impl StoreCore {
    fn graveyard_path(&self) -> PathBuf {
        self.dir.join(GRAVEYARD_FILE_NAME)
    }

    /// What the graveyard keeps of `session`: the highest mark of its
    /// reclaimed files (and its writer), the highest next sequence number.
    pub(super) fn grave(&self, session: &SessionId) -> Result<Option<Grave>, StoreError> {
        let path = self.graveyard_path();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("reading the graveyard", &path, e)),
        };
        let mut found: Option<Grave> = None;
        for (rec, _) in graveyard_entries(&bytes, &path)?.0 {
            if rec.id.as_deref() != Some(session.as_str()) {
                continue;
            }
            let grave = found.get_or_insert_with(Grave::default);
            if let Some(token) = rec.token
                && grave.mark.as_ref().is_none_or(|m| token > m.token)
            {
                grave.mark = Some(Mark {
                    token,
                    owner: rec.owner.clone(),
                });
            }
            grave.next_seq = grave.next_seq.max(rec.seq.unwrap_or(1));
        }
        Ok(found)
    }

    /// Appends `grave` for `session` to the graveyard and makes it durable.
    fn bury(&self, session: &SessionId, grave: &Grave) -> Result<(), StoreError> {
        let path = self.graveyard_path();
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(open_flags())
            .open(&path)
            .map_err(|e| StoreError::io("opening the graveyard", &path, e))?;
        let file = lock_blocking(file, &path)?;
        let size = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting the graveyard", &path, e))?
            .len();
        let mut bytes = vec![0u8; size as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| StoreError::io("reading the graveyard", &path, e))?;
        let (_, committed) = graveyard_entries(&bytes, &path)?;
        if committed < size {
            // A torn entry left by a crash: cut it before appending.
            file.set_len(committed)
                .map_err(|e| StoreError::io("cutting a torn graveyard entry", &path, e))?;
        }
        let mut line = grave_line(session, grave, self.now_ms());
        push_commit(&mut line, 0);
        (&*file)
            .write_all(line.as_bytes())
            .map_err(|e| StoreError::io("appending to the graveyard", &path, e))?;
        file.sync_data()
            .map_err(|e| StoreError::io("syncing the graveyard", &path, e))?;
        if !existed {
            self.dir_file.sync_all().map_err(|e| {
                StoreError::io(
                    "syncing the store directory after creating the graveyard",
                    &self.dir,
                    e,
                )
            })?;
        }
        Ok(())
    }

    fn reclaim_deleted(&self, older_than: Duration) -> Result<ReclaimReport, StoreError> {
        let now = self.now_ms();
        let cutoff = now.saturating_sub(u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX));
        let tmp_cutoff = SystemTime::now()
            .checked_sub(older_than.max(MIN_TEMPORARY_AGE))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut report = ReclaimReport {
            temporary_files: self.clean_staging(tmp_cutoff),
            ..ReclaimReport::default()
        };
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if name.starts_with(".tmp-") && is_file {
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t < tmp_cutoff);
                if old && std::fs::remove_file(entry.path()).is_ok() {
                    report.temporary_files += 1;
                }
                continue;
            }
            if name.starts_with('.') || !is_file {
                continue;
            }
            let Some(stem) = name.strip_suffix(FILE_SUFFIX) else {
                continue;
            };
            let path = entry.path();
            let session = match self.session_in(name, stem, &path) {
                Ok(Some(session)) => session,
                Ok(None) => continue,
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "reclaiming skips a file that is not a readable session");
                    continue;
                }
            };
            let outcome = self.reclaim_one(&session, cutoff);
            match outcome {
                Ok(Some(bytes)) => {
                    report.bytes += bytes;
                    report.reclaimed.push(session);
                    lock(&self.names).remove(name);
                }
                Ok(None) => {}
                Err(AttemptError::Contended) => report.busy.push(session),
                Err(AttemptError::Store(e)) if e.kind() == StoreErrorKind::Busy => {
                    report.busy.push(session);
                }
                Err(AttemptError::Store(e)) if e.kind() == StoreErrorKind::Corrupt => {
                    warn!(path = %path.display(), error = %e, "reclaiming skips a session file it cannot read");
                }
                Err(AttemptError::Store(e)) => return Err(e),
            }
        }
        if !report.reclaimed.is_empty() {
            self.dir_file.sync_all().map_err(|e| {
                StoreError::io(
                    "syncing the store directory after removing session files (their marks are kept)",
                    &self.dir,
                    e,
                )
            })?;
        }
        report.reclaimed.sort();
        report.busy.sort();
        Ok(report)
    }

    /// Removes the temporary files of interrupted creations from the
    /// staging directory, those last changed before `cutoff`; how many.
    fn clean_staging(&self, cutoff: SystemTime) -> usize {
        let Ok(entries) = std::fs::read_dir(self.dir.join(STAGING_DIR_NAME)) else {
            return 0;
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(".tmp-"))
            })
            .filter(|e| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t < cutoff)
            })
            .filter(|e| std::fs::remove_file(e.path()).is_ok())
            .count()
    }

    /// Removes `session`'s file when it is deleted and was deleted at or
    /// before `cutoff`; its size when removed. Never waits for a lock.
    fn reclaim_one(&self, session: &SessionId, cutoff: u64) -> Result<Option<u64>, AttemptError> {
        self.with_session(session, Wait::Once, |state, path| {
            if !self.ensure_open(state, path)? {
                return Ok(None);
            }
            let removed = self.locked(
                state,
                path,
                Some(session),
                LockMode::Exclusive,
                |file: &File, index: &mut FileIndex| {
                    let due = !index.live
                        && index.id.is_some()
                        && index.deleted_at.is_some_and(|at| at <= cutoff);
                    if !due {
                        return Ok(None);
                    }
                    let size = file
                        .metadata()
                        .map_err(|e| StoreError::io("inspecting session file", path, e))?
                        .len();
                    let grave = Grave {
                        mark: index.high_water.clone(),
                        next_seq: index.next_seq,
                    };
                    // A change of the directory: under the index lock, so
                    // the index stays trusted; the id leaves it, and a
                    // crash before the marker costs a listing a rebuild.
                    let removed = self.changing_dir(Wait::Once, || {
                        self.bury(session, &grave)?;
                        std::fs::remove_file(path).map_err(|e| {
                            StoreError::io("removing a deleted session's file", path, e)
                        })?;
                        let _ = self.log_session_locked(session, None);
                        Ok(())
                    });
                    match removed {
                        Ok(()) => {}
                        Err(AttemptError::Store(e)) => return Err(e),
                        Err(AttemptError::Contended) => {
                            return Err(StoreError::Busy {
                                path: path.to_path_buf(),
                                timeout: self.opts.lock_timeout,
                            });
                        }
                    }
                    Ok(Some(size))
                },
            )?;
            if removed.is_some() {
                state.file = None;
                state.index = FileIndex::default();
            }
            Ok(removed)
        })
    }
}

/// The committed entries of the graveyard `bytes` and where the last one
/// ends; a torn final entry is left out, damage before a committed entry
/// is `Corrupt` (a lost entry would lose a mark).
fn graveyard_entries(
    bytes: &[u8],
    path: &std::path::Path,
) -> Result<(Vec<(Record, usize)>, u64), StoreError> {
    let mut entries = Vec::new();
    let mut pending: Option<(Record, usize)> = None;
    let mut committed = 0usize;
    let mut at = 0usize;
    let mut no = 0u64;
    while let Some(nl) = bytes[at..].iter().position(|&b| b == b'\n') {
        let next = at + nl + 1;
        no += 1;
        let rec = serde_json::from_slice::<Record>(&bytes[at..at + nl]).ok();
        match (rec, pending.take()) {
            (Some(rec), Some((entry, start)))
                if rec.t == "c" && commits(&rec, &bytes[start..at], 1) =>
            {
                entries.push((entry, start));
                committed = next;
            }
            (Some(rec), None) if rec.t == "g" => pending = Some((rec, at)),
            _ => {
                let from = committed;
                if stored_beyond(bytes, from, false) {
                    return Err(StoreError::corrupt(
                        path,
                        Some(no),
                        "a damaged graveyard entry before committed ones; the marks of reclaimed sessions it held are lost — restore the graveyard from a backup",
                    ));
                }
                break;
            }
        }
        at = next;
    }
    Ok((entries, committed as u64))
}

/// Takes the graveyard's exclusive lock, waiting for it (only reclaiming
/// takes it, briefly).
fn lock_blocking(file: File, path: &std::path::Path) -> Result<Flock<File>, StoreError> {
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(locked) => return Ok(locked),
            Err((f, nix::errno::Errno::EINTR)) => file = f,
            Err((_, errno)) => {
                return Err(StoreError::io("locking the graveyard", path, errno.into()));
            }
        }
    }
}
