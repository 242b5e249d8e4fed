//! Session events in Redis, every write fenced by the writer's lease token
//! in one server-side script; and a [`SessionLease`](lease_port::SessionLease)
//! kept in the same Redis.
//!
//! # What it is for
//!
//! [`RedisStore`] implements [`session_store::SessionStore`] over one
//! Redis database: the same rules as the JSONL directory store (see the
//! `session-store` crate), reachable from every host that reaches Redis.
//! [`RedisLease`] is the lease that comes with it: set-if-absent with a
//! server-side expiry, plus a token counter per session.
//!
//! # When to choose it
//!
//! Several server hosts that share one Redis and no file system. Pick the
//! store's own leases ([`RedisStoreBuilder::leases`]) when that Redis is
//! persistent (see *Durability*), or pair the store with another lease
//! backend (etcd, Kubernetes, a lease service) whose tokens outlive Redis.
//! For one host, the JSONL store with file leases needs no service at all.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_port::{OwnerId, SessionId, SessionLease};
//! use redis_session_store::RedisStore;
//! use serde_json::json;
//! use session_store::{SessionStore, StoreErrorKind, WriteFence};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379/0")
//!     .prefix("chat:")
//!     .leases(Duration::from_secs(15))
//!     .connect()
//!     .await?;
//! let leases = store.session_lease().expect("configured with leases");
//! store.bind_authority(&leases.authority().await?).await?;
//!
//! let chat = SessionId::new("chat-7")?;
//! store.create(&chat).await?;
//! let a = leases.acquire(&chat, &OwnerId::new("host-a/1")?).await?;
//! store.append(&chat, WriteFence::from(&a), &[json!({"text": "hi"})]).await?;
//!
//! // A takes too long; its grant lapses and B takes over with a greater token.
//! # leases.release(&a).await?;
//! let b = leases.acquire(&chat, &OwnerId::new("host-b/1")?).await?;
//! store.append(&chat, WriteFence::from(&b), &[json!({"text": "from b"})]).await?;
//! let late = store.append(&chat, WriteFence::from(&a), &[json!({"text": "late"})]).await;
//! assert_eq!(late.unwrap_err().kind(), StoreErrorKind::Fenced);
//! # Ok(()) }
//! ```
//!
//! (`no_run`: it needs a Redis server. The crate's tests run the same
//! against a real one.)
//!
//! # The store
//!
//! - **Fencing** is the JSONL store's rule: a write carries a
//!   [`WriteFence`](session_store::WriteFence) (token and owner); the store
//!   refuses a token below the session's high-water mark, and an equal
//!   token from another owner than the one the mark belongs to; a higher
//!   token raises the mark and binds it to its owner. The check and the
//!   write are one Lua script, so nothing runs between them: a stale owner
//!   can never append after a newer token has written.
//! - **Events** are a stream per session whose entry ids are `<seq>-0`, so
//!   readers page by sequence number ([`Page::next_seq`](session_store::Page)).
//!   A batch is all or nothing: the script checks everything that could
//!   refuse it before its first write, and Redis writes a script's effects
//!   to the append-only file as one transaction, so a crash never leaves
//!   part of a batch.
//! - **Deletion** removes the events and the session from the listing but
//!   keeps its record (the mark and the last sequence number): a
//!   re-created session refuses old tokens and never reuses a number.
//! - **Unfenced writes** are refused unless allowed
//!   ([`RedisStoreBuilder::allow_unfenced`]), and always once the session
//!   accepted a fenced write.
//! - **The fencing authority** ([`bind_authority`](session_store::SessionStore::bind_authority))
//!   is recorded under the prefix with a set-if-absent script. A store
//!   instance that has bound an authority checks, inside every fenced
//!   write's script, that Redis still records it; if Redis lost its data,
//!   every process that bound before the loss is refused instead of writing
//!   into marks that were wiped.
//! - **Errors**: refusals are the store's own kinds (`Fenced`, `Unfenced`,
//!   `NotFound`, `AlreadyExists`, `AuthorityMismatch`); bad input is
//!   `Invalid` with nothing sent; a failed or timed-out request is `Io`
//!   whose path names the server (credentials removed) and whose source is
//!   an [`io::Error`](std::io::Error) wrapping a [`RequestError`]; data the
//!   store did not write in the shape it writes is `Corrupt`, naming the
//!   key. **A write that fails with `Io` may have been done** (the reply
//!   can be what was lost): read the session before writing it again.
//! - **Waiting for appends**
//!   ([`wait_for_append`](session_store::SessionStore::wait_for_append),
//!   what a server's followers do): every append's script publishes its
//!   session id on the channel `<prefix>appends`, and each store instance
//!   keeps one subscription to it, so a thousand waiters hold one
//!   connection, not a thousand. Messages can be lost (a subscription being
//!   re-made, or a user whose ACL grants no channels: the append still
//!   succeeds), so a waiter also reads its session every second; that read
//!   is how it learns of a deletion.
//! - **Every request has a deadline** ([`RedisStoreBuilder::request_timeout`]).
//! - **TLS and authentication** come from the URL:
//!   `redis://user:password@host:6379/0`, `rediss://…` with the `tls`
//!   feature (rustls with ring, the system's trusted roots).
//!
//! # The Redis lease
//!
//! - The grant is a string key `"<token> <owner>"` with a server-side
//!   expiry (`PX`); beside it a token record that never expires holds the
//!   last token issued (only ever incremented) and the last grant made.
//!   Acquire is one script: the live holder re-acquiring keeps its token
//!   and gets a new expiry; anyone taking a free (released or expired)
//!   lease gets the next token, so every takeover has a greater token than
//!   any before it. Renew and release are compare-and-set scripts on the
//!   exact grant (token and owner). A lapsed grant is reclaimed by its
//!   renew only while it is still the last grant made, which proves that
//!   nobody acquired the session since and that its holder did not release
//!   it (a release forgets the grant); otherwise it is lost.
//! - [`Lease::expiry`](lease_port::Lease::expiry) is the client's clock
//!   when the request was sent plus the TTL, so it is never later than the
//!   server's own expiry; Redis time is never read.
//! - [`renew_many`](lease_port::SessionLease::renew_many) renews up to
//!   1,000 leases in one script call (one round trip), and
//!   [`renews_in_batches`](lease_port::SessionLease::renews_in_batches) is
//!   true.
//! - **A floor** ([`acquire_above`](lease_port::SessionLease::acquire_above)):
//!   the acquire script first raises the token record to the floor, so the
//!   grant and every later takeover are above it. A server passes the
//!   store's high-water mark when its fresh token was refused as below it.
//! - **The authority** is a random id created once, by the first client
//!   that asks, with set-if-absent under the prefix: the same for every
//!   client of one database and prefix, across restarts of Redis and of
//!   the clients, and different for any other Redis, database or prefix.
//!   A client that knows the authority checks it in every acquire.
//!
//! # What it requires of its deployment
//!
//! The fence is only as good as what Redis keeps. Two settings matter, and
//! the crate checks the one it can see:
//!
//! - **`maxmemory-policy noeviction`** (checked). Under any evicting policy
//!   a full Redis drops keys: with `volatile-*` the live grants first (the
//!   only keys with an expiry, so a second owner takes a session its holder
//!   still counts on), with `allkeys-*` token records, high-water marks and
//!   sessions too (tokens restart, stale writers are accepted). Both
//!   [`RedisStoreBuilder::connect`] and [`RedisLeaseBuilder::connect`] read
//!   the policy (`CONFIG GET maxmemory-policy`, or `INFO memory` where
//!   `CONFIG` is renamed or not granted) and refuse anything else as
//!   `Rewound`, naming the fix; the policy is read again every
//!   [`DEFAULT_POLICY_CHECK_INTERVAL`] while clients run, and a change to an
//!   evicting policy refuses every call until it is set back. A user who may
//!   read neither is refused too: grant it `+config|get` or `+info`. Many
//!   managed Redis offerings default to `volatile-lru`: set the parameter.
//! - **Persistence that keeps acknowledged writes**: the append-only file
//!   with `appendfsync always`. Not checkable from a client; see below for
//!   what happens without it.
//!
//! ## State that goes back is refused
//!
//! Every script checks and advances a counter under the prefix
//! (`<prefix>clock`), and each process remembers the highest value it saw.
//! A Redis that answers below it lost writes it had confirmed: restarted
//! from an older snapshot, crashed under `appendfsync everysec`, failed
//! over to a replica that lagged, flushed, or keys removed by hand. Every
//! store call ([`StoreErrorKind::Rewound`](session_store::StoreErrorKind::Rewound))
//! and lease call ([`LeaseErrorKind::Rewound`](lease_port::LeaseErrorKind::Rewound))
//! of such a process is then refused before it does anything, so no token
//! is issued twice to it and no write lands under a mark Redis forgot.
//! Restoring the newer data ends the refusal; otherwise restarting the
//! processes accepts the older state (its sessions lose what Redis lost).
//! Reads are checked too: a follower never sees a session go back.
//!
//! The counter alone misses a loss once other processes' writes since
//! carried it past what a process saw, so three checks back it, each on
//! what only grows per session: a store instance remembers the highest
//! sequence number and mark it saw of each session and refuses a record
//! below them; a lease client refuses a new grant at or below a token it
//! was granted for the session; and a renewal, or a write of a store fenced
//! by its own leases, under a token above what the session's token record
//! says was issued is refused to its holder before the token can be
//! granted again. What none can see: a process started after the loss
//! knows nothing newer, and one idle through it learns only at its next
//! call.
//!
//! ## Durability: honest limits
//!
//! - **Tokens are exactly as durable as Redis's persistence.** With the
//!   append-only file and `appendfsync always`, an acknowledged token
//!   survives a restart or a crash of Redis (the crate's tests restart and
//!   kill a real server and check). With `appendfsync everysec` a crash
//!   can lose about the last second of writes; with no persistence a
//!   restart loses everything.
//! - **Losing the data loses the fencing with it.** Counters, high-water
//!   marks and both authority records live in the same database, so a
//!   `FLUSHALL`, a restart without persistence or a failover to a replica
//!   that had not received the writes takes them together. Processes that
//!   were running then are refused (see above) and must be restarted; the
//!   restarted deployment serves what Redis kept. A writer that learned
//!   about the old state elsewhere is not fenced by marks that are gone.
//! - **Single Redis.** This is not Redlock and makes no promise across
//!   several primaries or across a failover (replication is asynchronous:
//!   a promoted replica may miss the last grants). Keys of one session
//!   share a hash tag, but the scripts also touch per-prefix keys, so Redis
//!   Cluster is not supported.
//! - **The Redis host's clock.** A grant's expiry (`PX`) is kept by Redis
//!   as an absolute time on its host's wall clock. A forward step of that
//!   clock (an NTP correction, a resumed virtual machine) expires grants
//!   early while their holders, timing them on their own monotonic clocks,
//!   still act: two owners of one session for the length of the step. The
//!   store's fencing still refuses the stale writer's writes, but the lease
//!   alone does not exclude it. Run Redis hosts with slewing time sync (no
//!   steps), or use a backend that judges expiry on a monotonic clock.
//!
//! # Key layout
//!
//! Under the prefix (default [`DEFAULT_PREFIX`]), with the session id
//! percent-encoding `%`, `{` and `}` (injective; the braces are the hash
//! tag):
//!
//! | key | holds |
//! |---|---|
//! | `<prefix>{<id>}:lease` | the grant `"<token> <owner>"`, with the lease's expiry |
//! | `<prefix>{<id>}:lease-tokens` | hash: `issued` (the last token), `grant` (the last grant made) |
//! | `<prefix>{<id>}:record` | hash: `live`, `seq` (last sequence number), `mark`, `writer` |
//! | `<prefix>{<id>}:events` | stream, ids `<seq>-0`, fields `ts`, `k` (token), `w` (writer), `p` (the event's JSON) |
//! | `<prefix>sessions` | sorted set of the existing session ids |
//! | `<prefix>clock` | the change counter every script checks and advances |
//! | `<prefix>lease-authority` | the leases' authority id |
//! | `<prefix>fencing-authority` | the authority the store is bound to |
//!
//! # Features
//!
//! - `tls`: `rediss://` URLs.

mod appends;
mod authority;
mod conn;
mod keys;
mod lease;
mod scripts;
mod store;

pub use conn::{DEFAULT_POLICY_CHECK_INTERVAL, DEFAULT_REQUEST_TIMEOUT, RequestError};
pub use keys::DEFAULT_PREFIX;
pub use lease::{RedisLease, RedisLeaseBuilder};
pub use store::{
    DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_PAGE_BYTES, MAX_PAGE_EVENTS, RedisStore, RedisStoreBuilder,
};
