//! A real tonic server on loopback for the tests, stopped on drop.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use grpcdriver::{GrpcLease, LeaseServer, ServeError};
use lease_port::{Clock, SessionLease};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A lease server serving one backend until stopped or dropped.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Running {
    /// Serves `backend` on a fresh loopback port, or on `addr` when given
    /// (a restart on the address clients already use).
    pub(crate) async fn start(
        backend: Arc<dyn SessionLease>,
        clock: Arc<dyn Clock>,
        addr: Option<SocketAddr>,
        configure: impl FnOnce(LeaseServer) -> LeaseServer,
    ) -> Running {
        let listener = bind(addr).await;
        let addr = listener.local_addr().expect("bound");
        let server = configure(LeaseServer::new(backend).clock(clock));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, async {
            let _ = stopped.await;
        }));
        Running {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops taking calls and waits until the server has let go of its
    /// port.
    pub(crate) async fn stop(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.expect("the server task does not panic"),
            None => Ok(()),
        }
    }

    /// A client of this server with `configure` applied.
    pub(crate) fn client(
        &self,
        clock: Arc<dyn Clock>,
        configure: impl FnOnce(grpcdriver::GrpcLeaseBuilder) -> grpcdriver::GrpcLeaseBuilder,
    ) -> GrpcLease {
        configure(GrpcLease::builder(self.addr.to_string()).clock(clock))
            .build()
            .expect("client")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn bind(addr: Option<SocketAddr>) -> TcpListener {
    let addr = addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    // A restarted server takes the port its predecessor just closed; give
    // the kernel a moment if a connection of the old one still lingers.
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("bind {addr}: {last:?}");
}

/// A session id for tests.
pub(crate) fn session(name: &str) -> lease_port::SessionId {
    lease_port::SessionId::new(name).expect("a valid session id")
}

/// An owner id for tests.
pub(crate) fn owner(name: &str) -> lease_port::OwnerId {
    lease_port::OwnerId::new(name).expect("a valid owner id")
}

/// The gRPC status a client error came from, when it came from one.
pub(crate) fn wire_status(e: &lease_port::LeaseError) -> Option<&tonic::Status> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(status) = s.downcast_ref::<tonic::Status>() {
            return Some(status);
        }
        source = s.source();
    }
    None
}
