//! A renew that reclaims a lease just past its reported expiry (within the
//! grace: the unraced reclaim the crate documents) answers a fresh expiry.
//! When the client's own view of its shared etcd lease has lapsed too, the
//! renewal goes through another path than usual, and that path must extend
//! the client's sweep bookkeeping as well: otherwise the next sweep, set off
//! by any other call on the same client, deletes the key and its guard as
//! if the hold had been released, and another owner takes the session at
//! once while the holder still counts on the lease it was just given.

use std::time::{Duration, Instant, SystemTime};

use etcdlease::EtcdLease;
use lease_port::{Lease, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

const TTL: Duration = Duration::from_secs(4);
/// A wide grace, so the reclaiming renewal lands inside it on a noisy
/// machine.
const GRACE: Duration = Duration::from_secs(3);

fn client(etcd: &EtcdServer) -> EtcdLease {
    EtcdLease::builder([etcd.endpoint()])
        .prefix("/reclaim/")
        .ttl(TTL)
        .expiry_grace(GRACE)
        .request_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Until when the holder of `lease`, renewed by a call sent at `sent`,
/// counts on it (the keeper's rule: the TTL from the send, never past the
/// reported expiry).
fn counted_until(lease: &Lease, sent: Instant) -> Instant {
    let left = lease
        .expiry()
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    (Instant::now() + left).min(sent + TTL)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_reclaimed_within_the_grace_is_not_swept_while_its_holder_counts_on_it() {
    let etcd = EtcdServer::start().unwrap();
    let (a, b) = (client(&etcd), client(&etcd));
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let (reclaimed, other) = (
        SessionId::new("reclaimed").unwrap(),
        SessionId::new("other").unwrap(),
    );

    let acquired_at = Instant::now();
    let lease = a.acquire(&reclaimed, &alice).await.unwrap();
    // Past the reported expiry, well inside the grace etcd still keeps the
    // key for: the renewal is the reclaim the crate documents.
    tokio::time::sleep_until((acquired_at + TTL + GRACE / 3).into()).await;
    let sent = Instant::now();
    let renewed = a
        .renew(&lease)
        .await
        .expect("the key is still alice's: the reclaim within the grace succeeds");
    assert_eq!(renewed.token(), lease.token());
    let alice_counts_until = counted_until(&renewed, sent);

    // After the acquire's TTL plus grace (when the client's bookkeeping
    // says the hold ended), alice's client does anything else: its sweep
    // runs.
    tokio::time::sleep_until((acquired_at + TTL + GRACE + Duration::from_millis(400)).into()).await;
    a.acquire(&other, &alice).await.unwrap();

    // Bob tries, until alice's renewed lease has surely run out.
    let stop = alice_counts_until + Duration::from_secs(1);
    while Instant::now() < stop {
        if let Ok(taken) = b.acquire(&reclaimed, &bob).await {
            let bob_from = Instant::now();
            assert!(
                bob_from >= alice_counts_until,
                "two live owners: bob took {taken:?} while alice still counts {renewed:?} live \
                 for {:?} more",
                alice_counts_until - bob_from
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
