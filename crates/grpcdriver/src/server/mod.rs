//! The server: any [`SessionLease`] behind the lease service, with the
//! standard health and reflection services beside it.

mod auth;
mod identity;
mod service;
mod stats;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_port::{Clock, SessionLease, SystemClock};
use tokio::net::TcpListener;
use tonic::codegen::http;
use tonic::transport::server::TcpIncoming;
use tracing::{info, warn};

pub use identity::{
    CertName, ClientIdentity, Identities, IdentitiesError, IdentitiesErrorKind, IdentityStore,
    OwnerScope, hash_token,
};
pub use stats::ServerStats;

use crate::pb::{self, lease_service_server::LeaseServiceServer};
use auth::{AuthLayer, Authenticator};
use service::LeaseService;

/// The most leases one batch may carry, unless configured otherwise.
pub const DEFAULT_MAX_BATCH: usize = 4096;
/// The largest request message accepted, unless configured otherwise: a
/// full batch of leases with the longest ids fits.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Concurrent calls per connection, unless configured otherwise.
pub const DEFAULT_CONCURRENCY_PER_CONNECTION: usize = 256;
/// Concurrent calls and streams per connection (HTTP/2's own limit, which
/// also bounds long-lived KeepAlive streams), unless configured otherwise.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// A KeepAlive stream that carries no batch for this long is closed.
pub const DEFAULT_STREAM_IDLE: Duration = Duration::from_secs(120);
/// The longest a call may run on the server, whatever deadline its client
/// sent.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address is reachable from other hosts and no authentication is
    /// configured; pass [`LeaseServer::allow_insecure`] to accept that.
    #[error(
        "refusing to serve leases on {0} without authentication: configure a bearer token or \
         client certificates, listen on loopback, or allow insecure serving explicitly"
    )]
    Unauthenticated(SocketAddr),
    /// One shared bearer token and per-client identities were both
    /// configured: the shared token would let its holders act for any
    /// owner. List it in the identities (`token NAME * sha256:…`) if that
    /// is meant.
    #[error(
        "a shared bearer token beside identities would act for every owner: list it in the \
         identities as `token NAME * sha256:…` if that is meant, else drop it"
    )]
    SharedTokenBesideIdentities,
    /// The TLS configuration was refused.
    #[error("TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// Reflection could not read the contract's descriptors.
    #[error("reflection: {0}")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// The backend could not name its authority.
    #[error("the lease backend names no authority: {0}")]
    Backend(#[source] lease_port::LeaseError),
    /// The listener failed.
    #[error("listener: {0}")]
    Io(#[source] std::io::Error),
    /// The transport failed while serving.
    #[error("serving: {0}")]
    Transport(#[source] tonic::transport::Error),
}

/// Server-side TLS: a certificate and key, and optionally the CA whose
/// client certificates are required (mutual TLS).
#[cfg(feature = "tls")]
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mutual", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tls")]
impl ServerTls {
    /// Serves TLS with this PEM certificate chain and PEM private key.
    pub fn new(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            client_ca_pem: None,
        }
    }

    /// Requires every client to present a certificate signed by this PEM
    /// CA (mutual TLS); a client without one fails the handshake.
    pub fn require_client_certs(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.client_ca_pem = Some(ca_pem.into());
        self
    }

    fn config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let mut c =
            ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem));
        if let Some(ca) = &self.client_ca_pem {
            c = c.client_ca_root(Certificate::from_pem(ca));
        }
        c
    }
}

/// Who may read a session's holder with `Get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GetAccess {
    /// Every authenticated caller reads every session's holder and token.
    /// Safe when callers are told apart: a token lets nobody release a
    /// lease its identity may not act for.
    #[default]
    Everyone,
    /// A caller reads a held session only when its identity may act for
    /// the holder; otherwise PERMISSION_DENIED, reason NOT_PERMITTED. A
    /// free session reads as free to everyone.
    OwnOwners,
}

/// A lease service over one backend, configured and ready to serve.
///
/// Health (`grpc.health.v1.Health`, reporting `mecatl.lease.v1.LeaseService`)
/// and reflection (v1 and v1alpha) are served beside it without
/// authentication, so probes and tools such as `grpcurl` can find it; the
/// lease service itself requires the configured bearer token and/or client
/// certificate.
///
/// With [`identities`](LeaseServer::identities), or client certificates,
/// each caller acts only for its own owner ids ([`OwnerScope`]): a call
/// naming another owner is refused with PERMISSION_DENIED, reason
/// NOT_PERMITTED, so one client can neither take nor release another's
/// leases. One shared [`bearer_token`](LeaseServer::bearer_token) cannot
/// tell its holders apart, and lets each act for any owner.
pub struct LeaseServer {
    backend: Arc<dyn SessionLease>,
    clock: Arc<dyn Clock>,
    bearer: Option<Arc<str>>,
    identities: Option<IdentityStore>,
    get_access: GetAccess,
    #[cfg(feature = "tls")]
    tls: Option<ServerTls>,
    allow_insecure: bool,
    max_batch: usize,
    max_message_bytes: usize,
    concurrency_per_connection: usize,
    call_timeout: Duration,
    max_streams: u32,
    stream_idle: Duration,
    ttl: Option<Duration>,
    stats: Arc<ServerStats>,
}

