//! TLS for `tokio_postgres` over rustls (ring), checking what the mode asks.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::SslMode;
use crate::error::{ConfigError, TlsError};

/// Where the server's certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// Nothing: encrypt, check nothing (`require` without `sslrootcert`).
    None,
    /// The platform's roots (`sslrootcert=system`).
    System,
    /// The PEM certificates in this file.
    File(std::path::PathBuf),
}

/// What the TLS keys of a URL ask for, read and checked.
pub(crate) struct Settings {
    pub(crate) mode: SslMode,
    pub(crate) roots: Roots,
    pub(crate) identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Makes the TLS connector of each connection; cheap to clone (one rustls
/// configuration shared).
#[derive(Clone)]
pub struct MakeRustlsConnect {
    config: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for MakeRustlsConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustlsConnect")
            .field("tls", &self.config.is_some())
            .finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl MakeRustlsConnect {
    /// The connector `settings` describe; its files read now, so a bad one
    /// is refused before any connection is tried.
    pub(crate) fn new(settings: &Settings) -> Result<Self, ConfigError> {
        if settings.mode == SslMode::Disable {
            return Ok(Self { config: None });
        }
        let provider = provider();
        let verifier: Arc<dyn ServerCertVerifier> = match (&settings.roots, settings.mode) {
            (Roots::None, _) => Arc::new(AnyCertificate(provider.clone())),
            (roots, mode) => {
                let store = Arc::new(root_store(roots)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(store, provider.clone())
                    .build()
                    .map_err(|e| ConfigError::File {
                        key: "sslrootcert",
                        path: root_path(roots),
                        detail: e.to_string(),
                    })?;
                if mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ConfigError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &settings.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates("sslcert", cert)?, private_key(key)?)
                .map_err(ConfigError::Tls)?,
        };
        // PostgreSQL 17 requires it with sslnegotiation=direct; older
        // servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Self {
            config: Some(Arc::new(config)),
        })
    }
}

fn root_path(roots: &Roots) -> std::path::PathBuf {
    match roots {
        Roots::File(path) => path.clone(),
        _ => "system".into(),
    }
}

fn root_store(roots: &Roots) -> Result<RootCertStore, ConfigError> {
    let mut store = RootCertStore::empty();
    let certs = match roots {
        Roots::None => Vec::new(),
        Roots::File(path) => certificates("sslrootcert", path)?,
        Roots::System => rustls_native_certs::load_native_certs().certs,
    };
    let (_, unusable) = store.add_parsable_certificates(certs);
    if store.is_empty() {
        return Err(ConfigError::File {
            key: "sslrootcert",
            path: root_path(roots),
            detail: format!("no usable CA certificate ({unusable} could not be used)"),
        });
    }
    Ok(store)
}

fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bad = |detail: String| ConfigError::File {
        key,
        path: path.to_path_buf(),
        detail,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, ConfigError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| ConfigError::File {
        key: "sslkey",
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// `require` without a root certificate, as libpq: the channel is
/// encrypted and the handshake's signatures checked, the certificate not.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name may be any.
/// webpki checks the chain before the name, so a name error means the
/// chain passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl<S> MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = TlsError;

    /// Never fails: tokio-postgres asks for a connector before it knows
    /// whether TLS will be spoken (not with `disable`, nor on a Unix
    /// socket, whose "host" is no server name), so a connector that cannot
    /// serve says so only if it is used.
    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, TlsError> {
        Ok(RustlsConnect {
            connector: self.config.clone().map(tokio_rustls::TlsConnector::from),
            name: ServerName::try_from(host.to_owned()).ok(),
            host: host.to_owned(),
        })
    }
}

/// The TLS connector of one connection.
pub struct RustlsConnect {
    connector: Option<tokio_rustls::TlsConnector>,
    name: Option<ServerName<'static>>,
    host: String,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream<S>, TlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = self.connector.ok_or(TlsError::Disabled)?;
            let name = self.name.ok_or_else(|| TlsError::BadHostName {
                host: self.host.clone(),
            })?;
            match connector.connect(name, stream).await {
                Ok(tls) => Ok(RustlsStream(tls)),
                Err(e) => Err(handshake_error(self.host, e)),
            }
        })
    }
}

/// rustls's certificate verdicts, named for what to fix.
fn handshake_error(host: String, e: io::Error) -> TlsError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => TlsError::WrongName { host },
        Some(cert @ rustls::Error::InvalidCertificate(_)) => TlsError::Untrusted {
            host,
            source: cert.clone(),
        },
        _ => TlsError::Handshake { host, source: e },
    }
}

/// A TLS connection to PostgreSQL.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// No channel binding is offered: SCRAM then runs without it, as with
/// `channel_binding=prefer` (the default) against any TLS library that
/// offers none.
impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
