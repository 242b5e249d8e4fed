//! Kube clients whose connections to their API server are bounded.
//!
//! kube's default client speaks HTTP/1.1 through a pool that opens a new
//! connection whenever every open one is busy, so a burst of concurrent
//! requests (a thousand acquires at start-up) opens about as many TCP
//! connections. Here the connector itself holds a permit per open
//! connection: a request that finds every connection busy waits for one to
//! come back to the pool instead of opening another.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use lease_port::LeaseError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::retry::RetryLayer;
use tower::{BoxError, Service, ServiceBuilder};

/// How many TCP connections a client built here keeps to its API server
/// at most, when no other bound is given.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;

/// How long opening one connection may take, waiting for a free permit
/// included, when the configuration gives no connect timeout.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A kube client for `config` that keeps at most `max_connections` TCP
/// connections to the API server open at once, however many requests its
/// clones send concurrently: requests beyond them wait for a connection
/// to come free (see the crate docs, "Connections"). Every clone of the
/// returned client shares the one pool and its bound, so give clones of one
/// client to every [`K8sLease`](crate::K8sLease) of a process that talks to
/// that API server.
///
/// Authentication, extra headers and kube's retry of 429, 503 and 504
/// answers follow `config`, as with `kube::Client::try_from`. A bound of
/// zero, an HTTP proxy (`proxy_url`), or an `https` server in a build
/// without the `rustls-tls` feature is
/// [`Invalid`](lease_port::LeaseErrorKind::Invalid). Makes no request;
/// call it inside a Tokio runtime, whose tasks serve the connections.
pub fn client_from_config(
    config: kube::Config,
    max_connections: usize,
) -> Result<kube::Client, LeaseError> {
    if max_connections == 0 {
        return Err(LeaseError::invalid(
            "a Kubernetes client needs at least one connection",
        ));
    }
    if let Some(proxy) = &config.proxy_url {
        return Err(LeaseError::invalid(format!(
            "the kubeconfig names proxy {proxy}: reach the API server directly"
        )));
    }
    let bad = |what: &'static str| move |e: kube::Error| LeaseError::invalid(what).with_source(e);
    let mut tcp = HttpConnector::new();
    // The connector also opens `https` URLs: TLS is layered on top.
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let bounded = Bounded {
        inner: tcp,
        permits: Arc::new(Semaphore::new(max_connections)),
        connect_timeout: config.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
    };
    #[cfg(feature = "rustls-tls")]
    let connector = config
        .rustls_https_connector_with_connector(bounded)
        .map_err(bad("its TLS settings cannot be used"))?;
    #[cfg(not(feature = "rustls-tls"))]
    let connector = if config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTPS) {
        return Err(LeaseError::invalid(
            "an https API server needs k8slease built with the `rustls-tls` feature",
        ));
    } else {
        bounded
    };
    let pool = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        // Every connection the bound allows may wait idle: closing one only
        // to open another would churn.
        .pool_max_idle_per_host(max_connections)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(
            config
                .auth_layer()
                .map_err(bad("its credentials cannot be used"))?,
        )
        .layer(
            config
                .extra_headers_layer()
                .map_err(bad("its impersonation headers cannot be used"))?,
        )
        .map_err(BoxError::from)
        .service(pool);
    Ok(kube::client::ClientBuilder::new(service, config.default_namespace).build())
}

/// Opens TCP connections while it holds fewer than its permits allow.
#[derive(Clone)]
struct Bounded {
    inner: HttpConnector,
    permits: Arc<Semaphore>,
    connect_timeout: Duration,
}

impl Service<Uri> for Bounded {
    type Response = BoundedIo<<HttpConnector as Service<Uri>>::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(BoxError::from)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut inner = self.inner.clone();
        let permits = Arc::clone(&self.permits);
        let timeout = self.connect_timeout;
        Box::pin(async move {
            // The wait for a permit counts against the connect timeout: the
            // pool starts a connect for every request that finds no idle
            // connection and lets it finish in the background when another
            // connection came free first; those must not wait for ever.
            let connect = async move {
                let permit = permits.acquire_owned().await?;
                let io = inner.call(uri).await?;
                Ok::<_, BoxError>(BoundedIo {
                    io,
                    _permit: permit,
                })
            };
            match tokio::time::timeout(timeout, connect).await {
                Ok(connected) => connected,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no connection to the API server came free in time",
                )
                .into()),
            }
        })
    }
}

/// A connection counted against its client's bound until it closes.
struct BoundedIo<T> {
    io: T,
    _permit: OwnedSemaphorePermit,
}

impl<T: Read + Unpin> Read for BoundedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for BoundedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for BoundedIo<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}