impl std::fmt::Debug for LeaseServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseServer")
            .field("bearer", &self.bearer.as_ref().map(|_| "<set>"))
            .field("allow_insecure", &self.allow_insecure)
            .field("max_batch", &self.max_batch)
            .field("max_message_bytes", &self.max_message_bytes)
            .finish_non_exhaustive()
    }
}

impl LeaseServer {
    /// Serves `backend` with every default: no authentication (loopback
    /// only), no TLS, the limits above.
    pub fn new(backend: Arc<dyn SessionLease>) -> Self {
        Self {
            backend,
            clock: Arc::new(SystemClock),
            bearer: None,
            identities: None,
            get_access: GetAccess::default(),
            #[cfg(feature = "tls")]
            tls: None,
            allow_insecure: false,
            max_batch: DEFAULT_MAX_BATCH,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            concurrency_per_connection: DEFAULT_CONCURRENCY_PER_CONNECTION,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            max_streams: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            stream_idle: DEFAULT_STREAM_IDLE,
            ttl: None,
            stats: Arc::default(),
        }
    }

    /// The clock the backend's expiries are read against when turning them
    /// into remaining time (the backend's own clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Requires `authorization: Bearer <token>` on every lease call: one
    /// token shared by every client, each of which may then act for any
    /// owner. Serving refuses it beside
    /// [`identities`](LeaseServer::identities)
    /// ([`ServeError::SharedTokenBesideIdentities`]).
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer = Some(Arc::from(token.into()));
        self
    }

    /// Authenticates callers by these identities: each bearer token or
    /// client certificate they list names a client and the owner ids it
    /// may act for. Keep a clone of the store to replace or
    /// [`reload`](IdentityStore::reload) them while serving.
    pub fn identities(mut self, identities: IdentityStore) -> Self {
        self.identities = Some(identities);
        self
    }

    /// Who may read a session's holder ([`GetAccess::Everyone`] unless
    /// set).
    pub fn get_access(mut self, access: GetAccess) -> Self {
        self.get_access = access;
        self
    }

    /// Serves TLS (and mutual TLS when the config requires client
    /// certificates).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Accepts serving on a non-loopback address without authentication.
    /// Anyone who can reach the port can then take or release any lease.
    pub fn allow_insecure(mut self, allow: bool) -> Self {
        self.allow_insecure = allow;
        self
    }

    /// The most leases one BatchRenew call or KeepAlive batch may carry.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The largest request message accepted; larger ones are refused with
    /// INVALID_ARGUMENT before they are read.
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.max_message_bytes = n;
        self
    }

    /// Concurrent calls per connection; more wait their turn.
    pub fn concurrency_per_connection(mut self, n: usize) -> Self {
        self.concurrency_per_connection = n.max(1);
        self
    }

    /// The longest a call may run, whatever deadline its client sent.
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }

    /// The TTL the backend grants, stated to clients (GetAuthority) so a
    /// client that counts on a longer one refuses to start instead of
    /// acting past its grant.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Concurrent streams per connection (unary calls and KeepAlive
    /// streams alike); HTTP/2 refuses more.
    pub fn max_streams_per_connection(mut self, n: u32) -> Self {
        self.max_streams = n.max(1);
        self
    }

    /// How long a KeepAlive stream may carry nothing before it is closed.
    pub fn stream_idle(mut self, d: Duration) -> Self {
        self.stream_idle = d;
        self
    }

    /// The server's counters (shared: keep the handle to read them while
    /// it serves, e.g. for a metrics endpoint).
    pub fn stats(&self) -> Arc<ServerStats> {
        Arc::clone(&self.stats)
    }

    fn authenticator(&self) -> Authenticator {
        #[cfg(feature = "tls")]
        let mutual_tls = self.tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some());
        #[cfg(not(feature = "tls"))]
        let mutual_tls = false;
        Authenticator {
            shared_token: self.bearer.clone(),
            identities: self.identities.clone(),
            mutual_tls,
        }
    }

    fn authenticated(&self) -> bool {
        self.authenticator().authenticates()
    }

    fn encrypted(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Refuses an exposed address without authentication (unless allowed),
    /// and a shared bearer token beside identities.
    pub fn check_exposure(&self, addr: SocketAddr) -> Result<(), ServeError> {
        if self.bearer.is_some() && self.identities.is_some() {
            return Err(ServeError::SharedTokenBesideIdentities);
        }
        if addr.ip().is_loopback() {
            return Ok(());
        }
        if !self.authenticated() {
            if self.allow_insecure {
                warn!(%addr, "serving leases without authentication on a non-loopback address");
                return Ok(());
            }
            return Err(ServeError::Unauthenticated(addr));
        }
        if (self.bearer.is_some() || self.identities.is_some()) && !self.encrypted() {
            warn!(%addr, "bearer tokens cross the network in clear text: configure TLS");
        }
        if !self.authenticator().tells_callers_apart() {
            warn!(
                %addr,
                "one shared bearer token: every client may act for any owner, and so release \
                 any other's leases; give each client an identity of its own"
            );
        }
        Ok(())
    }

    /// Serves on `listener` until `shutdown` completes, then stops taking
    /// calls and lets those in flight finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let addr = listener.local_addr().map_err(ServeError::Io)?;
        self.check_exposure(addr)?;
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        self.serve_on(incoming, shutdown, Some(addr)).await
    }

    /// Serves on the connections `incoming` yields, until `shutdown`
    /// completes, as [`serve`](Self::serve) does on a TCP listener: for a
    /// transport of your own (a Unix socket, an in-process pipe, a
    /// simulated network). The configuration is checked as for any
    /// address (a shared token beside identities is refused), but with no
    /// address nothing can tell whether the transport reaches other hosts:
    /// one that does needs the authentication and TLS
    /// [`serve`](Self::serve) would demand, and without authentication a
    /// warning says so unless [`allow_insecure`](Self::allow_insecure) was
    /// set.
    pub async fn serve_with_incoming<I, IO, IE>(
        self,
        incoming: I,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError>
    where
        I: tokio_stream::Stream<Item = Result<IO, IE>>,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if self.bearer.is_some() && self.identities.is_some() {
            return Err(ServeError::SharedTokenBesideIdentities);
        }
        if !self.authenticated() && !self.allow_insecure {
            warn!(
                "serving leases without authentication on a transport of the caller's: \
                 reachable from other hosts, any client may act for any owner"
            );
        }
        self.serve_on(incoming, shutdown, None).await
    }

    async fn serve_on<I, IO, IE>(
        self,
        incoming: I,
        shutdown: impl Future<Output = ()> + Send,
        addr: Option<SocketAddr>,
    ) -> Result<(), ServeError>
    where
        I: tokio_stream::Stream<Item = Result<IO, IE>>,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(pb::SERVICE_NAME, tonic_health::ServingStatus::Serving)
            .await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(ServeError::Reflection)?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .map_err(ServeError::Reflection)?;
        let (stop_streams, stopping) = tokio::sync::watch::channel(false);
        let shutdown = async move {
            shutdown.await;
            let _ = stop_streams.send(true);
        };
        let authority = self
            .backend
            .authority()
            .await
            .map_err(ServeError::Backend)?;
        let auth = Arc::new(self.authenticator());
        let leases = LeaseServiceServer::new(LeaseService {
            backend: Arc::clone(&self.backend),
            clock: Arc::clone(&self.clock),
            max_batch: self.max_batch,
            stats: Arc::clone(&self.stats),
            stopping,
            authority: Arc::from(authority.as_str()),
            ttl: self.ttl,
            call_timeout: self.call_timeout,
            stream_idle: self.stream_idle,
            auth: Arc::clone(&auth),
            get_access: self.get_access,
        })
        .max_decoding_message_size(self.max_message_bytes);
        let leases = tonic::service::interceptor::InterceptedService::new(
            leases,
            AuthLayer(Arc::clone(&auth)),
        );

        let builder = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(self.concurrency_per_connection)
            .max_concurrent_streams(self.max_streams)
            .timeout(self.call_timeout)
            .http2_keepalive_interval(Some(Duration::from_secs(20)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)));
        #[cfg(feature = "tls")]
        let builder = match &self.tls {
            Some(tls) => builder.tls_config(tls.config()).map_err(ServeError::Tls)?,
            None => builder,
        };
        info!(
            addr = addr.map(tracing::field::display),
            authenticated = self.authenticated(),
            callers_told_apart = auth.tells_callers_apart(),
            get_access = ?self.get_access,
            "serving leases"
        );
        let mut builder =
            builder.layer(tower::util::MapResponseLayer::new(input_errors_as_invalid));
        builder
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(leases)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(ServeError::Transport)
    }
}

/// gRPC's codec answers a request larger than the limit with OUT_OF_RANGE
/// and an undecodable one with INTERNAL, before any handler runs. Both are
/// the caller's bad input, and the contract promises INVALID_ARGUMENT for
/// bad input; handlers never answer either code themselves, so a response
/// that carries one in its headers (a trailers-only answer) came from the
/// codec.
fn input_errors_as_invalid(
    mut response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers_mut();
    let codec_refusal = match headers.get("grpc-status").map(http::HeaderValue::as_bytes) {
        Some(b"11") => true,
        Some(b"13") => headers.get("grpc-message").is_some_and(|m| {
            m.as_bytes().starts_with(b"failed%20to%20decode")
                || m.as_bytes().starts_with(b"failed to decode")
        }),
        _ => false,
    };
    if codec_refusal {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    }
    response
}
