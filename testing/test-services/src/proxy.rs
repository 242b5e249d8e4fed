//! A TCP proxy that injects network faults between a client and a real
//! service, switchable while the test runs.
//!
//! It knows nothing of the protocol it carries (gRPC, RESP, HTTP), so the
//! same proxy stands in front of a lease server, Redis, or an API emulator.
//! Each accepted connection is carried by plain threads: one reader and one
//! writer per direction, the writer holding each chunk until its delay has
//! passed, so a delay is latency added to every chunk, not a cap on
//! throughput.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::ServiceError;

/// What the proxy does to the traffic it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// Forward everything as it comes.
    #[default]
    Pass,
    /// Forward everything, each chunk held back this long in its direction.
    Delay {
        /// Added to every chunk from the client to the upstream.
        to_upstream: Duration,
        /// Added to every chunk from the upstream to the client.
        to_client: Duration,
    },
    /// Close every connection, and every new one as soon as it is accepted:
    /// the service looks down.
    Drop,
    /// Accept connections and read from them, but forward nothing and
    /// answer nothing, keeping every connection open: a partition, or a
    /// host that vanished without resetting its connections.
    Blackhole,
    /// Forward the client's bytes, discard the upstream's: requests take
    /// effect but their replies are lost ("the write committed, the reply
    /// never came").
    DropReplies,
}

impl ProxyMode {
    /// The same delay in both directions.
    pub fn delay(each_way: Duration) -> ProxyMode {
        ProxyMode::Delay {
            to_upstream: each_way,
            to_client: each_way,
        }
    }

    /// Whether this mode carries bytes both ways; a connection that lost
    /// bytes under an earlier mode cannot be carried on (its protocol
    /// stream has a hole) and is closed when such a mode is set.
    fn forwards_both_ways(self) -> bool {
        matches!(self, ProxyMode::Pass | ProxyMode::Delay { .. })
    }
}

/// What the proxy has seen since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyCounters {
    /// Connections accepted from clients (including those closed at once
    /// under [`ProxyMode::Drop`]).
    pub connections: u64,
    /// Connections open now.
    pub open_connections: u64,
    /// Bytes forwarded to the upstream.
    pub bytes_to_upstream: u64,
    /// Bytes forwarded to clients.
    pub bytes_to_client: u64,
    /// Bytes read from clients and thrown away.
    pub discarded_from_client: u64,
    /// Bytes read from the upstream and thrown away.
    pub discarded_from_upstream: u64,
}

/// A fault-injecting TCP proxy on a free loopback port in front of one
/// upstream address; stopped, with every connection closed, on drop.
///
/// ```no_run
/// use std::time::Duration;
/// use test_services::{FaultProxy, ProxyMode, RedisServer};
///
/// let redis = RedisServer::start().unwrap();
/// let proxy = FaultProxy::start(redis.addr()).unwrap();
/// // Point the client under test at `proxy.addr()` instead of the server.
/// proxy.set_mode(ProxyMode::delay(Duration::from_millis(50)));
/// proxy.set_mode(ProxyMode::DropReplies);
/// proxy.set_mode(ProxyMode::Pass);
/// assert!(proxy.counters().connections == 0);
/// ```
///
/// Switching modes affects connections already open, not only new ones.
/// A connection that lost bytes (under [`ProxyMode::Blackhole`] or
/// [`ProxyMode::DropReplies`]) is closed as soon as a mode that forwards
/// both ways is set, as a real connection would be reset after a long
/// partition: its peers see the break and reconnect through the proxy.
/// Delays apply to data, not to connection set-up.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    mode: Mutex<ProxyMode>,
    links: Mutex<HashMap<u64, Arc<Link>>>,
    next_link: AtomicU64,
    stopping: AtomicBool,
    connections: AtomicU64,
    bytes_to_upstream: AtomicU64,
    bytes_to_client: AtomicU64,
    discarded_from_client: AtomicU64,
    discarded_from_upstream: AtomicU64,
}

/// One client connection and, unless it was accepted into a blackhole,
/// its connection to the upstream.
#[derive(Debug)]
struct Link {
    client: TcpStream,
    upstream: Option<TcpStream>,
    /// Bytes were discarded: the streams on both ends no longer agree.
    broken: AtomicBool,
}

