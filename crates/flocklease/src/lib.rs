//! [`SessionLease`] for processes on one host: one lease file per session in
//! a shared directory, each read and rewritten under a short `flock`.
//!
//! # What it is for
//!
//! Several server processes on one machine (replicas behind a local load
//! balancer, a worker pool, a restarted process overlapping its predecessor)
//! must not drive the same session at once. Point every process at the same
//! directory and each session has exactly one live owner, with a fencing
//! token that rises on every takeover — across releases, expiries, process
//! crashes and host restarts. Tokens rise strictly but not consecutively
//! (see "Durability").
//!
//! # When to choose it
//!
//! - All competing processes run on **one host** and can share a directory
//!   on a **local** file system (ext4, xfs, btrfs, APFS). tmpfs works but a
//!   reboot empties it and restarts every token at 1; see
//!   [`FlockLease::is_volatile`].
//! - You want nothing to deploy: no lease service, no cluster API.
//!
//! Not for: processes on several hosts (use a lease service shared by the
//! hosts), or
//! tasks of one process only (`memlease` is cheaper). **Never put the
//! directory on a network file system** (NFS, SMB, CephFS, 9p, FUSE mounts of
//! remote storage): `flock` there is emulated, absent, or local to one client,
//! and two hosts could both believe they own a session.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use flocklease::FlockLease;
//! use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! // Each process opens its own instance on the shared directory.
//! let replica_a = FlockLease::builder(dir.path()).ttl(Duration::from_secs(30)).open()?;
//! let replica_b = FlockLease::builder(dir.path()).ttl(Duration::from_secs(30)).open()?;
//! let (a, b) = (OwnerId::new("host1/pid-100")?, OwnerId::new("host1/pid-200")?);
//! let chat = SessionId::new("chat/7")?;
//!
//! let lease = replica_a.acquire(&chat, &a).await?;
//! let err = replica_b.acquire(&chat, &b).await.unwrap_err();
//! assert_eq!(err.kind(), LeaseErrorKind::Held);
//! assert_eq!(err.holder(), Some(&a));
//!
//! let lease = replica_a.renew(&lease).await?; // every TTL/3 or so
//! replica_a.release(&lease).await?;
//! let next = replica_b.acquire(&chat, &b).await?;
//! assert!(next.token() > lease.token()); // fence every write with it
//! # Ok::<(), lease_port::LeaseError>(())
//! # }).unwrap();
//! ```
//!
//! # How it works
//!
//! Each session has one file, `<dir>/<stem>.lease`, where `<stem>` is
//! [`session_filename::stem`] of the id: safe characters only, no path
//! traversal, at most 120 bytes (long ids are hashed), never two ids on one
//! name. Every operation opens the file (`O_NOFOLLOW | O_CLOEXEC`, relative
//! to the directory descriptor opened at start-up), takes an exclusive
//! `flock`, checks the directory path still names that directory, reads the
//! record, decides by the injected [`Clock`], rewrites the record in place
//! with `pwrite`, and unlocks. The lock is held only for that critical
//! section — never while a session runs — so a holder that dies or stops
//! leaves a record that simply expires.
//!
//! `flock` locks belong to the open file description, so two instances in
//! one process exclude each other exactly as two processes do, and opening
//! and closing another descriptor on a lease file (an operator tool,
//! [`list_leases`], a second instance) never drops anyone's lock — unlike
//! POSIX `fcntl` locks, which is why they are not used.
//!
//! Files are never renamed over, truncated or unlinked by this crate: the
//! record is the only copy of the session's highest token.
//!
//! # On-disk format
//!
//! A lease file is empty (created, no token issued yet) or holds exactly one
//! [`RECORD_LEN`]-byte (1,024) record, little-endian (format version 3,
//! [`FORMAT_VERSION`]), in two 512-byte sectors that each carry their own
//! checksum. A power cut persists whole sectors, so everything a token
//! depends on sits in the first:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `MECLEASE` ([`MAGIC`]) |
//! | 8 | 2 | format version, 3 |
//! | 10 | 1 | state: 0 free (released), 1 held |
//! | 11 | 1 | zero |
//! | 12 | 2 | session id length in bytes |
//! | 14 | 2 | owner id length in bytes (0 when free) |
//! | 16 | 8 | token: the highest ever issued for the session (kept when free) |
//! | 24 | 8 | expiry, nanoseconds since the Unix epoch (0 when free) |
//! | 32 | 8 | reservation ceiling, ≥ token (see "Durability") |
//! | 40 | 8 | expiry on `CLOCK_MONOTONIC` of the writing boot, nanoseconds (0 when free) |
//! | 48 | 16 | clock domain of the writer: its boot id (`/proc/sys/kernel/random/boot_id`) with the last 8 bytes XORed with its time namespace's inode; zero when unknown |
//! | 64 | 256 | full session id, UTF-8, zero-padded |
//! | 320 | 188 | zero |
//! | 508 | 4 | CRC-32 (IEEE) of bytes 0..508 |
//! | 512 | 256 | owner id, UTF-8, zero-padded |
//! | 768 | 248 | zero |
//! | 1016 | 4 | copy of the CRC at 508: binds this sector to its header |
//! | 1020 | 4 | CRC-32 of bytes 512..1020 |
//!
//! A record whose header sector checks out but whose owner sector does not
//! (or belongs to another header) was torn by a power cut between the two
//! sectors: the token, ceiling and expiry are known, the holder is not. It
//! is read as held by an unknown holder until its expiry, then taken over
//! with a token past its ceiling — no error, no operator needed. A header
//! sector that fails its checksum cannot come from a power cut on a device
//! that writes sectors whole; it is corruption, an error naming the file
//! and the remedy ([`repair`]).
//!
//! Older records are still read and replaced by a version 3 record on the
//! next write: version 2 (556 bytes: the same first 40 bytes, session id at
//! 40, owner id at 296, one CRC at 552) and version 1 (548 bytes, no
//! ceiling; ids at 32 and 288, CRC at 544; it synced every token, so its
//! token is taken as its ceiling). Their expiry is judged on the wall clock.
//! A version 2 record spans two sectors under one checksum, so one torn by
//! a power cut fails its checksum: an error that names [`repair`], to be run
//! with a minimum token at least the highest the session's store has seen. Older builds refuse version 3
//! files ([`LeaseFileError::Version`] or [`LeaseFileError::Oversized`],
//! `Transient`), so do not run old and new builds on one directory at
//! once: a session an old process meets in the new format stops there with
//! an error, never with a second owner or a lower token.
//!
//! A file of exactly [`RECORD_LEN`] (or 556, or 548) zero bytes is read as
//! "created, never written" too (a crash can leave one after the first
//! write's size change but before its data; no token was returned from it,
//! because a file's first record is always a reservation, synced before it
//! returns). Anything else that does not decode — wrong length, wrong
//! magic, an unknown version, a failed header checksum, inconsistent fields
//! (a token above its ceiling, say), or the record of another session — is
//! an error naming the file ([`LeaseFileError`]). It is **never** treated as
//! free and never resets the token: that session stops, with a clear
//! message, until an operator runs [`repair`] with a minimum token.
//!
//! # Durability
//!
//! Tokens stay strictly increasing across releases, expiries, process
//! crashes, power loss and host restarts, without an `fdatasync` per token:
//!
//! - **Reservations.** The record carries a ceiling. Every write carries it
//!   forward, and it only rises, in a write that is `fdatasync`ed before the
//!   lock is released and before the acquire that wrote it returns: a
//!   *reservation*. Invariant: every token ever returned is at most the
//!   ceiling last made durable.
//! - **The file's name.** A synced write also `fsync`s the directory unless
//!   this instance already did so after that file (that inode) existed: the
//!   file's creator may have died, or its directory sync failed, between
//!   the record and the name becoming durable, and a file whose name a
//!   power loss takes away would restart its tokens at 1.
//! - **Arming.** An instance issues a token without a sync only when it
//!   finds in the record the very ceiling it reserved itself and saw synced
//!   (it is then *armed* for that file), and only up to that ceiling: it
//!   issues `token + 1` in a plain in-place write. Otherwise — its first new
//!   token for the session, another instance reserved since, or the range
//!   used up — it reserves: token `max(token, ceiling) + 1`, new ceiling
//!   `token + n - 1` for a [reservation](FlockLeaseBuilder::token_reservation)
//!   of `n` (default 1,024), synced before returning.
//! - **Why that suffices.** A power loss can roll a record back to its last
//!   synced state, but it ends every process at once, so no instance armed
//!   before it survives; every instance after it reserves before issuing,
//!   jumping past a durable ceiling that is ≥ every token issued before the
//!   loss. A process crash loses nothing of the page cache, and only the
//!   crashed instance's arming, so survivors and newcomers read the true
//!   latest token. Between power losses, an armed instance's own
//!   reservation was made after the last one, and every later write went
//!   through the shared page cache under the file lock, so the record's
//!   token is the latest issued. Its ceiling is durable because this
//!   instance saw its `fdatasync` succeed: trusting a ceiling read from the
//!   record alone would trust a reservation whose sync failed (an I/O
//!   error leaves the record in the page cache but not on disk), which is
//!   why arming is per ceiling, not per session. For the same reason a live
//!   holder re-acquiring its own token syncs unless this instance is armed
//!   with the record's ceiling.
//! - **Cost.** One synced acquire per `n` new tokens of a session while one
//!   instance keeps taking it; an acquire through another instance than the
//!   last reserver syncs once and skips the rest of the old range (up to
//!   `n - 1` tokens). `token_reservation(1)` syncs every new token, as
//!   builds before reservations did. Tokens are 64-bit: skipping 1,024 per
//!   reservation leaves room for 2⁵⁴ reservations per session.
//! - `renew` and `release` are not synced and never move the ceiling. After
//!   a power loss a renewal may be lost (the lease then ends at an earlier
//!   expiry, which every process restarted with the host has outlived
//!   anyway) and a release may be lost (the session stays held until its
//!   expiry). Neither can lower a token below a durable ceiling.
//! - **Deleting a lease file by hand resets that session's tokens to 1.** The
//!   next owner's writes would then carry tokens a store may already have
//!   seen higher and refuse. Do not delete lease files of sessions whose data
//!   you keep; delete them only together with that data (or for sessions
//!   that are gone). Clearing a damaged file is the same decision.
//!
//! # Unsynced lease files
//!
//! A session's first acquire through an instance costs two syncs: the
//! reservation's `fdatasync` and, for a new file, the directory's `fsync`.
//! Beside a store that does not sync its own writes, those two syncs are
//! most of a first run, and they buy nothing the store keeps.
//! [`FlockLeaseBuilder::durability`]`(`[`Durability::Unsynced`]`)` drops
//! every per-session sync: reservations, re-acquires and new files' names
//! are left to the kernel's writeback, exactly as the store's appends are.
//! Everything else stays: reservations are still written and armed, every
//! write still goes through the shared page cache under the file lock, so
//! while the machine runs, tokens rise exactly as they do synced — a
//! process crash loses nothing.
//!
//! What a machine crash (power loss, kernel panic) may lose: any lease file
//! created since the last writeback, and any record written since, back to
//! an older one; the store, unsynced too, may lose its latest appends and
//! with them some of its high-water marks. A token must still never name
//! two owners — outside systems key effects on (session, token) — so the
//! directory counts the host's boots in `.boot-epoch`: the first unsynced
//! instance of a boot counts it, and every instance syncs the count itself
//! when it opens (one `fdatasync` and one directory `fsync` per instance,
//! not per session); every token of that boot lies above `count × 2³²`.
//! A boot whose tokens reach the next boot's floor (billions of takeovers
//! of one session, or a floor from a store's mark) counts itself further,
//! synced, before the token is returned. Whatever a power loss took back,
//! the next boot's tokens are above every token of the boots before it. A
//! synced instance on such a directory keeps above the last count too.
//! When the boot id cannot be read (`/proc/sys/kernel/random/boot_id`),
//! every instance counts a boot of its own. A damaged `.boot-epoch` is
//! refused at start-up ([`LeaseFileError::BootEpoch`]) rather than
//! guessed at. Every new boot's count is the greatest of: one past the
//! last count, one past every token the lease files show (a count put
//! back from an older copy, or deleted, is behind them), and the wall
//! clock's second since 2025. So boots counted without a boot id, one per
//! instance start, stay on the clock, and unless a directory counted more
//! boots than seconds went by, a copy of it counts past its original.
//! Reading the lease files makes a boot's first instance cost one pass
//! over the directory (about 6 µs a file).
//!
//! Within one boot, the store's mark still backs the lease files: whatever
//! of the store survived carries its mark, and the store refuses a token
//! at or below it. A server that meets that refusal acquires again with
//! [`acquire_above`](SessionLease::acquire_above) the mark (`mecated`
//! does, once per claim): the record jumps past it, for every later owner
//! too. A lease file lost or rolled back while the store's writes survived
//! costs one refused claim, not a session.
//!
//! So the data written under the last seconds' tokens may be lost with a
//! power loss, as the store's unsynced appends are, but no token repeats.
//! This mode also trusts the page cache within one boot: a writeback error
//! the kernel reports to no one (an `fdatasync` would have) can drop a
//! record back to the disk's older copy while processes run, the same loss
//! the store's unsynced appends risk. A directory is only as durable as its
//! least durable instance: run every instance on it with one setting.
//!
//! # Tokens above a floor
//!
//! [`acquire_above`](SessionLease::acquire_above)`(session, owner, floor)`
//! is an acquire whose token is greater than `floor` — a store's
//! high-water mark for the session, when the lease directory lags the
//! store (restored from an older copy, a lease file repaired or deleted).
//! It follows every rule of `acquire` (`Held` for another live owner), and
//! in the same locked step raises the record: when the token it would hand
//! out is not above `floor` it reserves instead, token
//! `max(token, ceiling, floor) + 1` with a new ceiling past it, synced
//! before the token is returned. So the token record, not just this one
//! grant, is past the floor: every later takeover — another owner, another
//! instance, after a restart or a power loss — is above it too. The live
//! holder re-acquiring keeps its token when that is above `floor`, and
//! otherwise gets the new, greater one (its old token is then superseded:
//! renewing it answers `Held`). A floor the current token already exceeds
//! costs nothing more than `acquire`.
//!
//! # Errors
//!
//! | kind | when |
//! |---|---|
//! | `Held` | another owner holds the session live; renew of a lease no longer ours |
//! | `Transient` | I/O errors, the lock not obtained within the lock timeout ("lock file wedged"), a damaged or foreign lease file, a symlink or non-regular file at a lease name, the directory replaced or removed — the cause is the `source()`, a [`LeaseFileError`] |
//! | `Unsupported` | only from [`FlockLeaseBuilder::open`]: the file system does not support `flock` at all ([`LeaseFileError::LocksUnsupported`]); a failing `flock` call on a lease file (`ENOLCK`, say) is `Transient` |
//! | `Invalid` | a lock timeout above a quarter of the TTL; a volatile directory refused ([`LeaseFileError::Volatile`]); the clock is outside 1970..2554 or the TTL overflows it; 2⁶⁴ tokens used |
//!
//! # Blocking and time bounds
//!
//! Anything that can wait — polling a non-blocking `flock` with back-off
//! until the [lock timeout](FlockLeaseBuilder::lock_timeout), and the
//! `fdatasync` of a reservation — runs on Tokio's blocking pool
//! (`spawn_blocking`), never on an async worker, and on the calling thread
//! outside a runtime. The lock timeout defaults to a quarter of the TTL (at
//! most 2 s) and may not exceed it, so a renewal never waits past its
//! keeper's margin. Past it the operation fails with `Transient` ("lock
//! file wedged") instead of hanging: a process stopped or stuck inside its
//! critical section delays only that one session's file.
//!
//! The future stays cancellable throughout: a caller's deadline (the
//! keeper's renew deadline, a `tokio::time::timeout`) fires while the lock
//! is waited for. Dropping the future tells the blocking work its caller is
//! gone: a lock wait stops at its next poll (within 4 ms) and a write not
//! yet begun is never made, so an abandoned acquire cannot take a session
//! after its caller gave up. A write already under way when the future is
//! dropped (with its `fdatasync`) finishes on the pool, holding that one
//! file's lock; its effect is that of an answer lost in transit.
//!
//! The rest — open, an uncontended non-blocking `flock`, `pread`, `pwrite`
//! into the page cache and close, a few microseconds on a local file system;
//! with reservations, that is most acquires too — runs inline by default, because handing it to another thread would
//! cost several times the work itself.
//! [`FlockLeaseBuilder::inline_fast_path`]`(false)` sends every operation
//! the blocking way.
//!
//! The directory's identity (the path still names the directory opened at
//! start-up) is re-checked under the file lock at most every
//! [`dir_check_interval`](FlockLeaseBuilder::dir_check_interval) (default
//! 250 ms; `ZERO` for every operation), so a directory replaced while
//! processes run is refused within that interval rather than splitting the
//! processes between two directories.
//!
//! # Clocks
//!
//! Expiry on one host is immune to wall-clock steps. Every write records
//! the expiry twice: on the wall clock, and on `CLOCK_MONOTONIC` together
//! with the writer's clock domain (the boot id and the time namespace: a
//! process in another time namespace — `unshare --time`, a CRIU restore —
//! reads an offset `CLOCK_MONOTONIC` in the same boot). A record written in
//! the current boot and time namespace is judged on the monotonic clock alone (read through the injected [`Clock`]'s
//! [`instant`](Clock::instant), which is `CLOCK_MONOTONIC` for
//! [`SystemClock`]), so an NTP step forward never ends a live lease early
//! and a step back never keeps a dead holder's lease alive. The wall clock
//! is used only for records of an earlier boot (whose holders are gone) or
//! of another time namespace, for version 1 and 2 records, and when the
//! boot id cannot be read. The
//! monotonic clock is the one [`Lease`] keepers count their renew deadlines
//! on, so it stops with them during a suspend; `CLOCK_BOOTTIME` would let a
//! lease lapse across a suspend its holder's keeper never saw. The
//! [`Lease::expiry`] returned is a wall-clock time, for display and for
//! callers; [`list_leases`] judges live or expired on the wall clock it is
//! given. The lock timeout is always real, monotonic time.
//!
//! # Reporting the holder
//!
//! [`current`](SessionLease::current) reads the one session's file — the
//! same name its acquire uses — under a shared `flock` held for one
//! `pread`, and judges it exactly as an acquire would at that moment, on
//! the same clocks: a live hold is reported with its owner, its token and
//! its expiry (counted from now on the clock that judged it); a released
//! or expired hold, or a session that never had a file, is `None`. It
//! opens the file read-only and never creates, writes or syncs anything,
//! so asking about any number of sessions leaves the directory as it was.
//! Waiting for the lock follows the same [lock timeout](FlockLeaseBuilder::lock_timeout)
//! and runs off the async workers as every other operation does. A hold
//! whose holder's name was lost to a torn write (see "On-disk format") is
//! live with no owner to name: it is reported as a `Held` error without a
//! holder rather than as `None`. A damaged file is the same `Transient`
//! error every other operation gives.
//!
//! # Operators
//!
//! [`list_leases`] lists every file of a directory with session, owner,
//! token, reservation ceiling, expiry and state (live, expired, free), or
//! why it is unreadable.

