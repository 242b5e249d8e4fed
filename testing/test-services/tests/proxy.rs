//! The fault proxy in front of a tiny echo server and a real Redis: each
//! mode does what it says to open and new connections, and the counters
//! add up.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use test_services::{FaultProxy, ProxyMode, RedisServer};

/// Long enough for any loaded machine to deliver a loopback byte.
const ARRIVES: Duration = Duration::from_secs(20);
/// How long a test waits to see that nothing arrives. A proxy that leaks
/// bytes leaks them at once, so a short look is enough to catch it.
const LOOK: Duration = Duration::from_millis(150);

/// Echoes every byte back on every connection, until the process ends.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn connect(proxy: &FaultProxy) -> TcpStream {
    let s = TcpStream::connect(proxy.addr()).unwrap();
    s.set_read_timeout(Some(ARRIVES)).unwrap();
    s
}

fn echo(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    ask(s, msg, msg.len())
}

/// Sends `msg` and reads a reply of `len` bytes.
fn ask(s: &mut TcpStream, msg: &[u8], len: usize) -> Vec<u8> {
    s.write_all(msg).unwrap();
    let mut got = vec![0u8; len];
    s.read_exact(&mut got).unwrap();
    got
}

/// Nothing is readable within [`LOOK`], and the connection is still open.
fn silent_but_open(s: &mut TcpStream) {
    s.set_read_timeout(Some(LOOK)).unwrap();
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        Ok(0) => panic!("the connection was closed"),
        Ok(n) => panic!("{n} bytes arrived: {:?}", &buf[..n]),
        Err(e) => panic!("the connection broke: {e}"),
    }
    s.set_read_timeout(Some(ARRIVES)).unwrap();
}

/// The proxy closed the connection: a read ends (EOF or reset) instead of
/// waiting.
fn closed(s: &mut TcpStream) {
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("{what} never happened");
}

#[test]
fn passes_bytes_both_ways_and_counts_them() {
    let proxy = FaultProxy::start(echo_server()).unwrap();
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    let mut a = connect(&proxy);
    let mut b = connect(&proxy);
    assert_eq!(echo(&mut a, b"hello"), b"hello");
    assert_eq!(echo(&mut b, b"mecatl!"), b"mecatl!");
    let c = proxy.counters();
    assert_eq!(c.connections, 2);
    assert_eq!(c.open_connections, 2);
    assert_eq!(c.bytes_to_upstream, 12);
    assert_eq!(c.bytes_to_client, 12);
    assert_eq!(c.discarded_from_client + c.discarded_from_upstream, 0);
    drop((a, b));
    wait_until("both connections forgotten", || {
        proxy.counters().open_connections == 0
    });
}

#[test]
fn delays_hold_bytes_back_in_the_direction_asked() {
    let proxy = FaultProxy::start(echo_server()).unwrap();
    let mut s = connect(&proxy);
    assert_eq!(echo(&mut s, b"warm"), b"warm");
    // Far beyond a look: the reply cannot come early unless the delay is
    // ignored.
    proxy.set_mode(ProxyMode::Delay {
        to_upstream: Duration::ZERO,
        to_client: Duration::from_secs(3),
    });
    s.write_all(b"late").unwrap();
    // The request went through at once; only the answer waits.
    wait_until("the request reached the echo server", || {
        proxy.counters().bytes_to_upstream == 8
    });
    silent_but_open(&mut s);
    let mut got = [0u8; 4];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"late");

    proxy.set_mode(ProxyMode::Delay {
        to_upstream: Duration::from_secs(3),
        to_client: Duration::ZERO,
    });
    s.write_all(b"slow").unwrap();
    thread::sleep(LOOK);
    assert_eq!(
        proxy.counters().bytes_to_upstream,
        8,
        "the request was forwarded before its delay"
    );
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"slow");

    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(echo(&mut s, b"fast"), b"fast");
    assert_eq!(
        proxy.counters().connections,
        1,
        "one connection carried it all"
    );
}

#[test]
fn drop_closes_open_connections_and_every_new_one() {
    let proxy = FaultProxy::start(echo_server()).unwrap();
    let mut open = connect(&proxy);
    assert_eq!(echo(&mut open, b"x"), b"x");
    proxy.set_mode(ProxyMode::Drop);
    closed(&mut open);
    let mut fresh = connect(&proxy);
    let _ = fresh.write_all(b"anyone?");
    closed(&mut fresh);
    wait_until("both connections counted", || {
        proxy.counters().connections == 2
    });
    assert_eq!(proxy.counters().bytes_to_upstream, 1);

    proxy.set_mode(ProxyMode::Pass);
    let mut again = connect(&proxy);
    assert_eq!(echo(&mut again, b"back"), b"back");
}

#[test]
fn blackhole_reads_and_answers_nothing_then_resets_on_pass() {
    let proxy = FaultProxy::start(echo_server()).unwrap();
    let mut old = connect(&proxy);
    assert_eq!(echo(&mut old, b"before"), b"before");
    proxy.set_mode(ProxyMode::Blackhole);

    old.write_all(b"lost").unwrap();
    silent_but_open(&mut old);
    let mut new = connect(&proxy);
    new.write_all(b"also lost").unwrap();
    silent_but_open(&mut new);
    wait_until("the proxy read what was sent", || {
        proxy.counters().discarded_from_client == 13
    });
    let c = proxy.counters();
    assert_eq!(c.bytes_to_upstream, 6, "nothing was forwarded");
    assert_eq!(c.bytes_to_client, 6, "nothing was answered");
    assert_eq!(c.open_connections, 2, "both connections kept open");

    // Both lost bytes: carrying them on would hand the peers a stream with
    // a hole, so they are reset and the client reconnects.
    proxy.set_mode(ProxyMode::Pass);
    closed(&mut old);
    closed(&mut new);
    let mut again = connect(&proxy);
    assert_eq!(echo(&mut again, b"healed"), b"healed");
}

#[test]
fn drop_replies_lets_a_write_commit_and_loses_its_answer() {
    let redis = RedisServer::start().expect("start redis");
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut s = connect(&proxy);
    assert_eq!(ask(&mut s, b"*1\r\n$4\r\nPING\r\n", 7), b"+PONG\r\n");

    proxy.set_mode(ProxyMode::DropReplies);
    s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$9\r\ncommitted\r\n")
        .unwrap();
    wait_until("the reply was read and thrown away", || {
        proxy.counters().discarded_from_upstream == 5
    });
    silent_but_open(&mut s);
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$9\r\ncommitted");

    proxy.set_mode(ProxyMode::Pass);
    closed(&mut s);
    let mut again = connect(&proxy);
    assert_eq!(
        ask(&mut again, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", 15),
        b"$9\r\ncommitted\r\n"
    );
}

#[test]
fn an_upstream_that_is_down_closes_the_client_and_dropping_the_proxy_closes_all() {
    let gone = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let proxy = FaultProxy::start(gone).unwrap();
    let mut s = connect(&proxy);
    closed(&mut s);

    let proxy = FaultProxy::start(echo_server()).unwrap();
    let addr = proxy.addr();
    let mut s = connect(&proxy);
    assert_eq!(echo(&mut s, b"x"), b"x");
    drop(proxy);
    closed(&mut s);
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens after the proxy is dropped"
    );
}
