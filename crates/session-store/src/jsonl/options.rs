//! How a [`JsonlStore`](super::JsonlStore) is configured: its defaults
//! and the builder-style [`JsonlOptions`], kept apart from the store so the
//! knobs can be read in one place.

use std::sync::Arc;
use std::time::Duration;

use lease_port::{Clock, SystemClock};

use super::GenerationCheck;

/// The largest serialised event accepted, by default.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Session files kept open (with their index) by default.
pub const DEFAULT_MAX_OPEN: usize = 1024;

/// How long a call waits for a session's lock by default before giving up
/// with [`StoreErrorKind::Busy`](crate::StoreErrorKind::Busy).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The most bytes of stored lines one page reads by default.
pub const DEFAULT_MAX_PAGE_BYTES: usize = 4 << 20;

/// When appends reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FsyncPolicy {
    /// `fdatasync` after every write, before it is acknowledged (and the
    /// directory after a file is created). Every store call then runs on
    /// tokio's blocking pool.
    Always,
    /// `fdatasync` after a write when at least this long has passed since
    /// the session file's last sync. Writes after the last sync are lost by
    /// a crash (of the machine, not of the process).
    Interval(Duration),
    /// Leave it to the kernel.
    Never,
}

/// Configures a [`JsonlStore`](super::JsonlStore).
#[derive(Debug, Clone)]
pub struct JsonlOptions {
    pub(super) fsync: FsyncPolicy,
    pub(super) allow_unfenced: bool,
    pub(super) cross_process: bool,
    pub(super) max_event_bytes: usize,
    pub(super) max_open: usize,
    pub(super) lock_timeout: Duration,
    pub(super) max_page_bytes: usize,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) generation: GenerationCheck,
}

impl Default for JsonlOptions {
    fn default() -> Self {
        Self {
            fsync: FsyncPolicy::Always,
            allow_unfenced: false,
            cross_process: true,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_open: DEFAULT_MAX_OPEN,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            max_page_bytes: DEFAULT_MAX_PAGE_BYTES,
            clock: Arc::new(SystemClock),
            generation: GenerationCheck::Off,
        }
    }
}

impl JsonlOptions {
    /// When writes reach the disk. Default [`FsyncPolicy::Always`].
    pub fn fsync(mut self, policy: FsyncPolicy) -> Self {
        self.fsync = policy;
        self
    }

    /// Accept [`WriteFence::Unfenced`](crate::WriteFence::Unfenced) writes (to sessions that never
    /// accepted a fenced one). Default false. Enable it only when the
    /// deployment proves that a single process uses the directory.
    pub fn allow_unfenced(mut self, allow: bool) -> Self {
        self.allow_unfenced = allow;
        self
    }

    /// Take an exclusive `flock` on the session file around every
    /// check-and-append (shared around reads), so several processes can use
    /// one directory. Default true. Turning it off saves two system calls
    /// per operation and is safe only when one process uses the directory.
    pub fn cross_process(mut self, on: bool) -> Self {
        self.cross_process = on;
        self
    }

    /// The largest serialised event accepted. Default 1 MiB.
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// How many session files to keep open with their in-memory index.
    /// Default 1024.
    pub fn max_open(mut self, files: usize) -> Self {
        self.max_open = files.max(1);
        self
    }

    /// How long a call waits for a session that someone else has locked
    /// (another process holding its file lock, or a slow call of this
    /// process while [`cross_process`](Self::cross_process) is on) before
    /// failing with [`StoreErrorKind::Busy`](crate::StoreErrorKind::Busy).
    /// Default 5 s ([`DEFAULT_LOCK_TIMEOUT`]).
    ///
    /// The wait happens on tokio's blocking pool, never on an async worker
    /// thread: a process stopped while holding a session's lock delays only
    /// the calls for that session, and only this long.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The most bytes of stored lines (an event's payload plus about 60
    /// bytes of framing) one [`read`](crate::SessionStore::read) returns, besides
    /// its `limit` on the count. A page always holds at least one event,
    /// however large, so a reader always progresses; `next_seq` says where
    /// the rest starts. Default 4 MiB ([`DEFAULT_MAX_PAGE_BYTES`]).
    pub fn max_page_bytes(mut self, bytes: usize) -> Self {
        self.max_page_bytes = bytes;
        self
    }

    /// The clock event timestamps come from. Default the system clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Whether [`JsonlStore::open`](super::JsonlStore::open) checks that
    /// the directory has not come back older, and advances its generation.
    /// Default [`GenerationCheck::Off`]: nothing is read or written, as
    /// readers and operator tools want.
    ///
    /// A server that writes to the store sets
    /// [`GenerationCheck::Witness`] with its lease directory (or
    /// [`GenerationCheck::InStore`] when its leases live elsewhere): `open`
    /// then fails with [`StoreErrorKind::Rewound`](crate::StoreErrorKind::Rewound)
    /// for a copy of the directory, or one older than its witness, until it
    /// is adopted ([`adopt_store_dir`](super::adopt_store_dir)). See the
    /// crate docs, "The store's generation".
    pub fn generation(mut self, check: GenerationCheck) -> Self {
        self.generation = check;
        self
    }
}
