//! The tables, created and upgraded by the first client that connects:
//! versioned, so a deployment never runs a manual step, and a database
//! written by a newer version of this crate is refused rather than misread.

use std::time::Duration;

use session_store::StoreError;
use tokio_postgres::error::SqlState;

use crate::conn::Connections;
use crate::error::{Op, invalid, store_error};

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// The component this crate records in the shared `<prefix>_schema` table
/// (the leases of `pglease` record theirs as `leases`).
pub(crate) const COMPONENT: &str = "store";

/// Bound on one statement of the set-up.
const SETUP_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The names of one deployment's tables, all sharing its prefix.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    pub(crate) sessions: String,
    pub(crate) events: String,
    pub(crate) authority: String,
    pub(crate) schema: String,
    /// Cancel requests, one row per session asked to stop a run.
    pub(crate) cancels: String,
    /// The `NOTIFY` channel appends, deletions and cancel requests are
    /// announced on.
    pub(crate) channel: String,
}

/// A table prefix: lowercase ASCII letters, digits and `_`, starting with
/// a letter or `_`, at most 40 bytes, so every name built from it needs no
/// quoting anywhere and stays within PostgreSQL's 63-byte identifiers.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), StoreError> {
    let valid = !prefix.is_empty()
        && prefix.len() <= 40
        && prefix.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(invalid(format!(
            "table prefix {prefix:?} must be 1 to 40 lowercase letters, digits or _, starting \
             with a letter or _"
        )))
    }
}

impl Tables {
    pub(crate) fn new(prefix: &str) -> Result<Self, StoreError> {
        check_prefix(prefix)?;
        Ok(Self {
            sessions: format!("{prefix}_sessions"),
            events: format!("{prefix}_events"),
            authority: format!("{prefix}_store_authority"),
            schema: format!("{prefix}_schema"),
            cancels: format!("{prefix}_cancel_requests"),
            channel: format!("{prefix}_session_appends"),
        })
    }
}

/// Creates or upgrades the tables, only when they are absent or older: a
/// role allowed to use the tables but not to create any connects to a
/// deployment made by another. The step is one simple-protocol batch,
/// which PostgreSQL runs as one transaction, serialised among concurrent
/// clients (this crate's and pglease's, which share `<prefix>_schema`) by
/// a transaction-level advisory lock (a session-level one would outlive
/// the transaction on a pooled connection). A table of another application
/// under the same names fails the creation, and is refused, not adopted.
pub(crate) async fn migrate(
    conns: &Connections,
    t: &Tables,
    location: &str,
) -> Result<(), StoreError> {
    match version(conns, t, location).await? {
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        Some(v) if v > SCHEMA_VERSION => {
            return Err(invalid(format!(
                "the session tables {} are at schema version {v}, newer than the \
                 {SCHEMA_VERSION} this client knows: upgrade this client",
                t.sessions
            )));
        }
        _ => {}
    }
    let sql = setup_sql(t);
    let Tables {
        sessions,
        events,
        authority,
        cancels,
        ..
    } = t;
    conns
        .batch(&sql, SETUP_STATEMENT_TIMEOUT)
        .await
        .map_err(|e| {
            if e.code() == Some(&SqlState::DUPLICATE_TABLE) {
                return invalid(format!(
                    "the tables {sessions}, {events}, {authority} and {cancels} could not be \
                     created: {e} \
                     (another application's tables under these names? choose another table \
                     prefix)"
                ));
            }
            store_error(e, "creating the session tables", location, Op::Write)
        })?;
    match version(conns, t, location).await? {
        Some(SCHEMA_VERSION) => Ok(()),
        other => Err(invalid(format!(
            "the session tables {sessions} record schema version {other:?} after creation"
        ))),
    }
}

