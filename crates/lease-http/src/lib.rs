//! A fenced session server in a few dozen lines, for anyone with axum:
//! keeper and store errors answered as HTTP, and an extractor that leases
//! the route's `/{session}` for the handler.
//!
//! # What it is for
//!
//! `lease-keeper` gives a run of a session its lease and fence;
//! `session-store` refuses a write whose fence a later owner has passed.
//! Between them and an HTTP client, every server needs the same two
//! things: a request that leases its session before the handler runs
//! ([`Leased`]), and one answer for each refusal — a status, a stable
//! code, a message for people, whether to retry and when
//! ([`HttpError`]). This crate is those two, so that two processes
//! serving one store never both write a session, and a client is told
//! which one has it and when to come back.
//!
//! # When to choose it
//!
//! - You serve sessions over HTTP with axum and want each request that
//!   writes to own its session for the request's length: share a
//!   [`Sessions`] (the keeper and the store) as the router's state, add
//!   [`Leased`] to the handler, write through [`LeaseGuard::spawn_write`],
//!   return `Result<_, HttpError>` and let `?` answer every refusal.
//! - You answer HTTP some other way (another framework, a gateway, a gRPC
//!   status): use the plain functions — [`keeper_code`], [`store_code`],
//!   [`ErrorCode::status`], [`keeper_retry_after`], [`store_retry_after`],
//!   [`keeper_message`], [`store_message`] — and answer the same.
//! - Runs that outlive a request (an agent working in the background, as
//!   `mecated` runs them) acquire through the keeper themselves, and can
//!   still answer their refusals with [`HttpError`].
//! - You run a service that a session's runs call for their side effects
//!   (mail, payments, tickets): keep an [`EffectFence`], and it refuses a
//!   request from an owner that lost the session (its token below the
//!   highest seen) and a repeat of an effect key ([`effect_fence`]).
//!
//! # Example
//!
//! A handler appending the request's body to its session, fenced by the
//! request's lease; a second process (here a second keeper over the same
//! lease table) holding the session makes the request a 409 with
//! `Retry-After`. `examples/chat.rs` is the same as a server over file
//! leases, run as two processes.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//!
//! use axum::{Router, body::Body, extract::State, routing::post};
//! use http::{Request, StatusCode, header};
//! use lease_http::{ErrorBody, ErrorCode, HttpError, Leased, Sessions};
//! use lease_keeper::LeaseKeeper;
//! use lease_port::{OwnerId, SessionId};
//! use memlease::MemLease;
//! use serde_json::json;
//! use session_store::{JsonlOptions, JsonlStore, SessionStore};
//! use tower::ServiceExt;
//!
//! async fn append(
//!     State(app): State<Sessions<JsonlStore>>,
//!     Leased(run): Leased,
//!     text: String,
//! ) -> Result<String, HttpError> {
//!     let (store, id) = (app.store, run.session_id().clone());
//!     // On a task of its own, fenced by the request's lease: a client
//!     // disconnecting cannot cut it short, and the release waits for it.
//!     let appended = run.spawn_write(move |fence| async move {
//!         store.append(&id, fence, &[json!({ "text": text })]).await
//!     })?;
//!     let receipt = appended.await?;
//!     // Answered after the release; its error is only logged: the write
//!     // is made.
//!     if let Err(e) = run.finish().await {
//!         eprintln!("release: {e}");
//!     }
//!     Ok(receipt.last_seq.to_string())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ttl = Duration::from_secs(30);
//! let leases = MemLease::new(ttl); // clones share one table
//! let keeper = LeaseKeeper::new(Arc::new(leases.clone()), OwnerId::new("host-a")?, ttl)?;
//! let dir = tempfile::tempdir()?;
//! let store = Arc::new(JsonlStore::open(dir.path(), JsonlOptions::default())?);
//! let chat = SessionId::new("chat-7")?;
//! store.create(&chat).await?;
//! let app = Router::new()
//!     .route("/{session}/messages", post(append))
//!     .with_state(Sessions::new(keeper, store));
//! let send = |uri: &str| Request::post(uri).body(Body::from("hello")).unwrap();
//!
//! let answer = app.clone().oneshot(send("/chat-7/messages")).await?;
//! assert_eq!(answer.status(), StatusCode::OK);
//!
//! // Another process holds the session: 409, who holds it, when to retry.
//! let elsewhere = LeaseKeeper::new(Arc::new(leases), OwnerId::new("host-b")?, ttl)?;
//! let held = elsewhere.acquire(&chat).await?;
//! let answer = app.clone().oneshot(send("/chat-7/messages")).await?;
//! assert_eq!(answer.status(), StatusCode::CONFLICT);
//! assert!(answer.headers().contains_key(header::RETRY_AFTER));
//! let body = axum::body::to_bytes(answer.into_body(), 64 * 1024).await?;
//! let body: ErrorBody = serde_json::from_slice(&body)?;
//! assert_eq!(body.error.code, ErrorCode::SessionLeasedElsewhere);
//! assert_eq!(body.error.holder.as_deref(), Some("host-b"));
//! held.finish().await?;
//!
//! // An id breaking the id rules never reaches the keeper: 400 `invalid`.
//! let answer = app.oneshot(send("/%07/messages")).await?;
//! assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
//! # Ok(()) }
//! ```
//!
//! # The answers
//!
//! Every error is answered with its code's status and the JSON body
//! `mecated` answers ([`ErrorBody`]):
//! `{"error": {"code", "holder"?, "message", "retryable"}}`, plus
//! `Retry-After` (whole seconds, rounded up) where waiting helps.
//!
//! | error | code | status | `Retry-After` |
//! |---|---|---|---|
//! | keeper `LeasedElsewhere` | `session_leased_elsewhere` (with `holder` when known) | 409 | the holder's lease's time left, else the TTL |
//! | keeper `Busy` | `session_busy` | 409 | the TTL |
//! | keeper `Unavailable` | `lease_unavailable` | 503 | 1 s |
//! | keeper `ShuttingDown` | `shutting_down` | 503 | — |
//! | keeper `Invalid` | `invalid` | 400 | — |
//! | keeper `Rewound` | `state_rewound` | 500 | — |
//! | keeper `RunEnded` | `lease_lost` | 409 | — |
//! | keeper `WritesInFlight` | `internal` | 500 | — |
//! | store `NotFound` | `not_found` | 404 | — |
//! | store `AlreadyExists` | `session_exists` | 409 | — |
//! | store `Fenced` | `write_fenced` | 409 | — |
//! | store `Unfenced` | `unfenced_write_refused` | 409 | — |
//! | store `Invalid` | `invalid` | 400 | — |
//! | store `Busy` | `store_busy` | 503 | 1 s |
//! | store `Unavailable` | `store_unavailable` | 503 | 1 s |
//! | store `Rewound` | `state_rewound` | 500 | — |
//! | store `Io`, `Corrupt`, `AuthorityMismatch`, `Unsupported` | `internal` | 500 | — |
//!
//! The keeper rows are the table on [`KeeperErrorKind`](lease_keeper::KeeperErrorKind);
//! [`keeper_code`] says why the two rows that table leaves open are
//! answered as they are. `retryable` is true for `session_busy`,
//! `lease_unavailable`, `store_busy` and `store_unavailable` only: what
//! certainly did nothing and may succeed on the same process later. A
//! session leased elsewhere carries `Retry-After` but is not retryable
//! here: it is another process's until its holder lets go.
//!
//! # The extractors
//!
//! [`Leased`] reads the path parameter named `session` ([`SESSION_PARAM`]),
//! validates it as a [`SessionId`](lease_port::SessionId) (400 `invalid`
//! otherwise), acquires its lease from the [`LeaseKeeper`](lease_keeper::LeaseKeeper)
//! the state gives through [`FromRef`](axum::extract::FromRef), and hands
//! the handler the [`LeaseGuard`]. Its docs say when the lease is released
//! and what a client disconnecting does. [`SessionPath`] is the validation
//! alone, for routes that only read.
//!
//! A late write of a holder that lost its session is answered 409
//! `lease_lost` when the keeper saw the loss first, and 409 `write_fenced`
//! when the store refused it: which one depends on timing, so a client
//! treats them alike (the write was not made; another process owns the
//! session now).
//!
//! **A backend whose tokens can start below what the store has seen** (a
//! `memlease` table with a named authority after a restart) needs its
//! first grant raised above the store's mark, or the store fences its first
//! writes. `Leased` acquires plainly; for such a backend, lease in the
//! handler instead: take the id with [`SessionPath`], read
//! `store.high_water(&id)` and acquire with
//! `keeper.acquire_above_within(&id, Duration::ZERO, mark)` when there is a
//! mark. Every other backend of this workspace keeps its tokens across
//! restarts and needs none of this.
//!
//! Built on axum 0.8 (its `/{session}` path syntax).
//!
//! [`LeaseGuard`]: lease_keeper::LeaseGuard
//! [`LeaseGuard::spawn_write`]: lease_keeper::LeaseGuard::spawn_write

mod code;
pub mod effect_fence;
mod error;
mod extract;
mod mapping;
mod state;

pub use code::ErrorCode;
pub use effect_fence::{EffectClaim, EffectFence, EffectTicket, Refusal};
pub use error::{ErrorBody, ErrorDetail, HttpError};
pub use extract::{Leased, SESSION_PARAM, SessionPath};
pub use mapping::{
    STORE_RETRY_AFTER, error_chain, keeper_code, keeper_message, keeper_retry_after, store_code,
    store_message, store_retry_after, whole_seconds,
};
pub use state::Sessions;
