//! Paged listing: the smallest live session ids after a cursor, taken
//! from the listing index (`list_index`), so a page costs what its own
//! sessions cost and not what the directory holds.

use std::ops::Bound;

use lease_port::SessionId;
use tracing::warn;

use super::list_index::Live;
use super::locking::{AttemptError, LockMode, Wait};
use super::{FILE_SUFFIX, StoreCore, lock};
use crate::{SessionPage, StoreErrorKind};

impl StoreCore {
    /// At most `limit` live sessions after `after`, and whether more follow.
    ///
    /// The index is brought up to date once, then read in id order a
    /// batch at a time. An id it knows live is listed as it is; only an
    /// unsure one (a change cut short, or a rebuilt index) is checked
    /// against its file, and what was found is recorded for later pages.
    pub(super) fn list_page(
        &self,
        after: Option<&SessionId>,
        limit: usize,
        wait: Wait,
    ) -> Result<SessionPage, AttemptError> {
        self.refresh_index(wait)?;
        // One more than the page: whether a session follows it.
        let want = limit + 1;
        let mut live = Vec::with_capacity(want.min(1024));
        let mut from = after.cloned();
        loop {
            let (batch, record): (Vec<(SessionId, Live)>, bool) = {
                let ix = lock(&self.list_index);
                let lower = from.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
                let batch = ix
                    .ids
                    .range::<SessionId, _>((lower, Bound::Unbounded))
                    .take(want - live.len())
                    .map(|(id, l)| (id.clone(), *l))
                    .collect();
                (batch, !ix.memory_only)
            };
            let exhausted = batch.len() < want - live.len();
            for (session, known) in batch {
                from = Some(session.clone());
                if known == Live::Yes || self.is_live(&session, record, wait)? {
                    live.push(session);
                    if live.len() == want {
                        live.pop();
                        return Ok(SessionPage::new(live, true));
                    }
                }
            }
            if exhausted {
                return Ok(SessionPage::new(live, false));
            }
        }
    }

    /// The session a `*.jsonl` file is named for. A plain stem spells its
    /// id, so nothing is read (the header is still compared when the file
    /// is opened to check the session is live); a hashed one is read from
    /// the header. `None`, with a warning, for a file that cannot be a
    /// session.
    pub(super) fn session_named(&self, name: &str, stem: &str) -> Option<SessionId> {
        let path = || self.dir.join(name);
        if let Some(id) = session_filename::decode(stem) {
            return match SessionId::new(id) {
                Ok(session) => Some(session),
                Err(e) => {
                    warn!(path = %path().display(), error = %e, "listing skips a file whose name is no session id");
                    None
                }
            };
        }
        match self.session_in(name, stem, &path()) {
            Ok(session) => session,
            Err(e) => {
                warn!(path = %path().display(), error = %e, "listing skips a file that is not a readable session");
                None
            }
        }
    }

    /// Whether `session` exists (created and not deleted), by its file,
    /// recorded in the index (with `record`) while the file's lock is
    /// held, so no change of the session can slip between what was found
    /// and what is recorded. A file that cannot be read as the session is
    /// logged and counts as absent, as in a full listing; a session locked
    /// past the deadline fails the listing with `Busy` (leaving it out
    /// would misreport it).
    fn is_live(&self, session: &SessionId, record: bool, wait: Wait) -> Result<bool, AttemptError> {
        let live = self.with_session(session, wait, |state, path| {
            if !self.ensure_open(state, path)? {
                if record {
                    self.record_missing(session, path);
                }
                return Ok(false);
            }
            self.locked(state, path, Some(session), LockMode::Shared, |_, index| {
                if record {
                    let known = index.live.then_some(Live::Yes);
                    // Only saves the next page this check: never waited for.
                    let _ = self.log_session(session, known, Wait::Once);
                }
                Ok(index.live)
            })
        });
        match live {
            Err(AttemptError::Store(e)) if e.kind() != StoreErrorKind::Busy => {
                let stem = session_filename::stem(session);
                warn!(session = %session, error = %e, "listing skips a session file it cannot read");
                lock(&self.names).remove(&format!("{stem}{FILE_SUFFIX}"));
                Ok(false)
            }
            other => other,
        }
    }

    /// Records `session`, whose file is missing, as not live: under the
    /// index lock, which every link of a new file holds, after looking
    /// again, so a file linked meanwhile is not recorded as missing.
    fn record_missing(&self, session: &SessionId, path: &std::path::Path) {
        let Ok(Some(_shared)) = self.lock_index(false, Wait::Once) else {
            return;
        };
        let missing = std::fs::symlink_metadata(path)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if missing {
            let _ = self.log_session_locked(session, None);
        }
    }
}
