//! The lease service's gRPC over the simulated network: the real tonic
//! client and server, their bytes carried by turmoil's TCP.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::{Channel, Endpoint, Uri};

/// A connection accepted by the simulated lease service.
pub(crate) struct SimConnection(turmoil::net::TcpStream);

impl tonic::transport::server::Connected for SimConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConnection {
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

/// The connections a simulated listener accepts, as the server takes them.
pub(crate) fn incoming(
    listener: turmoil::net::TcpListener,
) -> impl Stream<Item = io::Result<SimConnection>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(s, _)| SimConnection(s));
        Some((accepted, listener))
    })
}

/// A lazily connecting channel to `addr` ("host:port") over the simulated
/// network, keeping every setting of the client's endpoint.
pub(crate) fn channel_to(addr: String) -> impl Fn(Endpoint) -> Channel + Send + Sync + 'static {
    move |endpoint: Endpoint| {
        let addr = addr.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let addr = addr.clone();
            async move {
                turmoil::net::TcpStream::connect(addr)
                    .await
                    .map(TokioIo::new)
            }
        }))
    }
}
