//! The JSONL directory store: one append-only JSON-lines file per session,
//! every write fenced by the writer's lease token.
//!
//! Everything here is also exported at the crate root; the crate
//! documentation describes the store's format and rules.

// This file holds the store itself (opening the directory, the
// `SessionStore` methods); the work is split by concern: `options`
// (configuration), `format` (what a line of a session file says), `index`
// (what the store knows of a file), `cache` (the open sessions and the
// names a listing learnt), `list_index` (which sessions are live, shared
// through a log), `listing` (paged listing), `locking`
// (in-process mutex, `flock`, when a call leaves the async worker), `write` (how bytes reach the end of a
// file, and are taken back on failure), `ops` (the fenced operations
// built from them) and `generation` (the directory's generation record and
// its witness).

mod authority;
mod cache;
#[cfg(feature = "cancel-requests")]
mod cancel;
#[cfg(test)]
mod crash_sim;
mod format;
mod generation;
mod graveyard;
mod hub;
mod index;
mod list_index;
#[cfg(test)]
mod list_index_tests;
mod listing;
mod locking;
mod notify;
mod ops;
mod options;
#[cfg(test)]
mod tests;
mod write;

use std::collections::HashMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, SessionId};
use nix::fcntl::OFlag;
use serde_json::Value;

#[cfg(feature = "cancel-requests")]
use crate::CancelRequest;
use crate::{
    AppendReceipt, ListCursor, Page, SessionPage, SessionStore, StoreError, WriteFence,
    check_list_limit,
};
pub use authority::AUTHORITY_FILE_NAME;
use cache::OpenSession;
#[cfg(feature = "cancel-requests")]
pub use cancel::CANCEL_DIR_NAME;
use format::millis;
pub use generation::{
    GENERATION_FILE_NAME, GenerationCheck, StoreGeneration, WITNESS_DIR_NAME, adopt_store_dir,
};
pub use graveyard::{GRAVEYARD_FILE_NAME, ReclaimReport};
use ops::validate_batch;
pub use options::{
    DEFAULT_LOCK_TIMEOUT, DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_OPEN, DEFAULT_MAX_PAGE_BYTES,
    FsyncPolicy, JsonlOptions,
};

/// The name of the subdirectory of a store directory where a server keeps
/// the store's file leases (`flocklease`) unless told otherwise:
/// `.session-leases`. [`JsonlStore::list`](SessionStore::list) ignores it,
/// like every name starting with `.`.
pub const DEFAULT_LEASE_DIR_NAME: &str = ".session-leases";

/// Where new session files are written before they are linked into the
/// store directory, so that only the link changes the directory.
const STAGING_DIR_NAME: &str = ".staging";

/// Suffix of session files.
pub const FILE_SUFFIX: &str = ".jsonl";

/// One session file per session in a directory; every write fenced.
///
/// Cheap to clone; clones share the open files and indexes. Any number of
/// processes may open the same directory (with the default
/// [`cross_process`](JsonlOptions::cross_process)).
#[derive(Clone, Debug)]
pub struct JsonlStore {
    core: Arc<StoreCore>,
}

/// What every clone of a [`JsonlStore`] shares: the directory, the
/// options, the open sessions.
#[derive(Debug)]
struct StoreCore {
    dir: PathBuf,
    dir_file: File,
    opts: JsonlOptions,
    open_sessions: Mutex<HashMap<SessionId, Arc<OpenSession>>>,
    /// Session ids read from the headers of files [`list`] found, by file
    /// name, so a listing does not open every file to learn them again.
    ///
    /// [`list`]: SessionStore::list
    names: Mutex<HashMap<String, SessionId>>,
    /// The ids of the directory's session files, sorted, as far as this
    /// instance has read the shared listing index.
    list_index: Mutex<list_index::ListIndex>,
    /// The generation this instance last claimed (with a generation check
    /// on): a record found lower later went back under it.
    generation: Mutex<Option<generation::StoreGeneration>>,
    /// Why the directory is refused from now on: a later check found it
    /// older than what this instance claimed (put back from a copy while it
    /// served). Every call is then refused; only a new instance, after the
    /// operator adopted the directory, serves it again.
    went_back: Mutex<Option<String>>,
    /// The directory's watch, which wakes this process's waiters.
    hub: hub::Hub,
    /// Test hook: how many of the next data syncs fail.
    #[cfg(test)]
    fail_syncs: std::sync::atomic::AtomicU32,
    /// Test hook: outcome lines of the listing index are not written, as
    /// by a process killed right after its change.
    #[cfg(test)]
    skip_outcomes: std::sync::atomic::AtomicBool,
    /// Test hook: how many times cancel requests were read.
    #[cfg(test)]
    cancel_reads: std::sync::atomic::AtomicU64,
}

