//! Paged listing: the smallest session ids after a cursor, found by
//! streaming the directory while keeping only as many names as the page
//! needs, so memory follows the page and not the store.

use std::collections::BinaryHeap;

use lease_port::SessionId;
use tracing::warn;

use super::locking::{AttemptError, LockMode, Wait};
use super::{FILE_SUFFIX, StoreCore, lock};
use crate::{SessionPage, StoreError, StoreErrorKind};

impl StoreCore {
    /// At most `limit` live sessions after `after`, and whether more follow.
    ///
    /// Each pass streams the directory once and keeps the smallest ids
    /// after the cursor (a bounded max-heap), then checks which of them
    /// are live in id order. Deleted sessions keep their files, so a pass
    /// may come up short; the next one resumes after the last id it
    /// checked and keeps twice as many, so a directory dense with deleted
    /// sessions costs a few passes rather than one per missing session.
    pub(super) fn list_page(
        &self,
        after: Option<&SessionId>,
        limit: usize,
        wait: Wait,
    ) -> Result<SessionPage, AttemptError> {
        // One more than the page: whether a session follows it.
        let want = limit + 1;
        let mut live = Vec::with_capacity(want.min(1024));
        let mut from = after.cloned();
        let mut keep = want;
        loop {
            let (candidates, exhausted) = self.smallest_after(from.as_ref(), keep)?;
            for session in candidates {
                from = Some(session.clone());
                if self.is_live(&session, wait)? {
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
            keep = keep.saturating_mul(2);
        }
    }

    /// The `keep` smallest session ids of the directory greater than
    /// `after`, sorted, and whether they were all there were.
    fn smallest_after(
        &self,
        after: Option<&SessionId>,
        keep: usize,
    ) -> Result<(Vec<SessionId>, bool), StoreError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| StoreError::io("listing store directory", &self.dir, e))?;
        let mut heap: BinaryHeap<SessionId> = BinaryHeap::with_capacity(keep.min(1024) + 1);
        let mut dropped = false;
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
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let Some(session) = self.session_named(name, stem) else {
                continue;
            };
            if after.is_some_and(|a| &session <= a) {
                continue;
            }
            if heap.len() == keep {
                // Full: only an id below the largest kept one gets in.
                if heap.peek().is_some_and(|largest| &session >= largest) {
                    dropped = true;
                    continue;
                }
                heap.pop();
                dropped = true;
            }
            heap.push(session);
        }
        Ok((heap.into_sorted_vec(), !dropped))
    }

    /// The session a `*.jsonl` file is named for. A plain stem spells its
    /// id, so nothing is read (the header is still compared when the file
    /// is opened to check the session is live); a hashed one is read from
    /// the header. `None`, with a warning, for a file that cannot be a
    /// session.
    fn session_named(&self, name: &str, stem: &str) -> Option<SessionId> {
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

    /// Whether `session` exists (created and not deleted). A file that
    /// cannot be read as the session is logged and counts as absent, as
    /// in a full listing; a session locked past the deadline fails the
    /// listing with `Busy` (leaving it out would misreport it).
    fn is_live(&self, session: &SessionId, wait: Wait) -> Result<bool, AttemptError> {
        let live = self.with_session(session, wait, |state, path| {
            if !self.ensure_open(state, path)? {
                return Ok(false);
            }
            self.locked(state, path, Some(session), LockMode::Shared, |_, index| {
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
}