mod authority;
#[cfg(test)]
mod crash_sim;
mod error;
mod inspect;
mod record;
mod store;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease,
    SystemClock,
};

pub use authority::{AUTHORITY_FILE, adopt};
pub use error::LeaseFileError;
pub use inspect::{LeaseEntry, LeaseInfo, LeaseState, list_leases, repair};
pub use record::{FORMAT_VERSION, MAGIC, RECORD_LEN};

use store::{Op, Reply, Settings, Step, Store};

/// The TTL granted when none is configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How long an operation waits for a lease file's lock when none is
/// configured. A critical section takes microseconds (milliseconds with the
/// `fdatasync` of a reservation), so waiting this long means the holder of the
/// file lock is stopped or stuck.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// How often, at most, the directory's identity is re-checked when no
/// interval is configured.
pub const DEFAULT_DIR_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// How many tokens one synced reservation covers when none is configured.
pub const DEFAULT_TOKEN_RESERVATION: u64 = 1024;

/// Leases stored as lock-guarded files in one directory. Cheap to clone;
/// clones share the directory handle.
///
/// Create one per process with [`FlockLease::builder`]; every process (and
/// every instance) on the same directory coordinates with every other.
#[derive(Clone)]
pub struct FlockLease {
    store: Arc<Store>,
}

