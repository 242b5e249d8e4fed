//! How a client reaches its server: address, TLS, credentials, deadlines,
//! retries.

use std::sync::Arc;
use std::time::Duration;

use lease_port::{Clock, LeaseError, SystemClock};
use tonic::transport::{Channel, Endpoint};

/// Deadline of one call (all its attempts), unless configured otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Time allowed to open a connection, unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Attempts of an idempotent call refused with UNAVAILABLE, unless
/// configured otherwise.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// Leases per batch the client sends; larger renewals are split.
pub const DEFAULT_CLIENT_BATCH: usize = 1024;

/// Client-side TLS: the CA that signed the server's certificate, and for
/// mutual TLS the client's own certificate and key.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain: Option<String>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("mutual", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tls")]
impl ClientTls {
    /// Trusts servers whose certificate this PEM CA signed.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        }
    }

    /// Presents this PEM certificate and key (mutual TLS).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The name to verify the server's certificate against, when it is not
    /// the host in the address (e.g. connecting by IP).
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    fn config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut c = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        if let Some(d) = &self.domain {
            c = c.domain_name(d.clone());
        }
        c
    }
}

/// Configures a [`GrpcLease`](crate::GrpcLease).
#[derive(Debug, Clone)]
pub struct GrpcLeaseBuilder {
    pub(crate) address: String,
    pub(crate) bearer: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<ClientTls>,
    pub(crate) call_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) attempts: u32,
    pub(crate) max_batch: usize,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) min_grant: Option<Duration>,
    pub(crate) plaintext_token: bool,
    pub(crate) transport: Option<Transport>,
}

/// How the channel is made from its configured endpoint, when not over TCP.
#[derive(Clone)]
pub(crate) struct Transport(Arc<dyn Fn(Endpoint) -> Channel + Send + Sync>);

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transport(..)")
    }
}

impl GrpcLeaseBuilder {
    pub(crate) fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            bearer: None,
            #[cfg(feature = "tls")]
            tls: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            attempts: DEFAULT_ATTEMPTS,
            max_batch: DEFAULT_CLIENT_BATCH,
            clock: Arc::new(SystemClock),
            min_grant: None,
            plaintext_token: false,
            transport: None,
        }
    }

    /// Connects through `connect` instead of TCP: it is handed the endpoint
    /// this builder configured (the address as its URI, the timeouts, the
    /// HTTP/2 keep-alive, TLS) and returns a channel over a transport of
    /// its own, typically with [`Endpoint::connect_with_connector_lazy`]:
    /// a Unix socket, an in-process pipe, a simulated network. It should
    /// connect lazily, as the TCP channel does, so building the client
    /// never waits for the server.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use grpcdriver::GrpcLease;
    /// // The channel's tasks run on the runtime the client is built in.
    /// let client = GrpcLease::builder("http://leases.internal:7878")
    ///     .transport(|endpoint| endpoint.connect_lazy())
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn transport(
        mut self,
        connect: impl Fn(Endpoint) -> Channel + Send + Sync + 'static,
    ) -> Self {
        self.transport = Some(Transport(Arc::new(connect)));
        self
    }

    /// Sends `authorization: Bearer <token>` with every lease call.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer = Some(token.into());
        self
    }

    /// Connects with TLS (and mutual TLS when the config has an identity).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The deadline of one call, all its attempts included; it is also sent
    /// to the server (`grpc-timeout`). Keep it well under the margin the
    /// keeper leaves for renewal (TTL/6 or less), so a stuck call is given
    /// up on while the lease still has time to be renewed.
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }

    /// The time allowed to open a connection.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Attempts of an idempotent call answered UNAVAILABLE (at least 1),
    /// all within the call's deadline.
    pub fn attempts(mut self, n: u32) -> Self {
        self.attempts = n.max(1);
        self
    }

    /// Leases per batch sent to the server; larger renewals are split.
    /// Keep it at or under the server's limit.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The clock expiries are reckoned on (the time a request was sent plus
    /// the remaining time the server answered).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Refuses any grant that lives less than `ttl` from when its request
    /// was sent: an acquire is answered `Invalid`, a renewal `Invalid` (the
    /// keeper takes that as loss). Set it to the TTL the caller counts on
    /// (the keeper's), so a lease service configured with a shorter TTL is
    /// found out on the first grant instead of letting two owners overlap.
    pub fn min_grant(mut self, ttl: Duration) -> Self {
        self.min_grant = Some(ttl);
        self
    }

    /// Sends the bearer token over plain text to a host other than
    /// loopback. Refused by default: anyone on the path could read the
    /// token and take or release any lease.
    pub fn allow_plaintext_token(mut self, allow: bool) -> Self {
        self.plaintext_token = allow;
        self
    }

    /// Whether the configured address is this host (loopback): a token may
    /// cross it in plain text.
    pub(crate) fn is_loopback(&self) -> bool {
        let uri: tonic::codegen::http::Uri = match self.uri().parse() {
            Ok(u) => u,
            Err(_) => return false,
        };
        let host = uri.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// The address with a scheme: `https://` when TLS is configured,
    /// `http://` otherwise, unless the address names one.
    pub(crate) fn uri(&self) -> String {
        if self.address.contains("://") {
            return self.address.clone();
        }
        #[cfg(feature = "tls")]
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        #[cfg(not(feature = "tls"))]
        let scheme = "http";
        format!("{scheme}://{}", self.address)
    }

    /// A lazily connecting channel: building a client never waits for the
    /// server, and a server that is down is a `Transient` error per call.
    pub(crate) fn channel(&self) -> Result<Channel, LeaseError> {
        let uri = self.uri();
        let endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| {
                LeaseError::invalid(format!("lease service address {uri:?}: {e}")).with_source(e)
            })?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            // A connection whose peer vanished (a blackhole, a dead host)
            // is noticed and replaced instead of hanging every call.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        #[cfg(feature = "tls")]
        let endpoint = match &self.tls {
            Some(tls) => endpoint.tls_config(tls.config()).map_err(|e| {
                LeaseError::invalid(format!("TLS configuration: {e}")).with_source(e)
            })?,
            None => endpoint,
        };
        Ok(match &self.transport {
            Some(Transport(connect)) => connect(endpoint),
            None => endpoint.connect_lazy(),
        })
    }
}
