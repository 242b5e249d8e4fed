//! A remote lease service over gRPC (`mecatl-leased`, or any server of the
//! `mecatl.lease.v1` contract): processes on several hosts.

use std::path::PathBuf;
#[cfg(feature = "grpc")]
use std::time::Duration;

#[cfg(feature = "grpc")]
use crate::error::{OpenError, OpenErrorKind};

/// How to reach a remote lease service.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseService {
    /// `HOST:PORT`, or an `http://` / `https://` URI.
    pub address: String,
    /// File holding the bearer token, if the service requires one.
    pub token_file: Option<PathBuf>,
    /// PEM CA of the service's certificate: TLS when set.
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the service's certificate is checked against.
    pub tls_domain: Option<String>,
    /// Send the token in plain text to a non-loopback address.
    pub plaintext_token: bool,
}

impl std::fmt::Debug for LeaseService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseService")
            .field("address", &self.address)
            .field("token_file", &self.token_file)
            .field("tls", &self.ca.is_some())
            .field("mutual_tls", &self.identity.is_some())
            .finish()
    }
}

impl LeaseService {
    /// `the lease service at ADDRESS`, for messages.
    pub fn describe(&self) -> String {
        format!("the lease service at {}", self.address)
    }

    /// The client, for a holder that counts on leases of `ttl`. Its files
    /// are read now; the service is reached on first use.
    ///
    /// Its calls give up well within the renewal margin (a sixth of the
    /// TTL, at most two seconds), so a stuck call never eats the time a
    /// keeper has left to renew; and every grant must cover `ttl`, or two
    /// owners could overlap, so a shorter one is refused at once.
    #[cfg(feature = "grpc")]
    pub fn open(&self, ttl: Duration) -> Result<grpcdriver::GrpcLease, OpenError> {
        let file = |e| OpenError::file(self.describe(), e);
        let mut b = grpcdriver::GrpcLease::builder(self.address.clone())
            .call_timeout((ttl / 6).min(grpcdriver::DEFAULT_CALL_TIMEOUT))
            .min_grant(ttl)
            .allow_plaintext_token(self.plaintext_token);
        if let Some(path) = &self.token_file {
            b = b.bearer_token(
                crate::read_token_file(path, "lease service token file").map_err(file)?,
            );
        }
        if let Some(ca) = &self.ca {
            let ca = crate::read_tls_file(ca, "lease service CA").map_err(file)?;
            let mut tls = grpcdriver::ClientTls::new(ca);
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(
                    crate::read_tls_file(cert, "client certificate").map_err(file)?,
                    crate::read_tls_file(key, "client key").map_err(file)?,
                );
            }
            if let Some(domain) = &self.tls_domain {
                tls = tls.domain(domain.clone());
            }
            b = b.tls(tls);
        }
        b.build()
            .map_err(|e| OpenError::new(OpenErrorKind::Backend, self.describe(), e))
    }
}
