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
//! # How it maps to etcd
//!
//! - **One key per session**, `{prefix}s/{id}` with the id percent-encoded
//!   (injective: no two ids share a key). The value names the holder and
//!   keeps the original id.
//! - **Beside it, a guard** `{prefix}g/{id}`, on no etcd lease: every write
//!   that takes the session writes the guard too, at the same revision,
//!   and only a release deletes it (or the sweep, which removes a hold as
//!   its release would; see
//!   [One etcd lease per client](#one-etcd-lease-per-client)). A key gone
//!   while its guard remains is a hold that lapsed without a release (see
//!   [Lapsed holds](#lapsed-holds)).
//! - **Acquire** is one transaction: if neither key nor guard exists, put
//!   both, the key with the client's etcd lease attached; otherwise read
//!   them. A live holder of another owner is
//!   [`Held`](lease_port::LeaseErrorKind::Held), naming it.
//! - **The fencing token** is the key's `mod_revision`: the revision of the
//!   write that took the session. etcd revisions are cluster-wide, only
//!   grow, and are kept in etcd's log, so a takeover's token is greater than
//!   every token issued before it — after a release, after expiry, after
//!   etcd restarts and after leader changes.
//! - **Re-acquire by the live holder** writes nothing and keeps the token
//!   when this client holds the key and its reported expiry has not passed.
//!   Otherwise (another client of the same owner, or a hold past its
//!   reported expiry that etcd still keeps for the grace) it rewrites the
//!   key under a compare on its revision, which raises the token: the older
//!   values then renew as lost, and a hold that had expired is taken anew
//!   as any takeover is.
//! - **Renew** refreshes the etcd lease with a keep-alive, then reads the
//!   key (linearizably) to check that it still exists with the lease's
//!   token and owner: a keep-alive alone cannot tell that the key was
//!   released and taken by someone else meanwhile. The read also proves the
//!   keep-alive: it counts only when the read comes from the same raft term.
//!   etcd 3.4 answers keep-alives from the leader's memory, and a leader
//!   that was frozen (SIGSTOP, a long pause) and has not yet learnt it was
//!   replaced still answers them, refreshing nothing the real leader knows
//!   of; the fault tests caught exactly that. A later read from the same
//!   term shows the member was still leader when it answered.
//! - **Release** is one transaction (two nested in one, as etcd allows
//!   since 3.3) that deletes the key if its `mod_revision` is the lease's
//!   token and its value names the lease's owner, and the guard on the
//!   same two conditions, each on its own: it never removes another hold
//!   (a newer hold has a newer revision), and it removes the caller's key
//!   even when the guard is gone (deleted by hand) or the guard when the
//!   key is (a lapsed hold). Once etcd has answered, nothing of the hold
//!   is left, whichever conditions held; a release that gets no answer is
//!   completed by the sweep.
//!
//! # One etcd lease per client
//!
//! Each [`EtcdLease`] grants one etcd lease and attaches every key it writes
//! to it, so one keep-alive keeps all of its sessions, and
//! [`renew_many`](SessionLease::renew_many) costs one keep-alive plus one
//! read transaction per [`max_txn_ops`](EtcdLeaseBuilder::max_txn_ops)
//! sessions. The trade-offs:
//!
//! - The sessions of one client share their fate: when the client stops
//!   renewing (paused, partitioned, killed), all of them expire together.
//!   They would anyway — one process renews them all.
//! - Renewing any session refreshes the etcd lease of all of them, so a
//!   session that its holder neither renews nor releases (it counted the
//!   lease lost while etcd was unreachable, or its release failed) would
//!   stay held while the client renews others. The client remembers until
//!   when each of its keys was renewed and deletes, with a transaction
//!   conditional on the key's lease, value and revision, any key not
//!   renewed for the TTL plus the grace — when etcd itself would have
//!   deleted it had it had an etcd lease of its own. Renew a lease through
//!   the client that acquired it: another client's renewals refresh the
//!   etcd lease but not this bookkeeping.
//! - A key stays in that bookkeeping until etcd has answered a delete
//!   conditional on its hold (a release's or the sweep's), or a read showed
//!   it gone or another's: a delete that failed, timed out or was dropped
//!   with its call is sent again by the next sweep. A release makes its
//!   hold (acquired through this client) due for the sweep at once, so a
//!   release whose answer was lost, or whose call was dropped, still frees
//!   the session, without waiting out the TTL. The sweep runs within the
//!   client's acquires and renewals, at most every 250 ms, one at a time.
//! - A released session is deleted, so the shared keep-alive never keeps a
//!   released or taken-over session alive.
//!
//! # Time: etcd's TTL and [`Lease::expiry`]
//!
//! etcd judges expiry on the leader's own clock: it counts the TTL from when
//! it serves a grant or keep-alive, and deletes the keys when it has passed.
//! No client clock is involved, so client clock skew cannot free a session
//! early. The [`Lease::expiry`] a client reports is its own, conservative
//! view: the wall-clock time *before* it sent the grant or keep-alive, plus
//! the TTL etcd answered. etcd's deadline is later than that (it started
//! counting later), and leader changes only extend etcd leases, so a holder
//! that stops acting at its reported expiry has stopped before etcd frees
//! the session. Judge local deadlines on a monotonic clock from the same
//! send time.
//!
//! etcd TTLs are whole seconds, and etcd raises a TTL below its minimum
//! (1.5 election timeouts, rounded up: 2 s with default settings). The
//! configured TTL must be whole seconds.
//!
//! etcd is asked for the TTL plus a grace ([`expiry_grace`](EtcdLeaseBuilder::expiry_grace),
//! default 1 s), and the reported expiry leaves the grace out. A holder
//! therefore stops acting a grace before etcd frees the session, and a
//! renewal that arrives just after the reported expiry still finds the
//! key — still the caller's, which the read proves, so renewing it is the
//! unraced reclaim the contract allows — instead of losing a session
//! nobody else could have taken. The price: after a holder dies, etcd
//! keeps its keys for the TTL plus the grace (and its expiry check, every
//! 500 ms), and another owner then waits out [lapsed holds](#lapsed-holds).
//!
//! # Lapsed holds
//!
//! etcd deletes a key when its etcd lease ends, and nothing tells a reader
//! why it ended. A holder that stopped renewing counted its lease lost
//! long before. But etcd 3.4 before 3.4.28 and 3.5 before 3.5.11 also end
//! leases that are still being renewed: a leader frozen for longer than a
//! TTL (a pause, a stalled disk) wakes up believing it still leads,
//! revokes every etcd lease that expired in its stale view, and the
//! revocation is forwarded to the new leader and committed (etcd issues
//! #12528 and #15247; the fix narrows the window rather than closing it).
//! The holders renewing on the new leader then count on their leases for
//! up to a TTL after their keys are gone. The fault tests reproduce it
//! with SIGSTOP on the leader of a three-member cluster.
//!
//! So a session whose key is gone while its guard remains is taken over by
//! another owner only after the acquiring client has seen it so, with the
//! guard unchanged, for the TTL plus the grace on its own monotonic clock:
//! the holder's last renewal was sent before its key was deleted, so its
//! own expiry has passed by then. An acquire that meets such a session
//! waits out the rest of that time before it answers; the sighting is
//! remembered, so a caller whose timeout is shorter makes progress by
//! calling again. The same owner takes its lapsed hold back at once.
//! Released sessions have no guard and are taken at once.
//!
//! The price: after a holder dies without releasing, another owner takes
//! its sessions about two TTLs (plus two graces) after the holder's last
//! renewal rather than one.
//!
//! # Reporting the holder
//!
//! [`current`](SessionLease::current) reads the session's key
//! (linearizably), then asks etcd how long the key's etcd lease has left
//! (`LeaseTimeToLive`, which refreshes nothing). The holder is the owner
//! the key's value names, the token the key's `mod_revision` — the token
//! its acquire returned — and the expiry is the time the second request
//! was *sent*, plus the whole seconds etcd says are left (it rounds down
//! and counts from when it answered), minus the [grace](EtcdLeaseBuilder::expiry_grace):
//! never later than when etcd could free the key, less the grace the
//! holder itself leaves out of its expiry. So it answers `None` for:
//!
//! - a session never taken, or released (no key, no guard);
//! - a [lapsed hold](#lapsed-holds) (the key gone, its guard left): nobody
//!   renews it any more — its holder's next renewal finds the key gone
//!   and stops. Another owner's acquire may still be refused for a while
//!   (it waits out the lapse), so a caller told `None` should still expect
//!   `Held` from acquire and retry;
//! - a key whose etcd lease has less than the grace left: its holder's own
//!   expiry has passed and etcd is about to delete it.
//!
//! A hold is reported live as long as its etcd lease is: a client that
//! keeps renewing other sessions keeps this one's etcd lease alive too,
//! until it sweeps keys nobody renewed for the TTL plus the grace (see
//! [One etcd lease per client](#one-etcd-lease-per-client)) — so a hold
//! whose keeper stopped without releasing may show a little longer than it
//! is used. The report assumes every client of the prefix has the same
//! grace. A key under the prefix that this crate did not write is a
//! `Transient` error with [`EtcdError::Malformed`] as its source.
//!
//! # Authority
//!
//! [`authority`](SessionLease::authority) names the cluster (its id, from
//! every answer's header), the prefix, and a random marker stored once under
//! the prefix. The marker tells apart two clusters that happen to share an
//! id (same member names and peer URLs, no distinct
//! `--initial-cluster-token`) and a cluster whose data was wiped: its
//! revisions start again from 1, so its tokens must never meet a store
//! fenced by the old one.
//!
//! # What it requires of its deployment
//!
//! - **An etcd cluster that keeps every write it acknowledged.** Tokens are
//!   revisions, and a token is greater than every earlier one only while
//!   the cluster's history is never cut back: keep etcd's fsync (no
//!   `--unsafe-no-fsync`, an etcd 3.5 flag), never restore the cluster
//!   from a snapshot or a backup, or wipe it, while clients (and the
//!   stores they fence) are running, and keep every client of a prefix on
//!   the same cluster.
//! - **The keys under the prefix are this crate's.** Session keys, guards
//!   (`{prefix}g/…`) and the authority marker are written and deleted by
//!   its clients only; none is to be edited or deleted by hand.
//!
//! When that breaks:
//!
//! - *Restored or wiped under running clients.* Every client remembers the
//!   highest revision it was answered from, and refuses each answer from
//!   an older store as [`Rewound`](lease_port::LeaseErrorKind::Rewound)
//!   (source [`EtcdError::Rewound`], whose message says what to do): it
//!   never hands out a token from there, and retrying cannot help. Restore
//!   the newer data, or restart the clients to go on with the older: a
//!   restarted client cannot tell, and its tokens may repeat tokens issued
//!   before, which a store that took them refuses (its high-water mark is
//!   above them; [`acquire_above`](SessionLease::acquire_above) answers
//!   `Rewound` for a grant not above a store's mark). A wiped cluster also
//!   gets a new [authority](#authority), which a store fenced by the old
//!   one refuses. A client started after the restore that never saw the
//!   newer state cannot detect it at all.
//! - *Another cluster at the endpoints.* Refused as
//!   [`Invalid`](lease_port::LeaseErrorKind::Invalid) (source
//!   [`EtcdError::ClusterChanged`]).
//! - *A guard deleted by hand while its session is held.* The holder keeps
//!   the session; its release, or the sweep when it abandons the session,
//!   still frees it. But the session has lost what tells a lapsed hold from
//!   a released one: if its key's etcd lease ends while the holder counts
//!   on it (the frozen-leader case of [Lapsed holds](#lapsed-holds)),
//!   another owner takes it at once instead of waiting the lapse out. A
//!   guard deleted after its hold lapsed lets the next owner in at once,
//!   too.
//! - *A session key deleted by hand.* A lapsed hold: its holder's next
//!   renewal answers [`Held`](lease_port::LeaseErrorKind::Held), and
//!   another owner waits the lapse out.
//! - *A key written by hand.* A session key this crate did not write makes
//!   acquire answer `Held`, naming nobody, and `current` a `Transient`
//!   error with [`EtcdError::Malformed`] as its source, until it is
//!   deleted; a guard without its session key is waited out as a lapsed
//!   hold.
//!
//! # Errors
//!
//! Credentials etcd refuses, or a user without permission on the prefix:
//! [`Invalid`](lease_port::LeaseErrorKind::Invalid), a configuration to fix.
//! Answers from a store older than one already seen:
//! [`Rewound`](lease_port::LeaseErrorKind::Rewound), for an operator to fix
//! (see [What it requires of its deployment](#what-it-requires-of-its-deployment)).
//! etcd unreachable, a timeout, no leader: [`Transient`](lease_port::LeaseErrorKind::Transient),
//! keeping an [`EtcdError`] as its source. Every request has its own
//! timeout ([`request_timeout`](EtcdLeaseBuilder::request_timeout)); after
//! a member fails to answer, the next request goes to the next endpoint.

