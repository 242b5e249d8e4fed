//! A PostgreSQL session store, and the leases it brings when no lease flag
//! names others: pglease's, in the same database under the same prefix,
//! which the store then checks in every fenced append.

use std::path::PathBuf;

use crate::PostgresLeases;
#[cfg(feature = "postgres-store")]
use crate::error::{OpenError, OpenErrorKind};

/// Which database, and which tables in it, hold the sessions.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresStore {
    /// `postgres://user@host:port/database?…` (a password in it works, but
    /// shows in process lists: prefer `password_file`).
    pub url: String,
    /// File holding the password, in place of any the URL carries.
    pub password_file: Option<PathBuf>,
    /// Prefix of the store's tables' names (and of the leases' it brings),
    /// shared by the servers.
    pub table_prefix: String,
}

/// The URL is left out: it may carry a password.
impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("password_file", &self.password_file)
            .field("table_prefix", &self.table_prefix)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// `the PostgreSQL store in PREFIX_sessions`, for messages (never the
    /// URL).
    pub fn describe(&self) -> String {
        format!("the PostgreSQL store in {}_sessions", self.table_prefix)
    }

    /// The leases this store brings: pglease on the same URL, with the same
    /// credentials and table prefix.
    pub fn own_leases(&self) -> PostgresLeases {
        PostgresLeases {
            url: self.url.clone(),
            password_file: self.password_file.clone(),
            table_prefix: self.table_prefix.clone(),
        }
    }

    /// Opens the store together with the leases it checks: with `leases`
    /// (opened, pglease's) in this store's database under this store's
    /// prefix, every fenced append and deletion also requires the live
    /// lease row; otherwise the store's marks alone fence them. Whether
    /// they share the database is asked of the database — the authority
    /// the leases name must be the one recorded in the store's own
    /// database — not read from the two URLs, which may name one database
    /// differently (a host alias, a pooler in front) or two alike. The
    /// second of the pair says whether the check is on.
    #[cfg(feature = "postgres-store")]
    pub async fn open_beside(
        &self,
        leases: &pglease::PgLease,
        leases_prefix: &str,
    ) -> Result<(pg_session_store::PgStore, bool), OpenError> {
        use lease_port::SessionLease;
        let plain = self.open(false).await?;
        if leases_prefix != self.table_prefix {
            return Ok((plain, false));
        }
        let theirs = leases.authority().await.map_err(|e| {
            OpenError::other(
                OpenErrorKind::Backend,
                "the PostgreSQL leases".to_owned(),
                e,
            )
        })?;
        let here = plain
            .lease_authority(&self.table_prefix)
            .await
            .map_err(|e| OpenError::other(OpenErrorKind::Backend, self.describe(), e))?;
        if here.as_ref() != Some(&theirs) {
            return Ok((plain, false));
        }
        drop(plain);
        Ok((self.open(true).await?, true))
    }

    /// The store: reads the password file, connects, and creates or
    /// upgrades the tables before answering. With `lease_check`, every
    /// fenced append and deletion also requires pglease's live lease row
    /// under this prefix (the lease tables must exist: open the leases
    /// first).
    #[cfg(feature = "postgres-store")]
    pub async fn open(&self, lease_check: bool) -> Result<pg_session_store::PgStore, OpenError> {
        let mut b = pg_session_store::PgStore::builder(self.url.clone())
            .table_prefix(self.table_prefix.clone());
        if lease_check {
            b = b.leases_in_same_database(self.table_prefix.clone());
        }
        if let Some(file) = &self.password_file {
            let password = crate::read_password_file(file, "PostgreSQL password file")
                .map_err(|e| OpenError::file(self.describe(), e))?;
            b = b.password(password);
        }
        b.connect()
            .await
            .map_err(|e| OpenError::other(OpenErrorKind::Backend, self.describe(), e))
    }
}

#[cfg(all(test, feature = "postgres-store"))]
mod tests {
    use super::*;

    fn store(url: &str, prefix: &str) -> PostgresStore {
        PostgresStore {
            url: url.into(),
            password_file: None,
            table_prefix: prefix.into(),
        }
    }

    #[test]
    fn the_store_brings_leases_on_its_own_url_credentials_and_prefix() {
        let mut s = store("postgres://app@db:5432/chat", "chat");
        s.password_file = Some("/run/pw".into());
        assert_eq!(
            s.own_leases(),
            PostgresLeases {
                url: "postgres://app@db:5432/chat".into(),
                password_file: Some("/run/pw".into()),
                table_prefix: "chat".into(),
            }
        );
    }

    #[test]
    fn debug_leaves_the_url_out() {
        let s = store("postgres://app:secret@db/chat", "p");
        assert!(!format!("{s:?}").contains("secret"));
    }
}
