//! etcd v3 leases: processes on several hosts that reach one etcd cluster.

use std::path::PathBuf;
#[cfg(feature = "etcd")]
use std::time::Duration;

#[cfg(feature = "etcd")]
use crate::error::{OpenError, OpenErrorKind};

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdLeases {
    /// Client endpoints of the cluster.
    pub endpoints: Vec<String>,
    /// Key prefix shared by the servers.
    pub prefix: String,
    /// PEM CA of the members' certificates: TLS when set.
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A user and the file holding its password, for a cluster with
    /// authentication enabled.
    pub user: Option<(String, PathBuf)>,
}

impl EtcdLeases {
    /// `etcd at ENDPOINTS`, for messages.
    pub fn describe(&self) -> String {
        format!("etcd at {}", self.endpoints.join(","))
    }

    /// The backend, granting `ttl`. Its files are read now; etcd itself is
    /// reached on first use.
    #[cfg(feature = "etcd")]
    pub fn open(&self, ttl: Duration) -> Result<etcdlease::EtcdLease, OpenError> {
        let file = |e| OpenError::file(self.describe(), e);
        let mut b = etcdlease::EtcdLease::builder(self.endpoints.iter().map(String::as_str))
            .prefix(self.prefix.clone())
            .ttl(ttl)
            // Both servers answer a request meeting a lapsed hold at once
            // (409, or held) rather than keep it waiting past its caller's
            // deadline; its retries see the session free.
            .lapsed_hold_wait(Duration::ZERO);
        if let Some(ca) = &self.ca {
            let ca = crate::read_tls_file(ca, "etcd CA").map_err(file)?;
            let mut tls = etcdlease::TlsOptions::default().ca_certificate_pem(ca);
            if let Some((cert, key)) = &self.identity {
                tls = tls.client_identity_pem(
                    crate::read_tls_file(cert, "etcd client certificate").map_err(file)?,
                    crate::read_tls_file(key, "etcd client key").map_err(file)?,
                );
            }
            b = b.tls(tls);
        }
        if let Some((user, password_file)) = &self.user {
            let credentials = crate::read_etcd_credentials(user, password_file).map_err(|e| {
                OpenError::new(OpenErrorKind::File, self.describe(), e).at(password_file)
            })?;
            b = b.credentials(credentials);
        }
        b.build()
            .map_err(|e| OpenError::new(OpenErrorKind::Backend, self.describe(), e))
    }
}