mod error;
mod held_keys;
mod keys;
mod lapsed;
mod shared_lease;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use futures_util::future::join_all;
use lease_port::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};

pub use error::EtcdError;
pub use keys::MAX_PREFIX_LEN;
pub use wire::{Credentials, TlsOptions};

use held_keys::HeldKeys;
use keys::{KeySpace, decode_owner, decode_value, encode_value};
use lapsed::LapsedHolds;
use shared_lease::{Grant, SharedLease};
use wire::EtcdClient;
use wire::messages::{
    Compare, DeleteRangeRequest, KeyValue, PutRequest, RangeRequest, Request, RequestOp, Response,
    TargetUnion, TxnRequest, TxnResponse, compare_result, compare_target,
};

/// The TTL granted when none is configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "/mecatl/leases/";

/// etcd's default limit on operations in one transaction
/// (`--max-txn-ops`).
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// How much longer than the reported TTL etcd keeps a key, when not
/// configured.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);

/// etcd's longest lease TTL, in seconds.
const MAX_ETCD_TTL_SECS: u64 = 9_000_000_000;

/// How often an acquire retries when the key or the etcd lease changed
/// between its steps.
const ACQUIRE_ATTEMPTS: usize = 4;

/// Configures an [`EtcdLease`].
#[derive(Debug, Clone)]
pub struct EtcdLeaseBuilder {
    endpoints: Vec<String>,
    prefix: String,
    ttl: Duration,
    request_timeout: Option<Duration>,
    max_txn_ops: usize,
    grace: Duration,
    lapsed_hold_wait: Option<Duration>,
    tls: TlsOptions,
    credentials: Option<Credentials>,
}

