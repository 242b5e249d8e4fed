//! Safety under faults: record what concurrent lease holders did, check the
//! record against the lease and fencing rules, and draw it.
//!
//! # What it is for
//!
//! A lease backend can pass every conformance case and still let two
//! owners act on one session when a holder pauses, a reply is lost, a
//! clock steps or a service restarts. This crate runs workers that
//! acquire, write fenced events, renew and release against a real backend
//! and a real store while faults are injected, records every operation
//! with its invocation and completion instants and its outcome (ambiguous
//! ones included), and checks the history afterwards:
//!
//! - [`Recorder`] and [`History`]: the thread-safe record.
//! - [`check`] → [`Verdict`]: the properties below, with the first
//!   violation and the operations around it, as text.
//! - [`write_svg`]: a timeline a person reads at a glance, written beside
//!   the verdict.
//! - [`run`]: the workload ([`Workload`], [`Target`], [`FaultInjector`]),
//!   whose clients a fault injector can restart mid-run ([`Restarts`]).
//! - [`server_log`]: the end-to-end check of a session server's store
//!   against what its clients were told ([`check_server`]), drawn with the
//!   same timeline ([`server_timeline`]).
//!
//! Wrappers that break one rule each (`tests/support/broken.rs`: no
//! fencing in the store, a store accepting an equal token from another
//! owner, no token bump on takeover, a renew that ignores loss, a release
//! of another owner's hold) are test support, shared by the tests and the
//! `faults` example: the checker must find every one, and the tests show
//! it does.
//!
//! Use it to test a backend or a store under faults (`cargo xtask faults`
//! drives it for every backend of this workspace), or to check histories
//! your own harness records.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use lease_history::{SteppedClock, Target, Workload, check, run, write_svg};
//! use session_store::{FsyncPolicy, JsonlOptions, JsonlStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let workload = Workload::new(300, 7);
//! let clock = Arc::new(SteppedClock::new());
//! let leases = memlease::MemLease::builder()
//!     .ttl(workload.ttl)
//!     .clock(clock.clone())
//!     .build();
//! let store = JsonlStore::open(dir.path(), JsonlOptions::default().fsync(FsyncPolicy::Never))?;
//! let target = Target::new(vec![Arc::new(leases)], Arc::new(store), clock);
//!
//! let history = run(&workload, target, None, None).await?;
//! let verdict = check(&history);
//! assert!(verdict.is_clean(), "{verdict}");
//! write_svg(&history, &verdict, &dir.path().join("timeline.svg"))?;
//! # Ok(()) }
//! ```
//!
//! # The lease model
//!
//! All instants are on one monotonic timeline, from the recorder's start.
//! A successful acquire or renew invoked at `i`, completed at `c`, whose
//! lease had `v` left when the caller read the authority's clock just
//! after `i` (capped at the TTL), gives its owner a **hold** from `c` until
//! `v` has passed on the authority's clock since `i`, or until the owner
//! invokes the release of that token, whichever is first. The holder
//! cannot count on the lease before it has the answer, and the backend
//! counts the grant from no earlier than `i`, so a hold is never longer
//! than the backend's own view of it: a hold that overlaps another
//! owner's is a real fault, never an artefact of timing.
//!
//! The authority's clock runs with the monotonic one except for recorded
//! steps ([`FaultKind::ClockForward`], [`FaultKind::ClockBackward`]); a
//! forward step takes effect from the start of its injection and a
//! backward one from its end, which again only shortens holds.
//!
//! Per session, [`check`] verifies:
//!
//! - **(a) single holder** — no two holds of different owners overlap.
//!   Ambiguous grants give no hold.
//! - **(b) token order** — a grant's token is above every token granted
//!   to another owner by a grant completed before it was invoked (a
//!   takeover bumps the token; a renewal after a takeover fails), never
//!   below the owner's own earlier tokens, and a renewal answers the token
//!   it renewed.
//! - **(c) store fencing** — judged on what the store holds at the end
//!   ([`History::store_logs`]), so an ambiguous write counts exactly when
//!   it landed: in the store's order, no event carries a token below an
//!   earlier event's, nor the mark's token from another owner; every
//!   acknowledged write is there and no refused one is; and the order
//!   agrees with real time (a write answered before another began is not
//!   ordered after it).
//!
//! # State that went back
//!
//! An authority or a store can come back older than its clients saw it —
//! restarted from an older snapshot, its storage rewound, a directory put
//! back from a backup — and what was done after the copy is lost: data
//! loss the deployment suffers, which no client can undo. A fault injector
//! records it as a [`Rewind`] (what went back, when the copy was taken,
//! when the state went back) and, once the clients have told the operator
//! so, restarts every client to accept the older state
//! ([`Restarts::restart`], which starts a new [epoch](Op::epoch) and marks
//! the rewind accepted by it). The checker then:
//!
//! - judges **(a)** and **(b)** per *era*, from one accepted rewind to the
//!   next: the accepting clients start over on the older state, whose
//!   tokens may be below those used before;
//! - lets **(c)** miss an acknowledged write that an accepted rewind of the
//!   store may have taken away (done after its copy began), and no other;
//! - adds **(f) rewound**: no client in use when the state went back (of
//!   an epoch begun before the rewind and before the one that accepted it)
//!   succeeds at what went back — acquiring or renewing leases, writing to
//!   the store — in a call invoked after it had gone back (a release, which
//!   only gives up the caller's own hold, may; should it end a hold of the
//!   accepting clients, (a) sees two holders in their era); and no call
//!   invoked while the
//!   authority ran with an evicting memory policy
//!   ([`FaultKind::EvictingPolicy`]) succeeds. A refusal is
//!   [`Outcome::Rewound`].
//!
//! A rewind nobody noticed is never accepted, so everything it lost counts.

#[cfg(feature = "broken")]
pub mod broken;
mod check;
mod clock;
mod history;
mod rng;
mod runner;
pub mod server_log;
mod timeline;

pub use check::{Hold, Property, Verdict, Violation, check, holds};
pub use clock::{ClockStepper, SteppedClock};
pub use history::{
    Ambiguity, Fault, FaultInvocation, FaultKind, History, Invocation, Logged, Op, OpKind, Outcome,
    Recorder, Restart, Rewind,
};
pub use rng::Rng;
pub use runner::{
    Clients, FaultInjector, Progress, Restarts, RunError, Target, Workload, Writer, run,
};
pub use server_log::{ServerHistory, check_server, server_timeline};
pub use timeline::{MAX_DRAWN_OPS, render_svg, write_svg};
