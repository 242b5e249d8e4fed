//! How bytes reach the end of a session file: a torn tail is cut first,
//! the write is synced as the policy says, and a write (or sync) that
//! fails is cut back so a write reported failed never appears later.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::Path;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::warn;

use super::index::FileIndex;
use super::{FsyncPolicy, StoreCore};
use crate::StoreError;

impl StoreCore {
    /// `fdatasync` when the policy says one is due.
    pub(super) fn sync_after_write(&self, file: &File, index: &mut FileIndex) -> io::Result<()> {
        let due = match self.opts.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Never => false,
            FsyncPolicy::Interval(every) => index.last_sync.is_none_or(|t| t.elapsed() >= every),
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
            index.last_sync = Some(Instant::now());
        }
        Ok(())
    }

    /// Removes a torn tail before writing after it; appends with O_APPEND
    /// would otherwise glue a new line onto the torn one.
    pub(super) fn repair(
        &self,
        file: &File,
        path: &Path,
        index: &mut FileIndex,
    ) -> Result<(), StoreError> {
        if index.torn > 0 {
            warn!(path = %path.display(), bytes = index.torn, "removing a torn final line left by a crash");
            file.set_len(index.pos)
                .map_err(|e| StoreError::io("truncating a torn line", path, e))?;
            index.torn = 0;
        }
        Ok(())
    }

    /// Writes `bytes` at the end (`index.pos`, the file locked) and syncs
    /// them as the policy says. The caller advances the index only on
    /// success.
    ///
    /// On failure — of the write, or of the sync after a complete write —
    /// the file is cut back to `index.pos`, so a write reported failed never
    /// appears later, and the index stays in step with the file. Only when
    /// the cut fails too may the bytes remain: the error says so, and the
    /// index is marked for a full re-read so the store follows the file
    /// (sequence numbers are never reused).
    pub(super) fn write_end(
        &self,
        mut file: &File,
        path: &Path,
        index: &mut FileIndex,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let (op, source) = match file.write_all(bytes) {
            Err(e) => ("appending to session file", e),
            Ok(()) => match self.sync_after_write(file, index) {
                Ok(()) => return Ok(()),
                Err(e) => ("syncing session file", e),
            },
        };
        if let Err(cut) = file.set_len(index.pos) {
            warn!(path = %path.display(), %cut, "cannot cut back a failed write; re-reading the file");
            index.valid = false;
            let op = if op == "syncing session file" {
                "syncing session file (the write could not be cut back and may be stored)"
            } else {
                "appending to session file (the partial write could not be cut back)"
            };
            return Err(StoreError::io(op, path, source));
        }
        Err(StoreError::io(op, path, source))
    }
}