impl EtcdLeaseBuilder {
    /// How long an acquire waits out a [lapsed hold](crate#lapsed-holds)
    /// before it answers [`Held`](lease_port::LeaseErrorKind::Held),
    /// naming the previous holder. Default: the whole wait (the TTL plus
    /// the grace), so an acquire succeeds once the session is safe to take.
    /// A server that answers requests rather than making them wait sets
    /// zero: its callers retry, and the wait counts from the first sighting
    /// whichever call made it.
    pub fn lapsed_hold_wait(mut self, wait: Duration) -> Self {
        self.lapsed_hold_wait = Some(wait);
        self
    }

    /// Certificates for `https://` endpoints; needs the `tls` feature
    /// (without it, any TLS setting is an invalid configuration).
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    /// A user of a cluster with authentication enabled. The user needs read
    /// and write permission on every key under the [prefix](Self::prefix);
    /// etcd lease calls need no permission. Combine with TLS: etcd sends
    /// tokens and passwords as plain request metadata.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// The key prefix all sessions live under: non-empty, ending in `/`, at
    /// most [`MAX_PREFIX_LEN`] bytes. Tokens of one prefix are one
    /// authority. Default [`DEFAULT_PREFIX`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The TTL of every grant, in whole seconds (etcd's unit), at least one.
    /// Default [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How much longer than the TTL etcd keeps a key after its last
    /// renewal, in whole seconds. Holders count their expiry without it;
    /// another owner can take the session only once it has passed too.
    /// Default [`DEFAULT_GRACE`]; see the crate documentation.
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The deadline of every request to etcd; at most half the TTL, so a
    /// renewal that times out leaves time for another. Default: a quarter
    /// of the TTL, at most 2 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// The most operations put in one transaction: set it to the cluster's
    /// `--max-txn-ops`. Default [`DEFAULT_MAX_TXN_OPS`].
    pub fn max_txn_ops(mut self, n: usize) -> Self {
        self.max_txn_ops = n;
        self
    }

