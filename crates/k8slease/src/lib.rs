//! [`SessionLease`](lease_port::SessionLease) on Kubernetes: one
//! `coordination.k8s.io/v1` Lease object per session in one namespace, with
//! a fencing token that rises on every takeover, and one *owner Lease* per
//! client and owner that renews all of its sessions at once.
//!
//! # What it is for
//!
//! Replicas of a server in one cluster must not drive the same session at
//! once. Give every replica a `K8sLease` on the same namespace: each session
//! has at most one live owner, and every takeover hands out a token greater
//! than any before it, which the session store checks on every write. It
//! needs nothing but the API server and five verbs on Leases — and an
//! etcd beneath it that keeps what it acknowledged (see "What it requires
//! of the cluster").
//!
//! # When to choose it
//!
//! - The processes run in one Kubernetes cluster (or reach its API server),
//!   and a service account may `get`, `list`, `watch`, `create` and
//!   `update` Leases in one namespace.
//! - Holding many sessions is cheap: a process renews them all with one
//!   write per renewal period, and proves them its own with one list or,
//!   from [`DEFAULT_WATCH_FROM`] sessions on, with a watch that delivers
//!   only what changes (one request per period at 10,000 sessions,
//!   counted on the emulator).
//!   Acquiring and releasing a session cost one to four requests each.
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
//! `mecatl.dev/fencing-token` annotation, the owner lease its hold hangs on
//! in the `mecatl.dev/owner-lease` label, `acquireTime` and `renewTime`
//! (both when it was taken), `leaseDurationSeconds` (the TTL) and
//! `leaseTransitions`, raised on every change of holder so `kubectl` shows
//! takeovers. An object is created free, holding nobody, and its first
//! holder takes it with an update like any later one: a holder and its
//! token are always written together.
//!
//! ## Owner leases
//!
//! Each client makes, for each owner id it acquires for, an owner lease:
//! a Lease named `mecatl-o-<hash of the owner id>-<part unique to the
//! client>`, labelled `mecatl.dev/role=owner` and, with its own name,
//! `mecatl.dev/owner-lease`, held by the owner id. Its
//! `renewTime` says when that holder last renewed; its
//! `leaseDurationSeconds` is its *hold*, the TTL plus a third of it in
//! whole seconds (the TTL itself under three seconds): one renewal can then
//! serve every batch renewal for a third of a TTL and still give each
//! lease a whole TTL from its call, as
//! [`granted_ttl`](lease_port::SessionLease::granted_ttl) promises. A session's hold is live while the owner lease its
//! label names is live: held by the session's holder and not expired by
//! the reader's [`ExpiryJudgement`], judged on that owner lease exactly as
//! a session's own record was judged before. A missing owner lease, or one
//! held by nobody or someone else, leaves the session free.
//!
//! - **Renewal** writes the owner lease, conditional on the version this
//!   client last wrote, and lists the session objects labelled with it to
//!   prove they still name our holder and token: one update and one list
//!   per owner for all its sessions; an owner holding many watches them
//!   instead of listing (see "Holding many sessions"). [`renew_many`](lease_port::SessionLease::renew_many)
//!   does this at most once per hold minus TTL (a third of a TTL), however
//!   many calls the leases come in (the lease keeper sends them in
//!   batches); a call in between answers from the last renewal and list,
//!   with an expiry a TTL from the call, which the hold still covers. A session the list does not show as ours (released,
//!   taken, deleted, or edited by hand) is decided on its own object.
//!   [`renew`](lease_port::SessionLease::renew) of one lease reads its
//!   object and renews the owner lease.
//! - **Acquire** hangs the session on this client's owner lease, renewed by
//!   a write sent after the acquire began (concurrent acquires share one),
//!   never on a remembered renewal: an owner lease revoked or deleted since
//!   would leave the new grant free for anyone from the start. The grant
//!   lives as long as that renewal: its expiry is when the renewal was sent,
//!   plus the TTL. A refused acquire writes nothing.
//! - **Takeover after a crash**: a session whose owner lease has expired
//!   (seen unchanged for its hold, on the taker's clock: a crashed holder's
//!   sessions are taken a third of a TTL later than a single session's
//!   record would lapse) is taken only
//!   after the taker *revokes* that owner lease, clearing its holder with a
//!   write conditional on the version it judged expired. Either the
//!   holder's renewal came first (the revocation fails, and the taker
//!   finds the owner lease live), or the revocation did (the holder's next
//!   renewal fails, and every session on it is lost — answered `Held`, so
//!   the keeper stops them all).
//! - **Release** clears one session's holder and label; the owner lease and
//!   the other sessions on it are untouched.
//! - **Incarnations**: a new client (a restarted process) makes its own
//!   owner lease and never renews an earlier one, so it cannot bring back
//!   its predecessor's sessions: [`renew`](lease_port::SessionLease::renew)
//!   of a lease hanging on another client's owner lease is `Held`. Acquire
//!   by the same owner id is allowed by the contract and moves the session
//!   onto the new owner lease with a new, greater token; the earlier client,
//!   if it still runs, finds that session gone at its next renewal.
//! - Session objects without the label (written by an older k8slease,
//!   whose holders renew each object) are judged by their own record, and
//!   moved onto an owner lease when next taken. All clients of a namespace
//!   must run this version: an older one would judge a session whose
//!   object is not rewritten as expired.
//!
//! `kubectl get leases` shows each session's holder; `kubectl get leases
//! -l mecatl.dev/role=owner` the owner leases and their renewal times;
//! `kubectl get leases -l mecatl.dev/owner-lease=NAME` the sessions on one,
//! and that owner lease itself.
//! Owner leases of clients that ended are left behind, held until they
//! lapse and inert afterwards; delete them at will once expired.
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
//! API requests (measured with the emulator's request counters):
//!
//! | operation | requests |
//! |---|---|
//! | renewal of every session of one owner, per third of a TTL ([`renew_many`](lease_port::SessionLease::renew_many)) | 1 update + 1 list; 1 update while its watch runs |
//! | renew of one lease | get + update |
//! | release | 1 update (get + update if this process never saw the object) |
//! | first acquire of a client | + 1 create (its owner lease) |
//! | acquire, session never leased | get + create + update, + 1 update of the owner lease |
//! | acquire, free or expired session | get + update, + 1 update of the owner lease (+ 1 update revoking an expired owner lease) |
//! | acquire, held elsewhere | get of the object and of its owner lease |
//!
//! ## Holding many sessions
//!
//! The list after each renewal costs the API server a read of every
//! session on the owner lease, and this client their decoding: at 10,000
//! sessions, 10,000 objects each renewal period. So once an owner holds
//! [`Builder::watch_from`] sessions on one client ([`DEFAULT_WATCH_FROM`],
//! 100, by default), that client lists them once and then *watches* the
//! label `mecatl.dev/owner-lease=<its owner lease>`, which the owner lease
//! carries too. A watch sends every change in `resourceVersion` order,
//! and a session that leaves the label (taken over, released) as deleted;
//! so once it has delivered the owner lease's own renewal, it has shown
//! every change to the sessions before that renewal, which is what the
//! list proved. A renewal then costs one request however many sessions
//! the owner holds.
//!
//! The watch saves requests and decides nothing alone. Whenever it cannot
//! show the sessions as of a renewal within a quarter of the request
//! timeout — starting, or starting over — the renewal lists, as below the
//! threshold. A watch that ends, however (closed by the API server after
//! four minutes, broken, its history compacted, its versions gone back),
//! starts over from a list rather than resuming from the last version it
//! saw: behind an API server restarted for an etcd restore, versions it
//! saw may have been used again for other changes, which a resumed watch
//! would never send. That is one list every four minutes or so. A version
//! that goes back on the watch makes it list again, and that list is
//! refused as `Rewound` as any other would be. Storage can also go back
//! where no watch event shows it: restored to a point after the owner
//! lease's previous renewal but before a session acquired since, with the
//! version counter then pushed past everything this client saw by other
//! writers. So a session whose
//! object changed after the version the renewal was conditional on is read
//! again before the watch's word is taken for it (a read older than what
//! this client saw is `Rewound`); with more than 32 such sessions, the
//! renewal lists instead. A renewal that changed nothing (same version)
//! lists too. A Role without `watch` is not an error: the client asks once,
//! then lists each period.
//!
//! One owner per client watches (the first to reach the threshold; a
//! process holds its sessions as one owner), and the watch holds one
//! connection to the API server for as long as it runs (see
//! "Connections").
//!
//! ## Upgrading from per-session renewals
//!
//! Every client of one namespace must judge holds the same way. A client
//! of an earlier version, which renewed each session's own object, judges
//! a session by that object alone — which this version no longer rewrites
//! while it holds the session — and would take over sessions held here
//! once their objects had stood unchanged for a TTL. So do not roll from
//! such a version to this one: stop every process of the old version,
//! then start the new ones. Objects the old version left are read the old
//! way and moved onto an owner lease when next taken.
//!
//! # Fencing tokens
//!
//! Tokens come from the API server's `resourceVersion`, which every
//! etcd-backed API server draws from one cluster-wide counter that only
//! grows (Kubernetes documents it as opaque; a server whose versions are not
//! integers is refused as [`Unsupported`](lease_port::LeaseErrorKind::Unsupported)),
//! and are written in the `mecatl.dev/fencing-token` annotation in the same
//! write as the holder:
//!
//! - a takeover conditioned on version `v` writes token `v + 1`, or the
//!   stored token `+ 1` if that is higher. Every earlier token of the
//!   object is at most the version of the write that set it, which is at
//!   most `v`, or at most the stored token, which each takeover raises.
//! - [`acquire_above`](lease_port::SessionLease::acquire_above)`(floor)`
//!   writes at least `floor + 1`, also above the server's versions (a
//!   store's mark may be, after the Lease storage went back): the
//!   annotation carries the raise, so every later takeover — by any
//!   client, which reads the annotation — exceeds it in turn. The live
//!   holder whose token is not above `floor` gets a new one (its old value
//!   no longer renews); one above `floor` keeps its token. A session held
//!   by another owner is `Held`, whatever the floor; a floor of `u64::MAX`
//!   is [`Invalid`](lease_port::LeaseErrorKind::Invalid).
//!
//! **Promise:** within one namespace, every takeover's token is greater
//! than every token issued before for that session — across releases,
//! expiries, client restarts, and **out-of-band deletion** of the object
//! (`kubectl delete lease`): a recreated object's versions exceed every
//! version before the deletion, so its tokens do too. Two limits: it rests
//! on the server's versions growing (see "What it requires of the
//! cluster"), and a token raised above the versions by a floor lives only
//! in its object's annotation, so deleting that object lets tokens fall
//! back to the versions — the store's mark then refuses them, and an
//! acquire above that mark raises them again. A holder whose session
//! object is deleted has lost that lease: its next renewal is `Held` (the
//! list of its sessions no longer shows it, and its own read finds none).
//! A holder whose owner lease is deleted has lost every lease on it: the
//! renewal's write names the deleted object's uid, which the API server
//! takes as a precondition, so the owner lease is not re-created (should a
//! server re-create it anyway, its hold is cleared at once), and the next
//! grant hangs on a new owner lease. Someone who hand-writes a token
//! annotation can only raise later tokens.
//!
//! # What it requires of the cluster
//!
//! Only the Kubernetes API, with its usual guarantees: reads without a
//! `resourceVersion` answered from the newest state, and an etcd that keeps
//! every write it acknowledged, so versions never go back. Fencing rests on
//! that. An etcd that loses acknowledged writes — restored from a backup,
//! wiped, failed over to a member that had not received them, or an etcd
//! given to Leases alone (`--etcd-servers-overrides=coordination.k8s.io/leases#…`)
//! and treated as disposable, as is sometimes done to spare the main etcd
//! lease churn — hands out versions, and so tokens, that were issued
//! before, and the stores' checks would be all that stands between two
//! writers. Do not treat that etcd as disposable.
//!
//! Each client watches for it (clones share what they saw): it remembers
//! the highest `resourceVersion` seen on any object and on each object
//! (kept after the object is deleted). A write must be answered above the
//! highest version seen before it was sent (an update that changed nothing
//! keeps its version and is no write), and a read of an object at least at
//! the version of it seen before it was sent. An answer below is
//! [`Rewound`](lease_port::LeaseErrorKind::Rewound) — never `Transient`,
//! never a conflict to retry — naming the versions and what to do. The
//! operation fails; a write answered so may have been applied (a hold it
//! made lapses at its TTL). The client keeps refusing: reads of an object
//! until someone writes it above what was seen, writes until the server's
//! versions pass the highest seen. A holder whose object the rewind removed
//! sees it as a deletion: its renewal is `Held`.
//!
//! To recover: restore the etcd's newest state; or accept the older one —
//! make sure no session store accepted tokens above the new versions, or
//! have the servers acquire above their stores' marks
//! ([`acquire_above`](lease_port::SessionLease::acquire_above);
//! `lease-keeper`'s `acquire_above_within` takes the mark as its floor),
//! then restart the lease clients
//! (a new client has seen nothing and accepts the server as it is).
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
//! Either way it is the owner lease a session hangs on that is judged,
//! not the session's object, which is not rewritten while it is held.
//!
//! In both modes a holder's own renewal needs no clock: it is a write
//! conditioned on the version it last wrote, which fails if anyone else
//! wrote since — and a taker writes (revokes) an owner lease before it
//! takes any session on it. The expiry reported in [`Lease::expiry`](lease_port::Lease::expiry)
//! is the local wall clock when the owner-lease renewal the grant rests on
//! was *sent*, plus the TTL: the holder's deadline never extends past what
//! any reader allows.
//!
//! # Reporting the holder
//!
//! [`current`](lease_port::SessionLease::current) is one GET of the
//! session's object and one of the owner lease it names. No object, or no
//! holder, or an owner lease gone or held by someone else, is `None`.
//! Otherwise the holder is judged exactly as this client's acquire would
//! judge it at that moment, by its [`ExpiryJudgement`] applied to the owner
//! lease, and a lapsed hold is `None`:
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
//! The token is the one the backend stored with the holder, in the
//! `mecatl.dev/fencing-token` annotation; edits of the object by others
//! (labels, annotations) leave it as granted. A live holder without the
//! annotation — set by hand, or by an older k8slease that created objects
//! with their holder and stated that create's version nowhere — has no
//! provable token: that is [`Transient`](lease_port::LeaseErrorKind::Transient),
//! never a guess, until the hold lapses or is renewed. An object that is not ours (no
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
//! # Connections
//!
//! kube's default client speaks HTTP/1.1 and opens a new TCP connection
//! whenever every open one is busy, so a thousand concurrent acquires open
//! a thousand connections or more (1,828 were counted for 1,000 acquires
//! and their renewals at once). The clients this crate builds —
//! [`client_from_kubeconfig`], [`client_infer`] and
//! [`client_from_config`]`(config, max)` — keep at most
//! [`DEFAULT_MAX_CONNECTIONS`] (8), or `max`, TCP connections to the API
//! server open at once; the same burst then uses 8. A request that finds
//! every connection busy waits for one to come back to the pool, within
//! its [request timeout](Builder::request_timeout); waiting for a
//! connection that does not come free counts against kube's connect
//! timeout too (`kube::Config::connect_timeout`; 10 s when unset).
//! Idle connections are kept (up to the bound) rather than closed and
//! opened again.
//!
//! The bound belongs to one client and every clone of it: clones share one
//! connection pool. Build one client per API server in a process and give
//! clones of it to every [`K8sLease`] there (`K8sLease::builder(client.clone(), ns)`):
//! they then share the bound. Two clients built separately keep a bound
//! each. A client built some other way (`kube::Client::try_from`) is used
//! as it is, unbounded.
//!
//! Renewals come first. A [`K8sLease`] sends at most six other requests
//! (acquires, releases, reads) at once; the rest wait their turn before
//! their request timeout starts, so a request that never left the queue
//! is never taken for one that may have landed. The requests that keep
//! every session held — every request of a `renew`, and making or renewing
//! this client's own owner lease, whoever asks — never wait for a turn, so
//! a burst of thousands of acquires cannot hold a renewal back past its
//! deadline: with the default bound, two connections stay free for it.
//! Several `K8sLease`s on clones of one client each take six turns, so
//! that guarantee holds for one `K8sLease` per client (as `mecated` and
//! `mecak8s` build them); give several a larger bound (`client_from_config`)
//! of at least six per instance and two more. A watching owner (see
//! "Holding many sessions") keeps one of those two for its watch; its
//! renewals are then one request each.
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
//! | an answer older than what this client saw (the Lease storage went back) | `Rewound` (not retryable) |
//! | `acquire_above` with a floor of `u64::MAX` | `Invalid` |
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
//! the verbs above, is equal for every client of one namespace of one
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
//!     verbs: [get, list, watch, create, update]
//! ```
//!
//! `list` and `watch` serve batch renewal alone: the read that proves a
//! process's sessions are still its own. `watch` may be left out; an owner
//! holding many sessions then lists them every renewal period.

mod backend;
mod connections;
mod error;
mod expiry;
mod name;
mod observe;
mod owner;
mod record;
mod sessions_watch;

pub use backend::{
    Builder, DEFAULT_TTL, DEFAULT_WATCH_FROM, K8sLease, client_from_kubeconfig, client_infer,
};
pub use connections::{DEFAULT_MAX_CONNECTIONS, client_from_config};
pub use expiry::ExpiryJudgement;
pub use name::object_name;
