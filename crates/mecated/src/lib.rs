//! mecated: a session server whose every run is owned by one process at a
//! time, and whose every write is fenced by that ownership.
//!
//! # What it is for
//!
//! Run several `mecated` processes over one store directory — behind a load
//! balancer, or simply started twice — and requests for one session may reach
//! any of them. Each run first leases its session (file leases under
//! `<STORE_DIR>/.session-leases` by default), renews the lease while the
//! agent works, and appends every event with the lease's fencing token. A
//! second process asked for the same session answers
//! `409 session_leased_elsewhere`; a process that stalls past its lease and
//! wakes after a takeover has its writes refused by the store and its run
//! cancelled.
//!
//! On loopback it serves any caller; beyond loopback it needs a token file
//! ([`auth`]): every route but health, readiness, the API document and the
//! operator page's HTML then needs a bearer token with the route's role,
//! and every delete and cancel leaves one line on the `audit` target.
//!
//! # Example
//!
//! Serving on an ephemeral port in-process, the way the tests do:
//!
//! ```
//! use std::sync::Arc;
//! use mecated::{Server, ServerConfig};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = std::env::temp_dir().join(format!("mecated-doc-{}", std::process::id()));
//! let server = Server::start(ServerConfig::for_store(&dir)).await?;
//! println!("serving on {}", server.local_addr());
//! assert!(server.shutdown().await);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), mecated::StartError>(())
//! # }).unwrap();
//! ```
//!
//! # Modules
//!
//! - [`agent`]: the agent loop (`echo`, `exec`), independent of leases.
//! - [`engine`]: the run engine — lease, claim the store, drive, release —
//!   answering domain errors, with no HTTP in it.
//! - [`auth`]: who may call the API: the token file (hashed bearer tokens
//!   with names and roles), read again without a restart.
//! - [`wire`]: the typed request and response bodies.
//! - [`http`]: routes, each with the role it needs and whether it is
//!   audited ([`http::route_table`]), Server-Sent Events, health, metrics,
//!   and the one mapping of engine errors to statuses and codes.
//! - [`openapi`]: the API description, derived from [`http`] and [`wire`].
//! - [`config`]: flags, environment variables, and how they combine.
//! - [`lease_view`]: who holds a session's lease now, read without taking
//!   part (for `Retry-After`, runs on other replicas, the operator page).
//! - [`backend`]: the one place flags become a store and a lease backend
//!   (and the single-process proof of unleased deployments).
//! - [`server`]: start-up and graceful shutdown.
//! - [`transcript`]: what a run's agent is given, and the cache that
//!   spares a run from reading its session's whole transcript again.

pub mod agent;
pub mod auth;
pub mod backend;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod http;
pub mod lease_view;
pub mod metrics;
pub mod openapi;
pub mod server;
pub mod transcript;
pub mod wire;

pub use server::{Server, ServerConfig, StartError};
