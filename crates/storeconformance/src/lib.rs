//! The behaviour suite every `SessionStore` must pass.
//!
//! # What it is for
//!
//! The `session-store` crate states the store contract in prose — every
//! write fenced by a token and its writer against a per-session
//! high-water mark, unfenced writes only when allowed, the lease
//! authority bound once, batches all or nothing, pages and listings that
//! hold under concurrent writes; this crate states it in code. Both of
//! this project's stores (the JSONL directory store and the Redis store)
//! run it, and so should yours: implement
//! [`SessionStore`](session_store::SessionStore) over your database and
//! let the suite tell you which rule you got wrong — before a stale owner
//! writes after a takeover.
//!
//! # When to choose it
//!
//! For a store: any implementation of `SessionStore` whose clients may be
//! several processes. For a lease backend use `leaseconformance` instead;
//! a crate offering both (a database with conditional writes) runs both.
//! Store-specific behaviour — crash recovery, what survives a restart of
//! the database, deployment checks — stays in the store's own tests.
//!
//! # How to use it
//!
//! Hand the suite a [`StoreFactory`] — fresh clients of one fresh store,
//! a client allowing unfenced writes if the store can be configured so,
//! its event size limit if it has one — and expand [`suite!`] in an
//! integration test. It becomes one `#[tokio::test]` per case, so
//! filtering, `#[ignore]` and nextest work as usual. The test crate needs
//! `tokio` with the `macros` and `rt-multi-thread` features.
//!
//! ```
//! use std::sync::Arc;
//!
//! use async_trait::async_trait;
//! use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};
//! use storeconformance::StoreFactory;
//!
//! const MAX_EVENT_BYTES: usize = 4096;
//!
//! /// One fresh directory per factory; every client is a store instance of
//! /// its own on it, as another process would open it.
//! struct Jsonl(tempfile::TempDir);
//!
//! impl Jsonl {
//!     fn open(&self, allow_unfenced: bool) -> Arc<dyn SessionStore> {
//!         let opts = JsonlOptions::default()
//!             .fsync(FsyncPolicy::Never)
//!             .max_event_bytes(MAX_EVENT_BYTES)
//!             .allow_unfenced(allow_unfenced);
//!         Arc::new(JsonlStore::open(self.0.path(), opts).expect("open the store"))
//!     }
//! }
//!
//! #[async_trait]
//! impl StoreFactory for Jsonl {
//!     async fn store(&self) -> Arc<dyn SessionStore> {
//!         self.open(false)
//!     }
//!     async fn unfenced_store(&self) -> Option<Arc<dyn SessionStore>> {
//!         Some(self.open(true))
//!     }
//!     fn max_event_bytes(&self) -> Option<usize> {
//!         Some(MAX_EVENT_BYTES)
//!     }
//! }
//!
//! // In tests/conformance.rs this one line is the whole suite:
//! // storeconformance::suite!(async { Jsonl(tempfile::tempdir().unwrap()) });
//!
//! // Cases are plain async functions too:
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let factory = Jsonl(tempfile::tempdir().unwrap());
//! storeconformance::cases::equal_token_from_another_writer_refused(&factory).await;
//! # });
//! ```
//!
//! A store on a server (Redis, a database) starts one for the factory, or
//! gives each factory a key prefix of its own, and connects a client per
//! [`store`](StoreFactory::store) call.
//!
//! # The cases
//!
//! Sessions: [`create_and_exists`](cases::create_and_exists) (`AlreadyExists`,
//! `NotFound`), [`append_and_read_back`](cases::append_and_read_back),
//! [`session_isolation`](cases::session_isolation) (ids an unsafe key or
//! file naming would merge).
//!
//! Fencing: [`lower_token_refused`](cases::lower_token_refused),
//! [`equal_token_from_another_writer_refused`](cases::equal_token_from_another_writer_refused),
//! [`higher_token_binds_its_writer`](cases::higher_token_binds_its_writer),
//! [`tokens_compare_exactly`](cases::tokens_compare_exactly) (the whole
//! `u64` range), [`delete_is_fenced`](cases::delete_is_fenced),
//! [`recreated_session_keeps_mark_and_numbers`](cases::recreated_session_keeps_mark_and_numbers),
//! [`unfenced_refused_unless_allowed`](cases::unfenced_refused_unless_allowed),
//! [`unfenced_refused_once_fenced`](cases::unfenced_refused_once_fenced),
//! [`append_after_writes_only_onto_the_log_it_names`](cases::append_after_writes_only_onto_the_log_it_names)
//! (a conditional append onto a log that moved writes nothing and raises
//! no mark),
//! [`authority_binding`](cases::authority_binding),
//! [`racing_first_bindings`](cases::racing_first_bindings).
//!
//! Concurrency: [`racing_equal_tokens_one_writer_wins`](cases::racing_equal_tokens_one_writer_wins),
//! [`racing_lower_and_higher_tokens`](cases::racing_lower_and_higher_tokens),
//! [`racing_writers_never_repeat_a_sequence_number`](cases::racing_writers_never_repeat_a_sequence_number),
//! [`paging_under_concurrent_appends`](cases::paging_under_concurrent_appends),
//! [`listing_under_concurrent_changes`](cases::listing_under_concurrent_changes).
//!
//! Reading and following: [`read_paging`](cases::read_paging),
//! [`listing_pages`](cases::listing_pages),
//! [`wait_wakes_on_append`](cases::wait_wakes_on_append),
//! [`wait_times_out`](cases::wait_times_out),
//! [`wait_on_missing_or_deleted_is_not_found`](cases::wait_on_missing_or_deleted_is_not_found),
//! [`cancel_requests_wake_the_holder`](cases::cancel_requests_wake_the_holder)
//! (a request recorded through one client wakes a holder waiting through
//! another; the token only rises, the count only grows),
//! [`last_seq_follows_appends`](cases::last_seq_follows_appends).
//!
//! Bad input: [`bad_input_is_invalid`](cases::bad_input_is_invalid) (an
//! empty batch, an event over the limit, page and listing limits out of
//! bounds: `Invalid`, nothing written).
//!
//! Every failure says which rule broke and the state the session was in
//! ("after x wrote with token 5: y appends with token 5 through another
//! client: expected a refusal (Fenced), but it succeeded").
//!
//! # The suite is tested too
//!
//! A suite that cannot fail proves nothing. This crate's own tests run it
//! against deliberately broken stores — JSONL stores behind wrappers that
//! accept a lower token, accept an equal token from another writer, lose
//! the writer binding on a takeover, compare tokens as doubles, reuse
//! sequence numbers, ignore the page limit, write batches event by event,
//! and more — and require each to be caught by the case made for it.

