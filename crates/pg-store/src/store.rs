//! [`PgStore`]: the builder, and the store contract's operations over the
//! statements in `sql`.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, OwnerId, SessionId};
use pg_connect::PgConfig;
use serde_json::Value;
use session_store::{
    AppendReceipt, CancelRequest, ListCursor, Page, SessionPage, SessionStore, StoreError,
    StoreErrorKind, StoredEvent, WriteFence, check_list_limit,
};
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql, Type};

use crate::conn::{Connections, Failure};
use crate::error::{Op, corrupt, invalid, store_error};
use crate::floors::{Floors, Sent, SessionFloor};
use crate::listen::{Appends, CANCEL_MARK, Mode};
use crate::schema::{self, Tables};
use crate::sql::Statements;

/// An append's events serialised, and their sizes (`$10`, `$11`).
type Batch = (Vec<String>, Vec<i32>);

/// Default prefix of the tables' names, the one pglease uses too.
pub const DEFAULT_TABLE_PREFIX: &str = "mecatl";
/// The largest event accepted when none is configured, serialised.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;
/// The most bytes of events one page holds when none is configured (a page
/// always holds at least one event).
pub const DEFAULT_MAX_PAGE_BYTES: usize = 4 << 20;
/// The most events one page holds, whatever the caller's limit.
pub const MAX_PAGE_EVENTS: usize = 10_000;
/// The largest event limit that may be configured.
pub const MOST_EVENT_BYTES: usize = 256 << 20;
/// Default bound on one statement, waiting for a connection included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default number of connections per store (the `LISTEN` one aside).
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Default interval at which a waiter reads its session while
/// notifications do not arrive.
pub const DEFAULT_POLL_INTERVAL: Duration = session_store::APPEND_POLL_INTERVAL;

/// The `application_name` of the `LISTEN` connection.
const LISTEN_APPLICATION: &str = "pg-session-store listen";

/// Where waiters' notifications come from.
#[derive(Clone)]
enum NotifyVia {
    StoreUrl,
    Url(String),
    Off,
}

/// Configures and connects a [`PgStore`]; made by [`PgStore::builder`].
#[derive(Clone)]
pub struct PgStoreBuilder {
    url: String,
    password: Option<String>,
    prefix: String,
    lease_prefix: Option<String>,
    allow_unfenced: bool,
    max_event_bytes: usize,
    max_page_bytes: usize,
    request_timeout: Duration,
    connections: usize,
    notify: NotifyVia,
    poll_interval: Duration,
}

/// The URLs and password are left out: each may carry a secret.
impl fmt::Debug for PgStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStoreBuilder")
            .field("prefix", &self.prefix)
            .field("lease_prefix", &self.lease_prefix)
            .field("allow_unfenced", &self.allow_unfenced)
            .field("max_event_bytes", &self.max_event_bytes)
            .field("max_page_bytes", &self.max_page_bytes)
            .field("request_timeout", &self.request_timeout)
            .field("connections", &self.connections)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

impl PgStoreBuilder {
    /// The password to log in with, in place of any the URL carries (and
    /// of the notification URL's, when that carries none): read from a file
    /// by the caller, so it appears in no URL, process list or log.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Prefix of the tables' names (`<prefix>_sessions`, `<prefix>_events`,
    /// `<prefix>_store_authority`, and the shared `<prefix>_schema`):
    /// clients sharing sessions share it. Default [`DEFAULT_TABLE_PREFIX`].
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Check every fenced write against the live lease row in
    /// `<lease_prefix>_leases` of the same database — pglease's table, with
    /// the prefix its clients were given (`mecatl` by default): the lease
    /// must be unexpired, hold exactly the write's token, and belong to the
    /// write's owner (see the [crate documentation](crate)). A writer whose
    /// lease was taken over is then refused at once, before the new owner
    /// writes. Off by default: tokens from another authority carry no row
    /// here. The lease table must exist when the store connects.
    pub fn leases_in_same_database(mut self, lease_prefix: impl Into<String>) -> Self {
        self.lease_prefix = Some(lease_prefix.into());
        self
    }

    /// Accept unfenced writes to sessions that never accepted a fenced one
    /// (default false). Only for a deployment that proves a single writer.
    pub fn allow_unfenced(mut self, allow: bool) -> Self {
        self.allow_unfenced = allow;
        self
    }

    /// The largest event accepted, serialised (default
    /// [`DEFAULT_MAX_EVENT_BYTES`], at most [`MOST_EVENT_BYTES`]).
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// The most bytes of events a page holds (default
    /// [`DEFAULT_MAX_PAGE_BYTES`]).
    pub fn max_page_bytes(mut self, bytes: usize) -> Self {
        self.max_page_bytes = bytes;
        self
    }

    /// Bound on one statement, waiting for a connection included (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]). Past it the statement is cancelled: a
    /// write is then `Io` (it may have been done), a read `Unavailable`.
    pub fn request_timeout(mut self, bound: Duration) -> Self {
        self.request_timeout = bound;
        self
    }

