//! The behaviour suite every `SessionLease` backend must pass.
//!
//! # What it is for
//!
//! `lease-port` states the lease contract in prose; this crate states it in
//! code. Every backend of this project runs it, and so should yours: if your
//! infrastructure already has a locking primitive (etcd, a database
//! conditional write, a coordination service), implement
//! [`SessionLease`](lease_port::SessionLease) over it and let the suite tell
//! you what you got wrong — before two processes drive one session.
//!
//! # How to use it
//!
//! Hand the suite a [`LeaseFactory`] — fresh clients of your backend sharing
//! one store, a TTL, and a way to let time pass — and expand [`suite!`] in an
//! integration test. It becomes one `#[tokio::test]` per case, so filtering,
//! `#[ignore]` and nextest work as usual. The test crate needs `tokio` with
//! the `macros` and `rt-multi-thread` features.
//!
//! Two factories cover most backends, so the whole test is a constructor:
//! [`ManualClockFactory`] when the backend reads an injected clock (cases run
//! instantly), [`RealTimeFactory`] when its time is real (a service's own
//! clock; cases sleep past a short TTL).
//!
//! ```
//! use std::time::Duration;
//! use leaseconformance::ManualClockFactory;
//! use memlease::MemLease;
//!
//! const TTL: Duration = Duration::from_secs(10);
//!
//! fn factory() -> ManualClockFactory<MemLease> {
//!     // One in-memory store; every client is a clone of it.
//!     ManualClockFactory::shared(TTL, |clock| MemLease::builder().ttl(TTL).clock(clock).build())
//! }
//!
//! // In tests/conformance.rs this one line is the whole suite:
//! // leaseconformance::suite!(async { factory() });
//!
//! // Cases are plain async functions too:
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! leaseconformance::cases::takeover(&factory()).await;
//! let report = leaseconformance::check_all(|| async { factory() }).await;
//! assert!(report.iter().all(|case| case.passed()), "{report:?}");
//! # });
//! ```
//!
//! A backend whose clients are separate instances over shared state (a
//! directory, a service) makes each client with [`ManualClockFactory::new`]
//! or [`RealTimeFactory::new`], capturing the state in the closure; declare a
//! restart with `restart_by_new_clients()` or `restart_with(hook)`. Anything
//! else implements [`LeaseFactory`] directly.
//!
//! # The cases
//!
//! Each names the rule of the contract it checks (see `lease-port`):
//! [`acquire_free`](cases::acquire_free),
//! [`reacquire_same_owner`](cases::reacquire_same_owner),
//! [`renew_extends`](cases::renew_extends),
//! [`release_frees`](cases::release_frees),
//! [`release_idempotent`](cases::release_idempotent),
//! [`expiry`](cases::expiry), [`takeover`](cases::takeover),
//! [`monotonic_tokens`](cases::monotonic_tokens) (across a restart when the
//! backend can restart), [`renew_after_loss`](cases::renew_after_loss),
//! [`stale_release_after_takeover`](cases::stale_release_after_takeover),
//! [`session_isolation`](cases::session_isolation) (including ids an unsafe
//! encoding would merge), [`concurrent_race`](cases::concurrent_race) (exactly
//! one winner per round), [`concurrent_exclusion`](cases::concurrent_exclusion)
//! (holds never overlap), [`invalid_input`](cases::invalid_input) (forged
//! values, extreme tokens), [`authority_stable`](cases::authority_stable)
//! (one authority for every client, across restarts),
//! [`renew_many`](cases::renew_many) (batch renewal answers lease by lease),
//! [`current_reports_the_live_holder`](cases::current_reports_the_live_holder)
//! (the optional holder report), and [`model_check`](cases::model_check): random
//! operation sequences compared with a reference model, shrunk on failure.
//!
//! # Time
//!
//! Backends with an injected clock ([`TimeControl::Manual`]) run every case
//! instantly. Backends on real time ([`TimeControl::Real`]) sleep past a
//! short TTL where a case needs expiry; pick a TTL of about a second. A
//! real-time case also measures its own scheduling delay — time spent beyond
//! its planned sleeps — and when it fails after that delay ate its timing
//! margin (0.3 TTL), the failure is inconclusive and the case runs again (up
//! to five times): a loaded machine does not fail a correct backend, and no
//! check is loosened for it. The model check uses a fixed seed; set
//! `PROPTEST_RNG_SEED` to explore others.
//!
//! # The suite is tested too
//!
//! A suite that cannot fail proves nothing. This crate's own tests run it
//! against deliberately broken backends — no token bump on takeover, release
//! ignoring the owner, renew resurrecting a lease taken over, acquire
//! ignoring expiry, and more — and require each to be caught.

mod factories;
mod factory;
mod model;
mod support;
#[doc(hidden)]
pub mod timing;

pub mod cases;

pub use factories::{ManualClockFactory, RealTimeFactory};
pub use factory::{Capabilities, LeaseFactory, TimeControl};

use std::future::Future;

/// Calls `$callback!` with the name of every case, so the list lives in one
/// place.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ([$($callback:tt)*] $($args:tt)*) => {
        $($callback)*! {
            [$($args)*]
            acquire_free
            reacquire_same_owner
            renew_extends
            release_frees
            release_idempotent
            expiry
            takeover
            monotonic_tokens
            renew_after_loss
            stale_release_after_takeover
            session_isolation
            concurrent_race
            concurrent_exclusion
            invalid_input
            authority_stable
            renew_many
            current_reports_the_live_holder
            acquire_above_floor
            model_check
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    ([$make:expr] $($case:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $crate::timing::run_case(stringify!($case), |meter| async move {
                let factory = $make.await;
                meter.start(&factory);
                $crate::timing::scoped(meter, $crate::cases::$case(&factory)).await;
            })
            .await;
        }
    )*};
}

/// Expands to one `#[tokio::test]` per case, each on a fresh factory.
///
/// The argument is an expression evaluating to a future of the factory,
/// evaluated once per test:
///
/// ```text
/// leaseconformance::suite!(async { MyFactory::start().await });
/// ```
///
/// Wrap it in a module to keep the names apart when one test crate checks
/// several configurations.
#[macro_export]
macro_rules! suite {
    ($make:expr) => {
        $crate::__with_cases!([$crate::__suite_tests] $make);
    };
}

/// The outcome of one case in [`check_all`].
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    /// The case's name, as in [`cases`].
    pub name: &'static str,
    /// `None` when it passed; the panic message when it failed.
    pub failure: Option<String>,
}

impl CaseOutcome {
    /// True when the case passed.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __check_all {
    ([$make:ident $out:ident] $($case:ident)*) => {$(
        let outcome = $crate::timing::try_case(stringify!($case), |meter| {
            let future = $make();
            async move {
                let factory = future.await;
                meter.start(&factory);
                $crate::timing::scoped(meter, $crate::cases::$case(&factory)).await;
            }
        })
        .await;
        $out.push($crate::CaseOutcome {
            name: stringify!($case),
            failure: outcome.err().map(|e| e.message()),
        });
    )*};
}

/// Runs every case, each on a fresh factory from `make`, and reports which
/// passed instead of stopping at the first failure. Must run inside a Tokio
/// runtime; panics of failing cases are caught (and printed by the default
/// panic hook).
pub async fn check_all<F, Fut, Make>(make: Make) -> Vec<CaseOutcome>
where
    F: LeaseFactory,
    Fut: Future<Output = F> + Send + 'static,
    Make: Fn() -> Fut,
{
    let mut outcomes = Vec::new();
    __with_cases!([__check_all] make outcomes);
    outcomes
}