/// Configures a [`FlockLease`].
#[derive(Debug)]
pub struct FlockLeaseBuilder {
    dir: PathBuf,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    lock_timeout: Option<Duration>,
    inline_fast_path: bool,
    dir_check_interval: Duration,
    token_reservation: u64,
    refuse_volatile: bool,
    durability: Durability,
    /// The host's boot id; read from the kernel unless a test boots a host
    /// of its own.
    boot_id: Option<[u8; 16]>,
}

/// Whether a lease file's token record is made durable before its token is
/// used; see the crate docs, "Durability" and "Unsynced lease files".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every reservation is `fdatasync`ed, and a new file's name with the
    /// directory's `fsync`, before the token it covers is returned: tokens
    /// rise across power losses on their own. The default.
    #[default]
    Synced,
    /// Nothing is synced but one count per boot of the host: a record lives
    /// in the page cache until the kernel writes it back, and every token
    /// lies above this boot's floor, so tokens still rise across a power
    /// loss that takes records back. For processes whose store does not
    /// sync its writes either.
    Unsynced,
}

impl FlockLeaseBuilder {
    /// How long a grant lasts unless renewed. Default [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The clock expiries are judged by. Default [`SystemClock`]. Its
    /// monotonic reading judges expiry within one boot; its wall reading
    /// only across reboots (see the crate docs, "Clocks").
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The longest an operation waits for a lease file's lock before failing
    /// with `Transient` ("lock file wedged"). Default: a quarter of the TTL,
    /// at most [`DEFAULT_LOCK_TIMEOUT`]. More than a quarter of the TTL is
    /// refused by [`open`](Self::open) (`Invalid`): a renewal waiting that
    /// long would eat the margin its keeper renews within.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = Some(timeout);
        self
    }

    /// Whether the non-waiting part of an operation runs inline on the
    /// calling task (default `true`) or every operation goes to Tokio's
    /// blocking pool (`false`). See the crate docs, "Blocking and time
    /// bounds".
    pub fn inline_fast_path(mut self, inline: bool) -> Self {
        self.inline_fast_path = inline;
        self
    }

    /// How often, at most, an operation re-checks that the directory path
    /// still names the directory opened at start-up (one `lstat`, a third of
    /// the cost of a renewal). Default [`DEFAULT_DIR_CHECK_INTERVAL`];
    /// `Duration::ZERO` checks on every operation.
    pub fn dir_check_interval(mut self, interval: Duration) -> Self {
        self.dir_check_interval = interval;
        self
    }

    /// How many tokens one durable reservation covers: the first new token
    /// this instance issues for a session, and the first after each `n` more,
    /// writes a reservation ceiling `n - 1` above it and waits for
    /// `fdatasync`; the tokens in between are written without a sync. `1`
    /// syncs every new token. Default [`DEFAULT_TOKEN_RESERVATION`]; `0` is
    /// refused by [`open`](Self::open) (`Invalid`).
    ///
    /// Tokens stay strictly increasing either way (see the crate docs,
    /// "Durability"), but are no longer consecutive: each instance's first
    /// token for a session, and the first after a host crash, jumps past the
    /// last ceiling, skipping up to `n - 1` unused tokens. An instance
    /// remembers its reservations for up to 65,536 sessions; past that it
    /// forgets them all and reserves again as needed.
    pub fn token_reservation(mut self, n: u64) -> Self {
        self.token_reservation = n;
        self
    }

    /// Whether [`open`](Self::open) refuses a directory on a file system
    /// kept in memory (tmpfs, ramfs) with `Invalid`
    /// ([`LeaseFileError::Volatile`]). Default `false`; see
    /// [`FlockLease::is_volatile`].
    pub fn refuse_volatile(mut self, refuse: bool) -> Self {
        self.refuse_volatile = refuse;
        self
    }

    /// Whether reservations and new files' names are synced before their
    /// tokens are used. Default [`Durability::Synced`];
    /// [`Durability::Unsynced`] only beside a store that does not sync
    /// either (see the crate docs, "Unsynced lease files").
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Opens as a host whose boot id is `id`: a simulated reboot is a new
    /// id.
    #[cfg(test)]
    pub(crate) fn boot_id(mut self, id: [u8; 16]) -> Self {
        self.boot_id = Some(id);
        self
    }

    /// Opens the directory — creating it with mode 0700 when absent — and
    /// checks it: a symlink or a non-directory is refused with
    /// [`LeaseFileError::DirSymlink`] / [`LeaseFileError::NotADirectory`]
    /// (`Transient`). Blocking, once, at start-up.
    pub fn open(self) -> Result<FlockLease, LeaseError> {
        if self.token_reservation == 0 {
            return Err(LeaseError::invalid(
                "token reservation must cover at least one token",
            ));
        }
        let limit = self.ttl / 4;
        let lock_timeout = match self.lock_timeout {
            None => limit.min(DEFAULT_LOCK_TIMEOUT),
            Some(t) if t <= limit => t,
            Some(t) => {
                return Err(LeaseError::invalid(format!(
                    "lock timeout {t:?} exceeds a quarter of the TTL {:?}",
                    self.ttl
                )));
            }
        };
        let store = Store::new(
            self.dir,
            Settings {
                ttl: self.ttl,
                clock: self.clock,
                lock_timeout,
                inline_fast_path: self.inline_fast_path,
                dir_check_interval: self.dir_check_interval,
                reservation: self.token_reservation,
                durability: self.durability,
                boot_id: self
                    .boot_id
                    .unwrap_or_else(store::clock_domain::read_boot_id),
            },
        )?;
        // After the directory's own checks; a boot counted in a copy
        // issues nothing, and its adoption jumps past it.
        authority::refuse_a_copy(store.dir())?;
        if let (Some(fs), true) = (store.volatile, self.refuse_volatile) {
            return Err(LeaseFileError::Volatile {
                path: store.dir().to_path_buf(),
                fs,
            }
            .into());
        }
        Ok(FlockLease {
            store: Arc::new(store),
        })
    }
}

