//! The `SessionLease` contract: temporary, fenced ownership of a session by
//! one process.
//!
//! # What it is for
//!
//! When requests for one session (a chat, an agent run, a workflow) can reach
//! several processes, each process must first *own* the session before it
//! drives it, or two processes build divergent copies of it. This crate is the
//! port between the code that needs ownership and the backends that provide
//! it. It has no I/O and no runtime dependency; pick a backend crate for the
//! deployment:
//!
//! | crate | coordinates | choose it for |
//! |---|---|---|
//! | `memlease` | tasks in one process | tests; a single process that wants the lifecycle anyway |
//! | `flocklease` | processes on one host | several server processes sharing a directory |
//! | `etcdlease` | processes on any hosts reaching one etcd cluster | several hosts, tokens from etcd revisions, expiry judged by etcd |
//! | `k8slease` | processes in one Kubernetes cluster | pods leasing through the API server, no etcd of your own |
//! | `grpcdriver` | processes reaching one lease service | many hosts speaking one small gRPC contract to any backend |
//! | `redis-session-store` | processes sharing one Redis | a Redis you already run, store and leases in one |
//! | `pglease` | processes reaching one PostgreSQL primary | the database your sessions already live in; works behind PgBouncer |
//!
//! For anything else the hosts share, implement the trait over it, and
//! check that backend with `leaseconformance`.
//!
//! # Example
//!
//! ```
//! use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
//!
//! /// What a server does before driving a session: own it, or refuse.
//! async fn run_once(
//!     leases: &dyn SessionLease,
//!     me: &OwnerId,
//!     session: &SessionId,
//! ) -> Result<u64, String> {
//!     let lease = match leases.acquire(session, me).await {
//!         Ok(lease) => lease,
//!         Err(e) if e.kind() == LeaseErrorKind::Held => {
//!             return Err(format!("session leased elsewhere ({:?})", e.holder()));
//!         }
//!         Err(e) => return Err(e.to_string()),
//!     };
//!     // ... drive the session, tagging every write with the token ...
//!     let token = lease.token().get();
//!     leases.release(&lease).await.map_err(|e| e.to_string())?;
//!     Ok(token)
//! }
//! # use lease_port::{Lease, LeaseError, FencingToken};
//! # struct One;
//! # #[async_trait::async_trait]
//! # impl SessionLease for One {
//! #     async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
//! #         Ok(Lease::new(s.clone(), o.clone(), FencingToken::new(1), std::time::SystemTime::now()))
//! #     }
//! #     async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> { Ok(l.clone()) }
//! #     async fn release(&self, _: &Lease) -> Result<(), LeaseError> { Ok(()) }
//! #     async fn authority(&self) -> Result<lease_port::AuthorityId, LeaseError> {
//! #         lease_port::AuthorityId::new("one")
//! #     }
//! # }
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # rt.block_on(async {
//! let me = OwnerId::new("host-a/4242")?;
//! let session = SessionId::new("chat-7")?;
//! assert_eq!(run_once(&One, &me, &session).await, Ok(1));
//! # Ok::<(), LeaseError>(())
//! # }).unwrap();
//! ```
//!
//! # The contract
//!
//! Every backend keeps these rules; each is a case in `leaseconformance`.
//!
//! 1. **Acquire** succeeds when the lease is free, expired, or held live by
//!    the same owner. Held live by another owner → [`LeaseErrorKind::Held`].
//! 2. **Takeover raises the token.** Any acquisition other than the live
//!    holder re-acquiring returns a token greater than every token ever issued
//!    for the session — after a release, after expiry, after the backend
//!    restarts.
//! 3. **Renew** of the live lease returns the same token and a later expiry.
//!    After loss → `Held`. An expired lease may be reclaimed by renew only
//!    when the backend proves no competitor raced it (a compare-and-set on an
//!    unchanged record); otherwise expiry is loss.
//! 4. **Release** removes only the caller's own hold (owner and token match).
//!    It is idempotent: releasing an unknown, expired-and-taken, or
//!    differently-tokened lease succeeds and changes nothing.
//! 5. **Isolation**: different sessions never block or affect each other.
//! 6. **Exclusion**: at most one live owner per session at any instant, under
//!    any interleaving of calls from any number of tasks and processes.
//! 7. **One authority**: every client of one backend names the same
//!    [`AuthorityId`] through [`SessionLease::authority`], before and after
//!    restarts; another backend (another lease directory, namespace, service)
//!    names another.
//!
//! A lease is live while the backend's clock reads strictly before its
//! [`expiry`](Lease::expiry).
//!
//! # Errors
//!
//! [`LeaseError::kind`] is one of [`LeaseErrorKind::Held`],
//! [`Unsupported`](LeaseErrorKind::Unsupported) (the backend cannot provide
//! leases at all — never for a passing fault; callers stop consulting it),
//! [`Invalid`](LeaseErrorKind::Invalid) (bad input, never a panic) and
//! [`Transient`](LeaseErrorKind::Transient) (an infrastructure fault, with its
//! cause as `source()`).
//!
//! # Leases are not enough: fence every write
//!
//! A holder can pause (GC, SIGSTOP, a swapped-out VM) longer than its TTL and
//! resume believing it still owns the session. No lease protocol can prevent
//! that. What prevents damage is the store: every write carries
//! [`Lease::token`] and its writer, and the store refuses, atomically with the
//! write, a token below the highest it has accepted for that session, and an
//! equal token from another writer.
//!
//! A token is a number only within its [`AuthorityId`]: two lease
//! directories both issue token 1. A store records the authority that fences
//! it, and a server whose backend names another refuses to start.
//!
//! # Time
//!
//! [`Clock`] gives wall-clock time (lease expiries other processes read) and
//! monotonic time (deadlines a process keeps for itself). `ManualClock`, behind
//! the `test-util` feature, lets tests move time without sleeping.
//!
//! # Features
//!
//! - `test-util`: `ManualClock`.
//! - `serde`: `Serialize`/`Deserialize` for the value types; ids are validated
//!   when deserialised.

mod clock;
mod error;
mod fence;
mod id;
mod lease;
mod port;

#[cfg(feature = "test-util")]
pub use clock::ManualClock;
pub use clock::{Clock, MonotonicWallClock, SystemClock};
pub use error::{LeaseError, LeaseErrorKind};
pub use fence::{Fence, WriteFence};
pub use id::{AuthorityId, MAX_ID_LEN, OwnerId, SessionId};
pub use lease::{FencingToken, Lease};
pub use port::SessionLease;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trait_is_object_safe_and_shareable() {
        fn assert_shareable<T: Send + Sync + ?Sized>() {}
        assert_shareable::<dyn SessionLease>();
        let _: Option<std::sync::Arc<dyn SessionLease>> = None;
    }
}
