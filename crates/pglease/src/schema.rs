//! The tables, created and upgraded by the first client that connects:
//! versioned, so a deployment never runs a manual step, and a database
//! created by a newer version of this crate is refused rather than misread.

use lease_port::{AuthorityId, LeaseError};
use tokio_postgres::error::SqlState;

use crate::conn::Conn;

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// The names of one deployment's tables, all sharing its prefix.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    pub(crate) leases: String,
    pub(crate) authority: String,
    pub(crate) schema: String,
}

impl Tables {
    /// Table names from `prefix`: lowercase ASCII letters, digits and `_`,
    /// starting with a letter or `_`, so it needs no quoting anywhere.
    pub(crate) fn new(prefix: &str) -> Result<Self, LeaseError> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 40
            && prefix.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(LeaseError::invalid(format!(
                "table prefix {prefix:?} must be 1 to 40 lowercase letters, digits or _, \
                 starting with a letter or _"
            )));
        }
        Ok(Self {
            leases: format!("{prefix}_leases"),
            authority: format!("{prefix}_authority"),
            schema: format!("{prefix}_schema"),
        })
    }
}

/// Creates or upgrades the tables, only when they are absent or older: a
/// role allowed to use the tables but not to create any (PostgreSQL 15
/// grants no CREATE on `public` by default) connects to a deployment made
/// by another. Each step is one simple-protocol query, which PostgreSQL
/// runs as one transaction (no explicit `BEGIN`, so a failure never leaves
/// a pooled connection inside an aborted one), serialised among concurrent
/// clients by a transaction-level advisory lock (a session-level one would
/// outlive the transaction on a pooled connection). A table of another
/// application under the same names is refused, not adopted.
pub(crate) async fn migrate(conn: &mut Conn<'_>, t: &Tables) -> Result<(), LeaseError> {
    match version(conn, t).await? {
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        Some(v) if v > SCHEMA_VERSION => {
            return Err(LeaseError::invalid(format!(
                "the lease tables {} are at schema version {v}, newer than the {SCHEMA_VERSION} \
                 this client knows: upgrade this client",
                t.leases
            )));
        }
        _ => {}
    }
    let Tables {
        leases,
        authority,
        schema,
    } = t;
    // Version 1. Rows are never deleted: a released session keeps its last
    // token, so the next grant exceeds it. Created inside the lock only if
    // no client recorded the version meanwhile; without `IF NOT EXISTS`, so
    // a foreign table of the same name fails the creation.
    conn.batch(&format!(
        "SELECT pg_advisory_xact_lock(hashtext('{schema}'));
         CREATE TABLE IF NOT EXISTS {schema} (
             component text PRIMARY KEY,
             version integer NOT NULL
         );
         DO $migrate$
         BEGIN
             IF NOT EXISTS (SELECT 1 FROM {schema} WHERE component = 'leases') THEN
                 CREATE TABLE {leases} (
                     session_id text PRIMARY KEY,
                     owner text,
                     token bigint NOT NULL CHECK (token > 0),
                     expires_at timestamptz,
                     CHECK ((owner IS NULL) = (expires_at IS NULL))
                 );
                 CREATE TABLE {authority} (
                     singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                     id text NOT NULL
                 );
                 INSERT INTO {authority} (id) VALUES (gen_random_uuid()::text);
                 INSERT INTO {schema} (component, version) VALUES ('leases', {SCHEMA_VERSION});
             END IF;
         END
         $migrate$;"
    ))
    .await
    .map_err(|e| {
        LeaseError::new(
            e.kind(),
            format!(
                "the lease tables {leases} and {authority} could not be created (another \
                 application's tables under these names? choose another table prefix): {}",
                e.message()
            ),
        )
    })?;
    match version(conn, t).await? {
        Some(SCHEMA_VERSION) => Ok(()),
        other => Err(LeaseError::invalid(format!(
            "the lease tables {leases} record schema version {other:?} after creation"
        ))),
    }
}

/// The recorded schema version; `None` when there are no tables yet.
async fn version(conn: &mut Conn<'_>, t: &Tables) -> Result<Option<i32>, LeaseError> {
    let deadline = tokio::time::Instant::now() + SETUP_STATEMENT_TIMEOUT;
    let sql = format!(
        "SELECT version FROM {} WHERE component = 'leases'",
        t.schema
    );
    match conn.query(&sql, &[], deadline).await {
        Ok(rows) => Ok(rows.first().map(|r| r.get(0))),
        Err(e) if pg_code(&e) == Some(&SqlState::UNDEFINED_TABLE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// PostgreSQL's error code behind `e`, when it came from the server.
fn pg_code(e: &LeaseError) -> Option<&SqlState> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
        .and_then(tokio_postgres::Error::code)
}

/// Bound on one statement of the set-up.
const SETUP_STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `pg:<database>:<id>`: the id is made once, with the tables, so every
/// client of one deployment names one authority, and a deployment made
/// again (tables dropped and created) is another.
pub(crate) async fn authority(conn: &mut Conn<'_>, t: &Tables) -> Result<AuthorityId, LeaseError> {
    let deadline = tokio::time::Instant::now() + SETUP_STATEMENT_TIMEOUT;
    let rows = conn
        .query(
            &format!("SELECT current_database()::text, id FROM {}", t.authority),
            &[],
            deadline,
        )
        .await?;
    let row = rows
        .first()
        .ok_or_else(|| LeaseError::invalid(format!("{} has no row", t.authority)))?;
    let (db, id): (String, String) = (row.get(0), row.get(1));
    AuthorityId::new(format!("pg:{db}:{id}"))
}