    /// Connections this store keeps for statements (default
    /// [`DEFAULT_CONNECTIONS`]); waiters add one `LISTEN` connection.
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// `LISTEN` on this URL instead of the store's: a direct connection to
    /// the server when the store's URL is a transaction pooler, which does
    /// not carry `LISTEN`.
    pub fn notify_url(mut self, url: impl Into<String>) -> Self {
        self.notify = NotifyVia::Url(url.into());
        self
    }

    /// Whether waiters listen for notifications (default true). Without,
    /// they read their session every [`poll_interval`](Self::poll_interval).
    pub fn listen(mut self, listen: bool) -> Self {
        self.notify = match (listen, self.notify) {
            (false, _) => NotifyVia::Off,
            (true, NotifyVia::Off) => NotifyVia::StoreUrl,
            (true, other) => other,
        };
        self
    }

    /// How often a waiter reads its session while notifications do not
    /// arrive (default [`DEFAULT_POLL_INTERVAL`]).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    fn check(&self) -> Result<(), StoreError> {
        if !(1..=MOST_EVENT_BYTES).contains(&self.max_event_bytes) {
            return Err(invalid(format!(
                "the event size limit must be within 1..={MOST_EVENT_BYTES} bytes"
            )));
        }
        if self.max_page_bytes == 0 {
            return Err(invalid("the page size limit must be at least one byte"));
        }
        if self.request_timeout.is_zero() || self.poll_interval.is_zero() {
            return Err(invalid(
                "the request timeout and the poll interval must be longer than zero",
            ));
        }
        Ok(())
    }

    fn config(&self, url: &str) -> Result<PgConfig, StoreError> {
        let mut config = PgConfig::parse(url).map_err(|e| invalid(e.to_string()))?;
        if let Some(password) = &self.password
            && (url == self.url || config.pg().get_password().is_none())
        {
            config.pg_mut().password(password);
        }
        Ok(config)
    }

    /// Connects, creates or upgrades the tables (and checks the lease
    /// table when configured). `Invalid` for a bad URL, prefix or option,
    /// tables of a newer schema, or a missing lease table; `Unavailable`
    /// when the database cannot be reached in time.
    pub async fn connect(self) -> Result<PgStore, StoreError> {
        self.check()?;
        let config = self.config(&self.url)?;
        let tables = Tables::new(&self.prefix)?;
        let lease_table = match &self.lease_prefix {
            Some(p) => {
                schema::check_prefix(p)?;
                Some(format!("{p}_leases"))
            }
            None => None,
        };
        let location = config.location();
        let conns = Connections::new(config.clone(), self.connections, self.request_timeout);
        let setup = async {
            schema::migrate(&conns, &tables, &location).await?;
            match &lease_table {
                Some(leases) => schema::check_lease_table(&conns, leases, &location).await,
                None => Ok(()),
            }
        };
        let bound = self.request_timeout * 4;
        tokio::time::timeout(bound, setup).await.map_err(|_| {
            store_error(
                Failure::NotSent(format!("the set-up did not finish within {bound:?}"), None),
                "setting up the session tables",
                &location,
                Op::Read,
            )
        })??;
        let mode = match &self.notify {
            NotifyVia::Off => Mode::Poll,
            via => {
                let mut listen = match via {
                    NotifyVia::Url(url) => self.config(url)?,
                    _ => config.clone(),
                };
                listen.pg_mut().application_name(LISTEN_APPLICATION);
                Mode::Listen(Box::new(listen))
            }
        };
        let appends = Appends::new(
            mode,
            config,
            tables.channel.clone(),
            self.request_timeout,
            self.poll_interval,
        );
        Ok(PgStore {
            inner: Arc::new(Inner {
                sql: Statements::new(&tables, lease_table.as_deref()),
                conns,
                tables,
                location,
                lease_table,
                allow_unfenced: self.allow_unfenced,
                max_event_bytes: self.max_event_bytes,
                max_page_bytes: self.max_page_bytes,
                floors: Floors::default(),
                bound: OnceLock::new(),
                appends,
            }),
        })
    }
}

/// [`SessionStore`] in PostgreSQL tables (see the [crate
/// documentation](crate) for the rules, the tables and the statements).
///
/// Cheap to clone: clones share connections, the `LISTEN` connection and
/// what the store saw.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    conns: Connections,
    sql: Statements,
    tables: Tables,
    location: String,
    lease_table: Option<String>,
    allow_unfenced: bool,
    max_event_bytes: usize,
    max_page_bytes: usize,
    floors: Floors,
    /// The authority this instance bound, and the marker of the record
    /// (made when the record was written). Every fenced write checks that
    /// the record still holds exactly that marker: a record written again
    /// (the tables dropped and made anew, another database behind the URL)
    /// refuses an instance bound before.
    bound: OnceLock<(AuthorityId, String)>,
    appends: Appends,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.inner.location)
            .field("sessions", &self.inner.tables.sessions)
            .field("lease_table", &self.inner.lease_table)
            .finish_non_exhaustive()
    }
}

