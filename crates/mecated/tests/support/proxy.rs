//! A round-robin TCP proxy in front of several `mecated` processes, as a
//! load balancer would put them: each connection goes to the next
//! process. Tests may say where the next connection lands, and cut the
//! connections to one process mid-stream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

use super::Mecated;

pub(crate) struct RoundRobin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    backends: Vec<SocketAddr>,
    next: AtomicUsize,
    /// Which backend each connection went to, in order of arrival.
    landed: Mutex<Vec<usize>>,
    /// The connections open to each backend, to cut them.
    open: Mutex<Vec<(usize, AbortHandle)>>,
}

impl RoundRobin {
    pub(crate) async fn start(replicas: &[&Mecated]) -> Self {
        let backends = replicas
            .iter()
            .map(|m| {
                m.base
                    .strip_prefix("http://")
                    .unwrap_or(&m.base)
                    .parse()
                    .expect("a mecated address")
            })
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            backends,
            next: AtomicUsize::new(0),
            landed: Mutex::default(),
            open: Mutex::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Self {
            addr,
            shared,
            accept,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next connection goes to replica `i`; round robin goes on from
    /// there.
    pub(crate) fn next_to(&self, i: usize) {
        self.shared.next.store(i, Ordering::SeqCst);
    }

    /// The replica each connection went to, in order.
    pub(crate) fn landed(&self) -> Vec<usize> {
        self.shared.landed.lock().unwrap().clone()
    }

    /// Cuts every open connection to replica `i`, as a load balancer
    /// restarting or a network fault would.
    pub(crate) fn cut(&self, i: usize) {
        let mut open = self.shared.open.lock().unwrap();
        open.retain(|(backend, handle)| {
            if *backend == i {
                handle.abort();
            }
            *backend != i
        });
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.accept.abort();
        for (_, handle) in self.shared.open.lock().unwrap().drain(..) {
            handle.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let i = shared.next.fetch_add(1, Ordering::SeqCst) % shared.backends.len();
        shared.landed.lock().unwrap().push(i);
        let backend = shared.backends[i];
        let task = tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(backend).await else {
                return;
            };
            let mut client = client;
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
        let mut open = shared.open.lock().unwrap();
        open.retain(|(_, h)| !h.is_finished());
        open.push((i, task.abort_handle()));
    }
}
