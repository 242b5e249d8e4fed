//! Session events in PostgreSQL, every append one statement that checks the
//! writer's lease token and writer against the session's high-water mark —
//! and, when the leases live in the same database, against the live lease
//! row — before it writes.
//!
//! # What it is for
//!
//! [`PgStore`] implements [`session_store::SessionStore`] in a few tables
//! of one PostgreSQL database: the same rules as the JSONL directory store
//! and the Redis store (see the `session-store` crate), reachable from
//! every host that reaches the database, with the durability, backups and
//! replication the database already has. Followers wake through
//! `LISTEN`/`NOTIFY`, one connection per process.
//!
//! # When to choose it
//!
//! Several server hosts that share a PostgreSQL primary and no file system
//! — typically with pglease's leases in the same database, which this
//! store can check in the append itself
//! ([`PgStoreBuilder::leases_in_same_database`]). Prefer it to the Redis
//! store when PostgreSQL is what you run and back up already; prefer the
//! JSONL store for one host.
//!
//! # Example
//!
//! ```no_run
//! use lease_port::{OwnerId, SessionId, SessionLease};
//! use pg_session_store::PgStore;
//! use pglease::PgLease;
//! use serde_json::json;
//! use session_store::{SessionStore, StoreErrorKind, WriteFence};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "postgres://app:secret@db.internal:5432/chat";
//! // The leases first: they make their tables, which the store checks.
//! let leases = PgLease::builder(url).connect().await?;
//! let store = PgStore::builder(url)
//!     .leases_in_same_database("mecatl")
//!     .connect()
//!     .await?;
//! store.bind_authority(&leases.authority().await?).await?;
//!
//! let chat = SessionId::new("chat-7")?;
//! store.create(&chat).await?;
//! let a = leases.acquire(&chat, &OwnerId::new("host-a")?).await?;
//! store.append(&chat, WriteFence::from(&a), &[json!({"text": "hi"})]).await?;
//!
//! // A's grant ends and B takes over. A is refused at once — B has not
//! // written yet, but the append checks the live lease row.
//! # leases.release(&a).await?;
//! let b = leases.acquire(&chat, &OwnerId::new("host-b")?).await?;
//! let late = store.append(&chat, WriteFence::from(&a), &[json!({"text": "late"})]).await;
//! assert_eq!(late.unwrap_err().kind(), StoreErrorKind::Fenced);
//! store.append(&chat, WriteFence::from(&b), &[json!({"text": "from b"})]).await?;
//! # Ok(()) }
//! ```
//!
//! (`no_run`: it needs a PostgreSQL server. The crate's tests run the same
//! against a real one, directly and through PgBouncer.)
//!
//! # The tables
//!
//! Under a prefix (default [`DEFAULT_TABLE_PREFIX`], `mecatl`; names
//! distinct from pglease's `<prefix>_leases` and `<prefix>_authority`):
//!
//! | table | holds |
//! |---|---|
//! | `<prefix>_sessions` | one row per session ever created, never deleted: `session_id` (`COLLATE "C"`, the primary key), `live`, `last_seq`, `erased_through`, `mark` (`numeric(20,0)`: every `u64` exactly), `mark_writer`; a partial index on `session_id WHERE live` |
//! | `<prefix>_events` | `(session_id, seq)` primary key, `token`, `writer`, `at`, `bytes`, `payload` (`json`: the text as serialised, exactly) |
//! | `<prefix>_store_authority` | the bound lease authority and a random marker of the record |
//! | `<prefix>_schema` | shared with pglease: this crate's row is component `store`, version [`SCHEMA_VERSION`] |
//!
//! The first client that connects creates the tables, and a later version
//! upgrades them: one simple-protocol batch under
//! `pg_advisory_xact_lock`, so racing clients (pglease's too) take turns and
//! nothing is left on a pooled connection; no manual step. A database at a
//! newer version is refused (`Invalid`); a role that may use but not create
//! tables works once they exist; a foreign table under one of the names
//! fails the creation instead of being adopted.
//!
//! # The append is one statement
//!
//! An append sends the batch serialised (`text[]` and the sizes) with the
//! fence, and one statement, a single transaction:
//!
//! 1. locks the session's row (`SELECT … FOR UPDATE` in a materialized
//!    CTE). Under READ COMMITTED a concurrent writer's commit is waited
//!    for and its row read, so the check below sees the latest mark and
//!    the numbers follow the latest `last_seq`;
//! 2. with the leases in the same database, share-locks the session's
//!    lease row (`FOR SHARE`, after the session row: every writer locks in
//!    that order);
//! 3. decides one verdict: the log position and the session below what
//!    this client saw (`Rewound`, see below), the authority record
//!    changed, the session missing or deleted (`NotFound`), an unfenced
//!    write not allowed or the session fenced (`Unfenced`), a token below
//!    the mark or equal to it from another writer (`Fenced`), the lease
//!    check (`Fenced`), else `ok`;
//! 4. only under `ok`: raises `last_seq` by the batch, raises the mark to
//!    a higher token and binds it to the writer, inserts the events from
//!    `unnest($10::text[], $11::int4[]) WITH ORDINALITY` under the numbers
//!    after the locked row's, and calls `pg_notify` with the session id.
//!
//! All or nothing: nothing is written under any other verdict, and an
//! error anywhere rolls the whole statement back. Two equal-token writers
//! of different ids racing on a new session are serialised by the row
//! lock: the first raises the mark and binds it, the second is refused.
//! Sequence numbers come from the locked row, so none repeats. A deletion
//! is the same statement with `live` cleared, the events of this life
//! hidden (`erased_through = last_seq`) and removed; the row, its mark and
//! its `last_seq` stay, so a re-created session refuses old tokens and
//! never reuses a number. Bad input (an empty batch, an event over
//! [`PgStoreBuilder::max_event_bytes`], a page limit of 0) is `Invalid`
//! before anything is sent.
//!
//! # The lease check, when the leases live in the same database
//!
//! With [`PgStoreBuilder::leases_in_same_database`] every fenced append
//! and deletion also requires, in the same statement, that the session's
//! row in `<lease_prefix>_leases` (pglease's table):
//!
//! - is live: `expires_at > clock_timestamp()`, on the database's clock
//!   as pglease judges expiry, read once the session's row is locked (a
//!   write that waited for the lock is judged when it writes);
//! - holds exactly the write's token;
//! - belongs to the write's owner: the writer is the lease's owner, or the
//!   owner followed by `#` and an incarnation id (lease-keeper writes as
//!   `owner#<16 hex digits>`; an owner id too long for that suffix is cut
//!   to fit by the keeper, and a writer of exactly that shape whose head is
//!   a prefix of the owner is accepted).
//!
//! So a holder whose lease was taken over — or merely lapsed — is refused
//! even before the new owner's first write raises the mark: the mark
//! fences writes behind a newer write, the lease check fences them behind
//! a newer grant. The lease row is share-locked, so a takeover under way
//! waits for the write, or the write for the takeover and then sees it.
//! The refusal is [`Fenced`](session_store::StoreErrorKind::Fenced),
//! naming the lease row's token as the mark and its live holder (if any)
//! as the mark's writer. Owner ids should not be another owner's id
//! followed by `#`. Unfenced writes are not lease-checked (they are for
//! deployments without leases). The lease table must exist when the store
//! connects: connect the leases first.
//!
//! # Followers wake on `NOTIFY`
//!
//! [`wait_for_append`](session_store::SessionStore::wait_for_append)
//! registers with the store's one listener: a connection of its own,
//! opened by the first waiter, that runs `LISTEN <prefix>_session_appends`
//! and wakes the waiters of the session each notification names.
//! PostgreSQL delivers a notification only once the append commits, so a
//! woken waiter reads the event. A thousand waiters hold one connection.
//!
//! **A transaction pooler does not carry `LISTEN`.** `LISTEN` belongs to a
//! server session; PgBouncer in transaction mode runs it on whatever
//! server connection it picks and hands that connection to others
//! afterwards, so notifications do not reach the listener. The listener
//! therefore checks delivery — after each `LISTEN`, and every 30 s, it
//! sends itself a probe through the store's own URL and waits for it —
//! and while probes do not arrive, waiters read their session every
//! [`poll_interval`](PgStoreBuilder::poll_interval) (100 ms by default)
//! instead: behind PgBouncer the store polls, and logs a warning once.
//! Give [`notify_url`](PgStoreBuilder::notify_url) a direct URL of the
//! server to be woken instead; statements still go through the pooler.
//! [`listen(false)`](PgStoreBuilder::listen) polls without trying. While
//! notifications arrive, a waiter still reads its session every second (a
//! notification lost with a broken connection delays it by at most that),
//! and [`PgStore::notifications_arrive`] says which way waiters learn now.
//!
//! # Listing is paged by the index
//!
//! [`list_page`](session_store::SessionStore::list_page) is `WHERE live
//! AND session_id > $cursor ORDER BY session_id LIMIT $n + 1` on the
//! partial index of live ids, so a page costs the page, not the table, and
//! deleted sessions cost nothing. Ids compare bytewise (`COLLATE "C"`), as
//! [`SessionId`](lease_port::SessionId) orders them.
//!
//! # The fencing authority
//!
//! [`bind_authority`](session_store::SessionStore::bind_authority) inserts
//! the authority into `<prefix>_store_authority` once (`ON CONFLICT DO
//! NOTHING`, a loser of a race reads the winner's row) and compares. The
//! record carries a random marker; a store instance that has bound hands
//! its marker to every fenced write, which refuses (`Rewound`, or
//! `AuthorityMismatch` for another authority) when the record changed: the
//! tables were made anew, or another database answers the URL, and the
//! marks this process relied on went with them.
//!
//! # State that goes back is refused
//!
//! A restore from a backup or a failover to an asynchronous standby can
//! bring back a mark below a token already accepted. As in pglease, each
//! store instance keeps the highest write-ahead log position any statement
//! ran at, and per session the highest `last_seq` and mark it saw; every
//! write statement is handed them and refuses before writing when the log
//! or the row is below them (a row gone counts), and reads are checked on
//! the answer: [`Rewound`](session_store::StoreErrorKind::Rewound), the
//! message naming what went back. The log position is compared across a
//! promotion, so it catches a failover only until the new primary has
//! written as much WAL as was lost (a refused write writes nothing, other
//! clients' writes count); the session floors do not fade, but cover only
//! the sessions this instance saw. A process started after the loss cannot
//! tell; run with `synchronous_commit = on` (the default), and with a
//! synchronous standby if a failover must never lose an accepted write.
//!
//! # Connections and errors
//!
//! A few connections (default [`DEFAULT_CONNECTIONS`]), one statement at a
//! time each, every statement one unnamed `query_typed` exchange: nothing
//! rests on a connection, so statements go through PgBouncer in
//! transaction mode. A statement not answered within the request timeout
//! is cancelled on the server and its connection dropped. Refusals are the
//! store's kinds; a statement PostgreSQL refused did nothing (`Unavailable`
//! for a passing cause — connection, shutdown, deadlock, a standby —, `Io`
//! otherwise, `Invalid` for data it cannot store); **a write that timed
//! out or lost its connection is `Io` and may have been done**: read the
//! session before writing again. The URL is read by `pg_connect`, as libpq
//! reads it, TLS included (`sslmode=disable|prefer|require|verify-ca|
//! verify-full`, `sslrootcert=FILE` or `system`, `sslcert`/`sslkey`), for
//! the statements, the `LISTEN` connection and the cancels alike; a bad
//! value is `Invalid`, a TLS check that fails says which in the error
//! (`Unavailable`: nothing was sent).
//!
//! # Not offered
//!
//! [`session_lease`](session_store::SessionStore::session_lease) is
//! `None`: a store does not depend on a lease backend. Pair the store with
//! `pglease` on the same database (and name its prefix here), or with any
//! other backend.

mod conn;
mod error;
mod floors;
mod listen;
mod schema;
mod sql;
mod store;

pub use listen::{PROBE_INTERVAL, SAFETY_READ};
pub use schema::SCHEMA_VERSION;
pub use store::{
    DEFAULT_CONNECTIONS, DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_PAGE_BYTES, DEFAULT_POLL_INTERVAL,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_TABLE_PREFIX, MAX_PAGE_EVENTS, MOST_EVENT_BYTES, PgStore,
    PgStoreBuilder,
};