/// One column of a row this crate's statements answered.
fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize, table: &str) -> Result<T, StoreError> {
    row.try_get(i).map_err(|e| {
        corrupt(
            table,
            format!("PostgreSQL answered an unreadable column {i}: {e}"),
        )
    })
}

/// A decimal token or mark as the tables hold it.
fn token_of(text: &str, table: &str) -> Result<u64, StoreError> {
    text.parse()
        .map_err(|_| corrupt(table, format!("{text:?} is not a token")))
}

/// A session row's sequence number and mark, as answered.
fn row_floor(
    seq: Option<i64>,
    mark: Option<&str>,
    table: &str,
) -> Result<Option<SessionFloor>, StoreError> {
    let Some(seq) = seq else { return Ok(None) };
    let seq = u64::try_from(seq).map_err(|_| corrupt(table, format!("sequence number {seq}")))?;
    let mark = mark.map(|m| token_of(m, table)).transpose()?;
    Ok(Some(SessionFloor { seq, mark }))
}

/// One fenced write's answer (see `sql::answer`).
struct Verdict {
    verdict: String,
    row: Option<SessionFloor>,
    mark_writer: Option<String>,
    last_seq: Option<i64>,
    written: Option<i64>,
    recorded: Option<String>,
    lsn: Option<String>,
    lease_owner: Option<String>,
    lease_token: Option<String>,
    lease_live: Option<bool>,
}

impl Verdict {
    fn read(row: &Row, table: &str) -> Result<Verdict, StoreError> {
        let mark: Option<String> = col(row, 2, table)?;
        Ok(Verdict {
            verdict: col(row, 0, table)?,
            row: row_floor(col(row, 1, table)?, mark.as_deref(), table)?,
            mark_writer: col(row, 3, table)?,
            last_seq: col(row, 4, table)?,
            written: col(row, 5, table)?,
            recorded: col(row, 7, table)?,
            lsn: col(row, 8, table)?,
            lease_owner: col(row, 9, table)?,
            lease_token: col(row, 10, table)?,
            lease_live: col(row, 11, table)?,
        })
    }
}

impl PgStore {
    /// A builder connecting to `url` (`postgres://user:pass@host:port/db`,
    /// or `key=value` pairs; libpq's TLS keys included, see `pg_connect`).
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder {
            url: url.into(),
            password: None,
            prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            lease_prefix: None,
            allow_unfenced: false,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_page_bytes: DEFAULT_MAX_PAGE_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            notify: NotifyVia::StoreUrl,
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }

    /// Whether notifications reach this store's waiters now: false before
    /// the first wait, with [`listen(false)`](PgStoreBuilder::listen),
    /// while the `LISTEN` connection is down, and behind a transaction
    /// pooler without a [`notify_url`](PgStoreBuilder::notify_url) —
    /// waiters then poll.
    pub fn notifications_arrive(&self) -> bool {
        self.inner.appends.arriving()
    }

    /// The lease table every fenced write checks, when configured
    /// ([`PgStoreBuilder::leases_in_same_database`]).
    pub fn lease_table(&self) -> Option<&str> {
        self.inner.lease_table.as_deref()
    }

