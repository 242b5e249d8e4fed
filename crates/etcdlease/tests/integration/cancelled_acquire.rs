//! An acquire dropped after its transaction reached etcd but before the
//! answer came back (a client disconnect cancelling the request that was
//! acquiring) leaves the session key on the client's shared etcd lease. The
//! client must know of it, as it does after a lost reply, and sweep it:
//! otherwise, while the client keeps renewing any other session, the shared
//! keep-alive keeps the orphaned key alive, and every other owner is
//! answered `Held` for ever. The trait says a dropped acquire must leave
//! state exactly as a lost reply would.

use std::time::{Duration, Instant};

use etcdlease::EtcdLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::{EtcdServer, FaultProxy, ProxyMode};

const TTL: Duration = Duration::from_secs(4);

fn client(endpoint: String) -> EtcdLease {
    EtcdLease::builder([endpoint])
        .prefix("/cancelled-acquire/")
        .ttl(TTL)
        .request_timeout(Duration::from_secs(2))
        .lapsed_hold_wait(Duration::ZERO)
        .build()
        .unwrap()
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Whether etcd has `key`, asked through its HTTP gateway, bypassing the
/// proxy.
fn etcd_has(etcd: &EtcdServer, key: &[u8]) -> bool {
    let body = etcd
        .post("/v3/kv/range", &format!("{{\"key\":\"{}\"}}", base64(key)))
        .expect("etcd's gateway answers");
    body.contains("\"kvs\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_does_not_leave_a_session_held_for_ever() {
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(etcd.addr()).unwrap();
    let a = client(format!("http://{}", proxy.addr()));
    let b = client(etcd.endpoint());
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let (kept, orphan) = (
        SessionId::new("kept").unwrap(),
        SessionId::new("orphan").unwrap(),
    );
    let mut kept_lease = a.acquire(&kept, &alice).await.unwrap();

    // Answers to alice's client now come late; requests still arrive.
    proxy.set_mode(ProxyMode::Delay {
        to_upstream: Duration::ZERO,
        to_client: Duration::from_millis(1200),
    });
    let acquiring = tokio::spawn({
        let (a, orphan, alice) = (a.clone(), orphan.clone(), alice.clone());
        async move { a.acquire(&orphan, &alice).await }
    });
    let key = a.session_key(&orphan);
    let watching_since = Instant::now();
    while !etcd_has(&etcd, &key) {
        assert!(
            watching_since.elapsed() < Duration::from_secs(10),
            "the acquire never wrote its key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Committed, answer still on its way: the caller gives up.
    assert!(
        !acquiring.is_finished(),
        "the acquire answered before it could be cancelled; rerun"
    );
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    proxy.set_mode(ProxyMode::Pass);

    // Alice's process lives on and renews its other session; nobody acts
    // for the orphan. Bob must get it eventually (a lost reply would let
    // him after about two TTLs plus graces). Bounded: ten TTLs.
    let stop = Instant::now() + TTL * 10;
    let mut last = None;
    while Instant::now() < stop {
        tokio::time::sleep(TTL / 3).await;
        match a.renew(&kept_lease).await {
            Ok(renewed) => kept_lease = renewed,
            Err(e) => assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e:?}"),
        }
        match b.acquire(&orphan, &bob).await {
            Ok(_) => return,
            Err(e) => {
                assert_eq!(e.kind(), LeaseErrorKind::Held, "{e:?}");
                last = Some(e);
            }
        }
    }
    panic!(
        "the session whose acquire was cancelled stayed held while its client renewed another: \
         {last:?}"
    );
}
