//! [`SessionLease`] on etcd v3: fenced session leases shared by every
//! process that reaches one etcd cluster.
//!
//! # When to choose it
//!
//! - Server processes on several hosts that already run etcd (or a
//!   Kubernetes control plane's etcd you may use): leases survive any one
//!   etcd member failing, and fencing tokens are etcd revisions, which only
//!   grow for the life of the cluster.
//! - Many sessions per process: all of a process's sessions are renewed by
//!   one keep-alive and one batch of reads ([`SessionLease::renew_many`]).
//!
//! On one host, `flocklease` needs nothing to run. Without etcd, a
//! Kubernetes `Lease` object or a Redis backend may be what you have.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use etcdlease::EtcdLease;
//! use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
//!
//! # async fn run() -> Result<(), lease_port::LeaseError> {
//! let leases = EtcdLease::builder(["http://127.0.0.1:2379"])
//!     .prefix("/mecatl/leases/")
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let (me, chat) = (OwnerId::new("host-a/4242")?, SessionId::new("chat-7")?);
//!
//! let lease = leases.acquire(&chat, &me).await?;
//! // Tag every write to the session's store with lease.token().
//! let lease = leases.renew(&lease).await?; // about every TTL/3
//! leases.release(&lease).await?;
//!
//! let other = OwnerId::new("host-b/77")?;
//! let held = leases.acquire(&chat, &me).await?;
//! let err = leases.acquire(&chat, &other).await.unwrap_err();
//! assert_eq!(err.kind(), LeaseErrorKind::Held);
//! assert_eq!(err.holder(), Some(&me));
//! # leases.release(&held).await
//! # }
//! ```
//!
//! A runnable version against a real etcd is `tests/conformance.rs`.
//!
#![doc = include_str!("../docs/design.md")]

mod acquire;
mod authority;
mod builder;
mod current;
mod error;
mod held_keys;
mod keys;
mod lapsed;
mod release;
mod renew;
mod shared_lease;
mod sweep;
mod txn;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, Lease, LeaseError, OwnerId, SessionId, SessionLease};

pub use builder::{
    DEFAULT_GRACE, DEFAULT_MAX_TXN_OPS, DEFAULT_PREFIX, DEFAULT_TTL, EtcdLeaseBuilder,
};
pub use error::EtcdError;
pub use keys::MAX_PREFIX_LEN;
pub use wire::{Credentials, TlsOptions};

use held_keys::HeldKeys;
use keys::KeySpace;
use lapsed::LapsedHolds;
use shared_lease::SharedLease;
use wire::EtcdClient;

/// Session leases on one etcd cluster, under one key prefix.
///
/// One instance per process: its sessions share one etcd lease and one
/// keep-alive stream (see the crate documentation). Clones share them too.
#[derive(Clone)]
pub struct EtcdLease {
    inner: Arc<Inner>,
}

struct Inner {
    client: EtcdClient,
    keys: KeySpace,
    ttl: Duration,
    max_txn_ops: usize,
    shared: SharedLease,
    held: HeldKeys,
    lapsed: LapsedHolds,
    lapsed_hold_wait: Duration,
    authority: tokio::sync::OnceCell<AuthorityId>,
}

impl std::fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLease")
            .field("client", &self.inner.client)
            .field("prefix", &self.inner.keys.prefix())
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl EtcdLease {
    /// A builder for a client of the cluster whose members answer at
    /// `endpoints` (`http://host:port`; `https://` with the `tls` feature).
    pub fn builder<I, S>(endpoints: I) -> EtcdLeaseBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdLeaseBuilder::new(endpoints.into_iter().map(Into::into).collect())
    }

    /// The TTL requested for every grant.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The etcd key a session's lease lives under: for tests and operators
    /// who look at etcd directly.
    pub fn session_key(&self, session: &SessionId) -> Vec<u8> {
        self.inner.keys.session_key(session)
    }
}

#[async_trait]
impl SessionLease for EtcdLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.inner.acquire(session, owner).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.inner.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inner.release(lease).await
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.inner.authority().await
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        self.inner.current(session).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        self.inner.renew_many(leases).await
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    /// The TTL asked of etcd; a lease etcd grants shorter is refused.
    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.ttl())
    }
}