    /// The lease authority pglease records under `lease_prefix` in this
    /// store's database (`pg:<database>:<id>`, as `pglease::PgLease`
    /// answers it), or `None` when there are no such lease tables here.
    ///
    /// Equal to a lease backend's authority, it proves the leases live in
    /// this very database, however the two URLs spell it (a host alias, a
    /// pooler in front): the condition for
    /// [`leases_in_same_database`](PgStoreBuilder::leases_in_same_database).
    pub async fn lease_authority(
        &self,
        lease_prefix: &str,
    ) -> Result<Option<AuthorityId>, StoreError> {
        schema::check_prefix(lease_prefix)?;
        let table = format!("{lease_prefix}_authority");
        let sql = format!("SELECT current_database()::text, id FROM {table}");
        let rows = match self.inner.conns.query(&sql, &[]).await {
            Ok(rows) => rows,
            Err(f) if f.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                return Ok(None);
            }
            Err(f) => return Err(self.failed("reading the lease authority", Op::Read)(f)),
        };
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let (db, id): (String, String) = (col(row, 0, &table)?, col(row, 1, &table)?);
        AuthorityId::new(format!("pg:{db}:{id}"))
            .map(Some)
            .map_err(|_| corrupt(&table, format!("not an authority id: {id:?}")))
    }

    fn failed(&self, what: &'static str, op: Op) -> impl Fn(Failure) -> StoreError + '_ {
        move |f| store_error(f, what, &self.inner.location, op)
    }

    fn bound_marker(&self) -> &str {
        self.inner.bound.get().map_or("", |(_, m)| m.as_str())
    }

    /// The events serialised, with their sizes: `Invalid` for an empty
    /// batch or an event over the limit, before anything is sent.
    fn serialise(&self, events: &[Value]) -> Result<Batch, StoreError> {
        if events.is_empty() {
            return Err(invalid("an append needs at least one event"));
        }
        let mut texts = Vec::with_capacity(events.len());
        let mut sizes = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let text = serde_json::to_string(event).map_err(|e| {
                invalid(format!("event {i} of the batch cannot be serialised: {e}"))
            })?;
            if text.len() > self.inner.max_event_bytes {
                return Err(invalid(format!(
                    "event {i} of the batch is {} bytes serialised, over the limit of {}",
                    text.len(),
                    self.inner.max_event_bytes
                )));
            }
            sizes.push(i32::try_from(text.len()).unwrap_or(i32::MAX));
            texts.push(text);
        }
        Ok((texts, sizes))
    }

    /// Appends `events`; with `after`, only onto a log whose last seq it
    /// is (`None` when the log moved past it: nothing written).
    async fn append_at(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: Option<u64>,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        let batch = self.serialise(events)?;
        let sql = &self.inner.sql.append;
        // Above i64::MAX no log can be: such an `after` is always moved.
        let expected = after.map(|a| i64::try_from(a).unwrap_or(-1));
        let (_, last, written) = self
            .fenced(
                session,
                &fence,
                "appending to a session",
                sql,
                Some((&batch, expected)),
            )
            .await?;
        if after.is_some() && written == Some(0) {
            return Ok(None);
        }
        let n = batch.0.len() as u64;
        if written != Some(batch.0.len() as i64) || last < n {
            return Err(corrupt(
                &self.inner.tables.events,
                format!("an append of {n} events answered {written:?} written, ending at {last}"),
            ));
        }
        Ok(Some(AppendReceipt {
            first_seq: last - n + 1,
            last_seq: last,
        }))
    }

    /// Runs a fenced statement (append with its batch, or delete) and
    /// judges its answer: the new last sequence number when accepted.
    async fn fenced(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        what: &'static str,
        sql: &str,
        batch: Option<(&Batch, Option<i64>)>,
    ) -> Result<(Option<SessionFloor>, u64, Option<i64>), StoreError> {
        let (fenced, token, writer) = match fence {
            WriteFence::Fenced(f) => (
                true,
                Some(f.token().get().to_string()),
                Some(f.owner().as_str()),
            ),
            WriteFence::Unfenced => (false, None, None),
        };
        let id = session.as_str();
        let marker = self.bound_marker();
        let sent = self.inner.floors.sent(Some(session));
        let seen_seq = i64::try_from(sent.session.seq).unwrap_or(i64::MAX);
        let seen_mark = sent.session.mark.map(|m| m.to_string());
        let lsn = sent.lsn_text();
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&id, Type::TEXT),
            (&fenced, Type::BOOL),
            (&token, Type::TEXT),
            (&writer, Type::TEXT),
            (&self.inner.allow_unfenced, Type::BOOL),
            (&marker, Type::TEXT),
            (&seen_seq, Type::INT8),
            (&seen_mark, Type::TEXT),
            (&lsn, Type::TEXT),
        ];
        if let Some(((texts, sizes), after)) = &batch {
            params.push((texts, Type::TEXT_ARRAY));
            params.push((sizes, Type::INT4_ARRAY));
            params.push((after, Type::INT8));
        }
        let table = &self.inner.tables.sessions;
        let rows = self
            .inner
            .conns
            .query(sql, &params)
            .await
            .map_err(self.failed(what, Op::Write))?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt(table, format!("{what}: PostgreSQL answered no row")))?;
        let v = Verdict::read(row, table)?;
        self.judge(session, fence, &sent, v)
    }

    /// A fenced write's verdict as the store's answer.
    fn judge(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        sent: &Sent,
        v: Verdict,
    ) -> Result<(Option<SessionFloor>, u64, Option<i64>), StoreError> {
        self.check_lsn(v.lsn.as_deref(), sent)?;
        let table = &self.inner.tables.sessions;
        if !matches!(v.verdict.as_str(), "lsn" | "rewound" | "authority")
            && let Some(row) = v.row
        {
            self.inner.floors.saw(session, row);
        }
        let mark = || v.row.and_then(|r| r.mark).map(FencingToken::new);
        match (v.verdict.as_str(), fence) {
            ("ok", _) => {
                let last = v
                    .last_seq
                    .and_then(|s| u64::try_from(s).ok())
                    .ok_or_else(|| {
                        corrupt(table, "an accepted write answered no sequence number")
                    })?;
                let token = match fence {
                    WriteFence::Fenced(f) => Some(f.token().get()),
                    WriteFence::Unfenced => None,
                };
                let now = SessionFloor {
                    seq: last,
                    mark: v.row.and_then(|r| r.mark).max(token),
                };
                self.inner.floors.saw(session, now);
                Ok((v.row, last, v.written))
            }
            ("notfound", _) => Err(StoreError::NotFound {
                session: session.clone(),
            }),
            // A conditional append onto a log that moved on: nothing
            // written, nothing raised.
            ("moved", _) => {
                let last = v
                    .row
                    .map(|r| r.seq)
                    .ok_or_else(|| corrupt(table, "a moved log without its row"))?;
                Ok((v.row, last, Some(0)))
            }
            ("unfenced", _) => Err(StoreError::Unfenced {
                session: session.clone(),
                high_water: mark(),
            }),
            ("fenced", WriteFence::Fenced(f)) => Err(StoreError::Fenced {
                session: session.clone(),
                presented: f.token(),
                presented_by: f.owner().clone(),
                high_water: mark().ok_or_else(|| corrupt(table, "a refusal without a mark"))?,
                high_water_owner: v.mark_writer.and_then(|w| OwnerId::new(w).ok()),
            }),
            ("lease", WriteFence::Fenced(f)) => Err(self.lease_refused(session, f, &v)),
            ("lsn", _) => Err(self.log_went_back()),
            ("rewound", _) => Err(self.session_went_back(session, v.row, sent.session)),
            ("authority", _) => Err(self.authority_lost(v.recorded)),
            (other, _) => Err(corrupt(table, format!("unexpected verdict {other:?}"))),
        }
    }

    /// The refusal of a write by the lease check: `Fenced`, naming the
    /// lease row's token as the mark (the token the session is held under)
    /// and its live holder, if any, as the mark's writer.
    fn lease_refused(&self, session: &SessionId, f: &lease_port::Fence, v: &Verdict) -> StoreError {
        let leases = self
            .inner
            .lease_table
            .as_deref()
            .unwrap_or("the lease table");
        let token = v.lease_token.as_deref().and_then(|t| t.parse::<u64>().ok());
        let live = v.lease_live == Some(true);
        let holder = v.lease_owner.as_deref().filter(|_| live);
        let why = match (token, holder, v.lease_owner.as_deref()) {
            (None, _, _) => format!("{leases} has no lease of the session"),
            (Some(t), Some(h), _) => format!("its lease is held by {h} under token {t}"),
            (Some(t), None, Some(o)) => format!("its lease of {o} under token {t} expired"),
            (Some(t), None, None) => format!("its lease under token {t} was released"),
        };
        tracing::info!(
            %session, presented = %f.token(), writer = %f.owner(), %why,
            "a write was refused by the lease check"
        );
        StoreError::Fenced {
            session: session.clone(),
            presented: f.token(),
            presented_by: f.owner().clone(),
            high_water: FencingToken::new(token.unwrap_or(f.token().get())),
            high_water_owner: holder.and_then(|h| OwnerId::new(h).ok()),
        }
    }

    /// Refuses an answer from a log position below one seen before the
    /// statement was sent; raises the floor otherwise.
    fn check_lsn(&self, lsn: Option<&str>, sent: &Sent) -> Result<(), StoreError> {
        let table = &self.inner.tables.sessions;
        let lsn = lsn.ok_or_else(|| corrupt(table, "PostgreSQL answered no log position"))?;
        match self.inner.floors.lsn_went_back(lsn, sent) {
            Some(false) => Ok(()),
            Some(true) => Err(self.log_went_back()),
            None => Err(corrupt(
                table,
                format!("PostgreSQL answered the log position {lsn:?}"),
            )),
        }
    }

    fn log_went_back(&self) -> StoreError {
        let location = &self.inner.location;
        StoreError::rewound(
            location,
            format!(
                "PostgreSQL's write-ahead log at {location} is behind a position this process \
                 already saw: the database was restored from an older copy, or failed over to a \
                 standby that had not received every commit, and marks may have gone back with \
                 it. Nothing was done. Restore the newer data if it exists; otherwise restart \
                 this process to accept the older state, after moving the lease tokens above \
                 every mark the stores saw"
            ),
        )
    }

    /// The refusal of a session row below what this instance saw.
    fn session_went_back(
        &self,
        session: &SessionId,
        now: Option<SessionFloor>,
        seen: SessionFloor,
    ) -> StoreError {
        let location = &self.inner.location;
        let now = match now {
            Some(r) => format!(
                "holds sequence number {} and mark {}",
                r.seq,
                r.mark.map_or_else(|| "none".to_owned(), |m| m.to_string())
            ),
            None => "is gone".to_owned(),
        };
        StoreError::rewound(
            location,
            format!(
                "session {session} went back in {} at {location}: its row {now}, but this \
                 process already saw sequence number {} and mark {}. The table lost \
                 acknowledged writes (a restore, a lagging standby promoted, rows changed by \
                 hand); nothing was done. Restore the newer data if it exists; otherwise restart \
                 this process to accept the older state",
                self.inner.tables.sessions,
                seen.seq,
                seen.mark
                    .map_or_else(|| "none".to_owned(), |m| m.to_string())
            ),
        )
    }

    /// A fenced write found the authority record changed since this
    /// instance bound it.
    fn authority_lost(&self, recorded: Option<String>) -> StoreError {
        let table = &self.inner.tables.authority;
        let Some((offered, _)) = self.inner.bound.get() else {
            return corrupt(
                table,
                "an authority check this unbound store never asked for",
            );
        };
        match recorded.and_then(|r| AuthorityId::new(r).ok()) {
            Some(recorded) if &recorded != offered => {
                StoreError::authority_mismatch(&self.inner.location, recorded, offered.clone())
            }
            found => StoreError::rewound(
                &self.inner.location,
                format!(
                    "the record of the fencing authority ({offered}) in {table} {} since this \
                     process bound it: the tables were made anew or the database replaced, and \
                     the high-water marks with them; this process refuses to write until \
                     restarted",
                    if found.is_some() {
                        "was written anew"
                    } else {
                        "is gone"
                    }
                ),
            ),
        }
    }

    /// The authority record as the binding statement answers it, asked a
    /// second time when a racing first binding hid the winner's row from
    /// this statement's snapshot.
    async fn bind_row(&self, authority: &AuthorityId) -> Result<(String, String), StoreError> {
        let table = &self.inner.tables.authority;
        for _ in 0..2 {
            let rows = self
                .inner
                .conns
                .query(&self.inner.sql.bind, &[(&authority.as_str(), Type::TEXT)])
                .await
                .map_err(self.failed("binding the fencing authority", Op::Write))?;
            if let Some(row) = rows.first() {
                return Ok((col(row, 0, table)?, col(row, 1, table)?));
            }
        }
        Err(corrupt(table, "the binding answered no record twice"))
    }
}

