//! The session lease lifecycle: what a server runs around every run of a
//! session.
//!
//! # What it is for
//!
//! A [`SessionLease`](lease_port::SessionLease) backend answers single
//! calls; a server needs the whole life of a lease around each session run.
//! [`LeaseKeeper`] does that: it takes the per-session in-process lock,
//! acquires the lease with the process's owner identity, renews it in the
//! background, tells the run when ownership is lost, and releases the lease
//! when the run ends or the process shuts down — in a way a client
//! disconnect cannot cut short.
//!
//! # When to choose it
//!
//! Whenever the same session can be driven by more than one process (or you
//! want the lifecycle and fencing even with one): build one keeper per
//! process over the backend of the deployment (`memlease`, `flocklease`,
//! `etcdlease`, `k8slease`, `grpcdriver`, `redis-session-store`, or your
//! own [`SessionLease`](lease_port::SessionLease)), call
//! [`LeaseKeeper::acquire`] before every run, and make every store write
//! through [`LeaseGuard::spawn_write`], which hands the write the run's
//! [`WriteFence`](lease_port::WriteFence) and keeps the run open until the
//! write has ended. Code that only needs one call (a maintenance tool taking
//! a lease once) can use the backend directly. For an HTTP server,
//! `lease-http` does all of this per request.
//!
//! # Example
//!
//! Two keepers over one lease table stand for two processes; the store is
//! `session-store`'s JSONL directory.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use lease_keeper::{KeeperErrorKind, LeaseKeeper};
//! use lease_port::{OwnerId, SessionId};
//! use memlease::MemLease;
//! use serde_json::json;
//! use session_store::{JsonlOptions, JsonlStore, SessionStore, StoreErrorKind};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ttl = Duration::from_secs(30);
//! let backend = MemLease::new(ttl); // clones share one table
//! let a = LeaseKeeper::new(Arc::new(backend.clone()), OwnerId::new("host-a")?, ttl)?;
//! let b = LeaseKeeper::new(Arc::new(backend), OwnerId::new("host-b")?, ttl)?;
//! let dir = tempfile::tempdir()?;
//! let store = Arc::new(JsonlStore::open(dir.path(), JsonlOptions::default())?);
//! let chat = SessionId::new("chat-7")?;
//! store.create(&chat).await?;
//!
//! let run = a.acquire(&chat).await?;
//! // The write runs on its own task: dropping `appended` would not stop it,
//! // and the run's release would wait for it.
//! let (s, id) = (Arc::clone(&store), chat.clone());
//! let appended = run.spawn_write(move |fence| async move {
//!     s.append(&id, fence, &[json!({"text": "hi"})]).await
//! })?;
//! appended.await?;
//! let late_fence = run.fence(); // as if A paused here past its TTL
//!
//! // Another process is refused while A holds the session.
//! let err = b.acquire(&chat).await.unwrap_err();
//! assert_eq!(err.kind(), KeeperErrorKind::LeasedElsewhere);
//! assert!(err.retry_after().is_some());
//!
//! run.finish().await?; // released on a detached task
//! let taken = b.acquire(&chat).await?;
//! store.append(&chat, taken.fence(), &[json!({"text": "from B"})]).await?;
//!
//! // A's write arriving late is refused by the store: B's token is higher.
//! let err = store.append(&chat, late_fence, &[json!({"text": "late"})]).await.unwrap_err();
//! assert_eq!(err.kind(), StoreErrorKind::Fenced);
//! b.shutdown().await; // releases everything b still holds
//! # Ok(()) }
//! ```
//!
//! # The rules
//!
//! 1. **In-process lock first.** Each session has an async mutex per keeper.
//!    A second run of a session live in this process is refused at once with
//!    `Busy`, as a run on another process is refused with
//!    `LeasedElsewhere` — unless it asked to wait ([`KeeperBuilder::lock_wait`],
//!    [`LeaseKeeper::acquire_within`]). A run whose release has begun is
//!    always waited for, so the next request after a run answered is not
//!    refused. The wait is cancellable: drop the future. Never two runs of
//!    one session in one process.
//! 2. **Acquire outcomes.** `Held` → [`KeeperError::LeasedElsewhere`]
//!    carrying the holder when known; nothing started. `Transient` (or no
//!    answer within the acquire timeout, which is never more than the TTL,
//!    or an answer only once the TTL since the call was sent has passed) →
//!    [`KeeperError::Unavailable`], retryable; nothing held. `Invalid` →
//!    [`KeeperError::Invalid`].
//! 3. **`Unsupported` fails the run, unless unleased running was allowed.**
//!    By default a backend answering `Unsupported` fails the run
//!    `Unavailable`: a keeper never silently stops fencing. With
//!    [`KeeperBuilder::allow_unleased`], the first `Unsupported` is logged
//!    once; the keeper never consults that backend again
//!    ([`LeaseKeeper::is_unleased`]) and every run gets an *unleased* guard:
//!    [`LeaseGuard::is_leased`] is false and [`LeaseGuard::fence`] is
//!    `Unfenced`, which `session-store` accepts only when configured to (the
//!    deployment proves single-process ownership) and only while no fenced
//!    write was ever accepted for the session.
//! 4. **Renew about every TTL/3, with jitter, keeping the newest value.**
//!    The interval is `ttl × renew_fraction` scaled by a random factor in
//!    `1 ± jitter` ([`KeeperBuilder::renew_fraction`],
//!    [`KeeperBuilder::jitter`]), counted from when the previous successful
//!    renewal was sent. Each renewal passes the newest value and stores the
//!    answer ([`LeaseGuard::lease`], [`LeaseGuard::watch`]). A run's renew
//!    task is started by one keeper-wide driver task shortly before the
//!    first renewal can be due, so runs shorter than that cost no task.
//!    A backend that renews many leases in one exchange gets them in
//!    batches instead, under the same rules (see [Batch
//!    renewal](#batch-renewal)).
//! 5. **`Held` on renew is loss, at once.** The loss signal fires
//!    ([`LeaseGuard::lost`], [`LeaseGuard::loss_signal`]) with
//!    [`LossReason::Held`], and the stale value is never released.
//! 6. **Transient renew failures retry until the lease's own expiry**, every
//!    quarter interval. The expiry is measured on the monotonic clock as
//!    *ttl after the last successful renewal (or the acquisition) was sent*;
//!    reaching it — or a renew call still unanswered then — is loss
//!    ([`LossReason::Expired`]). Any other renew error is loss too
//!    ([`LossReason::Rejected`]).
//! 7. **Writes end before the run does.** Every store write of a run takes
//!    a [`WritePermit`] and keeps it until the write has ended —
//!    [`LeaseGuard::spawn_write`] does both, running the write on a task of
//!    its own; by hand, take it with [`LeaseGuard::begin_write`] and move it
//!    into whatever finishes the write. Never hold it in a future that a
//!    cancelled run may drop while the write goes on (a `select!` branch
//!    not taken): the write may still land, and must not land after the
//!    next owner's first write. Permits are refused
//!    ([`KeeperErrorKind::RunEnded`]) once the run lost its lease or its
//!    release began. The release first waits for every permit, at most the
//!    write wait ([`KeeperBuilder::write_wait`]); past it the lease is *not*
//!    released but left to lapse (no other owner gets the session before
//!    then) and `finish` says [`KeeperErrorKind::WritesInFlight`]. Either
//!    way the in-process lock is held until the last permit is dropped, so
//!    no write of a run can land inside the next run of its session in this
//!    process — leased or not: for an unleased run this is the only fence.
//! 8. **Detached release.** [`LeaseGuard::finish`] and dropping the guard
//!    both release on a task spawned on the runtime (tracked by the keeper),
//!    bounded by the release timeout. Dropping the caller's future — a
//!    client disconnect — cannot cancel it. The in-process lock is held
//!    until the release has finished, so the next run of the session in this
//!    process can never see its fresh lease released by the previous run.
//! 9. **No token serves two runs of one keeper.** When a release fails (or writes kept
//!    it from being tried) the backend may still hold the lease for this
//!    owner, and a same-owner acquire would hand its token back. The keeper
//!    remembers, per session, the token it could not release; an
//!    acquisition granting a token no greater is released and acquired
//!    again, and if the backend still grants no greater token the run fails
//!    `Unavailable` (after the old lease's expiry a greater token comes).
//!    The memory of a session is cleared by its next greater token.
//! 10. **Bounded shutdown.** [`LeaseKeeper::shutdown`] stops new
//!     acquisitions (waiters fail with `ShuttingDown`), fires every open
//!     run's loss signal with [`LossReason::Shutdown`], releases every lease
//!     still held (each once its run's writes ended, as in rule 7), and
//!     waits for all releases at most the shutdown bound.
//! 11. **Observability.** [`KeeperMetrics`] hooks (default [`NoMetrics`]):
//!     held-leases gauge, acquisitions and failures, losses with reason, renew
//!     latency with outcome (per lease, batched or not), batch sizes,
//!     releases. `tracing` spans
//!     `lease_keeper.acquire`, `lease_keeper.renew`, `lease_keeper.release`,
//!     `lease_keeper.shutdown` carry the session (and token).
//!
//! # Batch renewal
//!
//! When the backend says [`renews_in_batches`](lease_port::SessionLease::renews_in_batches)
//! — a lease service client sending one call for every session a process
//! holds, an etcd backend sharing one KeepAlive — a keeper holding many
//! runs pays for a few exchanges per renew interval instead of one per run.
//! Otherwise renewals go one by one, each run on its own task, exactly as
//! above.
//!
//! **What goes together, and when.** One keeper-wide task wakes when the
//! earliest renewal is due and sends, in one
//! [`renew_many`](lease_port::SessionLease::renew_many) call, every run
//! whose renewal is due now *or within a quarter of the renew interval*
//! (at most [`KeeperBuilder::renew_batch_limit`] leases a call; more go
//! out in several calls at the same moment). Runs whose renewal is in
//! flight are not waited for, nor is any later run. So:
//!
//! - a run is renewed at most a quarter interval early and never later
//!   than its due time;
//! - batches of one keeper go out more than a quarter interval apart: at
//!   most four calls per renew interval however many runs it holds, usually
//!   one or two;
//! - the runs of one batch draw one jitter factor, so they stay together;
//!   separate keepers still drift apart.
//!
//! **Why it is as safe as one by one.** Each run keeps its own rules:
//!
//! - its deadline is the TTL after the call that granted or last renewed
//!   *it* was sent — for a batch, when the batch was sent. While a batch is
//!   unanswered each of its runs is lost ([`LossReason::Expired`]) exactly
//!   at its own deadline, while the others keep waiting up to theirs; an
//!   answer arriving at or after a run's deadline does not count for it;
//! - each lease's answer is applied to its run alone: `Held` loses that run
//!   at once (rule 5), `Transient` retries it a quarter interval later, in
//!   whichever batch goes then, until its own deadline (rule 6); any other
//!   error, or a renewed value naming another token, owner or session, is
//!   [`LossReason::Rejected`]. A batch answering a different number of
//!   results than leases sent cannot be matched to its runs: every run in
//!   it is lost (`Rejected` with `Invalid`);
//! - a run that ends while its lease is in a batch is released at once (the
//!   release never waits for the batch), and the batch's answer for it is
//!   ignored: it is neither stored nor put back on the schedule.
//!
//! [`KeeperMetrics::renew_batch`] sees each call's size;
//! [`KeeperMetrics::renew_latency`] still sees each lease's outcome, with
//! the batch's latency.
//!
//! # Time
//!
//! Two clocks, each for what it is good at:
//!
//! - The **backend's wall clock** (the [`Clock`](lease_port::Clock) given to
//!   the backend) decides [`Lease::expiry`](lease_port::Lease::expiry). The
//!   keeper never compares expiries with its own wall clock: another host's
//!   clock may differ.
//! - The keeper's own deadlines (when to renew, when a lease must be taken
//!   as lost, every timeout) use **tokio's monotonic clock**
//!   ([`tokio::time::Instant`]). A wall-clock jump cannot stretch them, and
//!   tests can run them in virtual time with `#[tokio::test(start_paused =
//!   true)]` while moving the backend's wall time with a `ManualClock`.
//!
//! The TTL given to [`LeaseKeeper::builder`] must therefore be the TTL the
//! backend grants (or less): that, not the expiry field, is what the keeper
//! reckons with. A backend that says what it grants
//! ([`granted_ttl`](lease_port::SessionLease::granted_ttl); every backend of
//! this workspace does, and `grpcdriver` once given its `min_grant`) is
//! checked when the keeper is built: a keeper TTL longer than the grants is
//! refused as `Invalid`.
//!
//! # Runtime
//!
//! Needs a tokio runtime with the time driver enabled. A keeper belongs to
//! one runtime: its renewal driver is spawned on the runtime of the first
//! leased acquisition, and each guard's release runs on the runtime it was
//! acquired on.

mod error;
mod keeper;
mod metrics;

pub use error::{KeeperError, KeeperErrorKind};
pub use keeper::{
    DEFAULT_JITTER, DEFAULT_LOCK_WAIT, DEFAULT_RELEASE_TIMEOUT, DEFAULT_RENEW_BATCH_LIMIT,
    DEFAULT_RENEW_FRACTION, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_WRITE_WAIT, KeeperBuilder,
    LeaseGuard, LeaseKeeper, LossReason, LossSignal, ShutdownReport, WriteGate, WritePermit,
    WriteTask,
};
pub use metrics::{KeeperMetrics, NoMetrics, RenewOutcome};