impl FlockLease {
    /// A builder for leases in `dir`, with the defaults.
    pub fn builder(dir: impl Into<PathBuf>) -> FlockLeaseBuilder {
        FlockLeaseBuilder {
            dir: dir.into(),
            ttl: DEFAULT_TTL,
            clock: Arc::new(SystemClock),
            lock_timeout: None,
            inline_fast_path: true,
            dir_check_interval: DEFAULT_DIR_CHECK_INTERVAL,
            token_reservation: DEFAULT_TOKEN_RESERVATION,
            refuse_volatile: false,
            durability: Durability::Synced,
            boot_id: None,
        }
    }

    /// Leases in `dir` granting `ttl` on the system clock.
    pub fn open(dir: impl Into<PathBuf>, ttl: Duration) -> Result<Self, LeaseError> {
        Self::builder(dir).ttl(ttl).open()
    }

    /// The directory holding the lease files.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// The TTL this instance grants.
    pub fn ttl(&self) -> Duration {
        self.store.ttl
    }

    /// Whether the directory is on a file system kept in memory (tmpfs,
    /// ramfs; `statfs` at start-up). A reboot empties it, so every session's
    /// tokens restart at 1 while a store that outlives the reboot keeps its
    /// higher marks and refuses the new owners' writes. A server should
    /// refuse such a directory or warn loudly; see
    /// [`FlockLeaseBuilder::refuse_volatile`].
    pub fn is_volatile(&self) -> bool {
        self.store.volatile.is_some()
    }

