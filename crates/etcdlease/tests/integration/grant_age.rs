//! An acquire must not hand out a hold backed by an older refresh of the
//! client's shared etcd lease: etcd would free it `TTL + grace` after that
//! older refresh, while the caller (the lease keeper) counts the hold live
//! for `TTL` from when it sent the acquire, and another owner could take
//! the session in between.

use std::time::{Duration, Instant};

use etcdlease::EtcdLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

const TTL: Duration = Duration::from_secs(12);

fn client(etcd: &EtcdServer) -> EtcdLease {
    // Default grace (1 s) and default request timeout.
    EtcdLease::builder([etcd.endpoint()])
        .prefix("/grant-age/")
        .ttl(TTL)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_owner_never_acquires_before_the_first_owners_ttl_from_its_acquire() {
    let etcd = EtcdServer::start().unwrap();
    let (a, b) = (client(&etcd), client(&etcd));
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let (first, second) = (
        SessionId::new("first").unwrap(),
        SessionId::new("second").unwrap(),
    );

    // The first acquire grants the client's etcd lease.
    a.acquire(&first, &alice).await.unwrap();
    // Just under a quarter TTL later, a second session is acquired on the
    // same grant, without a keep-alive.
    tokio::time::sleep(TTL / 4 - Duration::from_millis(200)).await;
    let sent = Instant::now();
    let held = a.acquire(&second, &alice).await.unwrap();
    // The contract the keeper relies on: live until `sent + TTL`.
    let alice_counts_live_until = sent + TTL;

    // Alice's process is now cut off (paused, partitioned): it renews
    // nothing. Bob tries until he gets the session.
    let bob_took = loop {
        match b.acquire(&second, &bob).await {
            Ok(lease) => break lease,
            Err(e) if e.kind() == LeaseErrorKind::Held => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("unexpected error: {e:?}"),
        }
    };
    let bob_holds_from = Instant::now();
    assert!(
        bob_holds_from >= alice_counts_live_until,
        "two live owners: bob took {bob_took:?} while alice still counts {held:?} live \
         (for {:?} more)",
        alice_counts_live_until - bob_holds_from
    );
}