/// The set-up batch: the tables of every version up to
/// [`SCHEMA_VERSION`], each version's step run only on tables recorded at
/// the version before it.
fn setup_sql(t: &Tables) -> String {
    let Tables {
        sessions,
        events,
        authority,
        schema,
        cancels,
        ..
    } = t;
    // Version 1. Session rows are never deleted: a deleted session keeps
    // its mark and its last sequence number. `erased_through` hides the
    // events of earlier lives of a session (see `sql`). Ids are compared
    // bytewise (`COLLATE "C"`), as Rust compares them, so the listing's
    // order is the index's order.
    format!(
        "SELECT pg_advisory_xact_lock(hashtext('{schema}'));
         CREATE TABLE IF NOT EXISTS {schema} (
             component text PRIMARY KEY,
             version integer NOT NULL
         );
         DO $migrate$
         BEGIN
             IF NOT EXISTS (SELECT 1 FROM {schema} WHERE component = '{COMPONENT}') THEN
                 CREATE TABLE {sessions} (
                     session_id text COLLATE \"C\" PRIMARY KEY,
                     live boolean NOT NULL,
                     last_seq bigint NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
                     erased_through bigint NOT NULL DEFAULT 0
                         CHECK (erased_through >= 0 AND erased_through <= last_seq),
                     mark numeric(20, 0)
                         CHECK (mark >= 0 AND mark <= 18446744073709551615),
                     mark_writer text,
                     CHECK ((mark IS NULL) = (mark_writer IS NULL))
                 );
                 CREATE INDEX {sessions}_live ON {sessions} (session_id) WHERE live;
                 CREATE TABLE {events} (
                     session_id text COLLATE \"C\" NOT NULL,
                     seq bigint NOT NULL CHECK (seq > 0),
                     token numeric(20, 0),
                     writer text,
                     at timestamptz NOT NULL,
                     bytes integer NOT NULL CHECK (bytes >= 0),
                     payload json NOT NULL,
                     PRIMARY KEY (session_id, seq),
                     CHECK ((token IS NULL) = (writer IS NULL))
                 );
                 CREATE TABLE {authority} (
                     singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                     authority text NOT NULL,
                     marker text NOT NULL,
                     bound_at timestamptz NOT NULL DEFAULT now()
                 );
                 INSERT INTO {schema} (component, version) VALUES ('{COMPONENT}', 1);
             END IF;
             -- Version 2: cancel requests. Advice to a run's holder, never
             -- a write to the session, so not fenced; the run token only
             -- rises and the count only grows (see `sql`).
             IF (SELECT version FROM {schema} WHERE component = '{COMPONENT}') = 1 THEN
                 CREATE TABLE {cancels} (
                     session_id text COLLATE \"C\" PRIMARY KEY,
                     run numeric(20, 0) NOT NULL
                         CHECK (run >= 0 AND run <= 18446744073709551615),
                     serial bigint NOT NULL CHECK (serial > 0)
                 );
                 UPDATE {schema} SET version = 2 WHERE component = '{COMPONENT}';
             END IF;
         END
         $migrate$;"
    )
}

/// The recorded schema version; `None` when there are no tables yet.
async fn version(
    conns: &Connections,
    t: &Tables,
    location: &str,
) -> Result<Option<i32>, StoreError> {
    let sql = format!(
        "SELECT version FROM {} WHERE component = '{COMPONENT}'",
        t.schema
    );
    match conns.query(&sql, &[]).await {
        Ok(rows) => Ok(rows.first().map(|r| r.get(0))),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(None),
        Err(e) => Err(store_error(
            e,
            "reading the schema version",
            location,
            Op::Read,
        )),
    }
}

/// Checks that the lease table of the same database the append checks
/// (`<lease_prefix>_leases`, pglease's) exists with the columns it reads.
pub(crate) async fn check_lease_table(
    conns: &Connections,
    leases: &str,
    location: &str,
) -> Result<(), StoreError> {
    let sql = format!("SELECT session_id, owner, token, expires_at FROM {leases} LIMIT 0");
    match conns.query(&sql, &[]).await {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.code(),
                Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::UNDEFINED_COLUMN
            ) =>
        {
            Err(invalid(format!(
                "the store checks the leases of table {leases}, which does not exist in this \
                 database with the columns of pglease's lease table ({e}): connect the \
                 PostgreSQL leases (pglease) with the same table prefix first, or name their \
                 prefix"
            )))
        }
        Err(e) => Err(store_error(
            e,
            "checking the lease table",
            location,
            Op::Read,
        )),
    }
}