    /// Whether this instance syncs its reservations.
    pub fn durability(&self) -> Durability {
        self.store.durability
    }

    /// The longest an operation waits for a lease file's lock.
    pub fn lock_timeout(&self) -> Duration {
        self.store.lock_timeout
    }

    /// Takes the lock that makes `owner` this process's alone on this lease
    /// directory, for as long as the returned [`OwnerLock`] lives.
    ///
    /// Two processes leasing under one owner id would each be taken for the
    /// live holder re-acquiring, and both would run a session under one
    /// token; a server takes this lock at start-up and keeps it. The lock
    /// file is `.owners/<owner>.lock` inside the directory, found through
    /// the descriptor opened at start-up, so every spelling of the
    /// directory's path (a trailing slash, a symlinked parent) meets the
    /// same lock. Does not wait: an owner id in use fails at once with
    /// `Held` ([`LeaseFileError::OwnerInUse`] as the source). Blocking (a
    /// few system calls); call it at start-up.
    ///
    /// Builds before this one kept the lock beside the directory, in
    /// `<dir>.owners/`; they do not see this one, so do not run old and
    /// new builds on one directory at once.
    pub fn lock_owner(&self, owner: &OwnerId) -> Result<OwnerLock, LeaseError> {
        Ok(OwnerLock {
            _lock: self.store.lock_owner(owner)?,
            owner: owner.clone(),
        })
    }

