//! PostgreSQL connection settings read from a libpq-style URL, TLS
//! included, for `tokio_postgres` clients: connections opened within a
//! bound, and statements cancelled over the same TLS.
//!
//! # What it is for
//!
//! `tokio_postgres::Config` reads most of libpq's URL, but not its TLS
//! keys: `sslmode` only up to `require`, and `sslrootcert`, `sslcert` and
//! `sslkey` not at all. [`PgConfig::parse`] reads those four itself, hands
//! the rest to `tokio_postgres`, and builds the TLS connector (rustls, with
//! ring) the mode asks for:
//!
//! | `sslmode` | TLS | checks |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | as `require` |
//! | `require` | always | nothing, unless `sslrootcert` is given: then as `verify-ca` (libpq's rule) |
//! | `verify-ca` | always | the certificate chains to a root of `sslrootcert` |
//! | `verify-full` | always | that, and the certificate names the host connected to |
//!
//! `sslrootcert=FILE` holds PEM CA certificates, `sslrootcert=system` takes
//! the platform's roots; `verify-ca` and `verify-full` need one of them
//! (libpq's fallback `~/.postgresql/root.crt` is not read). `sslcert=FILE`
//! and `sslkey=FILE` (PEM; PKCS#8, PKCS#1 or SEC1) give a client
//! certificate. The files are read when parsing, so a bad one is a
//! [`ConfigError`] before anything is sent. SCRAM runs without channel
//! binding (`channel_binding=require` is refused by the server's answer).
//!
//! Used by `pglease` and `pg-session-store`, so both read one URL alike.
//!
//! # Example
//!
//! ```
//! use pg_connect::{ConfigError, PgConfig, SslMode};
//!
//! let config = PgConfig::parse("postgres://app@db.internal:5432/chat?sslmode=require")?;
//! assert_eq!(config.ssl_mode(), SslMode::Require);
//! assert_eq!(config.location(), "postgres://db.internal:5432/chat");
//! assert_eq!(config.pg().get_user(), Some("app"));
//!
//! // A value libpq does not know, and a check with nothing to check against,
//! // are refused by name.
//! let typo = PgConfig::parse("postgres://db/chat?sslmode=verify_full").unwrap_err();
//! assert!(matches!(typo, ConfigError::BadValue { key: "sslmode", .. }));
//! let no_ca = PgConfig::parse("host=db dbname=chat sslmode=verify-full").unwrap_err();
//! assert!(matches!(no_ca, ConfigError::NoRootCertificate { mode: "verify-full" }));
//! # Ok::<(), ConfigError>(())
//! ```
//!
//! Connecting, and cancelling a statement that overran its deadline:
//!
//! ```no_run
//! use std::time::Duration;
//! use pg_connect::PgConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "postgres://app@db.internal/chat?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem";
//! let mut config = PgConfig::parse(url)?;
//! config.pg_mut().password("from a file");
//! let client = config.connect_driven(Duration::from_secs(5)).await?;
//! let slow = client.query("SELECT pg_sleep(60)", &[]);
//! if tokio::time::timeout(Duration::from_secs(1), slow).await.is_err() {
//!     config.cancel(&client);
//! }
//! # Ok(()) }
//! ```

mod error;
mod tls;
mod url;

use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Connection, Socket};

pub use error::{ConfigError, ConnectError, TlsError};
pub use tls::{MakeRustlsConnect, RustlsConnect, RustlsStream};

use crate::tls::{Roots, Settings};

/// libpq's `sslmode`: whether to speak TLS, and what to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SslMode {
    /// Plain TCP (or a Unix socket).
    Disable,
    /// TLS when the server offers it, plain otherwise (libpq's default).
    Prefer,
    /// TLS, the certificate checked only when `sslrootcert` is given.
    Require,
    /// TLS, the certificate chained to a trusted root.
    VerifyCa,
    /// TLS, the certificate chained to a trusted root and naming the host.
    VerifyFull,
}

impl SslMode {
    /// Its spelling in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn parse(value: &str) -> Result<SslMode, ConfigError> {
        [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ]
        .into_iter()
        .find(|m| m.as_str() == value)
        .ok_or_else(|| ConfigError::BadValue {
            key: "sslmode",
            value: value.to_owned(),
            expected: "disable, prefer, require, verify-ca, verify-full",
        })
    }
}

/// What `tokio_postgres` reads of `url` (hosts, ports, database, user, …),
/// its TLS keys left out and no file read: to tell where two URLs lead.
pub fn settings(url: &str) -> Result<tokio_postgres::Config, ConfigError> {
    url::split(url)?
        .rest
        .parse()
        .map_err(ConfigError::Unreadable)
}

/// A connection string read whole: `tokio_postgres`'s settings and the TLS
/// connector its `ssl*` keys ask for. Cheap to clone.
#[derive(Clone)]
pub struct PgConfig {
    pg: tokio_postgres::Config,
    mode: SslMode,
    tls: MakeRustlsConnect,
}