/// Numbers the temporary files of this process: one counter for every
/// store instance, so two instances on one directory never pick the same
/// name (the name also holds the process id).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary file name in the store directory, unique to this call:
/// `.tmp-<what>-<pid>-<n>`.
fn tmp_name(what: &str) -> String {
    let n = TMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".tmp-{what}-{}-{n}", std::process::id())
}

/// Locks a mutex, ignoring poisoning.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Flags every session file is opened with: never follow a symbolic link,
/// never block, close on exec.
fn open_flags() -> i32 {
    (OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).bits()
}

impl JsonlStore {
    /// Opens (creating it, mode 0700, when missing) the store directory.
    ///
    /// With a [generation check](JsonlOptions::generation) on, it then
    /// checks the directory's generation record (and its witness) and
    /// advances it durably, once: blocking, a few `fsync`s, at start-up.
    ///
    /// Errors: `Invalid` when `dir` exists but is not a directory (or is a
    /// symbolic link); `Io` when it cannot be created or opened. With a
    /// generation check: `Rewound` when the directory is a copy or older
    /// than its witness (the message names both files and how to adopt it:
    /// [`adopt_store_dir`]); `Corrupt` for a damaged generation record or
    /// witness; `Unavailable` when another process held the generation
    /// lock past [`JsonlOptions::lock_timeout`].
    pub fn open(dir: impl Into<PathBuf>, opts: JsonlOptions) -> Result<Self, StoreError> {
        let dir = dir.into();
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => {
                return Err(StoreError::invalid(format!(
                    "{} is not a directory (symbolic links are refused)",
                    dir.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| StoreError::io("creating store directory", &dir, e))?;
            }
            Err(e) => return Err(StoreError::io("inspecting store directory", &dir, e)),
        }
        let dir_file = OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&dir)
            .map_err(|e| StoreError::io("opening store directory", &dir, e))?;
        let store = Self {
            core: Arc::new(StoreCore {
                hub: hub::Hub::new(&dir),
                dir,
                dir_file,
                opts,
                open_sessions: Mutex::default(),
                names: Mutex::default(),
                list_index: Mutex::default(),
                generation: Mutex::default(),
                went_back: Mutex::default(),
                #[cfg(test)]
                fail_syncs: std::sync::atomic::AtomicU32::new(0),
                #[cfg(test)]
                skip_outcomes: std::sync::atomic::AtomicBool::new(false),
                #[cfg(test)]
                cancel_reads: std::sync::atomic::AtomicU64::new(0),
            }),
        };
        if store.core.opts.generation != GenerationCheck::Off {
            store.core.claim_generation()?;
        }
        Ok(store)
    }

    /// The generation this instance claimed when it opened the directory,
    /// or last [advanced](Self::advance_generation) it to; `None` without a
    /// [generation check](JsonlOptions::generation). Other writers on the
    /// directory may have advanced it since.
    pub fn generation(&self) -> Option<StoreGeneration> {
        lock(&self.core.generation).clone()
    }