    /// [`list_leases`] of this instance's directory, judged by its clock, on
    /// the blocking pool.
    pub async fn list(&self) -> Result<Vec<LeaseEntry>, LeaseError> {
        let store = Arc::clone(&self.store);
        offload(move |_| list_leases(store.dir(), store.clock.now())).await
    }

    async fn run(&self, op: Op) -> Result<Reply, LeaseError> {
        let store = Arc::clone(&self.store);
        if !store.inline_fast_path || tokio::runtime::Handle::try_current().is_err() {
            return offload(move |abandoned| store.run_blocking(&op, abandoned)).await;
        }
        match store.run_until_wait(&op)? {
            Step::Done(reply) => Ok(reply),
            step => offload(move |abandoned| store.finish(step, &op, abandoned)).await,
        }
    }
}

/// An owner id held by this process on one lease directory; see
/// [`FlockLease::lock_owner`]. Dropping it (or the process ending) frees it.
pub struct OwnerLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
    owner: OwnerId,
}

impl OwnerLock {
    /// The owner id held.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }
}

impl fmt::Debug for OwnerLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnerLock")
            .field("owner", &self.owner)
            .finish()
    }
}

/// Runs blocking `f` on Tokio's blocking pool (on the calling thread
/// outside a runtime), never on an async worker, and stays cancellable:
/// dropping the returned future sets the flag `f` is given, which stops a
/// lock wait at its next poll and any write not yet begun. A write already
/// under way (with its `fdatasync`) finishes on the pool, holding only that
/// one file's lock.
async fn offload<T, F>(f: F) -> Result<T, LeaseError>
where
    F: FnOnce(&AtomicBool) -> Result<T, LeaseError> + Send + 'static,
    T: Send + 'static,
{
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return f(&AtomicBool::new(false));
    };
    let abandoned = Arc::new(AtomicBool::new(false));
    let _guard = AbandonOnDrop(Arc::clone(&abandoned));
    handle
        .spawn_blocking(move || f(&abandoned))
        .await
        .map_err(|e| {
            LeaseError::transient("lease file operation did not complete").with_source(e)
        })?
}

