//! A few connections, each running one statement at a time.
//!
//! One statement at a time per connection, and every statement sent as one
//! unnamed Parse/Bind/Execute/Sync exchange (`query_typed`), is what keeps
//! the backend correct behind a transaction pooler (PgBouncer in
//! `pool_mode = transaction`): the pooler may hand each exchange to a
//! different server connection, so nothing may rest on one — no named
//! prepared statement, no session setting, no session-level advisory lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_port::LeaseError;
use pg_connect::{ConnectError, PgConfig, TlsError};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::Client;

use crate::error::from_pg;

pub(crate) struct Connections {
    config: PgConfig,
    slots: Vec<Mutex<Option<Client>>>,
    next: AtomicUsize,
    connect_timeout: Duration,
}

impl Connections {
    pub(crate) fn new(config: PgConfig, size: usize, connect_timeout: Duration) -> Self {
        Self {
            config,
            slots: (0..size.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            connect_timeout,
        }
    }

    /// A live connection: a free one if there is, else the next in turn
    /// once it is free. A connection found closed is opened again.
    pub(crate) async fn get(&self) -> Result<Conn<'_>, LeaseError> {
        let mut slot = match self.slots.iter().find_map(|s| s.try_lock().ok()) {
            Some(slot) => slot,
            None => {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
                self.slots[i].lock().await
            }
        };
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(self.connect().await?);
        }
        Ok(Conn {
            slot,
            config: &self.config,
        })
    }

    async fn connect(&self) -> Result<Client, LeaseError> {
        self.config
            .connect_driven(self.connect_timeout)
            .await
            .map_err(|e| match e {
                ConnectError::Refused(e) => from_pg(e),
                // A certificate that fails its check, or a server without
                // the TLS the URL demands, fails every attempt alike.
                ConnectError::Tls(tls) if !matches!(tls, TlsError::Handshake { .. }) => {
                    LeaseError::invalid(tls.to_string()).with_source(tls)
                }
                other => LeaseError::transient(other.to_string()).with_source(other),
            })
    }
}

/// One connection, held for one statement.
pub(crate) struct Conn<'a> {
    slot: MutexGuard<'a, Option<Client>>,
    /// To cancel a statement over the connection's own TLS.
    config: &'a PgConfig,
}

impl Conn<'_> {
    /// Runs one statement, answered by `deadline`. A connection found
    /// broken is dropped, to be opened again by the next call.
    ///
    /// Past the deadline the statement may still be running — waiting on a
    /// row lock, say — and could commit later, long after its caller gave
    /// up (a release landing after the same owner re-acquired would free
    /// the new grant). So it is cancelled, and its connection is never
    /// used again: nothing queues behind it. A cancel can still lose the
    /// race with a commit; the outcome stays unknown, as the error says.
    pub(crate) async fn query(
        &mut self,
        sql: &str,
        params: &[(
            &(dyn tokio_postgres::types::ToSql + Sync),
            tokio_postgres::types::Type,
        )],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<tokio_postgres::Row>, LeaseError> {
        let armed = CancelOnDrop(Some(self));
        // An empty slot has nothing under way: dropping the guard then
        // cancels nothing.
        let Some(client) = armed.client() else {
            return Err(LeaseError::transient(
                "internal: a connection slot was left empty",
            ));
        };
        let answer = tokio::time::timeout_at(deadline, client.query_typed(sql, params)).await;
        let this = armed.disarm();
        match answer {
            Ok(out) => {
                if let Err(e) = &out
                    && (e.is_closed() || this.slot.as_ref().is_none_or(Client::is_closed))
                {
                    *this.slot = None;
                }
                out.map_err(from_pg)
            }
            Err(_) => {
                this.cancel();
                Err(LeaseError::transient(
                    "PostgreSQL did not answer in time: the statement was cancelled, and may or \
                     may not have taken effect",
                ))
            }
        }
    }

    /// Runs statements in the simple protocol, as one batch.
    pub(crate) async fn batch(&mut self, sql: &str) -> Result<(), LeaseError> {
        let Some(client) = self.slot.as_ref() else {
            return Err(LeaseError::transient(
                "internal: a connection slot was left empty",
            ));
        };
        let out = client.batch_execute(sql).await;
        if out.is_err() && client.is_closed() {
            *self.slot = None;
        }
        out.map_err(from_pg)
    }
}

impl Conn<'_> {
    /// Cancels the statement under way on the server and drops the
    /// connection.
    fn cancel(&mut self) {
        if let Some(client) = self.slot.take() {
            self.config.cancel(&client);
        }
    }
}

/// A statement under way on a connection: if its caller's future is
/// dropped before the answer (a keeper's renewal abandoned, an outer
/// timeout), the statement is cancelled on the server and the connection
/// dropped, as past the deadline: a release waiting for a row lock would
/// otherwise commit whenever the lock frees, long after its caller gave up.
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
