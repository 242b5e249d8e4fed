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
    pub(super) fn sync_after_write(
        &self,
        file: &File,
        path: &Path,
        index: &mut FileIndex,
    ) -> io::Result<()> {
        let due = match self.opts.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Never => false,
            FsyncPolicy::Interval(every) => index.last_sync.is_none_or(|t| t.elapsed() >= every),
        };
        if due {
            self.sync_file(file, path)?;
            index.last_sync = Some(Instant::now());
        }
        Ok(())
    }

    /// `fdatasync` (which also makes a changed length durable).
    fn sync_file(&self, file: &File, path: &Path) -> io::Result<()> {
        #[cfg(test)]
        {
            let fail = self
                .fail_syncs
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if fail.is_ok() {
                return Err(io::Error::other("injected fdatasync failure"));
            }
        }
        let _ = path;
        file.sync_data()?;
        #[cfg(test)]
        super::crash_sim::record(
            path,
            super::crash_sim::Op::Sync(std::thread::current().id()),
        );
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
            #[cfg(test)]
            super::crash_sim::record(path, super::crash_sim::Op::SetLen(index.pos));
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
        let written = file.write_all(bytes);
        #[cfg(test)]
        if written.is_ok() {
            super::crash_sim::record(path, super::crash_sim::Op::Append(bytes.to_vec()));
        }
        let (op, source) = match written {
            Err(e) => ("appending to session file", e),
            Ok(()) => match self.sync_after_write(file, path, index) {
                Ok(()) => return Ok(()),
                Err(e) => ("syncing session file", e),
            },
        };
        let cut = file.set_len(index.pos);
        #[cfg(test)]
        if cut.is_ok() {
            super::crash_sim::record(path, super::crash_sim::Op::SetLen(index.pos));
        }
        if let Err(cut) = cut {
            warn!(path = %path.display(), %cut, "cannot cut back a failed write; re-reading the file");
            index.valid = false;
            let op = if op == "syncing session file" {
                "syncing session file (the write could not be cut back and may be stored)"
            } else {
                "appending to session file (the partial write could not be cut back)"
            };
            return Err(StoreError::io(op, path, source));
        }
        // The cut must be as durable as the write could have been: else a
        // machine crash could bring back bytes the write left on disk.
        if self.opts.fsync != FsyncPolicy::Never
            && let Err(sync) = self.sync_file(file, path)
        {
            warn!(path = %path.display(), %sync, "cannot sync the cut-back of a failed write");
            let op = if op == "syncing session file" {
                "syncing session file (cut back, but the cut could not be synced: after a machine crash the write may reappear)"
            } else {
                "appending to session file (cut back, but the cut could not be synced: after a machine crash the write may reappear)"
            };
            return Err(StoreError::io(op, path, source));
        }
        Err(StoreError::io(op, path, source))
    }
}
