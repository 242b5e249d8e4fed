//! [`SessionLease`](lease_port::SessionLease) on Kubernetes: one
//! `coordination.k8s.io/v1` Lease object per session in one namespace, with
//! a fencing token that rises on every takeover.
//!
//! # What it is for
//!
//! Replicas of a server in one cluster must not drive the same session at
//! once. Give every replica a `K8sLease` on the same namespace: each session
//! has at most one live owner, and every takeover hands out a token greater
//! than any before it, which the session store checks on every write. It
//! needs nothing but the API server and three verbs on Leases.
//!
//! # When to choose it
//!
//! - The processes run in one Kubernetes cluster (or reach its API server),
//!   and a service account may `get`, `create` and `update` Leases in one
//!   namespace.
//! - Lease operations are rare next to session work: each costs one or two
//!   API requests (a renewal costs one), at a TTL of seconds. For thousands
//!   of sessions renewed every few seconds, a lease service with batched
//!   renewal spares the API server.
//!
//! Not for: processes on one host (`flocklease` needs no cluster).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use k8slease::K8sLease;
//! use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! # let emulator = k8s_emulator::Emulator::start(Default::default()).await.unwrap();
//! # let kubeconfig = emulator.kubeconfig_path();
//! // In a pod, `kube::Client::try_default()` reads the service account.
//! let client = k8slease::client_from_kubeconfig(kubeconfig).await?;
//! let leases = K8sLease::builder(client, "default")
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let (me, other) = (OwnerId::new("pod-a/4242")?, OwnerId::new("pod-b/17")?);
//! let chat = SessionId::new("chat/7")?;
//!
//! let lease = leases.acquire(&chat, &me).await?;
//! assert_eq!(leases.acquire(&chat, &other).await.unwrap_err().kind(), LeaseErrorKind::Held);
//! let lease = leases.renew(&lease).await?; // every TTL/3 or so
//! leases.release(&lease).await?;
//! let next = leases.acquire(&chat, &other).await?;
//! assert!(next.token() > lease.token()); // fence every store write with it
//! # Ok::<(), lease_port::LeaseError>(())
//! # }).unwrap();
//! ```
//!
//! # How it works
//!
//! Session `id` lives in the Lease [`object_name`]`(id)`: the id itself
//! when it is a short DNS label, else a SHA-256 hash, never both for two
//! ids. The object carries the id in the `mecatl.dev/session-id`
//! annotation (an object under our name without it, or with another id, is
//! refused as [`Invalid`](lease_port::LeaseErrorKind::Invalid) and left
//! alone), the label `app.kubernetes.io/managed-by=mecatl-k8slease`, the
//! holder in `spec.holderIdentity`, the token in the
//! `mecatl.dev/fencing-token` annotation, `renewTime`, `acquireTime`,
//! `leaseDurationSeconds` (the TTL) and `leaseTransitions`, raised on every
//! change of holder so `kubectl` shows takeovers.
//!
//! Every write starts from the object as read (so `strategy`,
//! `preferredHolder`, other labels and annotations survive) and is
//! conditional on its `resourceVersion`. A 409 `Conflict` or
//! `AlreadyExists`, a request timeout, a broken connection or a 5xx means
//! "decide again": the object is read and the decision made anew from what
//! is stored — a write whose reply was lost is found committed when the
//! stored holder and token are ours. Release clears the holder under the
//! same precondition; nothing is ever deleted. An empty and an absent
//! holder both mean free.
//!
//! Each client remembers the objects it saw, so a renewal or release is one
//! conditional write, and a read happens only when memory is missing or the
//! write loses (measured with the emulator's request counters):
//!
//! | operation | requests |
//! |---|---|
//! | renew | 1 update |
//! | release | 1 update (get + update if this process never saw the object) |
//! | acquire, session never leased | get + create |
//! | acquire, free or expired session | get + update (1 update when this client released it last) |
//! | acquire, held elsewhere | 1 get (+1 update when memory said free) |
//!
//! # Fencing tokens
//!
//! Tokens come from the API server's `resourceVersion`, which every
//! etcd-backed API server draws from one cluster-wide counter that only
//! grows (Kubernetes documents it as opaque; a server whose versions are not
//! integers is refused as [`Unsupported`](lease_port::LeaseErrorKind::Unsupported)):
//!
//! - a takeover conditioned on version `v` writes token `v + 1` (or more, if
//!   the stored token is higher) in the same write as the new holder. Every
//!   earlier token was at most the version of the write that set it, which
//!   is at most `v`.
//! - the create of an object grants the version the create produced.
//!
//! **Promise:** within one namespace, every takeover's token is greater
//! than every token issued before for that session — across releases,
//! expiries, client restarts, and **out-of-band deletion** of the object
//! (`kubectl delete lease`): a recreated object's versions exceed every
//! version before the deletion, so its tokens do too. It rests on the
//! server's versions growing; restoring etcd from a backup rewinds them
//! (and everything else in the cluster). A holder whose object is deleted
//! has lost its lease: its next renewal is `Held` (if that renewal's write
//! re-creates the object, as Leases' create-on-update allows, the hold is
//! cleared at once). Someone who hand-writes a token annotation can only
//! raise later tokens.
//!
//! # Expiry and clock skew
//!
//! The API server keeps no lease time: every client judges expiry itself,
//! by [`ExpiryJudgement`]:
//!
//! - [`SkewSafe`](ExpiryJudgement::SkewSafe) (default, client-go's rule): a
//!   lease has expired once this process has seen the object unchanged for
//!   the object's `leaseDurationSeconds`, on its monotonic clock, from when
//!   the reply showing that version arrived. No other host's clock is
//!   consulted, so wall-clock skew, steps and NTP jumps between hosts cannot
//!   cause two live holders; only a difference in clock *rates* over one TTL
//!   can. The cost: a process that has never seen the object change waits a
//!   full TTL after its first look before taking it over, however long ago
//!   the holder died.
//! - [`RecordTime`](ExpiryJudgement::RecordTime): a lease has expired once
//!   this host's wall clock passes the record's `renewTime` plus its
//!   duration. Takeover is immediate for a fresh process, but exclusion
//!   holds only while every host's clock is within the holder's renewal
//!   margin of every other's; a reader whose clock runs ahead takes over a
//!   live lease. Use it only with synchronised clocks.
//!
//! In both modes a holder's own renewal needs no clock: it is a write
//! conditioned on the version it last wrote, which fails if anyone else
//! wrote since. The expiry reported in [`Lease::expiry`](lease_port::Lease::expiry)
//! is the local wall clock when the granting request was *sent*, plus the
//! TTL: the holder's deadline never extends past what any reader allows.
//!
//! # Reporting the holder
//!
//! [`current`](lease_port::SessionLease::current) is one GET of the
//! session's object. No object, or no holder, is `None`. Otherwise the
//! holder is judged exactly as this client's acquire would judge it at
//! that moment, by its [`ExpiryJudgement`], and a lapsed hold is `None`:
//!
//! - [`SkewSafe`](ExpiryJudgement::SkewSafe): live until this process has
//!   seen that version unchanged for its `leaseDurationSeconds`, counted
//!   from when the reply that first showed it arrived (the read itself
//!   counts as a sighting). The expiry reported is when that ends, on the
//!   local clock. A process that never saw the object before reports a
//!   whole duration from now, however long ago the holder last wrote —
//!   conservative, and exactly when its own acquire would first succeed.
//! - [`RecordTime`](ExpiryJudgement::RecordTime): live until `renewTime`
//!   plus `leaseDurationSeconds`, which is the expiry reported.
//!
//! The token is the one the backend stored: the `mecatl.dev/fencing-token`
//! annotation, or, for an object unchanged since the create that made its
//! holder, that create's resourceVersion. An object that is not ours (no
//! or another session annotation, an unreadable token, a holder that is
//! not a valid owner id) is [`Invalid`](lease_port::LeaseErrorKind::Invalid),
//! as everywhere else. Needs only the `get` verb.
//!
//! # API-server faults
//!
//! Every request has its own timeout ([`Builder::request_timeout`], default
//! a quarter of the TTL, at most a third). When the API server is slow,
//! down, throttling or answering 5xx:
//!
//! - reads fail at once with [`Transient`](lease_port::LeaseErrorKind::Transient),
//!   keeping the cause as `source()`;
//! - a failed write is read back and decided again (it may have committed),
//!   up to six rounds, then `Transient` with the last cause;
//! - nothing is ever granted without a successful conditional write, so a
//!   fault can make an operation fail, never grant a lease twice. A lease
//!   whose renewals fail lapses at its expiry: the lifecycle must stop
//!   acting by then, and the store's token check covers a holder too slow
//!   to notice.
//!
//! # Errors
//!
//! | cause | kind |
//! |---|---|
//! | held live by another owner, or the caller's lease was lost | `Held`, naming the holder |
//! | 403: RBAC refuses a verb | `Invalid` (not retryable); the message names the verb and `leases.coordination.k8s.io` |
//! | namespace missing, 400/422, a foreign object under our name, TTL not whole seconds | `Invalid` |
//! | timeouts, connection errors, 401, 429, 5xx | `Transient`, with the cause as source |
//! | `resourceVersion` not an integer | `Unsupported` |
//!
//! A missing permission is `Invalid` rather than `Unsupported` because an
//! operator can grant it without restarting anything, and a server must not
//! stop leasing for good over it.
//!
//! # The authority
//!
//! [`authority`](lease_port::SessionLease::authority) is `k8s:<namespace>:<uid>`
//! where `<uid>` is the server-assigned uid of the Lease `mecatl-authority`
//! in the namespace, created by the first client that asks. It needs only
//! the same three verbs, is equal for every client of one namespace of one
//! cluster, and differs between clusters and namespaces. Deleting that
//! object changes it, and stores fenced by the old one then refuse their
//! servers until re-pointed (the safe direction).
//!
//! # Permissions
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: {name: mecatl-leases, namespace: NAMESPACE}
//! rules:
//!   - apiGroups: [coordination.k8s.io]
//!     resources: [leases]
//!     verbs: [get, create, update]
//! ```
//!
//! Batch renewal ([`renew_many`](lease_port::SessionLease::renew_many)) keeps
//! the default: the API has no multi-object write, so it would save nothing.

mod backend;
mod error;
mod expiry;
mod name;
mod observe;
mod record;

pub use backend::{Builder, DEFAULT_TTL, K8sLease, client_from_kubeconfig, client_infer};
pub use expiry::ExpiryJudgement;
pub use name::object_name;