    /// Checks the directory again exactly as [`open`](Self::open) did and
    /// advances its generation (in the store and in its witness).
    ///
    /// A restore is noticed only when the copy put back is older than the
    /// last advance, so a server advances at start-up (`open` does), when
    /// it stops, and every so often while it runs (say every few minutes:
    /// a few `fsync`s each time); then a backup taken while it ran is
    /// refused too once put back. Runs on tokio's blocking pool.
    ///
    /// Errors as for `open`, and `Rewound` when the record went back (or was
    /// replaced) since this instance last claimed it; `Invalid` without a
    /// generation check.
    pub async fn advance_generation(&self) -> Result<StoreGeneration, StoreError> {
        self.blocking(StoreCore::claim_generation).await
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// Where the server keeps file leases for this store:
    /// `<dir>/.session-leases` ([`DEFAULT_LEASE_DIR_NAME`]).
    pub fn lease_dir(&self) -> PathBuf {
        self.core.dir.join(DEFAULT_LEASE_DIR_NAME)
    }

    /// The file holding `session`.
    pub fn path_of(&self, session: &SessionId) -> PathBuf {
        self.core.path(&session_filename::stem(session))
    }
}

impl JsonlStore {
    /// Runs `f` on tokio's blocking pool (for rare calls that sync).
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&StoreCore) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let core = Arc::clone(&self.core);
        tokio::task::spawn_blocking(move || f(&core))
            .await
            .map_err(|e| {
                StoreError::io(
                    "running a blocking store task",
                    &self.core.dir,
                    io::Error::other(e.to_string()),
                )
            })?
    }
}

impl StoreCore {
    fn path(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}{FILE_SUFFIX}"))
    }

    fn now_ms(&self) -> u64 {
        millis(self.opts.clock.now())
    }
}

#[async_trait]
impl SessionStore for JsonlStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        let session = session.clone();
        self.run(move |core, wait| core.create(&session, wait))
            .await
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        let payloads = validate_batch(events, self.core.opts.max_event_bytes)?;
        let session = session.clone();
        let written = self
            .run(move |core, wait| core.append(&session, &fence, &payloads, None, wait))
            .await?;
        // Unconditional, it always writes.
        written.ok_or_else(|| StoreError::invalid("an unconditional append wrote nothing"))
    }

    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        let payloads = validate_batch(events, self.core.opts.max_event_bytes)?;
        let session = session.clone();
        self.run(move |core, wait| core.append(&session, &fence, &payloads, Some(after), wait))
            .await
    }

    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError> {
        if limit == 0 {
            return Err(StoreError::invalid("a page needs a limit of at least 1"));
        }
        let session = session.clone();
        self.run(move |core, wait| core.read(&session, from_seq, limit, wait))
            .await
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.run(|core, wait| core.list(wait)).await
    }

    async fn list_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        check_list_limit(limit)?;
        let after = after.map(|c| c.last().clone());
        self.run_blocking(move |core, wait| core.list_page(after.as_ref(), limit, wait))
            .await
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let session = session.clone();
        self.run(move |core, wait| core.delete(&session, &fence, wait))
            .await
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        let session = session.clone();
        self.run(move |core, wait| core.high_water(&session, wait))
            .await
    }

    async fn last_seq(&self, session: &SessionId) -> Result<u64, StoreError> {
        let session = session.clone();
        self.run(move |core, wait| core.last_seq(&session, wait))
            .await
    }

    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        let authority = authority.clone();
        self.blocking(move |core| core.bind_authority(&authority))
            .await
    }

    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.blocking(StoreCore::read_authority).await
    }

    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.wait_for_append_to_file(session, after_seq, timeout)
            .await
    }

    #[cfg(feature = "cancel-requests")]
    async fn wait_for_cancel_request(
        &self,
        session: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<CancelRequest>, StoreError> {
        self.wait_for_cancel_file(session, after_serial, timeout)
            .await
    }

    #[cfg(feature = "cancel-requests")]
    async fn request_cancel(
        &self,
        session: &SessionId,
        run: FencingToken,
    ) -> Result<(), StoreError> {
        // Only sessions that exist take requests.
        self.read(session, 1, 1).await?;
        let session = session.clone();
        self.blocking(move |core| core.write_cancel_request(&session, run))
            .await
    }

    #[cfg(feature = "cancel-requests")]
    async fn cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<CancelRequest>, StoreError> {
        let session = session.clone();
        self.blocking(move |core| core.read_cancel_request(&session))
            .await
    }
}
