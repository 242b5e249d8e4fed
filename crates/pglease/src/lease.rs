//! [`PgLease`]: the contract's operations over the statements in `sql`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use crate::conn::Connections;
use crate::floors::{Floors, Mark};
use crate::schema::{self, Tables};
use crate::sql::Statements;

/// Default time a grant lives unless renewed.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// Default bound on one statement, connecting included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default number of connections per client.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// The longest TTL: a century, in milliseconds.
const MAX_TTL_MS: i64 = 100 * 366 * 24 * 3600 * 1000;
/// Default prefix of the tables' names.
pub const DEFAULT_TABLE_PREFIX: &str = "mecatl";

/// Session leases in a PostgreSQL table. Cheap to clone; clones share
/// connections. See the [crate documentation](crate).
#[derive(Clone)]
pub struct PgLease {
    inner: Arc<Inner>,
}

struct Inner {
    conns: Connections,
    sql: Statements,
    ttl: Duration,
    ttl_ms: i64,
    request_timeout: Duration,
    authority: AuthorityId,
    floors: Floors,
}

impl std::fmt::Debug for PgLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLease")
            .field("authority", &self.inner.authority)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

/// Configures a [`PgLease`]; made by [`PgLease::builder`].
#[derive(Clone)]
pub struct PgLeaseBuilder {
    url: String,
    password: Option<String>,
    ttl: Duration,
    request_timeout: Duration,
    connections: usize,
    prefix: String,
}

/// The URL and password are left out: either may carry a secret.
impl std::fmt::Debug for PgLeaseBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLeaseBuilder")
            .field("ttl", &self.ttl)
            .field("request_timeout", &self.request_timeout)
            .field("connections", &self.connections)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl PgLeaseBuilder {
    /// How long a grant lives unless renewed. Default [`DEFAULT_TTL`];
    /// whole milliseconds, at least one.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Bound on one statement, connecting included; past it the call
    /// fails `Transient` (its outcome unknown). Default
    /// [`DEFAULT_REQUEST_TIMEOUT`].
    pub fn request_timeout(mut self, bound: Duration) -> Self {
        self.request_timeout = bound;
        self
    }

    /// Connections this client keeps. Default [`DEFAULT_CONNECTIONS`].
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// The password to log in with, in place of any the URL carries: read
    /// from a file by the caller, so it appears in no URL, process list or
    /// log.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Prefix of the tables' names (`<prefix>_leases`, `<prefix>_authority`,
    /// `<prefix>_schema`): clients sharing sessions share it. Default
    /// [`DEFAULT_TABLE_PREFIX`].
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Connects, creates or upgrades the tables, and reads the authority.
    /// `Invalid` for a bad URL, TTL or prefix, or tables of a newer schema;
    /// `Transient` when the database cannot be reached in time.
    pub async fn connect(self) -> Result<PgLease, LeaseError> {
        let mut config = pg_connect::PgConfig::parse(&self.url)
            .map_err(|e| LeaseError::invalid(e.to_string()).with_source(e))?;
        if let Some(password) = &self.password {
            config.pg_mut().password(password);
        }
        // Whole milliseconds, as the statements count, and well inside what
        // PostgreSQL's timestamps hold.
        let ttl_ms = i64::try_from(self.ttl.as_millis())
            .ok()
            .filter(|ms| *ms > 0 && *ms <= MAX_TTL_MS)
            .filter(|_| self.ttl.subsec_nanos().is_multiple_of(1_000_000))
            .ok_or_else(|| {
                LeaseError::invalid(format!(
                    "the TTL {:?} must be whole milliseconds, from 1 ms to 100 years",
                    self.ttl
                ))
            })?;
        let tables = Tables::new(&self.prefix)?;
        let conns = Connections::new(config, self.connections, self.request_timeout);
        let setup = async {
            let mut conn = conns.get().await?;
            schema::migrate(&mut conn, &tables).await?;
            schema::authority(&mut conn, &tables).await
        };
        let authority = tokio::time::timeout(self.request_timeout * 4, setup)
            .await
            .map_err(|_| {
                LeaseError::transient(format!(
                    "PostgreSQL did not finish setting up the lease tables within {:?}",
                    self.request_timeout * 4
                ))
            })??;
        Ok(PgLease {
            inner: Arc::new(Inner {
                conns,
                sql: Statements::new(&tables),
                ttl: self.ttl,
                ttl_ms,
                request_timeout: self.request_timeout,
                authority,
                floors: Floors::default(),
            }),
        })
    }
}