#[async_trait]
impl SessionStore for PgStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        let id = session.as_str();
        let sent = self.inner.floors.sent(Some(session));
        let seen_seq = i64::try_from(sent.session.seq).unwrap_or(i64::MAX);
        let seen_mark = sent.session.mark.map(|m| m.to_string());
        let lsn = sent.lsn_text();
        let table = &self.inner.tables.sessions;
        let rows = self
            .inner
            .conns
            .query(
                &self.inner.sql.create,
                &[
                    (&id, Type::TEXT),
                    (&seen_seq, Type::INT8),
                    (&seen_mark, Type::TEXT),
                    (&lsn, Type::TEXT),
                ],
            )
            .await
            .map_err(self.failed("creating a session", Op::Write))?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt(table, "create: PostgreSQL answered no row"))?;
        let verdict: String = col(row, 0, table)?;
        let made: i64 = col(row, 1, table)?;
        let mark: Option<String> = col(row, 3, table)?;
        let prev = row_floor(col(row, 2, table)?, mark.as_deref(), table)?;
        let lsn: Option<String> = col(row, 4, table)?;
        self.check_lsn(lsn.as_deref(), &sent)?;
        match verdict.as_str() {
            "lsn" => return Err(self.log_went_back()),
            "rewound" => return Err(self.session_went_back(session, prev, sent.session)),
            _ => {}
        }
        if let Some(prev) = prev {
            self.inner.floors.saw(session, prev);
        }
        match (verdict.as_str(), made) {
            ("new" | "again", 1) => Ok(()),
            ("new" | "again" | "exists", _) => Err(StoreError::AlreadyExists {
                session: session.clone(),
            }),
            (other, _) => Err(corrupt(
                table,
                format!("create: unexpected verdict {other:?}"),
            )),
        }
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        self.append_at(session, fence, None, events)
            .await?
            .ok_or_else(|| {
                corrupt(
                    &self.inner.tables.sessions,
                    "an unconditional append answered that the log moved",
                )
            })
    }

    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        self.append_at(session, fence, Some(after), events).await
    }

    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError> {
        if limit == 0 {
            return Err(invalid("a page needs a limit of at least one event"));
        }
        let want = limit.min(MAX_PAGE_EVENTS) as i64;
        let from = i64::try_from(from_seq).unwrap_or(i64::MAX);
        let budget = i64::try_from(self.inner.max_page_bytes).unwrap_or(i64::MAX);
        let id = session.as_str();
        let sent = self.inner.floors.sent(Some(session));
        let rows = self
            .inner
            .conns
            .query(
                &self.inner.sql.read,
                &[
                    (&id, Type::TEXT),
                    (&from, Type::INT8),
                    (&want, Type::INT8),
                    (&budget, Type::INT8),
                ],
            )
            .await
            .map_err(self.failed("reading a session", Op::Read))?;
        self.page(session, &sent, &rows)
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        let rows = self
            .inner
            .conns
            .query(&self.inner.sql.list_all, &[])
            .await
            .map_err(self.failed("listing sessions", Op::Read))?;
        let mut out = self.ids(&rows)?;
        out.sort();
        Ok(out)
    }

    async fn list_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        check_list_limit(limit)?;
        let take = limit as i64 + 1;
        let rows = match after {
            None => {
                self.inner
                    .conns
                    .query(&self.inner.sql.list_first, &[(&take, Type::INT8)])
                    .await
            }
            Some(c) => {
                let last = c.last().as_str();
                self.inner
                    .conns
                    .query(
                        &self.inner.sql.list_after,
                        &[(&last, Type::TEXT), (&take, Type::INT8)],
                    )
                    .await
            }
        }
        .map_err(self.failed("listing sessions", Op::Read))?;
        let mut sessions = self.ids(&rows)?;
        let more = sessions.len() > limit;
        sessions.truncate(limit);
        Ok(SessionPage::new(sessions, more))
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let sql = &self.inner.sql.delete;
        self.fenced(session, &fence, "deleting a session", sql, None)
            .await
            .map(drop)
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        let id = session.as_str();
        let table = &self.inner.tables.sessions;
        let sent = self.inner.floors.sent(Some(session));
        let rows = self
            .inner
            .conns
            .query(&self.inner.sql.high_water, &[(&id, Type::TEXT)])
            .await
            .map_err(self.failed("reading a high-water mark", Op::Read))?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt(table, "high_water: PostgreSQL answered no row"))?;
        let mark: Option<String> = col(row, 0, table)?;
        let now = row_floor(col(row, 1, table)?, mark.as_deref(), table)?;
        let lsn: Option<String> = col(row, 2, table)?;
        self.check_lsn(lsn.as_deref(), &sent)?;
        if sent.session.above(now) {
            return Err(self.session_went_back(session, now, sent.session));
        }
        let Some(now) = now else { return Ok(None) };
        self.inner.floors.saw(session, now);
        Ok(now.mark.map(FencingToken::new))
    }

    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        let table = &self.inner.tables.authority;
        let (recorded, marker) = self.bind_row(authority).await?;
        let recorded = AuthorityId::new(&recorded)
            .map_err(|_| corrupt(table, format!("unreadable authority {recorded:?}")))?;
        if &recorded != authority {
            return Err(StoreError::authority_mismatch(
                &self.inner.location,
                recorded,
                authority.clone(),
            ));
        }
        if let Err((_, _)) = self.inner.bound.set((authority.clone(), marker.clone()))
            && let Some((earlier, earlier_marker)) = self.inner.bound.get().cloned()
        {
            if earlier != *authority {
                // Bound to another authority, which the table no longer
                // records: the record was lost and the other is gone.
                return Err(StoreError::authority_mismatch(
                    &self.inner.location,
                    earlier,
                    authority.clone(),
                ));
            }
            if earlier_marker != marker {
                return Err(self.authority_lost(Some(recorded.to_string())));
            }
        }
        Ok(())
    }

    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        let table = &self.inner.tables.authority;
        let rows = self
            .inner
            .conns
            .query(&self.inner.sql.recorded, &[])
            .await
            .map_err(self.failed("reading the fencing authority", Op::Read))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let recorded: String = col(row, 0, table)?;
        AuthorityId::new(&recorded)
            .map(Some)
            .map_err(|_| corrupt(table, format!("unreadable authority {recorded:?}")))
    }

    /// Returns as soon as any process appends past `after_seq` (at once
    /// when one already did), woken by the append's notification: one
    /// `LISTEN` connection per store serves every waiter. The wait also
    /// reads the session every second while notifications arrive (a lost
    /// one costs at most that), every poll interval while they do not (a
    /// pooler, the connection down), and when woken — which is how it
    /// learns of a deletion (`NotFound`). A read the database could not
    /// answer is tried again on that schedule; the wait fails with it only
    /// if the database is still out of reach at its timeout. Dropping the
    /// future ends the wait and holds nothing.
    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let first = after_seq.saturating_add(1);
        let waiter = self.inner.appends.register(session);
        loop {
            // Armed before the read: an append landing between the read
            // and the wait still wakes it.
            let woken = waiter.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let unreachable = match self.read(session, first, 1).await {
                Ok(page) if !page.events.is_empty() => return Ok(true),
                Ok(_) => None,
                Err(e) if e.kind() == StoreErrorKind::Unavailable => Some(e),
                Err(e) => return Err(e),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return unreachable.map_or(Ok(false), Err);
            }
            let until = deadline.min(now + waiter.read_interval());
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn last_seq(&self, session: &SessionId) -> Result<u64, StoreError> {
        let id = session.as_str();
        let sent = self.inner.floors.sent(Some(session));
        let rows = self
            .inner
            .conns
            .query(&self.inner.sql.last_seq, &[(&id, Type::TEXT)])
            .await
            .map_err(self.failed("reading a session's last number", Op::Read))?;
        let row = rows.first().ok_or_else(|| {
            corrupt(
                &self.inner.tables.sessions,
                "last_seq: PostgreSQL answered no row",
            )
        })?;
        self.live_row(session, &sent, row, 3)
    }

    async fn request_cancel(
        &self,
        session: &SessionId,
        run: FencingToken,
    ) -> Result<(), StoreError> {
        let (id, run) = (session.as_str(), run.get().to_string());
        let note = format!("{CANCEL_MARK}{session}");
        let table = &self.inner.tables.cancels;
        let rows = self
            .inner
            .conns
            .query(
                &self.inner.sql.request_cancel,
                &[(&id, Type::TEXT), (&run, Type::TEXT), (&note, Type::TEXT)],
            )
            .await
            .map_err(self.failed("recording a cancel request", Op::Write))?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt(table, "request_cancel: PostgreSQL answered no row"))?;
        let live: bool = col(row, 0, table)?;
        if !live {
            return Err(StoreError::NotFound {
                session: session.clone(),
            });
        }
        Ok(())
    }

    async fn cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<CancelRequest>, StoreError> {
        let id = session.as_str();
        let table = &self.inner.tables.cancels;
        let rows = self
            .inner
            .conns
            .query(&self.inner.sql.cancel_request, &[(&id, Type::TEXT)])
            .await
            .map_err(self.failed("reading cancel requests", Op::Read))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let run: String = col(row, 0, table)?;
        let serial: i64 = col(row, 1, table)?;
        Ok(Some(CancelRequest {
            run: FencingToken::new(token_of(&run, table)?),
            serial: u64::try_from(serial)
                .map_err(|_| corrupt(table, format!("cancel request count {serial}")))?,
        }))
    }

    /// Woken by the request's notification on the store's one `LISTEN`
    /// connection; reading on the waiters' schedule behind a pooler.
    async fn wait_for_cancel_request(
        &self,
        session: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<CancelRequest>, StoreError> {
        let waiter = self.inner.appends.register_cancels(session);
        let recheck = waiter.read_interval();
        session_store::wait_notified(Some(waiter.notify()), timeout, recheck, || async {
            Ok(self
                .cancel_request(session)
                .await?
                .filter(|r| r.serial > after_serial))
        })
        .await
    }
}