/// Tells blocking work its caller is gone when the caller's future drops.
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn granted(reply: Reply) -> Result<Lease, LeaseError> {
    match reply {
        Reply::Granted(lease) => Ok(lease),
        Reply::Released | Reply::Current(_) => Err(LeaseError::transient(
            "internal: a grant was answered by another operation's reply",
        )),
    }
}

impl fmt::Debug for FlockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlockLease")
            .field("dir", &self.store.dir())
            .field("ttl", &self.store.ttl)
            .field("lock_timeout", &self.store.lock_timeout)
            .field("inline_fast_path", &self.store.inline_fast_path)
            .field("token_reservation", &self.store.reservation)
            .field("durability", &self.store.durability)
            .field("clock", &self.store.clock)
            .finish()
    }
}

#[async_trait]
impl SessionLease for FlockLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        granted(
            self.run(Op::Acquire(
                session.clone(),
                owner.clone(),
                self.store.boot_floor,
            ))
            .await?,
        )
    }

    /// An acquire whose token is above `floor`, raising the session's token
    /// record with it (see the crate docs, "Tokens above a floor"): in the
    /// one locked step of the grant, the record's token and reservation
    /// ceiling go past `floor` and are synced before the token is returned,
    /// so every later takeover, by any instance and after any crash, is
    /// above `floor` too. Never answers `Rewound`.
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        floor.check_floor()?;
        granted(
            self.run(Op::Acquire(
                session.clone(),
                owner.clone(),
                floor.get().max(self.store.boot_floor),
            ))
            .await?,
        )
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        granted(self.run(Op::Renew(lease.clone())).await?)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.run(Op::Release(lease.clone())).await.map(|_| ())
    }

    /// The live holder recorded in the session's file (see the crate docs,
    /// "Reporting the holder").
    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        match self.run(Op::Current(session.clone())).await? {
            Reply::Current(holder) => Ok(holder),
            Reply::Granted(_) | Reply::Released => Err(LeaseError::transient(
                "internal: a holder report was answered by another operation's reply",
            )),
        }
    }

    /// The directory's id (see [`AUTHORITY_FILE`]), created on first call.
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        let dir = self.store.dir().to_path_buf();
        tokio::task::spawn_blocking(move || authority::read_or_create(&dir))
            .await
            .map_err(|e| LeaseError::transient("authority lookup did not finish").with_source(e))?
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.ttl())
    }
}
