//! The private networks of namespaces: cut links are silent, healed links
//! carry traffic again, other hosts are unaffected, nothing is left behind.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use test_services::netns::{Host, NAMESPACE_PREFIX, Network};
use test_services::{EtcdCluster, ServiceError};

const PORT: u16 = 7000;

/// Long enough for a connection on an idle link, short enough to keep the
/// test quick; a cut link must not answer within it at all.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A listener on `host`'s address, serving from this thread's network
/// although it was bound on the host's.
fn listen(net: &Network, host: &Host) -> TcpListener {
    net.within(host, || {
        TcpListener::bind(SocketAddr::from((host.addr(), PORT)))
    })
    .unwrap()
    .unwrap()
}

/// Connects from `from` to `to`'s listener.
fn connect(net: &Network, from: &Host, to: &Host) -> std::io::Result<TcpStream> {
    let addr = SocketAddr::from((to.addr(), PORT));
    net.within(from, || TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT))
        .unwrap()
}

fn assert_reaches(net: &Network, from: &Host, to: &Host) {
    if let Err(e) = connect(net, from, to) {
        panic!("{} cannot reach {}: {e}", from.name(), to.name());
    }
}

/// Silence, not refusal: the attempt times out.
fn assert_silent(net: &Network, from: &Host, to: &Host) {
    match connect(net, from, to) {
        Ok(_) => panic!("{} reached {} across a cut", from.name(), to.name()),
        Err(e) => assert_eq!(
            e.kind(),
            ErrorKind::TimedOut,
            "{} -> {}: {e}",
            from.name(),
            to.name()
        ),
    }
}

fn namespaces_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_cut_link_is_silent_a_healed_one_carries_traffic_and_a_third_host_reaches_both() {
    let net = Network::new().unwrap();
    let (a, b, c) = (
        net.add_host("a").unwrap(),
        net.add_host("b").unwrap(),
        net.add_host("c").unwrap(),
    );
    let _listeners = [listen(&net, &a), listen(&net, &b), listen(&net, &c)];
    assert_reaches(&net, &a, &b);
    assert_reaches(&net, &b, &a);

    net.cut(&a, &b).unwrap();
    assert!(net.is_cut(&a, &b) && net.is_cut(&b, &a));
    assert_silent(&net, &a, &b);
    assert_silent(&net, &b, &a);
    assert_reaches(&net, &c, &a);
    assert_reaches(&net, &c, &b);
    assert_reaches(&net, &a, &c);
    assert_reaches(&net, &b, &c);

    net.heal(&a, &b).unwrap();
    assert!(!net.is_cut(&a, &b));
    assert_reaches(&net, &a, &b);
    assert_reaches(&net, &b, &a);
}

#[test]
fn an_open_connection_stalls_across_a_cut_and_resumes_when_healed() {
    let net = Network::new().unwrap();
    let (a, b) = (net.add_host("a").unwrap(), net.add_host("b").unwrap());
    let listener = listen(&net, &b);
    let mut client = connect(&net, &a, &b).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();

    net.cut(&a, &b).unwrap();
    client.write_all(b"x").unwrap();
    let mut byte = [0u8; 1];
    let stalled = server.read(&mut byte).unwrap_err();
    assert!(
        matches!(stalled.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{stalled}"
    );

    net.heal(&a, &b).unwrap();
    // TCP retransmits the byte once the link carries it again.
    server
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    server.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x");
}

#[test]
fn an_isolated_host_reaches_nobody_until_it_rejoins() {
    let net = Network::new().unwrap();
    let (a, b) = (net.add_host("a").unwrap(), net.add_host("b").unwrap());
    net.isolate(&a).unwrap();
    // A host added while `a` is isolated is cut from it as well.
    let c = net.add_host("c").unwrap();
    let _listeners = [listen(&net, &a), listen(&net, &b), listen(&net, &c)];
    assert_silent(&net, &a, &b);
    assert_silent(&net, &a, &c);
    assert_silent(&net, &c, &a);
    assert_reaches(&net, &b, &c);

    net.rejoin(&a).unwrap();
    assert_reaches(&net, &a, &b);
    assert_reaches(&net, &a, &c);
    assert_reaches(&net, &c, &a);
}

#[test]
fn commands_run_on_the_host_they_are_given() {
    let net = Network::new().unwrap();
    let a = net.add_host("a").unwrap();
    let out = net
        .run(&a, "ip", &["-4", "-o", "addr", "show", "eth0"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("{}/24", a.addr())), "{text}");

    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo $NETNS_TEST_VALUE; ip -o link show lo"])
        .env("NETNS_TEST_VALUE", "carried");
    let out = net.wrap(&a, &cmd).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("carried\n"), "{text}");
    assert!(text.contains("UP"), "loopback is up: {text}");

    let failed = net.run(&a, "false", &[] as &[&str]).unwrap_err();
    assert!(matches!(failed, ServiceError::Command { .. }), "{failed}");
}