/// A `bigint` column that may be NULL.
fn opt_i64(row: &Row, i: usize) -> Result<Option<i64>, LeaseError> {
    row.try_get(i)
        .map_err(|e| LeaseError::invalid("PostgreSQL answered an unreadable row").with_source(e))
}

fn text(row: &Row, i: usize) -> Result<Option<String>, LeaseError> {
    row.try_get(i)
        .map_err(|e| LeaseError::invalid("PostgreSQL answered an unreadable row").with_source(e))
}

fn token_of(t: i64) -> Result<FencingToken, LeaseError> {
    u64::try_from(t)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken::new)
        .ok_or_else(|| LeaseError::invalid(format!("PostgreSQL holds token {t}, not a token")))
}

/// Milliseconds left as a duration; a lease answered already over counts
/// as having none.
fn left(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The token as the table holds it; `None` for one it could never hold,
/// which this backend therefore never issued.
fn issuable(token: FencingToken) -> Option<i64> {
    i64::try_from(token.get()).ok()
}

fn token_param(token: FencingToken) -> Result<i64, LeaseError> {
    i64::try_from(token.get())
        .map_err(|_| LeaseError::invalid(format!("token {token} exceeds PostgreSQL's bigint")))
}

impl PgLease {
    /// A builder connecting to `url` (`postgres://user:pass@host:port/db`,
    /// or `key=value` pairs; libpq's TLS keys included, see `pg_connect`).
    pub fn builder(url: impl Into<String>) -> PgLeaseBuilder {
        PgLeaseBuilder {
            url: url.into(),
            password: None,
            ttl: DEFAULT_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            prefix: DEFAULT_TABLE_PREFIX.to_owned(),
        }
    }

    /// The TTL this client grants.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// One statement on a connection, answered within the request timeout
    /// (waiting for a free connection included) or cancelled.
    async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, LeaseError> {
        let bound = self.inner.request_timeout;
        let deadline = tokio::time::Instant::now() + bound;
        let mut conn = tokio::time::timeout_at(deadline, self.inner.conns.get())
            .await
            .map_err(|_| {
                LeaseError::transient(format!(
                    "no connection to PostgreSQL was free or could be opened within {bound:?}"
                ))
            })??;
        conn.query(sql, params, deadline).await
    }

    /// The last column of every statement: the log position it ran at,
    /// held against what was seen before the statement was sent.
    fn check_lsn(&self, row: &Row, i: usize, mark: &Mark) -> Result<(), LeaseError> {
        match text(row, i)? {
            Some(lsn) => self.inner.floors.note_lsn(&lsn, mark),
            None => Err(LeaseError::invalid("PostgreSQL answered no log position")),
        }
    }

    /// The session's row as it is, read after a refusal: who holds it
    /// (when live), its token, and how long its hold has left.
    async fn read_row(
        &self,
        session: &SessionId,
        mark: &Mark,
    ) -> Result<(Option<String>, Option<i64>, Option<i64>), LeaseError> {
        let rows = self
            .query(&self.inner.sql.row, &[(&session.as_str(), Type::TEXT)])
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| LeaseError::invalid("PostgreSQL answered a row read with no row"))?;
        self.check_lsn(row, 3, mark)?;
        Ok((text(row, 0)?, opt_i64(row, 1)?, opt_i64(row, 2)?))
    }

    async fn acquire_from(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        let floor = token_param(floor)?;
        let mark = self.inner.floors.mark(Some(session));
        let sent = SystemTime::now();
        let rows = self
            .query(
                &self.inner.sql.acquire,
                &[
                    (&session.as_str(), Type::TEXT),
                    (&owner.as_str(), Type::TEXT),
                    (&self.inner.ttl_ms, Type::INT8),
                    (&floor, Type::INT8),
                    (&mark.lsn_text(), Type::TEXT),
                ],
            )
            .await?;
        let Some(row) = rows.first() else {
            // Held: a fresh read names the holder (racing takeovers
            // included) and says how long it holds.
            let (holder, token, ms) = self.read_row(session, &mark).await?;
            self.inner.floors.check_row(session, token, &mark)?;
            let ms = ms.filter(|ms| *ms > 0);
            return Err(match (holder, ms) {
                (Some(h), Some(ms)) if h != owner.as_str() => {
                    LeaseError::held(Some(OwnerId::new(h)?)).with_held_for(left(ms))
                }
                _ => LeaseError::held(None),
            });
        };
        self.check_lsn(row, 1, &mark)?;
        let token = token_of(
            opt_i64(row, 0)?.ok_or_else(|| LeaseError::invalid("PostgreSQL granted no token"))?,
        )?;
        // A grant below what this client had been granted: the row lost
        // its history.
        self.inner
            .floors
            .check_row(session, Some(token.get() as i64), &mark)?;
        self.inner.floors.note_grant(session, token);
        // The grant lives the TTL from the statement's `now()`, which is no
        // earlier than the sending.
        Ok(Lease::new(
            session.clone(),
            owner.clone(),
            token,
            sent + self.inner.ttl,
        ))
    }

    /// Why a renewal found no row of its grant: another holder (`Held`),
    /// the hold released or lapsed and taken (`Held`), or a row that shows
    /// less than this client had been granted (`Rewound`).
    fn lost(
        &self,
        session: &SessionId,
        owner: Option<String>,
        token: Option<i64>,
        ms: Option<i64>,
        mark: &Mark,
    ) -> Result<Lease, LeaseError> {
        self.inner.floors.check_row(session, token, mark)?;
        let live = ms.is_some_and(|ms| ms > 0);
        let holder = match owner {
            Some(o) if live => Some(OwnerId::new(o)?),
            _ => None,
        };
        Err(LeaseError::held(holder))
    }

    async fn renew_batch(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Lease, LeaseError>>, LeaseError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let sessions: Vec<&str> = leases.iter().map(|l| l.session_id().as_str()).collect();
        let owners: Vec<&str> = leases.iter().map(|l| l.owner().as_str()).collect();
        // A token no bigint holds was never issued here: it matches no row,
        // and is answered `Held` like any stale value.
        let tokens: Vec<i64> = leases
            .iter()
            .map(|l| issuable(l.token()).unwrap_or(0))
            .collect();
        let marks: Vec<Mark> = leases
            .iter()
            .map(|l| self.inner.floors.mark(Some(l.session_id())))
            .collect();
        // The log position is one for the whole client.
        let seen = marks
            .first()
            .map_or_else(|| self.inner.floors.mark(None), |m| *m)
            .lsn_text();
        let sent = SystemTime::now();
        let rows = self
            .query(
                &self.inner.sql.renew_many,
                &[
                    (&sessions, Type::TEXT_ARRAY),
                    (&owners, Type::TEXT_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&self.inner.ttl_ms, Type::INT8),
                    (&seen, Type::TEXT),
                ],
            )
            .await?;
        if rows.len() != leases.len() {
            return Err(LeaseError::invalid(format!(
                "PostgreSQL answered {} rows for a batch of {} renewals",
                rows.len(),
                leases.len()
            )));
        }
        // One row per lease, in the order asked (`WITH ORDINALITY`). Each
        // renewed lease lives the TTL from when the batch was sent (the
        // statement set `now() + TTL`, and `now()` is no earlier than the
        // sending); a lease not renewed has its row read for the reason.
        let mut out = Vec::with_capacity(leases.len());
        for ((lease, row), mark) in leases.iter().zip(&rows).zip(&marks) {
            self.check_lsn(row, 2, mark)?;
            let renewed: bool = row.try_get(1).map_err(|e| {
                LeaseError::invalid("PostgreSQL answered an unreadable row").with_source(e)
            })?;
            out.push(if renewed {
                Ok(lease.with_expiry(sent + self.inner.ttl))
            } else {
                match self.read_row(lease.session_id(), mark).await {
                    Ok((owner, token, ms)) => self.lost(lease.session_id(), owner, token, ms, mark),
                    Err(e) => Err(e),
                }
            });
        }
        Ok(out)
    }
}

