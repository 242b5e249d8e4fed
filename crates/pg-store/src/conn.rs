//! A few connections, each running one statement at a time — pglease's
//! approach, for the same reasons.
//!
//! Every statement is sent as one unnamed Parse/Bind/Execute/Sync exchange
//! (`query_typed`), which is what keeps the store correct behind a
//! transaction pooler (PgBouncer in `pool_mode = transaction`): the pooler
//! may hand each exchange to another server connection, so nothing may rest
//! on one — no named prepared statement, no session setting, no
//! session-level advisory lock. (`LISTEN` is the exception, and lives on a
//! connection of its own: see `listen`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pg_connect::{ConnectError, PgConfig};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

/// Why a statement did not answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection could be opened (PostgreSQL refused it, or TLS
    /// failed: the source says which check), or none was free, in time:
    /// the statement was never sent.
    NotSent(String, Option<Box<dyn std::error::Error + Send + Sync>>),
    /// No answer by the deadline: the statement was cancelled, and may or
    /// may not have taken effect.
    TimedOut(Duration),
    /// PostgreSQL answered with an error: the statement (its own
    /// transaction) did nothing.
    Refused(tokio_postgres::Error),
    /// The connection broke with the statement sent: its outcome is
    /// unknown.
    Broken(tokio_postgres::Error),
}

impl Failure {
    /// PostgreSQL's error code, when it answered with one.
    pub(crate) fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            Failure::Refused(e) => e.code(),
            _ => None,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotSent(why, Some(e)) => write!(f, "{why}: {e}"),
            Failure::NotSent(why, None) => f.write_str(why),
            Failure::TimedOut(bound) => write!(
                f,
                "PostgreSQL did not answer within {bound:?}: the statement was cancelled, and \
                 may or may not have taken effect"
            ),
            Failure::Refused(e) => match e.as_db_error() {
                Some(db) => write!(
                    f,
                    "PostgreSQL refused the statement ({}): {}",
                    db.code().code(),
                    db.message()
                ),
                None => write!(f, "PostgreSQL refused the statement: {e}"),
            },
            Failure::Broken(e) => write!(f, "the connection to PostgreSQL broke: {e}"),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Failure::NotSent(_, Some(e)) => Some(e.as_ref()),
            Failure::Refused(e) | Failure::Broken(e) => Some(e),
            _ => None,
        }
    }
}

pub(crate) struct Connections {
    config: PgConfig,
    slots: Vec<Mutex<Option<Client>>>,
    next: AtomicUsize,
    request_timeout: Duration,
}

impl Connections {
    pub(crate) fn new(config: PgConfig, size: usize, request_timeout: Duration) -> Self {
        Self {
            config,
            slots: (0..size.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            request_timeout,
        }
    }

    /// One statement, answered within the request timeout (waiting for a
    /// free connection included) or cancelled.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Failure> {
        let bound = self.request_timeout;
        let deadline = tokio::time::Instant::now() + bound;
        let mut conn = tokio::time::timeout_at(deadline, self.get())
            .await
            .map_err(|_| {
                Failure::NotSent(
                    format!(
                        "no connection to PostgreSQL was free or could be opened within {bound:?}"
                    ),
                    None,
                )
            })??;
        conn.query(sql, params, deadline, bound).await
    }

    /// Statements in the simple protocol, as one batch (one implicit
    /// transaction), within `bound`.
    pub(crate) async fn batch(&self, sql: &str, bound: Duration) -> Result<(), Failure> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut conn = tokio::time::timeout_at(deadline, self.get())
            .await
            .map_err(|_| Failure::NotSent(format!("no connection within {bound:?}"), None))??;
        conn.batch(sql, deadline, bound).await
    }

    /// A live connection: a free one if there is, else the next in turn
    /// once it is free. A connection found closed is opened again.
    async fn get(&self) -> Result<Conn<'_>, Failure> {
        let mut slot = match self.slots.iter().find_map(|s| s.try_lock().ok()) {
            Some(slot) => slot,
            None => {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
                self.slots[i].lock().await
            }
        };
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(connect(&self.config, self.request_timeout).await?);
        }
        Ok(Conn {
            slot,
            config: &self.config,
        })
    }
}