    /// Checks the configuration and builds the client. Connections are made
    /// on first use; call this within a Tokio runtime.
    pub fn build(self) -> Result<EtcdLease, LeaseError> {
        let keys = KeySpace::new(&self.prefix)?;
        let ttl_secs = self.ttl.as_secs();
        if self.ttl.subsec_nanos() != 0 || ttl_secs == 0 {
            return Err(LeaseError::invalid(format!(
                "the TTL must be whole seconds, at least one (etcd's unit); got {:?}",
                self.ttl
            )));
        }
        if self.grace.subsec_nanos() != 0 {
            return Err(LeaseError::invalid(format!(
                "the expiry grace must be whole seconds (etcd's unit); got {:?}",
                self.grace
            )));
        }
        if ttl_secs.saturating_add(self.grace.as_secs()) > MAX_ETCD_TTL_SECS {
            return Err(LeaseError::invalid(
                "the TTL and grace are longer than etcd allows",
            ));
        }
        let timeout = self
            .request_timeout
            .unwrap_or_else(|| (self.ttl / 4).min(Duration::from_secs(2)));
        if timeout.is_zero() || timeout > self.ttl / 2 {
            return Err(LeaseError::invalid(format!(
                "the request timeout {timeout:?} must be above zero and at most half the TTL {:?}",
                self.ttl
            )));
        }
        if self.max_txn_ops == 0 {
            return Err(LeaseError::invalid("max_txn_ops must be at least one"));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LeaseError::invalid(
                "EtcdLease must be built within a Tokio runtime",
            ));
        }
        let mut client = EtcdClient::with_tls(&self.endpoints, timeout, &self.tls)
            .map_err(|e| e.into_lease_error("configure the etcd client"))?;
        if let Some(credentials) = self.credentials {
            client = client.with_credentials(credentials);
        }
        Ok(EtcdLease {
            inner: Arc::new(Inner {
                shared: SharedLease::new(client.clone(), self.ttl, self.grace),
                client,
                keys,
                ttl: self.ttl,
                max_txn_ops: self.max_txn_ops,
                held: HeldKeys::default(),
                lapsed: LapsedHolds::default(),
                lapsed_hold_wait: self.lapsed_hold_wait.unwrap_or(self.ttl + self.grace),
                authority: tokio::sync::OnceCell::new(),
            }),
        })
    }
}

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
        EtcdLeaseBuilder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: DEFAULT_TTL,
            request_timeout: None,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            grace: DEFAULT_GRACE,
            lapsed_hold_wait: None,
            tls: TlsOptions::default(),
            credentials: None,
        }
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

fn range_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::Range(RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

fn put_op(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::Put(PutRequest { key, value, lease })),
    }
}

fn delete_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::DeleteRange(DeleteRangeRequest {
            key,
            range_end: vec![],
        })),
    }
}

/// Deletes the hold `token` of `value`'s owner: its key and its guard,
/// each only if it is still this hold's (written at revision `token`, with
/// that value), each on its own compare, in one atomic step. Every write
/// that takes a session writes both at one revision, so a key or guard at
/// another revision belongs to another hold and stays. Either may be gone
/// already: the key when its etcd lease ended (a lapsed hold: the guard
/// still goes), the guard when it was deleted by hand (the key still
/// goes: it is on an etcd lease the client may keep alive for ever).
///
/// Once etcd has answered, neither is this hold's any more, whichever
/// compares held.
fn release_if_ours(key: &[u8], guard: &[u8], token: i64, value: &[u8]) -> TxnRequest {
    let if_ours = |k: &[u8]| RequestOp {
        request: Some(Request::Txn(TxnRequest {
            compare: vec![
                compare(k, compare_target::MOD, TargetUnion::ModRevision(token)),
                compare(k, compare_target::VALUE, TargetUnion::Value(value.to_vec())),
            ],
            success: vec![delete_op(k.to_vec())],
            failure: vec![],
        })),
    };
    TxnRequest {
        compare: vec![],
        success: vec![if_ours(key), if_ours(guard)],
        failure: vec![],
    }
}

/// The writes that take a session: its key on etcd lease `id`, and its
/// guard, on no etcd lease, so the guard's revision is the hold's token.
fn take_ops(key: &[u8], guard: &[u8], value: &[u8], id: i64) -> Vec<RequestOp> {
    vec![
        put_op(key.to_vec(), value.to_vec(), id),
        put_op(guard.to_vec(), value.to_vec(), 0),
    ]
}

fn compare(key: &[u8], target: i32, union: TargetUnion) -> Compare {
    Compare {
        result: compare_result::EQUAL,
        target,
        key: key.to_vec(),
        target_union: Some(union),
    }
}

/// The key read by the `n`th operation of a transaction's answer.
fn read_kv(answer: &mut TxnResponse, n: usize) -> Option<KeyValue> {
    match answer.responses.get_mut(n)?.response.as_mut()? {
        Response::Range(range) => range.kvs.pop(),
        _ => None,
    }
}

fn revision(answer: &TxnResponse) -> Option<i64> {
    answer
        .header
        .as_ref()
        .map(|h| h.revision)
        .filter(|&r| r > 0)
}

/// A token as etcd stores revisions; `None` for values etcd never issues.
fn token_revision(token: FencingToken) -> Option<i64> {
    i64::try_from(token.get()).ok().filter(|&r| r > 0)
}

fn token_of(revision: i64) -> FencingToken {
    FencingToken::new(revision.unsigned_abs())
}

/// Whether a stored key is the grant `lease` describes.
enum Verdict {
    /// Ours, attached to this etcd lease.
    Ours(i64),
    /// Gone or someone else's; the holder when the key names one.
    Lost(Option<OwnerId>),
}

fn judge(kv: Option<&KeyValue>, lease: &Lease) -> Verdict {
    let Some(kv) = kv else {
        return Verdict::Lost(None);
    };
    let holder = decode_owner(&kv.value);
    let ours = holder.as_ref() == Some(lease.owner())
        && token_revision(lease.token()) == Some(kv.mod_revision);
    if ours {
        Verdict::Ours(kv.lease)
    } else {
        Verdict::Lost(holder)
    }
}

