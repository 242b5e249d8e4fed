//! Session leases in PostgreSQL: the database most session servers already
//! run provides the lease, with no etcd, Redis or Kubernetes to add.
//!
//! # When to choose it
//!
//! Several processes, on any hosts, that reach one PostgreSQL primary. Pick
//! it when the sessions already live in PostgreSQL, or the team would
//! rather run one database than a lease service. Each process holds a
//! handful of connections; renewals of every session a process holds go in
//! one statement ([`renew_many`](lease_port::SessionLease::renew_many)).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
//! use pglease::PgLease;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "postgres://app:secret@db.internal:5432/chat";
//! let a = PgLease::builder(url).ttl(Duration::from_secs(15)).connect().await?;
//! let b = PgLease::builder(url).ttl(Duration::from_secs(15)).connect().await?;
//! let chat = SessionId::new("chat-7")?;
//!
//! let held = a.acquire(&chat, &OwnerId::new("replica-a")?).await?;
//! let err = b.acquire(&chat, &OwnerId::new("replica-b")?).await.unwrap_err();
//! assert_eq!(err.kind(), LeaseErrorKind::Held);
//! a.release(&held).await?;
//! let taken = b.acquire(&chat, &OwnerId::new("replica-b")?).await?;
//! assert!(taken.token() > held.token());
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! One row per session ever leased, in `<prefix>_leases`: the holder, its
//! token and its expiry. Rows are never deleted, so a session's token only
//! grows, across releases, expiries and restarts of every client.
//!
//! - **Acquire** is one `INSERT … ON CONFLICT DO UPDATE … WHERE` statement:
//!   granted when the row is free, expired, or already this owner's; the
//!   conflict branch re-reads the row under its lock, so two racing
//!   acquires never both win. A takeover takes a token above the row's,
//!   the floor asked for, and the database clock in milliseconds: tokens
//!   issued after a restore from an older copy still exceed those the copy
//!   lost.
//! - **Renew** and **release** are conditional `UPDATE`s naming owner and
//!   token; renewing an expired grant succeeds only while its row is
//!   unchanged (nobody took it).
//! - **Expiry is judged by the database's `now()`**, never a client's
//!   clock: a client whose clock runs fast or slow cannot free a session
//!   early. A grant or renewal lives the TTL from the statement's `now()`,
//!   and the client counts it from when it sent the call (no later than
//!   that `now()`); a read of the row says how long its hold has left.
//! - The tables are created, and later upgraded, by the first client that
//!   connects (versioned in `<prefix>_schema`; a database at a newer
//!   version is refused). The authority is `pg:<database>:<id>`, the id
//!   made once with the tables.
//!
//! - A statement not answered within the request timeout is cancelled on
//!   the server and its connection dropped: one stuck on a row lock could
//!   otherwise commit long after its caller gave up (a release landing
//!   after the same owner acquired again would free the new grant).
//!
//! # Behind a transaction pooler
//!
//! It works through PgBouncer in `pool_mode = transaction`: every operation
//! is one statement sent as one unnamed exchange, so a pooler may hand each
//! to any server connection. Nothing rests on a connection — no session
//! advisory lock, no named prepared statement, no `SET`. (Session-level
//! advisory locks are how most PostgreSQL lock libraries lose their locks
//! behind a pooler.)
//!
//! # State that goes back
//!
//! A restore from a backup, or a failover to an asynchronous standby that
//! had not received the last commits, can hand out a token again. Each
//! client notices, and refuses with
//! [`Rewound`](lease_port::LeaseErrorKind::Rewound):
//!
//! - a statement running at a write-ahead log position below one the client
//!   had seen when it sent it;
//! - a session's row showing a lower token than the client was granted, or
//!   gone.
//!
//! The log position is compared across the promotion, so it catches a
//! failover only until the new primary has written as much WAL as the old
//! one wrote after the standby's last receipt. Every write carries the
//! position the client saw and changes nothing on a database behind it, so
//! the refusals themselves do not move the new primary on (nor extend a
//! superseded grant); other clients' writes, and the server's own, still
//! do. The token floor does not fade, but covers only the sessions this
//! client was granted.
//!
//! A client started after the loss cannot tell, so the durability settings
//! decide what a token is worth: run with `synchronous_commit = on` (the
//! default), and with a synchronous standby (`synchronous_standby_names`)
//! if failover must never lose a grant.
//!
//! # Connections
//!
//! The URL is read by `pg_connect` (`postgres://user:password@
//! host:port/database?…`, or `key=value` pairs, as libpq reads them), TLS
//! included: `sslmode=disable|prefer|require|verify-ca|verify-full`,
//! `sslrootcert=FILE` (or `system`), and `sslcert`/`sslkey` for a client
//! certificate. A TLS check that fails (an untrusted certificate, one not
//! naming the host, a server without TLS where the mode requires it) is
//! `Invalid`, its reason kept as the source; plain TCP and Unix sockets
//! work as before.

mod conn;
mod error;
mod floors;
mod lease;
mod schema;
mod sql;

pub use lease::{
    DEFAULT_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT, DEFAULT_TABLE_PREFIX, DEFAULT_TTL, PgLease,
    PgLeaseBuilder,
};
pub use schema::SCHEMA_VERSION;
