//! The store's operations — create, append, delete, read, high water,
//! list — each one a fence check and a write (or a read) under the
//! session's locks, built from the pieces in the sibling modules.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use lease_port::{FencingToken, OwnerId, SessionId};
use nix::fcntl::{Flock, FlockArg};
use serde_json::Value;
use tracing::warn;

use super::format::{
    EventLine, FRAMING_LINE, deletion_line, fence_json, header_line, push_commit, push_event_line,
};
use super::index::{EventSpan, FileIndex, page_end};
use super::list_index::Live;
use super::locking::{AttemptError, LockMode, Wait};
use super::{FILE_SUFFIX, FsyncPolicy, STAGING_DIR_NAME, StoreCore, lock, open_flags, tmp_name};
use crate::{AppendReceipt, Page, StoreError, StoreErrorKind, StoredEvent, WriteFence};

/// The start of a write's buffer: the framing line when the file holds
/// lines that are not framed (a file written by format 1), else nothing (a
/// version-2 header, first in an empty file, starts the framing itself).
fn framing(index: &FileIndex) -> String {
    if index.framed || index.pos == 0 {
        String::new()
    } else {
        FRAMING_LINE.to_owned()
    }
}

impl StoreCore {
    /// Writes the record lines in `buf` (whole lines) with their commit
    /// line at the end of the file, then advances the index past them.
    fn write_framed(
        &self,
        file: &std::fs::File,
        path: &Path,
        index: &mut FileIndex,
        mut buf: String,
    ) -> Result<(), StoreError> {
        push_commit(&mut buf, 0);
        self.write_end(file, path, index, buf.as_bytes())?;
        index.pos += buf.len() as u64;
        index.lines += buf.bytes().filter(|&b| b == b'\n').count() as u64;
        index.framed = true;
        Ok(())
    }

