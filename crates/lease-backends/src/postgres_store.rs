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

    /// Whether `leases` live in this store's database under this store's
    /// prefix, so that each append can check the live lease row in the same
    /// statement. Decided on the host, port and database the two URLs
    /// name; two spellings of one server that differ there (a pooler and
    /// the server behind it) count as two, which leaves the check off: the
    /// store's marks still fence every write.
    #[cfg(feature = "postgres-store")]
    pub fn shares_tables_with(&self, leases: &PostgresLeases) -> bool {
        if self.table_prefix != leases.table_prefix {
            return false;
        }
        match (target(&self.url), target(&leases.url)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
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

/// The servers (host and port, in order) and the database a URL names, the
/// database defaulting to the user as PostgreSQL's does.
#[cfg(feature = "postgres-store")]
fn target(url: &str) -> Option<(Vec<String>, Vec<u16>, Option<String>)> {
    let config = pg_connect::settings(url).ok()?;
    let hosts = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.to_ascii_lowercase(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
        })
        .collect();
    let db = config.get_dbname().or(config.get_user()).map(str::to_owned);
    Some((hosts, config.get_ports().to_vec(), db))
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

    fn leases(url: &str, prefix: &str) -> PostgresLeases {
        PostgresLeases {
            url: url.into(),
            password_file: Some("pw".into()),
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
        assert!(s.shares_tables_with(&s.own_leases()));
    }

    #[test]
    fn leases_share_the_tables_only_in_the_same_database_under_the_same_prefix() {
        let s = store("postgres://app:secret@DB:5432/chat", "p");
        for same in [
            "postgres://other@db:5432/chat",
            "postgres://app@db/chat?connect_timeout=3",
            "host=db port=5432 dbname=chat user=x",
            // TLS keys say how to reach it, not where: no file is read.
            "postgres://app@db/chat?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
        ] {
            assert!(s.shares_tables_with(&leases(same, "p")), "{same}");
        }
        for other in [
            "postgres://app@db:5432/other",
            "postgres://app@db:6432/chat",
            "postgres://app@pooler:5432/chat",
            "not a url",
        ] {
            assert!(!s.shares_tables_with(&leases(other, "p")), "{other}");
        }
        assert!(!s.shares_tables_with(&leases("postgres://app@db/chat", "q")));
        // Without a database, PostgreSQL takes the user's name.
        let by_user = store("postgres://chat@db", "p");
        assert!(by_user.shares_tables_with(&leases("postgres://x@db/chat", "p")));
    }

    #[test]
    fn debug_leaves_the_url_out() {
        let s = store("postgres://app:secret@db/chat", "p");
        assert!(!format!("{s:?}").contains("secret"));
    }
}