impl PgStore {
    fn ids(&self, rows: &[Row]) -> Result<Vec<SessionId>, StoreError> {
        let table = &self.inner.tables.sessions;
        rows.iter()
            .map(|r| {
                let id: String = col(r, 0, table)?;
                SessionId::new(&id).map_err(|_| corrupt(table, format!("not a session id: {id:?}")))
            })
            .collect()
    }

    /// Checks a session's row as a read answered it (live, last sequence
    /// number and mark in columns 0 to 2, the log position in `lsn_col`)
    /// against what this client saw, and records it: `NotFound` unless
    /// the session is live. Its last sequence number.
    fn live_row(
        &self,
        session: &SessionId,
        sent: &Sent,
        row: &Row,
        lsn_col: usize,
    ) -> Result<u64, StoreError> {
        let sessions = &self.inner.tables.sessions;
        let live: Option<bool> = col(row, 0, sessions)?;
        let mark: Option<String> = col(row, 2, sessions)?;
        let now = row_floor(col(row, 1, sessions)?, mark.as_deref(), sessions)?;
        let lsn: Option<String> = col(row, lsn_col, sessions)?;
        self.check_lsn(lsn.as_deref(), sent)?;
        if sent.session.above(now) {
            return Err(self.session_went_back(session, now, sent.session));
        }
        if let Some(now) = now {
            self.inner.floors.saw(session, now);
        }
        match (live, now) {
            (Some(true), Some(now)) => Ok(now.seq),
            _ => Err(StoreError::NotFound {
                session: session.clone(),
            }),
        }
    }

