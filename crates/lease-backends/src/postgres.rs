//! PostgreSQL leases: processes on any hosts that reach one PostgreSQL
//! primary, directly or through a transaction pooler.

use std::path::PathBuf;
#[cfg(feature = "postgres")]
use std::time::Duration;

#[cfg(feature = "postgres")]
use crate::error::{OpenError, OpenErrorKind};

/// Which database, and which tables in it.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresLeases {
    /// `postgres://user@host:port/database?…` (a password in it works, but
    /// shows in process lists: prefer `password_file`).
    pub url: String,
    /// File holding the password, in place of any the URL carries.
    pub password_file: Option<PathBuf>,
    /// Prefix of the lease tables' names, shared by the servers.
    pub table_prefix: String,
}

/// The URL is left out: it may carry a password.
impl std::fmt::Debug for PostgresLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLeases")
            .field("password_file", &self.password_file)
            .field("table_prefix", &self.table_prefix)
            .finish_non_exhaustive()
    }
}

impl PostgresLeases {
    /// `PostgreSQL leases in PREFIX_leases`, for messages (never the URL).
    pub fn describe(&self) -> String {
        format!("PostgreSQL leases in {}_leases", self.table_prefix)
    }

    /// The backend, granting `ttl`: reads the password file, connects, and
    /// creates or upgrades the tables before answering.
    #[cfg(feature = "postgres")]
    pub async fn open(&self, ttl: Duration) -> Result<pglease::PgLease, OpenError> {
        let mut b = pglease::PgLease::builder(self.url.clone())
            .table_prefix(self.table_prefix.clone())
            .ttl(ttl);
        if let Some(file) = &self.password_file {
            let password = crate::read_password_file(file, "PostgreSQL password file")
                .map_err(|e| OpenError::file(self.describe(), e))?;
            b = b.password(password);
        }
        b.connect()
            .await
            .map_err(|e| OpenError::new(OpenErrorKind::Backend, self.describe(), e))
    }
}
