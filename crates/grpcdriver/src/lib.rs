//! Session leases over gRPC: a [`SessionLease`] client for a remote lease
//! service, and a server that exposes any backend as that service.
//!
//! # What it is for
//!
//! Processes on several hosts that must agree on who owns a session share
//! one lease service. The service runs a real lease backend (in memory, a
//! lease directory, etcd, …); every process reaches it through
//! [`GrpcLease`], which implements the same contract as every other
//! backend, so the lease keeper and the fenced store work unchanged.
//!
//! Choose it when the processes are on several hosts and no shared engine
//! (etcd, Kubernetes) is reachable from all of them, or to put one lease
//! service in front of such an engine for clients that should not speak
//! to it directly. On one host, a lease directory (`flocklease`) is
//! simpler and has no service to run.
//!
//! # Features
//!
//! - `tls` (default): TLS and mutual TLS on both ends, rustls with ring.
//! - `server` (off): [`LeaseServer`], which serves a backend as the lease
//!   service. A process that only asks for leases leaves it off and pulls
//!   in no HTTP router, health or reflection service.
//!
//! # Example
//!
//! A server (feature `server`) over an in-memory backend on loopback, and
//! a client of it:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use grpcdriver::{GrpcLease, LeaseServer};
//! use lease_port::{OwnerId, SessionId, SessionLease};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = Arc::new(memlease::MemLease::new(Duration::from_secs(10)));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(
//!     LeaseServer::new(backend).serve(listener, async { stopped.await.ok(); }),
//! );
//!
//! let leases = GrpcLease::connect(addr.to_string())?;
//! let session = SessionId::new("chat-42")?;
//! let lease = leases.acquire(&session, &OwnerId::new("host-a#1")?).await?;
//! // Tag every write to the session's store with `lease.token()`.
//! let lease = leases.renew(&lease).await?;
//! leases.release(&lease).await?;
//!
//! stop.send(()).ok();
//! server.await??;
//! # Ok(())
//! # }
//! ```
//!
//! # The contract on the wire
//!
//! `proto/mecatl/lease/v1/lease.proto` (its generated code is checked in:
//! no `protoc` is needed to build this crate). Tokens are `uint64`; the
//! server answers the *remaining* time of a grant, never a wall-clock
//! time, and the client counts it from when it sent the request, so a
//! delayed reply never lengthens the ownership it believes it has, and
//! the two hosts' clocks never need to agree.
//!
//! Errors are gRPC statuses carrying `google.rpc.ErrorInfo` with domain
//! [`ERROR_DOMAIN`]; the client decides on the reason:
//!
//! | backend answer | status | reason | client's [`LeaseErrorKind`](lease_port::LeaseErrorKind) |
//! |---|---|---|---|
//! | held elsewhere (acquire) | `FAILED_PRECONDITION` | `HELD_ELSEWHERE` | `Held` (with holder) |
//! | lease lost (renew, stale token) | `ABORTED` | `LEASE_LOST` | `Held` |
//! | bad input | `INVALID_ARGUMENT` | `INVALID` | `Invalid` |
//! | passing fault | `UNAVAILABLE` | `UNAVAILABLE` | `Transient` |
//! | backend cannot lease at all | `UNIMPLEMENTED` | `BACKEND_UNSUPPORTED` | `Unsupported` |
//! | optional method missing | `UNIMPLEMENTED` | `METHOD_UNSUPPORTED` (or none) | falls back |
//! | no or wrong credentials | `UNAUTHENTICATED` | `UNAUTHENTICATED` | `Invalid` |
//! | an owner the caller may not act for | `PERMISSION_DENIED` | `NOT_PERMITTED` | `Invalid` |
//! | authority state went back | `FAILED_PRECONDITION` | `STATE_REWOUND` | `Rewound` |
//!
//! A status without our `ErrorInfo` (from a proxy, a load balancer, a
//! different server) is never read as `Held` or `Unsupported`: it is
//! `Transient`, except `INVALID_ARGUMENT`/`OUT_OF_RANGE` and the auth
//! codes (`Invalid`), and `UNIMPLEMENTED` of a required method (`Invalid`:
//! the address serves something else).
//!
//! `STATE_REWOUND` is never retried: the service answered from older state
//! than the client has seen, and only an operator can fix that. A client
//! older than the reason reads it as a `FAILED_PRECONDITION` it does not
//! know, which is `Transient`.
//!
//! # Token floors
//!
//! [`SessionLease::acquire_above`] sends its floor as the request's
//! `min_token`; the server passes it to its backend's `acquire_above`
//! (and calls plain `acquire` when it is 0, as every older client sends).
//! A server older than the field ignores it, so the client checks the
//! answer itself: a token not above the floor is released and answered
//! `Rewound`.
//!
//! # Deadlines and retries
//!
//! Each call has one deadline ([`GrpcLeaseBuilder::call_timeout`]), sent to
//! the server as `grpc-timeout`, covering every attempt. Only `UNAVAILABLE`
//! is retried, with jittered exponential backoff, at most
//! [`GrpcLeaseBuilder::attempts`] times. Every call of the contract is
//! idempotent, so a retry after a lost reply is safe: renew and release
//! name one grant by token; acquire by the same owner while it holds the
//! lease returns that owner's lease again (with the same or a greater
//! token), so a retried acquire whose first attempt took the lease gets
//! it, and the first answer, never seen, gave nothing to anyone else.
//!
//! # Many leases, one stream
//!
//! [`SessionLease::renew_many`] sends every lease of a batch over one
//! long-lived KeepAlive stream, so a process holding many sessions pays one
//! exchange per renewal period, not one call per session. A server without
//! KeepAlive is asked with BatchRenew, and one without either lease by
//! lease; the fallback is decided once, from the server's answer.
//!
//! # Who may act for whom
//!
//! A lease names its owner, and `Renew` and `Release` need nothing but the
//! owner and the token. So a server that tells its callers apart — by an
//! [`IdentityStore`] of bearer tokens and client certificates, or by each
//! client certificate's own name — lets each caller act only for the owner
//! ids its identity admits, and refuses any other with `PERMISSION_DENIED`,
//! reason `NOT_PERMITTED`: one client can neither take nor release
//! another's leases, whatever it learned of them. A client asks
//! [`GrpcLease::who_am_i`] which owner ids it may use and builds its own
//! from the answer ([`CallerInfo::owner_id`]), so a deployment names each
//! client's identity once, in the service's identities file:
//!
//! ```text
//! # kind  name    owner prefixes  credential
//! token   chat-a  chat-a/         sha256:<SHA-256 of its token, hex>
//! cert    chat-b  chat-b/         uri:spiffe://example.org/ns/chat/sa/chat-b
//! ```
//!
//! One token shared by every client ([`LeaseServer::bearer_token`])
//! cannot tell them apart: each may act for any owner.
//!
//! # The server
//!
//! [`LeaseServer`] serves any `Arc<dyn SessionLease>`, with the standard
//! health service and reflection beside it. It refuses to listen on a
//! non-loopback address without authentication (a bearer token, or client
//! certificates) unless told otherwise, bounds request size, batch size,
//! calls per connection and call time, and answers oversized or malformed
//! requests with `INVALID_ARGUMENT`. The `mecatl-leased` daemon is this
//! server with flags. It is built with the `server` feature only.
//!
// Without the server its docs are on docs.rs, built with every feature.
#![cfg_attr(
    not(feature = "server"),
    doc = "[`LeaseServer`]: https://docs.rs/grpcdriver/latest/grpcdriver/struct.LeaseServer.html"
)]
#![cfg_attr(
    not(feature = "server"),
    doc = "[`IdentityStore`]: https://docs.rs/grpcdriver/latest/grpcdriver/struct.IdentityStore.html"
)]
#![cfg_attr(
    not(feature = "server"),
    doc = "[`LeaseServer::bearer_token`]: https://docs.rs/grpcdriver/latest/grpcdriver/struct.LeaseServer.html#method.bearer_token"
)]