fn raft_term(header: &Option<wire::messages::ResponseHeader>) -> Option<u64> {
    header.as_ref().map(|h| h.raft_term).filter(|&t| t > 0)
}

fn unproven(keep_alive_term: u64, read_term: Option<u64>) -> LeaseError {
    LeaseError::transient("renew: the keep-alive is not proven").with_source(EtcdError::Malformed {
        call: "LeaseKeepAlive",
        detail: format!(
            "answered in raft term {keep_alive_term}, the read after it in {read_term:?}: \
             a replaced leader may have answered it, so it extends nothing"
        ),
    })
}

/// The sweep took the hold as lapsed (its last renewal was a TTL and a
/// grace ago) while a renewal read it: it is being deleted, as etcd would
/// have deleted it.
fn swept() -> LeaseError {
    LeaseError::held(None).with_source(EtcdError::Malformed {
        call: "Txn",
        detail: "the hold lapsed and was swept while this renewal read it".into(),
    })
}

fn lost_by_etcd() -> LeaseError {
    LeaseError::held(None).with_source(EtcdError::Malformed {
        call: "LeaseKeepAlive",
        detail: "the etcd lease holding the key has expired".into(),
    })
}

impl Inner {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        let key = self.keys.session_key(session);
        let guard = self.keys.guard_of(&key);
        let value = encode_value(session, owner, self.ttl);
        // Set when an answer came from another raft term than the grant
        // behind it: the next round needs a keep-alive sent after that.
        let mut refresh_after: Option<Instant> = None;
        // The caller counts the lease from when it called (a keeper: from
        // when it sent the acquire, plus the TTL). A grant refreshed before
        // that would lapse earlier, and another owner could take the
        // session while the caller still counts it as its own: only a
        // keep-alive sent after the call began may back it.
        let started = Instant::now();
        let (mut attempts, mut waits) = (0, 0);
        while attempts < ACQUIRE_ATTEMPTS {
            attempts += 1;
            let (id, mut grant) = self
                .shared
                .ensure()
                .await
                .map_err(|e| e.into_lease_error("grant an etcd lease"))?;
            // A grant sent before this call is refreshed first, so every
            // acquire hands out a whole TTL from the call, and the
            // transaction after it proves the keep-alive (see
            // `Grant::term`). Concurrent acquires share one keep-alive.
            let not_before = refresh_after.unwrap_or(started);
            if refresh_after.is_some() || grant.sent_at < started {
                match self.shared.keep_alive(id, not_before).await {
                    Ok(Some(fresh)) => grant = fresh,
                    Ok(None) => continue,
                    Err(e) => return Err(e.into_lease_error("acquire: keep-alive failed")),
                }
            }
            let take_if_free = TxnRequest {
                compare: vec![
                    compare(&key, compare_target::CREATE, TargetUnion::CreateRevision(0)),
                    compare(
                        &guard,
                        compare_target::CREATE,
                        TargetUnion::CreateRevision(0),
                    ),
                ],
                success: take_ops(&key, &guard, &value, id),
                failure: vec![range_op(key.clone()), range_op(guard.clone())],
            };
            // Known before it is sent: if this call is dropped while the
            // write is on its way, the key is on our etcd lease and only
            // the sweep would ever remove it.
            self.held
                .hold_if_unknown(&key, id, value.clone(), self.shared.etcd_deadline(&grant));
            let mut answer = match self.client.txn(take_if_free).await {
                Err(e) if e.is_lease_not_found() => {
                    self.shared.forget(id);
                    continue;
                }
                Err(e) => {
                    // The put may have landed: remember the key so that it
                    // is swept unless its owner acquires it again.
                    let until = self.shared.etcd_deadline(&grant);
                    self.held.hold(key, id, None, value, until);
                    return Err(e.into_lease_error("acquire: transaction failed"));
                }
                Ok(answer) => answer,
            };
            let until = self.shared.etcd_deadline(&grant);
            let proven = raft_term(&answer.header) == Some(grant.term);
            if answer.succeeded {
                let rev = revision(&answer).ok_or_else(|| {
                    LeaseError::transient("acquire: etcd answered without a revision")
                })?;
                self.held
                    .hold(key.clone(), id, Some(rev), value.clone(), until);
                if !proven {
                    // Ours, but the grant is unproven: the next round
                    // refreshes it and finds the key ours.
                    refresh_after = Some(Instant::now());
                    continue;
                }
                self.sweep().await;
                return Ok(Lease::new(
                    session.clone(),
                    owner.clone(),
                    token_of(rev),
                    grant.expiry(),
                ));
            }
            let Some(kv) = read_kv(&mut answer, 0) else {
                let Some(lapsed) = read_kv(&mut answer, 1) else {
                    continue; // released since the compare; try again
                };
                // The key is gone but not released: its etcd lease ended.
                // Another owner's hold is taken over only once it has been
                // seen lapsed long enough (see `lapsed`); the same owner
                // takes it back at once, as it may re-acquire a live hold.
                let (previous, holder_ttl) = decode_value(&lapsed.value).unzip();
                if previous.as_ref() != Some(owner) {
                    // The holder counts on its own TTL, which may be longer
                    // than ours.
                    let wait = holder_ttl.unwrap_or(self.ttl).max(self.ttl) + self.shared.grace();
                    let wait =
                        self.lapsed
                            .remaining(&guard, lapsed.mod_revision, Instant::now(), wait);
                    if wait > self.lapsed_hold_wait {
                        return Err(LeaseError::held(previous)
                            .with_source(EtcdError::LapsedHold { free_in: wait }));
                    }
                    if !wait.is_zero() && waits < ACQUIRE_ATTEMPTS {
                        waits += 1;
                        attempts -= 1;
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                }
                let unchanged = vec![
                    compare(&key, compare_target::CREATE, TargetUnion::CreateRevision(0)),
                    compare(
                        &guard,
                        compare_target::MOD,
                        TargetUnion::ModRevision(lapsed.mod_revision),
                    ),
                ];
                let taken = self
                    .take(session, owner, &key, &value, unchanged, id, grant)
                    .await?;
                if let Some(lease) = taken {
                    self.lapsed.forget(&guard);
                    return Ok(lease);
                }
                refresh_after = Some(Instant::now());
                continue;
            };
            let holder = decode_owner(&kv.value);
            if holder.as_ref() != Some(owner) {
                // Answered: nothing of ours was written.
                self.held.forget_unknown(&key);
                return Err(match holder {
                    Some(h) => LeaseError::held(Some(h)),
                    None => LeaseError::held(None).with_source(EtcdError::Malformed {
                        call: "Txn",
                        detail: format!(
                            "the key of {session} holds a value this crate did not write"
                        ),
                    }),
                });
            }
            // The live holder re-acquiring keeps its token; a hold whose
            // reported expiry has passed (etcd keeps it for the grace) is
            // taken anew, with a greater token, as any takeover is.
            let live = kv.lease == id
                && self.held.renewed_past(
                    &key,
                    kv.mod_revision,
                    Instant::now() + self.shared.grace(),
                );
            if live && !proven {
                refresh_after = Some(Instant::now());
                continue;
            }
            if live {
                // Nothing to write, the token stays.
                self.held.hold(key, id, Some(kv.mod_revision), value, until);
                return Ok(Lease::new(
                    session.clone(),
                    owner.clone(),
                    token_of(kv.mod_revision),
                    grant.expiry(),
                ));
            }
            // The same owner holds it, but not as a live hold of this
            // client (another client's, or one whose reported expiry has
            // passed): rewrite it under our etcd lease, which raises the
            // token.
            let unchanged = vec![compare(
                &key,
                compare_target::MOD,
                TargetUnion::ModRevision(kv.mod_revision),
            )];
            if let Some(lease) = self
                .take(session, owner, &key, &value, unchanged, id, grant)
                .await?
            {
                return Ok(lease);
            }
            refresh_after = Some(Instant::now());
        }
        Err(LeaseError::transient(
            "acquire: the key or the etcd lease kept changing; try again",
        ))
    }

