//! The sessions a store keeps open — each file with its index, behind one
//! mutex — and the session ids a listing learnt from file headers, so a
//! busy session is not re-read from the start on every call.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use lease_port::SessionId;
use nix::errno::Errno;

use super::format::read_header_id;
use super::index::FileIndex;
use super::{StoreCore, lock, open_flags};
use crate::StoreError;

/// An open session: its file name outside the lock, its state inside.
#[derive(Debug)]
pub(super) struct OpenSession {
    pub(super) path: Arc<Path>,
    pub(super) state: Mutex<FileState>,
}

/// A session's open file (if any) and what the store knows of it, both
/// behind the session's in-process mutex.
#[derive(Debug, Default)]
pub(super) struct FileState {
    pub(super) file: Option<File>,
    pub(super) index: FileIndex,
}

impl StoreCore {
    /// The session's entry, made on first use; beyond
    /// [`max_open`](super::JsonlOptions::max_open) entries, idle ones are
    /// forgotten first.
    pub(super) fn open_session(&self, session: &SessionId) -> Arc<OpenSession> {
        let mut open_sessions = lock(&self.open_sessions);
        if let Some(s) = open_sessions.get(session) {
            return Arc::clone(s);
        }
        if open_sessions.len() >= self.opts.max_open {
            // Forget idle entries (nobody else holds them). Their files are
            // re-read when next used.
            open_sessions.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let s = Arc::new(OpenSession {
            path: self.path(&session_filename::stem(session)).into(),
            state: Mutex::default(),
        });
        open_sessions.insert(session.clone(), Arc::clone(&s));
        s
    }

    pub(super) fn open_file(&self, path: &Path) -> Result<Option<File>, StoreError> {
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

    /// Makes sure the state has its file open; false when it does not exist.
    pub(super) fn ensure_open(
        &self,
        state: &mut FileState,
        path: &Path,
    ) -> Result<bool, StoreError> {
        if state.file.is_none() {
            match self.open_file(path)? {
                Some(f) => state.file = Some(f),
                None => {
                    state.index = FileIndex::default();
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The session a file named `name` holds, from its header (read once,
    /// then remembered).
    pub(super) fn session_in(
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