mod client;
mod convert;
pub mod pb;
#[cfg(feature = "server")]
mod server;
mod status;

#[cfg(feature = "tls")]
pub use client::ClientTls;
pub use client::{
    CallerInfo, DEFAULT_ATTEMPTS, DEFAULT_CALL_TIMEOUT, DEFAULT_CLIENT_BATCH,
    DEFAULT_CONNECT_TIMEOUT, GrpcLease, GrpcLeaseBuilder, ServiceInfo,
};
#[cfg(all(feature = "server", feature = "tls"))]
pub use server::ServerTls;
#[cfg(feature = "server")]
pub use server::{
    CertName, ClientIdentity, Identities, IdentitiesError, IdentitiesErrorKind, IdentityStore,
    OwnerScope, hash_token,
};
#[cfg(feature = "server")]
pub use server::{
    DEFAULT_CALL_TIMEOUT as DEFAULT_SERVER_CALL_TIMEOUT, DEFAULT_CONCURRENCY_PER_CONNECTION,
    DEFAULT_MAX_BATCH, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_STREAMS_PER_CONNECTION,
    DEFAULT_STREAM_IDLE, GetAccess, LeaseServer, ServeError, ServerStats,
};
pub use status::ERROR_DOMAIN;

#[cfg(doc)]
use lease_port::SessionLease;