    /// Writes the session key (on etcd lease `id`) and its guard if
    /// `unchanged` holds, which raises the token. `None` when it did not
    /// hold, or the grant backing the write is unproven: the caller tries
    /// again.
    #[allow(clippy::too_many_arguments)]
    async fn take(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        key: &[u8],
        value: &[u8],
        unchanged: Vec<Compare>,
        id: i64,
        grant: Grant,
    ) -> Result<Option<Lease>, LeaseError> {
        let guard = self.keys.guard_of(key);
        self.held
            .hold_if_unknown(key, id, value.to_vec(), self.shared.etcd_deadline(&grant));
        let rewrite = TxnRequest {
            compare: unchanged,
            success: take_ops(key, &guard, value, id),
            failure: vec![],
        };
        match self.client.txn(rewrite).await {
            Ok(answer) if answer.succeeded => {
                let rev = revision(&answer).ok_or_else(|| {
                    LeaseError::transient("acquire: etcd answered without a revision")
                })?;
                let until = self.shared.etcd_deadline(&grant);
                self.held
                    .hold(key.to_vec(), id, Some(rev), value.to_vec(), until);
                if raft_term(&answer.header) != Some(grant.term) {
                    return Ok(None);
                }
                Ok(Some(Lease::new(
                    session.clone(),
                    owner.clone(),
                    token_of(rev),
                    grant.expiry(),
                )))
            }
            Ok(_) => Ok(None),
            Err(e) if e.is_lease_not_found() => {
                self.shared.forget(id);
                Ok(None)
            }
            Err(e) => {
                let until = self.shared.etcd_deadline(&grant);
                self.held
                    .hold(key.to_vec(), id, None, value.to_vec(), until);
                Err(e.into_lease_error("acquire: transaction failed"))
            }
        }
    }

    /// Turns a verdict and the keep-alive of its etcd lease into the answer
    /// of one renewal.
    async fn conclude(
        &self,
        lease: &Lease,
        verdict: Verdict,
        ours: &OurKeepAlive,
        started: Instant,
        read_term: Option<u64>,
    ) -> Result<Lease, LeaseError> {
        let key = self.keys.session_key(lease.session_id());
        let token = token_revision(lease.token()).unwrap_or(0);
        let id = match verdict {
            Verdict::Lost(holder) => {
                self.held.forget(&key, token);
                return Err(LeaseError::held(holder));
            }
            Verdict::Ours(id) => id,
        };
        let refreshed =
            match ours {
                Some((our_id, result)) if *our_id == id => match result {
                    Ok(grant) => Ok(*grant),
                    Err(e) => Err(LeaseError::transient("renew: keep-alive failed")
                        .with_source(Arc::clone(e))),
                },
                _ => return self.renew_on_other(id, lease, &key, token, started).await,
            }?;
        if let Some(grant) = &refreshed
            && read_term != Some(grant.term)
        {
            return Err(unproven(grant.term, read_term));
        }
        match refreshed {
            Some(grant) => {
                if !self
                    .held
                    .renewed(&key, token, self.shared.etcd_deadline(&grant))
                {
                    return Err(swept());
                }
                Ok(lease.with_expiry(grant.expiry()))
            }
            None => {
                self.held.forget(&key, token);
                Err(lost_by_etcd())
            }
        }
    }