    /// A read's rows as a page (see `sql::read`).
    fn page(&self, session: &SessionId, sent: &Sent, rows: &[Row]) -> Result<Page, StoreError> {
        let events = &self.inner.tables.events;
        let Some(first) = rows.first() else {
            if sent.session.above(None) {
                return Err(self.session_went_back(session, None, sent.session));
            }
            return Err(StoreError::NotFound {
                session: session.clone(),
            });
        };
        self.live_row(session, sent, first, 7)?;
        let mut out = Vec::with_capacity(rows.len());
        let mut next_seq = None;
        for row in rows {
            let Some(seq) = col::<Option<i64>>(row, 3, events)? else {
                continue;
            };
            let seq = u64::try_from(seq).map_err(|_| corrupt(events, format!("seq {seq}")))?;
            let Some(payload) = col::<Option<String>>(row, 6, events)? else {
                next_seq = Some(seq);
                break;
            };
            let token: Option<String> = col(row, 4, events)?;
            let at_ms: i64 = col(row, 5, events)?;
            let payload = serde_json::from_str(&payload).map_err(|e| StoreError::Corrupt {
                path: events.into(),
                line: None,
                message: format!("event {seq} of session {session} cannot be parsed"),
                source: Some(e),
            })?;
            out.push(StoredEvent {
                seq,
                token: token
                    .map(|t| token_of(&t, events).map(FencingToken::new))
                    .transpose()?,
                at: std::time::UNIX_EPOCH
                    + Duration::from_millis(u64::try_from(at_ms).unwrap_or(0)),
                payload,
            });
        }
        Ok(Page {
            events: out,
            next_seq,
            unfinished_write: false,
        })
    }
}