/// A new connection whose messages are driven by a task of the current
/// runtime (notifications on it are dropped: this is not the listener).
pub(crate) async fn connect(config: &PgConfig, bound: Duration) -> Result<Client, Failure> {
    config.connect_driven(bound).await.map_err(not_connected)
}

/// A connection that was not opened, as a statement never sent.
pub(crate) fn not_connected(e: ConnectError) -> Failure {
    match e {
        ConnectError::TimedOut(bound) => Failure::NotSent(
            format!("PostgreSQL did not accept a connection within {bound:?}"),
            None,
        ),
        ConnectError::Refused(e) => {
            Failure::NotSent("PostgreSQL refused a connection".into(), Some(Box::new(e)))
        }
        other => Failure::NotSent(other.to_string(), Some(Box::new(other))),
    }
}

/// One connection, held for one statement.
struct Conn<'a> {
    slot: MutexGuard<'a, Option<Client>>,
    /// To cancel a statement over the connection's own TLS.
    config: &'a PgConfig,
}

impl Conn<'_> {
    /// Runs one statement, answered by `deadline`. A connection found
    /// broken is dropped, to be opened again by the next call.
    ///
    /// Past the deadline the statement may still be running — waiting on a
    /// session's row lock, say — and could commit later, long after its
    /// caller gave up. So it is cancelled, and its connection is never used
    /// again: nothing queues behind it. A cancel can still lose the race
    /// with a commit; the outcome stays unknown, as the error says.
    async fn query(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        deadline: tokio::time::Instant,
        bound: Duration,
    ) -> Result<Vec<Row>, Failure> {
        let armed = CancelOnDrop(Some(self));
        // An empty slot has nothing under way: dropping the guard then
        // cancels nothing.
        let Some(client) = armed.client() else {
            return Err(Failure::NotSent(
                "internal: a connection slot was left empty".into(),
                None,
            ));
        };
        let answer = tokio::time::timeout_at(deadline, client.query_typed(sql, params)).await;
        let this = armed.disarm();
        match answer {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(this.failed(e)),
            Err(_) => {
                this.cancel();
                Err(Failure::TimedOut(bound))
            }
        }
    }

    async fn batch(
        &mut self,
        sql: &str,
        deadline: tokio::time::Instant,
        bound: Duration,
    ) -> Result<(), Failure> {
        let armed = CancelOnDrop(Some(self));
        // An empty slot has nothing under way: dropping the guard then
        // cancels nothing.
        let Some(client) = armed.client() else {
            return Err(Failure::NotSent(
                "internal: a connection slot was left empty".into(),
                None,
            ));
        };
        let answer = tokio::time::timeout_at(deadline, client.batch_execute(sql)).await;
        let this = armed.disarm();
        match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(this.failed(e)),
            Err(_) => {
                this.cancel();
                Err(Failure::TimedOut(bound))
            }
        }
    }

    /// An error answer, or a broken connection (then dropped).
    fn failed(&mut self, e: tokio_postgres::Error) -> Failure {
        if e.as_db_error().is_some() {
            return Failure::Refused(e);
        }
        if e.is_closed() || self.slot.as_ref().is_none_or(Client::is_closed) {
            *self.slot = None;
        }
        Failure::Broken(e)
    }

    /// Cancels the statement under way on the server and drops the
    /// connection.
    fn cancel(&mut self) {
        if let Some(client) = self.slot.take() {
            self.config.cancel(&client);
        }
    }
}

/// A statement under way on a connection: if its caller's future is
/// dropped before the answer (a client that left, an outer timeout), the
/// statement is cancelled on the server and the connection dropped. A
/// statement waiting for a row lock would otherwise commit whenever the
/// lock frees — after its caller gave up, and perhaps after the session's
/// next owner had begun — and its connection would go back to the slot
/// still busy.
struct CancelOnDrop<'c, 'a>(Option<&'c mut Conn<'a>>);

impl<'c, 'a> CancelOnDrop<'c, 'a> {
    fn client(&self) -> Option<&Client> {
        self.0.as_ref()?.slot.as_ref()
    }

    /// The answer came: nothing to cancel.
    fn disarm(mut self) -> &'c mut Conn<'a> {
        self.0.take().expect("armed until disarmed")
    }
}

impl Drop for CancelOnDrop<'_, '_> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            conn.cancel();
        }
    }
}