    /// Checks `fence` against the session's mark: the token and owner to
    /// write on the lines, or `None` for an accepted unfenced write.
    pub(super) fn check_fence<'f>(
        &self,
        session: &SessionId,
        fence: &'f WriteFence,
        index: &FileIndex,
    ) -> Result<Option<(u64, &'f str)>, StoreError> {
        match fence {
            WriteFence::Fenced(f) => {
                let (t, owner) = (f.token().get(), f.owner().as_str());
                if let Some(mark) = &index.high_water {
                    let refused =
                        t < mark.token || (t == mark.token && mark.owner.as_deref() != Some(owner));
                    if refused {
                        return Err(StoreError::Fenced {
                            session: session.clone(),
                            presented: f.token(),
                            presented_by: f.owner().clone(),
                            high_water: FencingToken::new(mark.token),
                            high_water_owner: mark
                                .owner
                                .as_deref()
                                .and_then(|o| OwnerId::new(o).ok()),
                        });
                    }
                }
                Ok(Some((t, owner)))
            }
            WriteFence::Unfenced => {
                if !self.opts.allow_unfenced || index.high_water.is_some() {
                    return Err(StoreError::Unfenced {
                        session: session.clone(),
                        high_water: index
                            .high_water
                            .as_ref()
                            .map(|m| FencingToken::new(m.token)),
                    });
                }
                Ok(None)
            }
        }
    }

    pub(super) fn create(&self, session: &SessionId, wait: Wait) -> Result<(), AttemptError> {
        let header = |ts: u64| header_line(session, ts, None);
        self.with_session(session, wait, |state, path| {
            for _ in 0..2 {
                if self.ensure_open(state, path)? {
                    // Waited for before the file's lock, never while
                    // holding it.
                    let mut held = Some(self.lock_index(false, wait)?);
                    return self.locked(
                        state,
                        path,
                        Some(session),
                        LockMode::Exclusive,
                        |file, index| {
                            if index.live {
                                return Err(StoreError::AlreadyExists {
                                    session: session.clone(),
                                });
                            }
                            // Deleted (or never completed): start a new incarnation.
                            self.repair(file, path, index)?;
                            self.log_unsure(session, &mut held)?;
                            let mut buf = framing(index);
                            buf.push_str(&header(self.now_ms()));
                            self.write_framed(file, path, index, buf)?;
                            index.id = Some(session.as_str().to_owned());
                            index.live = true;
                            index.deleted_at = None;
                            index.events.clear();
                            // Not written: `?` stays, which listing checks.
                            let _ = self.log_session(session, Some(Live::Yes), Wait::Once);
                            Ok(())
                        },
                    );
                }
                // A new file: it starts from what the graveyard kept of a
                // reclaimed predecessor, read after the file was seen
                // missing (entries are durable before files are removed).
                let grave = self.grave(session)?;
                let header = |ts: u64| header_line(session, ts, grave.as_ref());
                if self.create_file(session, path, &header, wait)? {
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
    ///
    /// The temporary file lies in a subdirectory ([`STAGING_DIR_NAME`]):
    /// only the link changes the store directory, and it is made under
    /// the listing index's lock, `?` logged before and the outcome and a
    /// marker after, so the index stays trusted while sessions are created.
    pub(super) fn create_file(
        &self,
        session: &SessionId,
        path: &Path,
        header: &dyn Fn(u64) -> String,
        wait: Wait,
    ) -> Result<bool, AttemptError> {
        let staging = self.dir.join(STAGING_DIR_NAME);
        if let Err(e) = DirBuilder::new().mode(0o700).create(&staging)
            && e.kind() != io::ErrorKind::AlreadyExists
        {
            return Err(StoreError::io("creating the staging directory", &staging, e).into());
        }
        let tmp = staging.join(tmp_name(&session_filename::stem(session)));
        let result = (|| -> Result<bool, AttemptError> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(open_flags())
                .open(&tmp)
                .map_err(|e| StoreError::io("creating session file", &tmp, e))?;
            let mut header = header(self.now_ms());
            push_commit(&mut header, 0);
            f.write_all(header.as_bytes())
                .map_err(|e| StoreError::io("writing session header", &tmp, e))?;

            if self.opts.fsync != FsyncPolicy::Never {
                f.sync_data()
                    .map_err(|e| StoreError::io("syncing session file", &tmp, e))?;
            }
            // Locked before it is linked: whoever looks at the new file
            // waits until the index says it is live.
            let _locked = Flock::lock(f, FlockArg::LockExclusive)
                .map_err(|(_, e)| StoreError::io("locking session file", &tmp, e.into()))?;
            self.changing_dir(wait, || {
                self.log_session_locked(session, Some(Live::Unsure))?;
                match std::fs::hard_link(&tmp, path) {
                    Ok(()) => {
                        // The session exists now, so this cannot fail the
                        // create; `?` stays, which listing checks.
                        let _ = self.log_session_locked(session, Some(Live::Yes));
                        #[cfg(test)]
                        super::crash_sim::record(
                            path,
                            super::crash_sim::Op::Created(header.into()),
                        );
                        Ok(true)
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(StoreError::io("linking session file", path, e).into()),
                }
            })
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

    /// Runs `write` on a live session's file under its exclusive lock,
    /// after the fence check (atomic with the write: the lock is held
    /// throughout) and the repair of a torn tail; `write` gets the accepted
    /// fence and the framing the file's tail needs. Raises the mark after a
    /// write that succeeded; `write` answers `None` when it chose to write
    /// nothing (a conditional append onto a log that moved), and the mark
    /// then stays what the file says. `write` may run again when the
    /// session's file had to be reopened.
    fn fenced_write<R>(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        wait: Wait,
        mut write: impl FnMut(
            &File,
            &Path,
            &mut FileIndex,
            &str,
            String,
        ) -> Result<Option<R>, StoreError>,
    ) -> Result<Option<R>, AttemptError> {
        self.with_session(session, wait, |state, path| {
            if !self.ensure_open(state, path)? {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                }
                .into());
            }
            self.locked(
                state,
                path,
                Some(session),
                LockMode::Exclusive,
                |file, index| {
                    if !index.live {
                        return Err(StoreError::NotFound {
                            session: session.clone(),
                        });
                    }
                    let fence = self.check_fence(session, fence, index)?;
                    self.repair(file, path, index)?;
                    let framing = framing(index);
                    let Some(written) = write(file, path, index, &fence_json(fence), framing)?
                    else {
                        return Ok(None);
                    };
                    if let Some((t, owner)) = fence {
                        let before = index.high_water.as_ref().map(|m| m.token);
                        index.raise_mark(t, Some(owner));
                        // Accepted: the mark is this token, never lower than
                        // before, and this token's only writer is this one.
                        debug_assert!(
                            index.high_water.as_ref().is_some_and(|m| m.token == t
                                && m.owner.as_deref() == Some(owner)
                                && before.is_none_or(|b| b <= t)),
                            "session {session}: mark {before:?} became {:?} accepting token {t} of {owner}",
                            index.high_water
                        );
                    }
                    Ok(Some(written))
                },
            )
        })
    }

    /// Appends `payloads`; with `after`, only onto a log whose last seq it
    /// is (`None` returned, nothing written, when the log moved past it).
    pub(super) fn append(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        payloads: &[String],
        after: Option<u64>,
        wait: Wait,
    ) -> Result<Option<AppendReceipt>, AttemptError> {
        self.fenced_write(
            session,
            fence,
            wait,
            |file, path, index, fence_text, mut buf| {
                if after.is_some_and(|a| index.next_seq != a.saturating_add(1)) {
                    return Ok(None);
                }
                let ts = self.now_ms();
                let total: usize = payloads.iter().map(|p| p.len() + 64).sum();
                buf.reserve(total + 64);
                let mut spans = Vec::with_capacity(payloads.len());
                let first_seq = index.next_seq;
                for (i, p) in payloads.iter().enumerate() {
                    let start = buf.len();
                    push_event_line(&mut buf, first_seq + i as u64, fence_text, ts, p);
                    spans.push((start as u64, (buf.len() - start) as u64));
                }
                let at = index.pos;
                self.write_framed(file, path, index, buf)?;
                for (i, (start, len)) in spans.into_iter().enumerate() {
                    index.events.push(EventSpan {
                        seq: first_seq + i as u64,
                        off: at + start,
                        len,
                    });
                }
                index.next_seq = first_seq + payloads.len() as u64;
                Ok(Some(AppendReceipt {
                    first_seq,
                    last_seq: index.next_seq - 1,
                }))
            },
        )
    }

    pub(super) fn delete(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        wait: Wait,
    ) -> Result<(), AttemptError> {
        // Waited for before the file's lock, as in `create`.
        let mut held = Some(self.lock_index(false, wait)?);
        self.fenced_write(
            session,
            fence,
            wait,
            |file, path, index, fence_text, mut buf| {
                let ts = self.now_ms();
                self.log_unsure(session, &mut held)?;
                buf.push_str(&deletion_line(fence_text, ts));
                self.write_framed(file, path, index, buf)?;
                index.deleted_at = Some(ts);
                index.live = false;
                index.events.clear();
                // Not written: `?` stays, which listing checks.
                let _ = self.log_session(session, None, Wait::Once);
                Ok(Some(()))
            },
        )
        .map(drop)
    }

    pub(super) fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
        wait: Wait,
    ) -> Result<Page, AttemptError> {
        let budget = self.opts.max_page_bytes as u64;
        self.with_session(session, wait, |state, path| {
            if !self.ensure_open(state, path)? {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                }
                .into());
            }
            self.locked(
                state,
                path,
                Some(session),
                LockMode::Shared,
                |file, index| {
                    if !index.live {
                        return Err(StoreError::NotFound {
                            session: session.clone(),
                        });
                    }
                    let start = index.events.partition_point(|e| e.seq < from_seq);
                    let end = page_end(&index.events, start, limit, budget);
                    let picked = &index.events[start..end];
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
                        next_seq: index.events.get(end).map(|e| e.seq),
                        unfinished_write: index.torn > 0,
                    })
                },
            )
        })
    }

    pub(super) fn high_water(
        &self,
        session: &SessionId,
        wait: Wait,
    ) -> Result<Option<FencingToken>, AttemptError> {
        self.with_session(session, wait, |state, path| {
            if !self.ensure_open(state, path)? {
                // Reclaimed (or never created): the graveyard knows.
                let grave = self.grave(session)?;
                return Ok(grave
                    .and_then(|g| g.mark)
                    .map(|m| FencingToken::new(m.token)));
            }
            self.locked(state, path, Some(session), LockMode::Shared, |_, index| {
                Ok(index
                    .high_water
                    .as_ref()
                    .map(|m| FencingToken::new(m.token)))
            })
        })
    }

    pub(super) fn last_seq(&self, session: &SessionId, wait: Wait) -> Result<u64, AttemptError> {
        self.with_session(session, wait, |state, path| {
            if !self.ensure_open(state, path)? {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                }
                .into());
            }
            self.locked(state, path, Some(session), LockMode::Shared, |_, index| {
                if !index.live {
                    return Err(StoreError::NotFound {
                        session: session.clone(),
                    });
                }
                Ok(index.next_seq.saturating_sub(1))
            })
        })
    }

    /// Every live session. A file that cannot be read as a session (a
    /// stray or damaged `*.jsonl`, one that names another session, one
    /// that cannot be opened) is logged and left out, so one bad file does
    /// not hide the others. A session locked past the deadline fails the
    /// listing with `Busy` (leaving it out would misreport it).
    pub(super) fn list(&self, wait: Wait) -> Result<Vec<SessionId>, AttemptError> {
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
            let live = self.with_session(&session, wait, |state, path| {
                if !self.ensure_open(state, path)? {
                    return Ok(false);
                }
                self.locked(state, path, Some(&session), LockMode::Shared, |_, index| {
                    Ok(index.live)
                })
            });
            match live {
                Ok(true) => out.push(session),
                Ok(false) => {}
                Err(AttemptError::Store(e)) if e.kind() != StoreErrorKind::Busy => {
                    warn!(path = %path.display(), error = %e, "listing skips a session file it cannot read");
                    lock(&self.names).remove(name);
                }
                Err(e) => return Err(e),
            }
        }
        out.sort();
        Ok(out)
    }
}

pub(super) fn validate_batch(events: &[Value], max: usize) -> Result<Vec<String>, StoreError> {
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