/// The password is left out.
impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("location", &self.location())
            .field("ssl_mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl PgConfig {
    /// Reads `url` (`postgres://…?…` or `key=value` pairs) and the files its
    /// TLS keys name.
    pub fn parse(url: &str) -> Result<PgConfig, ConfigError> {
        let split = url::split(url)?;
        let value = |key: &str| {
            split
                .tls
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
        };
        let mode = value("sslmode").map_or(Ok(SslMode::Prefer), SslMode::parse)?;
        let roots = match value("sslrootcert") {
            None | Some("") => Roots::None,
            Some("system") => Roots::System,
            Some(file) => Roots::File(file.into()),
        };
        if roots == Roots::None && matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
            return Err(ConfigError::NoRootCertificate {
                mode: mode.as_str(),
            });
        }
        let identity = match (value("sslcert"), value("sslkey")) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::HalfIdentity {
                    given: "sslcert",
                    missing: "sslkey",
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::HalfIdentity {
                    given: "sslkey",
                    missing: "sslcert",
                });
            }
        };
        let mut pg: tokio_postgres::Config = split.rest.parse().map_err(ConfigError::Unreadable)?;
        pg.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let tls = MakeRustlsConnect::new(&Settings {
            mode,
            roots,
            identity,
        })?;
        Ok(PgConfig { pg, mode, tls })
    }

    /// The mode asked for (`prefer` when none was).
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// The settings `tokio_postgres` reads.
    pub fn pg(&self) -> &tokio_postgres::Config {
        &self.pg
    }

    /// The settings `tokio_postgres` reads, to change some (a password from
    /// a file, an application name).
    pub fn pg_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.pg
    }

    /// The TLS connector, for `tokio_postgres` calls that take one.
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// `postgres://host:port/database`, without credentials: where errors
    /// may say the database is.
    pub fn location(&self) -> String {
        let port = self.pg.get_ports().first().copied().unwrap_or(5432);
        let db = self
            .pg
            .get_dbname()
            .or(self.pg.get_user())
            .unwrap_or("postgres");
        format!("postgres://{}:{port}/{db}", self.host())
    }

    fn host(&self) -> String {
        match self.pg.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_owned(),
        }
    }

    /// A new connection, within `bound`; the caller drives its
    /// [`Connection`] (for its notifications, say).
    pub async fn connect(
        &self,
        bound: Duration,
    ) -> Result<(Client, Connection<Socket, RustlsStream<Socket>>), ConnectError> {
        tokio::time::timeout(bound, self.pg.connect(self.tls()))
            .await
            .map_err(|_| ConnectError::TimedOut(bound))?
            .map_err(|e| ConnectError::from_pg(e, &self.host(), self.mode.as_str()))
    }

    /// A new connection, within `bound`, driven by a task of the current
    /// runtime (its notifications dropped); its end logged.
    pub async fn connect_driven(&self, bound: Duration) -> Result<Client, ConnectError> {
        let (client, connection) = self.connect(bound).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "a PostgreSQL connection ended");
            }
        });
        Ok(client)
    }

    /// Asks the server, on a new connection of the same TLS, to cancel the
    /// statement `client` is running; on a task of the current runtime, a
    /// failure logged. A statement past its deadline, or whose caller
    /// dropped it, could otherwise still commit long after its caller gave
    /// up: closing the connection does not stop a statement waiting for a
    /// lock. Outside a runtime (a future dropped as its runtime shuts
    /// down) there is nothing to send it from, and nothing is sent.
    pub fn cancel(&self, client: &Client) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a statement given up outside a runtime could not be cancelled");
            return;
        };
        let token = client.cancel_token();
        let tls = self.tls();
        runtime.spawn(async move {
            if let Err(e) = token.cancel_query(tls).await {
                tracing::warn!(error = %e, "a statement past its deadline could not be cancelled");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_the_rest_reaches_tokio_postgres() {
        for (text, mode) in [
            ("postgres://db/x", SslMode::Prefer),
            ("postgres://db/x?sslmode=disable", SslMode::Disable),
            ("postgres://db/x?sslmode=prefer", SslMode::Prefer),
            ("postgres://db/x?sslmode=require", SslMode::Require),
            ("host=db sslmode=require", SslMode::Require),
        ] {
            let config = PgConfig::parse(text).unwrap();
            assert_eq!(config.ssl_mode(), mode, "{text}");
            assert_eq!(config.pg().get_dbname().or(Some("x")), Some("x"));
        }
        let config =
            PgConfig::parse("postgres://u:secret@db:6432/chat?application_name=a").unwrap();
        assert_eq!(config.pg().get_application_name(), Some("a"));
        assert_eq!(config.location(), "postgres://db:6432/chat");
        assert!(!format!("{config:?}").contains("secret"));
        let unknown = PgConfig::parse("postgres://db/x?sslcrl=/x").unwrap_err();
        assert!(matches!(unknown, ConfigError::Unreadable(_)), "{unknown}");
        let target =
            settings("postgres://u@db:7/chat?sslmode=verify-full&sslrootcert=/none").unwrap();
        assert_eq!(target.get_ports(), [7]);
        assert_eq!(target.get_dbname(), Some("chat"));
    }

    #[test]
    fn bad_tls_settings_are_refused_by_name() {
        for (text, want) in [
            ("postgres://db/x?sslmode=allow", "sslmode"),
            ("postgres://db/x?sslmode=verify-ca", "verify-ca"),
            (
                "postgres://db/x?sslmode=verify-full&sslrootcert=",
                "verify-full",
            ),
            ("postgres://db/x?sslcert=c.pem", "without sslkey"),
            ("postgres://db/x?sslkey=k.pem", "without sslcert"),
            (
                "postgres://db/x?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
                "/no/such/ca.pem",
            ),
        ] {
            let err = PgConfig::parse(text).unwrap_err();
            assert!(err.to_string().contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn a_root_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let url = format!(
            "postgres://db/x?sslmode=verify-full&sslrootcert={}",
            empty.display()
        );
        let err = PgConfig::parse(&url).unwrap_err();
        assert!(
            matches!(&err, ConfigError::File { key: "sslrootcert", path, .. } if *path == empty),
            "{err}"
        );
    }
}
