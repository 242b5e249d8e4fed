//! PostgreSQL's errors in the lease contract's words.

use lease_port::LeaseError;
use tokio_postgres::error::SqlState;

/// Connection loss, a server shutting down, a serialization failure or a
/// deadlock pass; a standby refusing writes passes once a primary is
/// reached; everything else is the configuration's or this crate's fault.
pub(crate) fn from_pg(e: tokio_postgres::Error) -> LeaseError {
    let Some(db) = e.as_db_error() else {
        // No answer from the server: the connection, or the wire.
        return LeaseError::transient("PostgreSQL did not answer").with_source(e);
    };
    let code = db.code();
    let class = &code.code()[..2];
    let passing = matches!(class, "08" | "40" | "53" | "57" | "58")
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::LOCK_NOT_AVAILABLE;
    let message = if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        "PostgreSQL refused a write as read-only: the URL reaches a standby, not the primary"
            .to_owned()
    } else {
        format!("PostgreSQL refused the statement ({})", code.code())
    };
    if passing {
        LeaseError::transient(message).with_source(e)
    } else {
        LeaseError::invalid(message).with_source(e)
    }
}