    /// Renews a key that is on another client's etcd lease (same owner):
    /// keeps that lease alive, then proves the keep-alive with a read of
    /// the key (see `Grant::term`), which must still show the grant.
    async fn renew_on_other(
        &self,
        id: i64,
        lease: &Lease,
        key: &[u8],
        token: i64,
        started: Instant,
    ) -> Result<Lease, LeaseError> {
        let Some(grant) = self
            .shared
            .keep_alive(id, started)
            .await
            .map_err(|e| e.into_lease_error("renew: keep-alive failed"))?
        else {
            self.held.forget(key, token);
            return Err(lost_by_etcd());
        };
        let read = RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        let answer = self
            .client
            .range(read)
            .await
            .map_err(|e| e.into_lease_error("renew: reading the key failed"))?;
        match judge(answer.kvs.first(), lease) {
            Verdict::Ours(on) if on == id => {}
            Verdict::Ours(_) => {
                return Err(LeaseError::transient(
                    "renew: the key moved while its etcd lease was kept alive",
                ));
            }
            Verdict::Lost(holder) => return Err(LeaseError::held(holder)),
        }
        let read_term = raft_term(&answer.header);
        if read_term != Some(grant.term) {
            return Err(unproven(grant.term, read_term));
        }
        // The sweep must count from this renewal too: the holder counts on
        // it, whichever etcd lease the key is on. A key on this client's own
        // etcd lease that the sweep has taken meanwhile is being deleted.
        let known = self
            .held
            .renewed(key, token, self.shared.etcd_deadline(&grant));
        if !known && self.shared.is_ours(id) {
            return Err(swept());
        }
        Ok(lease.with_expiry(grant.expiry()))
    }

    async fn keep_alive_ours(&self, started: Instant) -> OurKeepAlive {
        let id = self.shared.current_id()?;
        Some((
            id,
            self.shared.keep_alive(id, started).await.map_err(Arc::new),
        ))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let started = Instant::now();
        let read = RangeRequest {
            key: self.keys.session_key(lease.session_id()),
            ..Default::default()
        };
        // The keep-alive first, the read after it: the read proves the
        // keep-alive (see `Grant::term`).
        let ours = self.keep_alive_ours(started).await;
        let answer = self
            .client
            .range(read)
            .await
            .map_err(|e| e.into_lease_error("renew: reading the key failed"))?;
        let verdict = judge(answer.kvs.first(), lease);
        let read_term = raft_term(&answer.header);
        let result = self
            .conclude(lease, verdict, &ours, started, read_term)
            .await;
        self.sweep().await;
        result
    }