#[test]
fn bad_host_names_and_foreign_hosts_are_typed_errors() {
    let net = Network::new().unwrap();
    let a = net.add_host("a").unwrap();
    for bad in ["", "A", "a b", "a/b", "../x", &"x".repeat(33), "a"] {
        let err = net.add_host(bad).unwrap_err();
        assert!(
            matches!(err, ServiceError::InvalidHost { .. }),
            "{bad:?}: {err}"
        );
    }
    let other = Network::new().unwrap();
    let foreign = other.add_host("a").unwrap();
    let err = net.cut(&a, &foreign).unwrap_err();
    assert!(matches!(err, ServiceError::InvalidHost { .. }), "{err}");
    let err = net.cut(&a, &a).unwrap_err();
    assert!(matches!(err, ServiceError::InvalidHost { .. }), "{err}");
}

#[test]
fn dropping_the_network_removes_its_namespaces() {
    let net = Network::new().unwrap();
    let a = net.add_host("a").unwrap();
    let base = a
        .namespace()
        .strip_suffix("-a")
        .expect("host namespaces extend the network's name")
        .to_owned();
    net.add_host("b").unwrap();
    let clone = net.clone();
    drop(net);
    assert_eq!(namespaces_named(&base).len(), 3, "a clone keeps it");
    drop(clone);
    assert_eq!(namespaces_named(&base), Vec::<String>::new());
}

#[test]
fn namespaces_of_a_dead_run_are_removed_by_the_next_network() {
    // A pid that was just used and is gone.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("{NAMESPACE_PREFIX}{dead}-0-left");
    let status = Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(Path::new("/run/netns").join(&stale).exists());

    let _net = Network::new().unwrap();
    assert!(
        !Path::new("/run/netns").join(&stale).exists(),
        "{stale} was left"
    );
    // Our own, live, are kept.
    let mine = format!("{NAMESPACE_PREFIX}{}-", std::process::id());
    assert!(!namespaces_named(&mine).is_empty());
}

#[test]
fn an_etcd_cluster_on_a_network_keeps_a_leader_when_one_member_is_isolated() {
    let net = Network::new().unwrap();
    let client = net.add_host("client").unwrap();
    let cluster = EtcdCluster::start_on(&net).unwrap();
    let endpoints = cluster.endpoints();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let host = cluster.host(i).unwrap();
        assert_eq!(endpoint, &format!("http://{}:2379", host.addr()));
    }
    let put = |endpoint: &str| {
        let addr: SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
        net.within(&client, || {
            let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            let body = r#"{"key":"aw==","value":"dg=="}"#;
            write!(
                s,
                "POST /v3/kv/put HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            )?;
            let mut reply = String::new();
            s.read_to_string(&mut reply)?;
            Ok::<String, std::io::Error>(reply)
        })
        .unwrap()
    };
    let leader = cluster.wait_for_leader().unwrap();
    let reply = put(&endpoints[leader]).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    let old = cluster.host(leader).unwrap().clone();
    net.isolate(&old).unwrap();
    let err = put(&endpoints[leader]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    // The two others elect a leader among themselves and take writes.
    let other = (leader + 1) % endpoints.len();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match put(&endpoints[other]) {
            Ok(reply) if reply.starts_with("HTTP/1.1 200") => break,
            result => assert!(
                std::time::Instant::now() < deadline,
                "no write through member {other}: {result:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    net.rejoin(&old).unwrap();
}
