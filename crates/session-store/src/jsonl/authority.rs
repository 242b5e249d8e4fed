//! The record of the lease authority that fences a store directory:
//! `<dir>/.fencing-authority`, written once — a private temporary file,
//! synced, hard-linked into place (a racing creator finds the name taken
//! and compares instead), the directory synced — and compared ever after.

use std::fs::OpenOptions;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use lease_port::AuthorityId;
use serde::Deserialize;

use super::{StoreCore, open_flags, tmp_name};
use crate::StoreError;

/// The name of the record in the store directory.
pub const AUTHORITY_FILE_NAME: &str = ".fencing-authority";

/// The largest record read (an id is at most a few hundred bytes).
const MAX_RECORD_BYTES: u64 = 4096;

#[derive(Deserialize)]
struct Record {
    v: u64,
    authority: String,
}

fn record_text(authority: &AuthorityId) -> String {
    format!(
        "{}\n",
        serde_json::json!({"v": 1, "authority": authority.as_str()})
    )
}

impl StoreCore {
    fn authority_path(&self) -> std::path::PathBuf {
        self.dir.join(AUTHORITY_FILE_NAME)
    }

    /// The recorded authority; `None` when there is no record.
    pub(super) fn read_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        let path = self.authority_path();
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(open_flags())
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("opening the authority record", &path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting the authority record", &path, e))?;
        if !meta.file_type().is_file() {
            return Err(damaged(&path, "not a regular file"));
        }
        let mut text = String::new();
        (&mut file)
            .take(MAX_RECORD_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| StoreError::io("reading the authority record", &path, e))?;
        let parsed = text
            .strip_suffix('\n')
            .and_then(|line| serde_json::from_str::<Record>(line).ok())
            .filter(|r| r.v == 1)
            .ok_or_else(|| damaged(&path, "not a complete authority record"))?;
        let id = AuthorityId::new(&parsed.authority)
            .map_err(|e| damaged(&path, &format!("the recorded id is invalid: {e}")))?;
        Ok(Some(id))
    }

    /// Records `authority` unless a record exists, then compares.
    pub(super) fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        let recorded = match self.read_authority()? {
            Some(recorded) => recorded,
            None => self.create_authority(authority)?,
        };
        if recorded == *authority {
            return Ok(());
        }
        Err(StoreError::authority_mismatch(
            self.authority_path().display().to_string(),
            recorded,
            authority.clone(),
        ))
    }

    /// Creates the record for `authority`; when another creator got there
    /// first, the authority it recorded.
    fn create_authority(&self, authority: &AuthorityId) -> Result<AuthorityId, StoreError> {
        let path = self.authority_path();
        let tmp = self.dir.join(tmp_name("authority"));
        let linked = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(open_flags())
                .open(&tmp)
                .map_err(|e| StoreError::io("creating the authority record", &tmp, e))?;
            f.write_all(record_text(authority).as_bytes())
                .map_err(|e| StoreError::io("writing the authority record", &tmp, e))?;
            f.sync_all()
                .map_err(|e| StoreError::io("syncing the authority record", &tmp, e))?;
            match std::fs::hard_link(&tmp, &path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(StoreError::io("linking the authority record", &path, e)),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        if !linked? {
            return self
                .read_authority()?
                .ok_or_else(|| damaged(&path, "removed while being created"));
        }
        self.dir_file.sync_all().map_err(|e| {
            StoreError::io(
                "syncing the store directory after recording its authority (the record exists)",
                &self.dir,
                e,
            )
        })?;
        Ok(authority.clone())
    }
}

fn damaged(path: &Path, what: &str) -> StoreError {
    StoreError::corrupt(
        path,
        None,
        format!(
            "{what}; the store's fencing authority is unknown. Restore the record, or — only if you know which lease authority fences this store — remove it and start a server with that authority's backend"
        ),
    )
}