    /// Deletes the keys on this client's etcd lease whose holders stopped
    /// renewing them a TTL and a grace ago, or released them without a
    /// confirmed answer (see `held_keys`). Each delete is conditional on
    /// the key still being on that lease with that value (and revision,
    /// when known), so it never touches a new hold. A key leaves the
    /// bookkeeping only once etcd answered its delete; the others wait for
    /// the next sweep.
    async fn sweep(&self) {
        let Some(sweep) = self.held.sweep(Instant::now()) else {
            return;
        };
        for (key, held) in &sweep.lapsed {
            let delete = match held.token {
                // The hold ended in its holder's view a grace ago, or its
                // holder released it: removed as its release would.
                Some(token) => release_if_ours(key, &self.keys.guard_of(key), token, &held.value),
                // Whether the write landed is unknown: the key goes only if
                // it is still ours, and its guard stays, so another owner
                // waits as for any lapsed hold.
                None => TxnRequest {
                    compare: vec![
                        compare(
                            key,
                            compare_target::LEASE,
                            TargetUnion::Lease(held.lease_id),
                        ),
                        compare(
                            key,
                            compare_target::VALUE,
                            TargetUnion::Value(held.value.clone()),
                        ),
                    ],
                    success: vec![delete_op(key.clone())],
                    failure: vec![],
                },
            };
            match self.client.txn(delete).await {
                // Answered: deleted now, or not this hold's any more.
                Ok(_) => self.held.deleted(key, held.generation),
                // etcd is not answering this client: the rest waits too,
                // rather than each costing the caller a timeout.
                Err(e) if e.is_member_fault() => return,
                Err(_) => {}
            }
        }
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        if leases.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let reads = leases.chunks(self.max_txn_ops).map(|chunk| {
            self.client.txn(TxnRequest {
                compare: vec![],
                success: chunk
                    .iter()
                    .map(|l| range_op(self.keys.session_key(l.session_id())))
                    .collect(),
                failure: vec![],
            })
        });
        // The keep-alive first, the reads after it (see `renew`).
        let ours = self.keep_alive_ours(started).await;
        let answers = join_all(reads).await;
        let mut out = Vec::with_capacity(leases.len());
        for (chunk, answer) in leases.chunks(self.max_txn_ops).zip(answers) {
            match answer {
                Ok(mut answer) => {
                    let read_term = raft_term(&answer.header);
                    for (n, lease) in chunk.iter().enumerate() {
                        let kv = read_kv(&mut answer, n);
                        let verdict = judge(kv.as_ref(), lease);
                        out.push(
                            self.conclude(lease, verdict, &ours, started, read_term)
                                .await,
                        );
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for _ in chunk {
                        out.push(Err(LeaseError::transient("renew: reading the keys failed")
                            .with_source(Arc::clone(&e))));
                    }
                }
            }
        }
        self.sweep().await;
        out
    }

    /// The live holder of `session` (see the crate docs, "Reporting the
    /// holder"): the key as stored, and how long its etcd lease has left.
    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let read = RangeRequest {
            key: self.keys.session_key(session),
            ..Default::default()
        };
        let answer = self
            .client
            .range(read)
            .await
            .map_err(|e| e.into_lease_error("current: reading the key failed"))?;
        // Gone, guard or not: released, or lapsed and no longer renewed.
        let Some(kv) = answer.kvs.into_iter().next() else {
            return Ok(None);
        };
        let malformed = |detail: String| {
            LeaseError::transient(format!("current: the key of {session} is not one of ours"))
                .with_source(EtcdError::Malformed {
                    call: "Range",
                    detail,
                })
        };
        let holder = decode_owner(&kv.value).ok_or_else(|| {
            malformed(format!(
                "the key of {session} holds a value this crate did not write"
            ))
        })?;
        if kv.lease == 0 {
            return Err(malformed(format!(
                "the key of {session} is on no etcd lease, so it never expires"
            )));
        }
        let sent = SystemTime::now();
        let left = match self.client.lease_time_to_live(kv.lease).await {
            Ok(answer) => answer.ttl,
            Err(e) if e.is_lease_not_found() => return Ok(None),
            Err(e) => return Err(e.into_lease_error("current: reading the etcd lease failed")),
        };
        let Ok(left @ 1..) = u64::try_from(left) else {
            return Ok(None);
        };
        let grace = self.shared.grace();
        // etcd counts from when it served the request and rounds down, so
        // counting from the send gives no later a time than etcd's; a
        // member that knows no deadline yet (just elected) answers more
        // than was ever granted, which is capped. The grace is left out
        // as the holder leaves it out of its own expiry.
        let left = Duration::from_secs(left)
            .min(self.ttl + grace)
            .saturating_sub(grace);
        if left.is_zero() {
            return Ok(None);
        }
        Ok(Some(Lease::new(
            session.clone(),
            holder,
            token_of(kv.mod_revision),
            sent + left,
        )))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let Some(token) = token_revision(lease.token()) else {
            return Ok(()); // never issued: nothing of ours to remove
        };
        let key = self.keys.session_key(lease.session_id());
        let value = encode_value(lease.session_id(), lease.owner(), self.ttl);
        // Sent, it may land whatever this call learns: a re-acquire by the
        // same owner must then write a new hold, not keep this one. Until
        // etcd answers, the hold stays in the bookkeeping, due for the
        // sweep: a release that fails or is dropped is completed there.
        self.held.releasing(&key, token, Instant::now());
        self.client
            .txn(release_if_ours(
                &key,
                &self.keys.guard_of(&key),
                token,
                &value,
            ))
            .await
            .map_err(|e| e.into_lease_error("release: transaction failed"))?;
        // Answered: etcd holds nothing of this hold any more.
        self.held.forget(&key, token);
        Ok(())
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.authority
            .get_or_try_init(|| async {
                let key = self.keys.authority_key();
                let marker = random_marker();
                let create_or_read = TxnRequest {
                    compare: vec![compare(
                        &key,
                        compare_target::CREATE,
                        TargetUnion::CreateRevision(0),
                    )],
                    success: vec![put_op(key.clone(), marker.clone().into_bytes(), 0)],
                    failure: vec![range_op(key)],
                };
                let mut answer = self
                    .client
                    .txn(create_or_read)
                    .await
                    .map_err(|e| e.into_lease_error("authority: transaction failed"))?;
                let cluster = answer.header.as_ref().map_or(0, |h| h.cluster_id);
                let stored = if answer.succeeded {
                    marker
                } else {
                    read_kv(&mut answer, 0)
                        .and_then(|kv| String::from_utf8(kv.value).ok())
                        .filter(|m| m.len() <= 64 && m.bytes().all(|b| b.is_ascii_hexdigit()))
                        .ok_or_else(|| {
                            LeaseError::transient("authority: the marker key is unreadable")
                        })?
                };
                AuthorityId::new(format!(
                    "etcd:{cluster:016x}:{stored}:{}",
                    self.keys.prefix()
                ))
            })
            .await
            .cloned()
    }
}

/// The keep-alive of this client's etcd lease made for a renewal, shared
/// by every lease of a batch.
type OurKeepAlive = Option<(i64, Result<Option<Grant>, Arc<EtcdError>>)>;

/// 128 random bits as hex, from the standard library's randomly keyed
/// hasher (seeded by the OS), the clock and the process id.
fn random_marker() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = String::with_capacity(32);
    for half in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(half);
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_port::LeaseErrorKind;

    #[test]
    fn tokens_outside_etcd_revisions_match_nothing() {
        assert_eq!(token_revision(FencingToken::new(0)), None);
        assert_eq!(token_revision(FencingToken::new(u64::MAX)), None);
        assert_eq!(token_revision(FencingToken::new(1 << 63)), None);
        assert_eq!(token_revision(FencingToken::new(42)), Some(42));
    }

    #[tokio::test]
    async fn bad_configuration_is_invalid() {
        let bad = [
            EtcdLease::builder(["http://127.0.0.1:1"]).ttl(Duration::from_millis(1500)),
            EtcdLease::builder(["http://127.0.0.1:1"]).ttl(Duration::ZERO),
            EtcdLease::builder(["http://127.0.0.1:1"])
                .ttl(Duration::from_secs(4))
                .request_timeout(Duration::from_secs(3)),
            EtcdLease::builder(["http://127.0.0.1:1"]).prefix("no-slash"),
            EtcdLease::builder(["127.0.0.1:2379"]),
            EtcdLease::builder(Vec::<String>::new()),
            EtcdLease::builder(["http://127.0.0.1:1"]).max_txn_ops(0),
        ];
        for builder in bad {
            let shown = format!("{builder:?}");
            let err = builder.build().unwrap_err();
            assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{shown}: {err}");
        }
    }

    #[test]
    fn building_outside_a_runtime_is_an_error_not_a_panic() {
        let err = EtcdLease::builder(["http://127.0.0.1:1"])
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
    }

    #[test]
    fn markers_differ() {
        assert_ne!(random_marker(), random_marker());
        assert_eq!(random_marker().len(), 32);
    }
}