#[async_trait]
impl SessionLease for PgLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.acquire_from(session, owner, FencingToken::new(0))
            .await
    }

    /// The floor is applied in the same statement as the grant.
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        floor.check_floor()?;
        self.acquire_from(session, owner, floor).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let session = lease.session_id();
        let Some(token) = issuable(lease.token()) else {
            return Err(LeaseError::held(None));
        };
        let mark = self.inner.floors.mark(Some(session));
        let sent = SystemTime::now();
        let rows = self
            .query(
                &self.inner.sql.renew,
                &[
                    (&session.as_str(), Type::TEXT),
                    (&lease.owner().as_str(), Type::TEXT),
                    (&token, Type::INT8),
                    (&self.inner.ttl_ms, Type::INT8),
                    (&mark.lsn_text(), Type::TEXT),
                ],
            )
            .await?;
        if let Some(row) = rows.first() {
            self.check_lsn(row, 0, &mark)?;
            return Ok(lease.with_expiry(sent + self.inner.ttl));
        }
        let (owner, token, ms) = self.read_row(session, &mark).await?;
        self.lost(session, owner, token, ms, &mark)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let session = lease.session_id();
        let Some(token) = issuable(lease.token()) else {
            return Ok(()); // never issued here: nothing of it to release
        };
        let mark = self.inner.floors.mark(Some(session));
        let rows = self
            .query(
                &self.inner.sql.release,
                &[
                    (&session.as_str(), Type::TEXT),
                    (&lease.owner().as_str(), Type::TEXT),
                    (&token, Type::INT8),
                    (&mark.lsn_text(), Type::TEXT),
                ],
            )
            .await?;
        if let Some(row) = rows.first() {
            return self.check_lsn(row, 1, &mark);
        }
        // Nothing of this grant was held; unless the table went back.
        let (_, token, _) = self.read_row(session, &mark).await?;
        self.inner.floors.check_row(session, token, &mark)
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        Ok(self.inner.authority.clone())
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let mark = self.inner.floors.mark(None);
        let sent = SystemTime::now();
        let rows = self
            .query(&self.inner.sql.current, &[(&session.as_str(), Type::TEXT)])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        self.check_lsn(row, 3, &mark)?;
        let owner = text(row, 0)?
            .map(OwnerId::new)
            .transpose()?
            .ok_or_else(|| LeaseError::invalid("PostgreSQL answered a holder with no owner"))?;
        let token = opt_i64(row, 1)?
            .ok_or_else(|| LeaseError::invalid("PostgreSQL answered a holder with no token"))?;
        let ms = opt_i64(row, 2)?.unwrap_or(0);
        Ok(Some(Lease::new(
            session.clone(),
            owner,
            token_of(token)?,
            sent + left(ms),
        )))
    }

    /// Every lease in one statement.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        match self.renew_batch(leases).await {
            Ok(out) => out,
            Err(e) => leases
                .iter()
                .map(|_| Err(LeaseError::new(e.kind(), e.message().to_owned())))
                .collect(),
        }
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.inner.ttl)
    }
}
