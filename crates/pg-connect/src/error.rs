//! Why a URL cannot be used, and why a connection was not opened.

use std::path::PathBuf;
use std::time::Duration;

/// A connection string that cannot be used: nothing was sent anywhere.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The string itself is broken: a bad `%` escape, an unclosed quote, a
    /// key without `=`.
    #[error("the PostgreSQL URL is malformed: {detail}")]
    Malformed {
        /// What is broken.
        detail: String,
    },
    /// A TLS key has a value it does not take.
    #[error("the PostgreSQL URL's {key}={value:?} is not one of {expected}")]
    BadValue {
        /// The key (`sslmode`, …).
        key: &'static str,
        /// The value given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// `sslmode=verify-ca` or `verify-full` without `sslrootcert`: there is
    /// nothing to verify the server's certificate against.
    #[error(
        "sslmode={mode} needs sslrootcert=FILE (the PEM of the CA that signed the server's \
         certificate) or sslrootcert=system (the platform's roots)"
    )]
    NoRootCertificate {
        /// The mode asked for.
        mode: &'static str,
    },
    /// One half of a client certificate: `sslcert` without `sslkey`, or the
    /// other way round.
    #[error("the PostgreSQL URL gives {given} without {missing}: a client certificate needs both")]
    HalfIdentity {
        /// The key given.
        given: &'static str,
        /// The key missing.
        missing: &'static str,
    },
    /// A file a TLS key names cannot be read, or holds no PEM of the kind
    /// the key wants.
    #[error("the PostgreSQL URL's {key} {}: {detail}", path.display())]
    File {
        /// The key naming it.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The TLS settings were refused as a whole (a client key that does not
    /// match its certificate, a root certificate rustls cannot use).
    #[error("the PostgreSQL URL's TLS settings cannot be used: {0}")]
    Tls(#[source] rustls::Error),
    /// The rest of the URL, as `tokio_postgres::Config` reads it.
    #[error("the PostgreSQL URL cannot be read: {0}")]
    Unreadable(#[source] tokio_postgres::Error),
}

/// Which check of TLS failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The server answered the TLS request with "no": it does not speak
    /// TLS, and the mode requires it.
    #[error("the server at {host} does not offer TLS, which sslmode={mode} requires")]
    NotOffered {
        /// The host connected to.
        host: String,
        /// The mode.
        mode: &'static str,
    },
    /// The server's certificate does not chain to a root of `sslrootcert`
    /// (or is expired, or otherwise invalid).
    #[error("the certificate of {host} is not trusted: {source}")]
    Untrusted {
        /// The host connected to.
        host: String,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// The certificate chains to a trusted root but does not name the host
    /// (`sslmode=verify-full` checks that; `verify-ca` does not).
    #[error(
        "the certificate of {host} does not name {host}, and sslmode=verify-full requires it \
         to: connect by a name it carries (or use verify-ca, which checks the chain only)"
    )]
    WrongName {
        /// The host connected to.
        host: String,
    },
    /// The host cannot be a TLS server name.
    #[error("{host:?} cannot be checked as a TLS server name")]
    BadHostName {
        /// The host.
        host: String,
    },
    /// TLS was asked of a configuration that turned it off: a bug of the
    /// caller.
    #[error("TLS is disabled (sslmode=disable)")]
    Disabled,
    /// The handshake failed otherwise (the connection broke, no common
    /// protocol version).
    #[error("the TLS handshake with {host} failed")]
    Handshake {
        /// The host connected to.
        host: String,
        /// What broke.
        #[source]
        source: std::io::Error,
    },
}

/// Why no connection was opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// Not within the bound.
    #[error("PostgreSQL did not accept a connection within {0:?}")]
    TimedOut(Duration),
    /// TLS failed: which check, and where.
    #[error("TLS to PostgreSQL failed: {0}")]
    Tls(#[source] TlsError),
    /// PostgreSQL (or the network) refused: the address, the login, the
    /// database.
    #[error("PostgreSQL refused a connection")]
    Refused(#[source] tokio_postgres::Error),
}

impl ConnectError {
    /// The TLS check that failed, found in `e`'s sources; else `e` itself.
    pub(crate) fn from_pg(e: tokio_postgres::Error, host: &str, mode: &'static str) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        while let Some(s) = source {
            if let Some(tls) = s.downcast_ref::<TlsError>() {
                return ConnectError::Tls(tls.clone_shallow());
            }
            // tokio-postgres's own words when the server answers the TLS
            // request with "N"; it has no kind to match on.
            if s.to_string() == "server does not support TLS" {
                return ConnectError::Tls(TlsError::NotOffered {
                    host: host.to_owned(),
                    mode,
                });
            }
            source = s.source();
        }
        ConnectError::Refused(e)
    }
}

impl TlsError {
    /// A copy for the caller, the I/O error's message kept when the error
    /// itself cannot be cloned.
    fn clone_shallow(&self) -> TlsError {
        match self {
            TlsError::NotOffered { host, mode } => TlsError::NotOffered {
                host: host.clone(),
                mode,
            },
            TlsError::Untrusted { host, source } => TlsError::Untrusted {
                host: host.clone(),
                source: source.clone(),
            },
            TlsError::WrongName { host } => TlsError::WrongName { host: host.clone() },
            TlsError::BadHostName { host } => TlsError::BadHostName { host: host.clone() },
            TlsError::Disabled => TlsError::Disabled,
            TlsError::Handshake { host, source } => TlsError::Handshake {
                host: host.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
        }
    }
}