mod factory;
mod support;

pub mod cases;

pub use factory::StoreFactory;

use std::future::Future;

/// Calls `$callback!` with the name of every case, so the list lives in one
/// place.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ([$($callback:tt)*] $($args:tt)*) => {
        $($callback)*! {
            [$($args)*]
            create_and_exists
            append_and_read_back
            session_isolation
            lower_token_refused
            equal_token_from_another_writer_refused
            higher_token_binds_its_writer
            tokens_compare_exactly
            delete_is_fenced
            recreated_session_keeps_mark_and_numbers
            unfenced_refused_unless_allowed
            unfenced_refused_once_fenced
            authority_binding
            racing_first_bindings
            racing_equal_tokens_one_writer_wins
            racing_lower_and_higher_tokens
            racing_writers_never_repeat_a_sequence_number
            read_paging
            paging_under_concurrent_appends
            listing_pages
            listing_under_concurrent_changes
            wait_wakes_on_append
            wait_times_out
            wait_on_missing_or_deleted_is_not_found
            bad_input_is_invalid
            cancel_requests_wake_the_holder
            last_seq_follows_appends
            append_after_writes_only_onto_the_log_it_names
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    ([$make:expr] $($case:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let factory = $make.await;
            $crate::cases::$case(&factory).await;
        }
    )*};
}

/// Expands to one `#[tokio::test]` per case, each on a fresh factory.
///
/// The argument is an expression evaluating to a future of the factory,
/// evaluated once per test:
///
/// ```text
/// storeconformance::suite!(async { MyFactory::start().await });
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

/// The failure of a case's task, as text.
#[doc(hidden)]
pub fn __failure(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned()),
        Err(e) => format!("the case did not finish: {e}"),
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __check_all {
    ([$make:ident $out:ident] $($case:ident)*) => {$(
        let future = $make();
        let outcome = tokio::spawn(async move {
            let factory = future.await;
            $crate::cases::$case(&factory).await;
        })
        .await;
        $out.push($crate::CaseOutcome {
            name: stringify!($case),
            failure: outcome.err().map($crate::__failure),
        });
    )*};
}

/// Runs every case, each on a fresh factory from `make`, and reports which
/// passed instead of stopping at the first failure. Must run inside a Tokio
/// runtime; panics of failing cases are caught (and printed by the default
/// panic hook).
pub async fn check_all<F, Fut, Make>(make: Make) -> Vec<CaseOutcome>
where
    F: StoreFactory,
    Fut: Future<Output = F> + Send + 'static,
    Make: Fn() -> Fut,
{
    let mut outcomes = Vec::new();
    __with_cases!([__check_all] make outcomes);
    outcomes
}