impl Link {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(u) = &self.upstream {
            let _ = u.shutdown(Shutdown::Both);
        }
    }

    fn carries_both_ways(&self) -> bool {
        self.upstream.is_some() && !self.broken.load(Ordering::Acquire)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`, in
    /// [`ProxyMode::Pass`]. The upstream need not be up yet: each client
    /// connection opens its own upstream connection when accepted.
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy, ServiceError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| ServiceError::io("bind the fault proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ServiceError::io("read the fault proxy's address", e))?;
        let shared = Arc::new(Shared {
            upstream,
            mode: Mutex::new(ProxyMode::Pass),
            links: Mutex::default(),
            next_link: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            bytes_to_upstream: AtomicU64::new(0),
            bytes_to_client: AtomicU64::new(0),
            discarded_from_client: AtomicU64::new(0),
            discarded_from_upstream: AtomicU64::new(0),
        });
        let s = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name("fault-proxy-accept".into())
            .spawn(move || accept_loop(&listener, &s))
            .map_err(|e| ServiceError::io("start the fault proxy", e))?;
        Ok(FaultProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Where clients connect: `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The mode in force.
    pub fn mode(&self) -> ProxyMode {
        *lock(&self.shared.mode)
    }

    /// Switches the mode, for open connections and new ones alike.
    pub fn set_mode(&self, mode: ProxyMode) {
        *lock(&self.shared.mode) = mode;
        let links = lock(&self.shared.links);
        for link in links.values() {
            let close = match mode {
                ProxyMode::Drop => true,
                m if m.forwards_both_ways() => !link.carries_both_ways(),
                _ => false,
            };
            if close {
                link.close();
            }
        }
    }

    /// Closes every open connection now, whatever the mode; new ones are
    /// accepted as the mode says.
    pub fn close_all(&self) {
        for link in lock(&self.shared.links).values() {
            link.close();
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> ProxyCounters {
        let s = &self.shared;
        ProxyCounters {
            connections: s.connections.load(Ordering::Relaxed),
            open_connections: lock(&s.links).len() as u64,
            bytes_to_upstream: s.bytes_to_upstream.load(Ordering::Relaxed),
            bytes_to_client: s.bytes_to_client.load(Ordering::Relaxed),
            discarded_from_client: s.discarded_from_client.load(Ordering::Relaxed),
            discarded_from_upstream: s.discarded_from_upstream.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        // The acceptor blocks in accept(); a connection of our own wakes it
        // to see the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        self.close_all();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for accepted in listener.incoming() {
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = accepted else {
            // A connection that failed between SYN and accept is the
            // client's problem; the proxy keeps listening.
            continue;
        };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let mode = *lock(&shared.mode);
        if mode == ProxyMode::Drop {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let upstream = if mode == ProxyMode::Blackhole {
            None
        } else {
            match TcpStream::connect(shared.upstream) {
                Ok(u) => Some(u),
                Err(_) => {
                    // As the client would have seen without the proxy.
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
            }
        };
        let id = shared.next_link.fetch_add(1, Ordering::Relaxed);
        let link = Arc::new(Link {
            broken: AtomicBool::new(upstream.is_none()),
            client,
            upstream,
        });
        // Registered before its threads start, so a mode switched from now
        // on reaches it.
        lock(&shared.links).insert(id, Arc::clone(&link));
        if let Err(e) = carry(shared, id, &link) {
            // The test sees the closed connection; stderr says why.
            eprintln!("fault proxy: cannot carry a connection: {e}");
            link.close();
            lock(&shared.links).remove(&id);
        }
    }
}

fn carry(shared: &Arc<Shared>, id: u64, link: &Arc<Link>) -> std::io::Result<()> {
    // Small writes (a gRPC frame, a RESP command) go out at once, so the
    // only latency is the one injected.
    link.client.set_nodelay(true)?;
    if let Some(u) = &link.upstream {
        u.set_nodelay(true)?;
    }
    let link = Arc::clone(link);
    let mut pumps = Vec::new();
    let client_side = link.client.try_clone()?;
    pumps.push(spawn_pump(
        shared,
        &link,
        client_side,
        link.upstream
            .as_ref()
            .map(TcpStream::try_clone)
            .transpose()?,
        Direction::ToUpstream,
    )?);
    if let Some(u) = &link.upstream {
        pumps.push(spawn_pump(
            shared,
            &link,
            u.try_clone()?,
            Some(link.client.try_clone()?),
            Direction::ToClient,
        )?);
    }
    // Forget the link once both directions have ended.
    let s = Arc::clone(shared);
    thread::Builder::new()
        .name("fault-proxy-reap".into())
        .spawn(move || {
            for p in pumps {
                let _ = p.join();
            }
            lock(&s.links).remove(&id);
        })?;
    Ok(())
}

/// Starts the reader (and writer) of one direction; the handle ends when
/// both have.
fn spawn_pump(
    shared: &Arc<Shared>,
    link: &Arc<Link>,
    from: TcpStream,
    to: Option<TcpStream>,
    direction: Direction,
) -> std::io::Result<JoinHandle<()>> {
    let (s, l) = (Arc::clone(shared), Arc::clone(link));
    thread::Builder::new()
        .name("fault-proxy-read".into())
        .spawn(move || {
            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
            let writer = to.map(|to| {
                let (s, l) = (Arc::clone(&s), Arc::clone(&l));
                thread::Builder::new()
                    .name("fault-proxy-write".into())
                    .spawn(move || write_loop(&s, &l, to, &rx, direction))
            });
            read_loop(&s, &l, from, &tx, direction);
            drop(tx);
            if let Some(Ok(w)) = writer {
                let _ = w.join();
            } else if writer.is_some() {
                l.close();
            }
        })
}

fn read_loop(
    shared: &Shared,
    link: &Link,
    mut from: TcpStream,
    to: &mpsc::Sender<(Instant, Vec<u8>)>,
    direction: Direction,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                link.close();
                return;
            }
        };
        let mode = *lock(&shared.mode);
        let delay = match (mode, direction) {
            (ProxyMode::Drop, _) => {
                link.close();
                return;
            }
            (ProxyMode::Pass, _) | (ProxyMode::DropReplies, Direction::ToUpstream) => {
                Some(Duration::ZERO)
            }
            (ProxyMode::Delay { to_upstream, .. }, Direction::ToUpstream) => Some(to_upstream),
            (ProxyMode::Delay { to_client, .. }, Direction::ToClient) => Some(to_client),
            (ProxyMode::Blackhole, _) | (ProxyMode::DropReplies, Direction::ToClient) => None,
        };
        match delay {
            Some(_) if mode.forwards_both_ways() && !link.carries_both_ways() => {
                link.close();
                return;
            }
            Some(_) if link.upstream.is_none() => {
                // Accepted into a blackhole: there is nowhere to forward to.
                link.close();
                return;
            }
            Some(d) => {
                if to.send((Instant::now() + d, buf[..n].to_vec())).is_err() {
                    link.close();
                    return;
                }
            }
            None => {
                link.broken.store(true, Ordering::Release);
                let counter = match direction {
                    Direction::ToUpstream => &shared.discarded_from_client,
                    Direction::ToClient => &shared.discarded_from_upstream,
                };
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
}

fn write_loop(
    shared: &Shared,
    link: &Link,
    mut to: TcpStream,
    chunks: &mpsc::Receiver<(Instant, Vec<u8>)>,
    direction: Direction,
) {
    let counter = match direction {
        Direction::ToUpstream => &shared.bytes_to_upstream,
        Direction::ToClient => &shared.bytes_to_client,
    };
    while let Ok((due, chunk)) = chunks.recv() {
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            thread::sleep(wait);
        }
        // Counted before the write, so a test that has read the bytes
        // also sees them counted.
        counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        if to.write_all(&chunk).is_err() {
            link.close();
            return;
        }
    }
    // The sender closed its side: pass the half-close on, so protocols
    // that read to the end still see it.
    let _ = to.shutdown(Shutdown::Write);
}
