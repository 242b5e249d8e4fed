//! Session event storage whose every write is fenced by the writer's lease
//! token, and a JSONL directory implementation.
//!
//! # What it is for
//!
//! A lease alone cannot stop a holder that paused past its TTL from writing
//! when it resumes. The store can: every write carries the writer's
//! [`FencingToken`](lease_port::FencingToken), and the store refuses, in the
//! same atomic step as the write, a token below the highest it has accepted
//! for that session. After a takeover, nothing the old owner does can change
//! the session.
//!
//! # When to choose it
//!
//! [`SessionStore`] is the port a server writes session events through;
//! implement it over your database (a conditional write does the fencing).
//! [`JsonlStore`] is the implementation for one host: a directory with one
//! append-only JSON-lines file per session, usable by several processes at
//! once. Pair it with `lease-keeper` and `flocklease` leases kept in
//! `<dir>/.session-leases` ([`DEFAULT_LEASE_DIR_NAME`]).
//!
//! # Example
//!
//! ```
//! use lease_port::{FencingToken, OwnerId, SessionId};
//! use serde_json::json;
//! use session_store::{
//!     FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, StoreErrorKind, WriteFence,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = JsonlStore::open(dir.path(), JsonlOptions::default().fsync(FsyncPolicy::Never))?;
//! let chat = SessionId::new("chat-7")?;
//! store.create(&chat).await?;
//!
//! // Owner A holds token 3 and writes; B takes over with token 4 and writes.
//! let (a, b) = (OwnerId::new("a")?, OwnerId::new("b")?);
//! let fence_a = WriteFence::new(FencingToken::new(3), a);
//! let fence_b = WriteFence::new(FencingToken::new(4), b);
//! store.append(&chat, fence_a.clone(), &[json!({"text": "hi from A"})]).await?;
//! store.append(&chat, fence_b, &[json!({"text": "hi from B"})]).await?;
//!
//! // A resumes after a pause: refused, atomically with the write.
//! let err = store.append(&chat, fence_a, &[json!({"text": "late"})]).await.unwrap_err();
//! assert_eq!(err.kind(), StoreErrorKind::Fenced);
//!
//! // Token 4 of another lease authority, presented by another writer:
//! // refused too, the mark belongs to B.
//! let c = WriteFence::new(FencingToken::new(4), OwnerId::new("c")?);
//! let err = store.append(&chat, c, &[json!({"text": "twin"})]).await.unwrap_err();
//! assert_eq!(err.kind(), StoreErrorKind::Fenced);
//!
//! let page = store.read(&chat, 1, 100).await?;
//! assert_eq!(page.events.len(), 2);
//! assert_eq!(page.events[1].payload, json!({"text": "hi from B"}));
//! # Ok(()) }
//! ```
//!
//! # The rules
//!
//! 1. **Every write is fenced, and the fence binds the writer.**
//!    [`append`](SessionStore::append) and [`delete`](SessionStore::delete)
//!    take a [`WriteFence`]: the lease token *and* the owner it was issued
//!    to ([`Fence`]). The store keeps a per-session *high-water mark* — the
//!    highest token it ever accepted, and the owner that first wrote it —
//!    and refuses with [`StoreError::Fenced`] a lower token, and an equal
//!    token from any other owner (two lease authorities both hand out
//!    token 1; owners are unique per process incarnation). The check and
//!    the write happen under one per-session lock, across processes too.
//!    A higher token is accepted and binds the mark to its owner. A mark
//!    read from lines written before writers were recorded has no owner:
//!    an equal token is then refused from everyone.
//!    [`append_after`](SessionStore::append_after) adds one more check
//!    under the same lock: the batch is written only if the session's last
//!    sequence number is the one given, and a batch not written raises no
//!    mark.
//! 2. **Unfenced writes** ([`WriteFence::Unfenced`], for a deployment whose
//!    lease backend answered `Unsupported`) are refused with
//!    [`StoreError::Unfenced`] unless the store is configured to allow them
//!    ([`JsonlOptions::allow_unfenced`], which a server sets only when it
//!    proves single-process ownership of the directory), and are refused
//!    anyway once the session accepted any fenced write.
//! 3. **Batches are all or nothing.** Invalid input (an empty batch, an
//!    event over the size limit, a page limit of 0) is a typed
//!    [`StoreError::Invalid`] with nothing written; a failed write is cut
//!    back so no partial line remains.
//! 4. **The mark lives in the data.** In the JSONL store the mark is the
//!    largest token on any accepted line, rebuilt from the file when it is
//!    opened; it survives restarts and deletions (a deletion is itself a
//!    fenced record), so a stale owner cannot write into a re-created
//!    session.
//! 5. **Errors keep their kind and cause**: [`StoreError::kind`] is one of
//!    [`StoreErrorKind`] `NotFound`, `AlreadyExists`, `Fenced`, `Unfenced`,
//!    `Invalid`, `Corrupt` (with file, line and parse error), `Io` (with the
//!    operation, path and OS error), `Busy` (the session stayed locked by
//!    someone else past the store's deadline; nothing was done, retry),
//!    `AuthorityMismatch` (the store is fenced by another lease authority).
//!    A write reported failed never appears later (see *Failed writes*
//!    below for the one exception, which its error names).
//! 6. **A store records the lease authority that fences it**
//!    ([`SessionStore::bind_authority`]): tokens mean something only
//!    within one authority (one lease directory, etcd prefix, namespace or
//!    lease service). The first binding records the
//!    [`AuthorityId`](lease_port::AuthorityId) once and durably; later
//!    ones, from any process, succeed only for the same id and otherwise
//!    fail with [`StoreError::AuthorityMismatch`] naming the recorded one.
//!    A server binds at start-up, before its first write. A store written
//!    before it recorded an authority is bound by its first binding:
//!    nothing in its data names the authority its tokens came from, and
//!    refusing would leave such a store unusable; its marks keep fencing
//!    (a lower token, or an equal one from another writer, stays refused).
//! 7. **A store may bring its own leases**: [`SessionStore::session_lease`]
//!    (default `None`; the JSONL store has none — the server puts
//!    `flocklease` files in [`JsonlStore::lease_dir`]).
//!
//! # The JSONL directory store
//!
//! - **File names** come from [`session_filename::stem`] plus `.jsonl`
//!   (safe, injective, case-fold-proof, bounded; long ids hashed). The first
//!   line of every file is a header holding the full session id, compared on
//!   every open, so a hashed name can never mix two sessions.
//! - **Record lines**: header `{"t":"h","v":2,"id":…,"ts":…}`, event
//!   `{"t":"e","seq":…,"token":…,"owner":…,"ts":…,"payload":…}` (an
//!   unfenced one `"token":null` and no owner), deletion
//!   `{"t":"d","token":…,"owner":…,"ts":…}`; `ts` is milliseconds since the
//!   Unix epoch. Files only ever grow, except when a torn tail is cut.
//! - **Every write is framed**: its record lines are followed by a commit
//!   line `{"t":"c","n":…,"len":…,"crc":…}` — how many lines, how many
//!   bytes, their CRC-32 — and readers take the lines only with a commit
//!   that matches them, so a batch is all or nothing across a crash too.
//!   Files of format 1 (headers `"v":1`, no commit lines, every line
//!   standing alone) are still read; the first write to one adds a framing
//!   line `{"t":"f"}` and frames itself and every later write. Versions
//!   before format 2 cannot read files written since.
//! - **Deletion** appends a deletion record: the session disappears from
//!   reads and [`list`](SessionStore::list) but its file (and mark) stays.
//!   Files are never renamed over, and unlinked only by
//!   [`JsonlStore::reclaim_deleted`].
//! - **Reclaiming** ([`JsonlStore::reclaim_deleted`], `mecated gc`) removes
//!   the files of sessions deleted at least a given time ago. What fencing
//!   needs stays: before a file is removed, its high-water mark (token and
//!   writer) and next sequence number are appended, with a commit line and
//!   `fdatasync`, to `<dir>/.graveyard` ([`GRAVEYARD_FILE_NAME`]); a
//!   session file made again starts from them (its header carries them),
//!   and [`high_water`](SessionStore::high_water) of a reclaimed session
//!   answers from them. So a re-created session never accepts an old token
//!   nor reuses a sequence number. A file is removed only under its
//!   exclusive `flock`, after checking that it is still deleted; every
//!   call checks after locking that the file it holds open is still linked
//!   and otherwise reopens it by name. Sessions locked elsewhere are left
//!   for a later run. The graveyard only grows, by one line (about 150
//!   bytes) per reclaimed file. Lease files are never touched.
//! - **The authority record** is `<dir>/.fencing-authority`
//!   ([`AUTHORITY_FILE_NAME`]), one JSON line `{"v":1,"authority":…}`,
//!   created by writing and syncing a private temporary file and
//!   hard-linking it into place (a racing creator finds the name taken
//!   and compares with what won), then syncing the directory. A record
//!   that cannot be read is [`StoreError::Corrupt`], never taken for
//!   "none".
//! - **Creation** writes the header to a private temporary file and
//!   hard-links it into place, so no process ever sees a file without its
//!   header and an existing file is never replaced.
//! - **Cross-process fencing**: with [`JsonlOptions::cross_process`] (the
//!   default) every check-and-append holds an exclusive `flock` on the
//!   session file and first reads whatever other processes appended since
//!   (the file size tells), so two processes can never both pass the mark
//!   check. Reads hold a shared `flock`.
//! - **No waiting on the executor**: locks (the session's in-process mutex
//!   and its `flock`) are only ever *tried* on an async worker thread. A
//!   call that finds them free runs there; one that finds them taken moves
//!   to tokio's blocking pool and retries with short pauses (1 ms doubling
//!   to 50 ms) until [`JsonlOptions::lock_timeout`] (default 5 s), then
//!   fails with [`StoreError::Busy`] having done nothing. So a process
//!   stopped (`SIGSTOP`, a debugger) while holding a session file's lock
//!   delays only the calls for that session, by at most the timeout, and
//!   never the other sessions or tasks — on a current-thread runtime too.
//! - **Fsync policy** ([`FsyncPolicy`]): `Always` (default; `fdatasync`
//!   before acknowledging, directory synced after creation, calls run on
//!   tokio's blocking pool), `Interval(d)` or `Never` (calls run inline
//!   when their locks are free: a few system calls on page-cached files).
//!   Fencing across a machine crash holds for acknowledged writes under
//!   `Always` only: a write lost by the crash also loses its token from
//!   the mark.
//!   Under `Always` at most one write per session (the one under way) is
//!   not durable at any moment, so a crash damages at most the end of the
//!   file; under `Interval` and `Never` several unsynced writes may be
//!   damaged out of order on file systems that write pages back out of
//!   order, and damage followed by a complete committed write is then
//!   `Corrupt` (see *Crash safety*).
//! - **Failed writes**: when a write, or the `fdatasync` after a complete
//!   write, fails, the file is cut back (under the session's locks, so no
//!   reader saw the lines) to where it ended before, and the store's view
//!   of the file does not move: the write never appears, and the next one
//!   takes its sequence numbers. Unless the policy is `Never`, the cut is
//!   synced before the error is returned, so the write cannot reappear
//!   after a machine crash either; should that sync fail, the error says
//!   the write may reappear after a crash. Should the cut fail, the error
//!   says the write may be stored, and the store re-reads the file before
//!   the next call, so sequence numbers still follow the file. Creating a new
//!   session file links it into place before syncing the directory; if
//!   that directory sync fails the error says the session exists (other
//!   processes may already use the file, so it is not taken back).
//! - **Crash safety**: everything after the last committed write that is
//!   not itself committed — an incomplete line, lines without their commit
//!   line, lines a commit does not match, zeros or bytes from elsewhere —
//!   is a *torn tail*: readers ignore it and report it
//!   ([`Page::unfinished_write`]); the next write to the session cuts it off
//!   before appending (`O_APPEND` would otherwise glue the new line to it).
//!   Earlier events are never affected, and the session stays readable.
//!   Damage *followed by* a committed write (a commit line matching the
//!   lines before it; in a format-1 file, any record line) cannot be left
//!   by a crash under `Always`: it is [`StoreError::Corrupt`] naming the
//!   file and line. Damage confined to the last write cannot be told from
//!   a torn write and is cut like one. A file truncated at a line end
//!   simply ends earlier. The crate's crash simulation checks this on
//!   every image a power loss may leave (any state since the last sync,
//!   cut anywhere, sectors lost or holding other bytes).
//! - **File safety**: the directory is created mode 0700, files 0600; files
//!   are opened with `O_NOFOLLOW` (a symbolic link is `Corrupt`, never
//!   followed) and must be regular files; [`list`](SessionStore::list)
//!   skips every name starting with `.` — [`DEFAULT_LEASE_DIR_NAME`],
//!   temporary files, the listing index — and anything that is not a
//!   `*.jsonl` regular file. A
//!   `*.jsonl` file that cannot be read as a session (stray, damaged, or
//!   naming a session that does not belong to its file name) is logged
//!   with `tracing::warn!` and left out; the listing goes on. A session
//!   locked past the timeout fails the listing with `Busy`. Each file's
//!   header is read once per store; afterwards a listing only brings the
//!   open sessions' views up to date (reading what was appended since).
//! - **Paged listing** ([`SessionStore::list_page`]) reads a listing
//!   index, `<dir>/.session-index`: a log of which sessions are live —
//!   `+` created (or checked live), `-` deleted, reclaimed or checked
//!   missing, `?` a change under way — each change of the directory's
//!   entries followed by a marker (the directory's device, inode and change
//!   time after it). Each store instance keeps the live ids sorted in
//!   memory and reads only what the log gained since its last page, so a
//!   page costs its own sessions, whatever the store's size, and opens no
//!   session file: only `?` ids are checked against their files.
//!   *Why it can be believed:* every line about a session is written while
//!   its file's `flock` is held (a new file is locked before it is linked
//!   into place), and a change of liveness is preceded by `?`, so a writer
//!   killed between a change and its outcome leaves `?`, never a wrong
//!   answer; a page checks a `?` under the file's lock and records what it
//!   found. Linking a new file, removing a reclaimed one and writing the
//!   generation record happen under `<dir>/.session-index.lock` held
//!   exclusively (new files are written in `<dir>/.staging` first, so the
//!   link is the only change) and are marked after, but only when the log
//!   was trusted just before. The log is trusted only while its last
//!   marker is the directory's current change time and it was written
//!   since the machine last booted. Anything done behind its back — a file
//!   copied in or removed by hand, a crash between a link and its marker,
//!   a version that kept no index, a backup put back (even with its times
//!   restored: no program can set a change time, and a copied directory
//!   has another inode) — moves the change time, no later marker covers
//!   it, and the log is rebuilt from the directory's names (one scan,
//!   under the lock), every id `?`; the first walk afterwards checks each
//!   file once. A log from another boot may have lost lines a power loss
//!   never wrote, so nothing in it is synced, whatever the
//!   [`FsyncPolicy`]. A directory that cannot be written (read-only, or
//!   another user's) is listed from an index built in memory from its
//!   names, every id checked against its file, rebuilt when the directory
//!   changes. Limits: a file system clock that did not tick between a
//!   logged change and one made behind the log's back hides the latter
//!   until the next rebuild (on Linux 6.13 and later the change time is
//!   fine-grained once read, which the marker does); deleting a session
//!   with a version of the store that kept no index is not seen (its
//!   directory does not change), until the log is rebuilt (remove
//!   `.session-index`). Memory: under 100 bytes an id per store instance;
//!   an instance's first page reads the whole log. [`ListCursor`] names
//!   the last id of a page, so a session that exists throughout a walk is
//!   listed exactly once.
//! - **Waiting** ([`SessionStore::wait_for_append`], and
//!   `wait_for_cancel_request` with the `cancel-requests` feature) is woken
//!   by one inotify instance per store watching the directory, not a file:
//!   a waiter costs an entry in a map, and any process's write wakes the
//!   waiters of this one. Where the kernel's inotify limits leave no
//!   instance, waiters read on an interval.
//! - **Pages** hold at most `limit` events and at most
//!   [`JsonlOptions::max_page_bytes`] (default 4 MiB) of stored lines, but
//!   always at least one event; [`Page::next_seq`] says where the rest
//!   starts.
//! - **Memory**: each open session keeps its file and an index of its
//!   events' offsets (24 bytes an event), at most
//!   [`JsonlOptions::max_open`] idle ones.
//!
//! # The store's generation
//!
//! A store directory put back from an older copy — a backup restored, an
//! older disk image, an `rsync` from a stale replica — has high-water marks
//! below tokens its lease authority already handed out, so an owner that
//! lost the session long ago could write again. The lease directory does
//! not go back with it; without a check nothing would notice. A server
//! that writes to the store therefore opens it with a generation check
//! ([`JsonlOptions::generation`]; the default, [`GenerationCheck::Off`],
//! reads and writes nothing):
//!
//! - **The record**, `<dir>/.store-generation` ([`GENERATION_FILE_NAME`]):
//!   the store's id (random, created with the record, kept by copies), a
//!   counter that only grows, and the directory's identity (device and
//!   inode) and path. [`JsonlStore::open`] reads it under the directory's
//!   exclusive `flock` (writers in every process advance one at a time),
//!   checks it, and writes it back with the counter one higher; so does
//!   [`JsonlStore::advance_generation`].
//! - **The witness**, `<witness>/.store-generations/<store id>`
//!   ([`WITNESS_DIR_NAME`]), the same record kept in a directory a restore
//!   of the store directory does not reach: the lease directory, given as
//!   [`GenerationCheck::Witness`]. It is written after the store's own
//!   record is durable, so it is never ahead of it after a crash; a
//!   missing witness (first use) is created, and one witness directory can
//!   serve any number of stores.
//! - **Refused** with [`StoreErrorKind::Rewound`], the message naming the
//!   files and how to adopt: a record written in another directory (a copy
//!   with a new inode: `cp -a`, a backup restored into a new directory,
//!   another disk); a generation below the witness's (an older copy put
//!   back into the same directory); a directory without a record that its
//!   witness remembers (emptied, recreated, or put back from before the
//!   record existed); a witness last written by a copy of the store in
//!   another directory (two copies in service).
//! - **Accepted**: a new directory, and a store written before generations
//!   were kept (its record is created: an upgrade, not an error); a witness
//!   behind the store (a crash between the two writes, an older lease
//!   directory).
//! - **Damaged** files (a failed checksum, a torn or foreign file) are
//!   [`StoreErrorKind::Corrupt`], never taken for "no record". Every write
//!   goes to a private temporary file, synced, renamed into place, and the
//!   directory synced, whatever the [`FsyncPolicy`].
//! - **What it notices**: a copy older than the last advance. A server
//!   advances at start-up (`open`), when it stops, and every few minutes
//!   while it runs ([`JsonlStore::advance_generation`]), so that a backup
//!   taken while it ran is refused too once put back. A copy taken after the
//!   last advance holds the same generation as its witness and cannot be
//!   told from the live directory; nor can a restore that also put the
//!   witness back (a witness inside the store directory, or one disk image
//!   holding both).
//! - **Adopting** ([`adopt_store_dir`]), with every server of the store
//!   stopped, accepts the directory as it is: records its identity, keeps
//!   the store's id, and sets the generation above the record and the
//!   witness. The marks stay as they are; the lease backend's tokens must
//!   then pass them (`acquire_above`, or a lease repair with a minimum
//!   token).
//!
//! ```
//! use session_store::{GenerationCheck, JsonlOptions, JsonlStore, StoreErrorKind};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let root = tempfile::tempdir()?;
//! let (store_dir, lease_dir) = (root.path().join("store"), root.path().join("leases"));
//! let opts = JsonlOptions::default().generation(GenerationCheck::witness(&lease_dir));
//!
//! let store = JsonlStore::open(&store_dir, opts.clone())?; // at start-up
//! assert_eq!(store.generation().unwrap().get(), 1);
//! let record = store_dir.join(session_store::GENERATION_FILE_NAME);
//! let backup = std::fs::read(&record)?; // a backup taken now ...
//! drop(store);
//!
//! let store = JsonlStore::open(&store_dir, opts.clone())?; // a later start
//! assert_eq!(store.generation().unwrap().get(), 2);
//! drop(store);
//!
//! std::fs::write(&record, backup)?; // ... put back in place
//! let err = JsonlStore::open(&store_dir, opts).unwrap_err();
//! assert_eq!(err.kind(), StoreErrorKind::Rewound);
//! assert!(err.to_string().contains("older than its witness"), "{err}");
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `cancel-requests`: `SessionStore::request_cancel` and
//!   `cancel_request`, by which any process asks the process running a
//!   session's run to stop it (a server offering a cancel endpoint across
//!   replicas). Off by default: a store's other users never need them.

mod error;
pub mod jsonl;
mod model;
mod port;

pub use error::{StoreError, StoreErrorKind};
pub use jsonl::{
    AUTHORITY_FILE_NAME, DEFAULT_LEASE_DIR_NAME, DEFAULT_LOCK_TIMEOUT, DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_OPEN, DEFAULT_MAX_PAGE_BYTES, FILE_SUFFIX, FsyncPolicy, GENERATION_FILE_NAME,
    GRAVEYARD_FILE_NAME, GenerationCheck, JsonlOptions, JsonlStore, ReclaimReport, StoreGeneration,
    WITNESS_DIR_NAME, adopt_store_dir,
};
/// The fence types are the lease contract's; re-exported so a store's
/// callers need no second import.
pub use lease_port::{Fence, WriteFence};
pub use model::{
    AppendReceipt, ListCursor, MAX_LIST_LIMIT, Page, SessionPage, StoredEvent, check_list_limit,
};
pub use port::{APPEND_POLL_INTERVAL, SessionStore, poll_for_append, wait_notified};
#[cfg(feature = "cancel-requests")]
pub use {
    jsonl::CANCEL_DIR_NAME,
    model::CancelRequest,
    port::{CANCEL_POLL_INTERVAL, poll_for_cancel_request},
};
