//! An exhaustive model of the lease contract, the keeper and the fenced
//! store, and a second opinion on `lease-history`'s checker.
//!
//! # What it is for
//!
//! The fault runs test the real code against real services, bounded by
//! real time, and judge what they record with `lease-history`'s checker.
//! Two things they cannot do: try every interleaving, and check the
//! checker. This crate models the protocol — processes whose keepers
//! acquire, renew (their lease counted from when the request was *sent*),
//! write under the lease and release once their writes are answered; one
//! lease authority; one store whose high-water mark is bound to the writer
//! that set it — over a network that loses, delays, reorders and
//! duplicates, with processes that pause (they simply take no step) and
//! crash (restarting as a new owner). [`stateright`] explores every state
//! within [`Bounds`], breadth first, so a violation comes with a shortest
//! path to it.
//!
//! The properties, checked in every state:
//!
//! - [`SINGLE_HOLDER`]: no two processes count on one session's lease at
//!   once;
//! - [`ONE_OWNER_PER_TOKEN`]: the authority never grants one token to two
//!   owners;
//! - [`STORE_FENCING`]: in the store's order tokens never go down, and one
//!   token has one writer — after a takeover is written, nothing the old
//!   owner does changes the session;
//! - [`WRITES_SETTLE_BEFORE_RELEASE`]: no write lands after the release of
//!   the lease it was sent under was handled.
//!
//! Each breakage the fault runs inject into real backends is a
//! [`Variant`] of the model, and each must be found. The model's paths are
//! also turned into histories ([`history_of`]) and judged by
//! `lease_history::check`: on a corpus of random paths ([`random_path`]),
//! the checker and the model must agree.
//!
//! Each process counts its leases on its own clock, which may run slow
//! against the authority's by up to [`Bounds::clock_lag`] ticks (it misses
//! ticks, never steps back); the keeper takes [`Bounds::keeper_margin`]
//! ticks off each lease for it. Within that margin every property holds
//! ([`Bounds::SMALL_SLOW_CLOCKS`]); past it only [`SINGLE_HOLDER`] breaks,
//! since the store's fence never reads a clock. The real keeper takes no
//! margin: it assumes its monotonic clock and the authority's run at one
//! rate, and counts on nothing but the fence when they do not. Clock steps
//! are left to the simulation (`lease-sim`) and the fault runs, which
//! inject them into the real code.
//!
//! # Example
//!
//! ```
//! use lease_model::{Bounds, LeaseSystem, Variant, STORE_FENCING};
//! use stateright::{Checker, Model};
//!
//! let bounds = Bounds { crashes: 0, ..Bounds::SMALL };
//! let broken = LeaseSystem::new(bounds, Variant::StoreWithoutFencing)
//!     .checker()
//!     .spawn_bfs()
//!     .join();
//! let path = broken.discovery(STORE_FENCING).expect("an unfenced store is caught");
//! // Breadth first: no shorter path breaks it.
//! assert_eq!(path.into_actions().len(), 16);
//! ```

mod history;
mod symmetry;
mod system;
mod variant;
mod walk;

pub use history::history_of;
pub use symmetry::permutations;
pub use system::{
    Action, Answer, Authority, Bounds, Held, Landed, LeaseSystem, Message, Owner, Process, Request,
    State, Store, TTL, one_owner_per_token, single_holder, store_fenced,
    writes_settle_before_release,
};
pub use variant::Variant;
pub use walk::{Agreement, judge, random_path};

/// The name of the single-holder property.
pub const SINGLE_HOLDER: &str = "single holder";
/// The name of the one-owner-per-token property.
pub const ONE_OWNER_PER_TOKEN: &str = "one owner per token";
/// The name of the store-fencing property.
pub const STORE_FENCING: &str = "store fencing";
/// The name of the property that writes settle before their lease's
/// release.
pub const WRITES_SETTLE_BEFORE_RELEASE: &str = "writes settle before release";
