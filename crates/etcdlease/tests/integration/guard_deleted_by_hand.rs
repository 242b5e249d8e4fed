//! A session's guard key deleted by hand (`etcdctl del <prefix>g/<id>`)
//! while the session is held. The guard is not to be edited (see the crate
//! documentation), but losing it must not leave the session held for ever:
//! the session key is on the client's shared etcd lease, which the client
//! keeps alive for as long as it renews any other session, so only a
//! delete by the client frees it. A release must still remove the caller's
//! hold, and so must the sweep of a hold its holder abandoned, or whose
//! release never got an answer.

use std::time::Duration;

use etcdlease::EtcdLease;
use etcdlease::wire::EtcdClient;
use etcdlease::wire::messages::DeleteRangeRequest;
use lease_port::{Lease, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::{EtcdServer, FaultProxy, ProxyMode};

const TTL: Duration = Duration::from_secs(2);
const PREFIX: &str = "/guard-gone/";

fn client(endpoint: String) -> EtcdLease {
    EtcdLease::builder([endpoint])
        .prefix(PREFIX)
        .ttl(TTL)
        .request_timeout(Duration::from_millis(500))
        // Another owner does not sit out a lapsed hold inside one call:
        // every attempt below answers at once.
        .lapsed_hold_wait(Duration::ZERO)
        .build()
        .unwrap()
}

/// Deletes the guard of `session` as an operator would, straight to etcd.
async fn delete_guard(etcd: &EtcdServer, session: &str) {
    let raw = EtcdClient::new(&[etcd.endpoint()], Duration::from_secs(5)).unwrap();
    let answer = raw
        .delete_range(DeleteRangeRequest {
            key: format!("{PREFIX}g/{session}").into_bytes(),
            range_end: vec![],
        })
        .await
        .unwrap();
    assert_eq!(answer.deleted, 1, "no guard of {session} to delete");
}

/// Renews `kept` through `holder` every third of a TTL, for `rounds`
/// rounds at most, and after each renewal tries to take `wanted` as
/// `other`. The renewals keep the holder's shared etcd lease alive, so
/// only the holder's own delete can free `wanted`. Fails unless `other`
/// got it; returns its lease.
async fn take_while_renewing(
    holder: &EtcdLease,
    mut kept: Lease,
    taker: &EtcdLease,
    wanted: &SessionId,
    other: &OwnerId,
    rounds: usize,
) -> Lease {
    let mut last = None;
    for _ in 0..rounds {
        tokio::time::sleep(TTL / 3).await;
        // A renewal right after a fault may find the connection broken.
        match holder
            .renew_many(std::slice::from_ref(&kept))
            .await
            .remove(0)
        {
            Ok(renewed) => kept = renewed,
            Err(e) => assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e:?}"),
        }
        match taker.acquire(wanted, other).await {
            Ok(lease) => return lease,
            Err(e) => {
                assert_eq!(e.kind(), LeaseErrorKind::Held, "{e:?}");
                last = Some(e);
            }
        }
    }
    panic!(
        "{wanted} stayed held while its client renewed another session, over {rounds} \
         thirds of a TTL: {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_frees_the_session_after_its_guard_was_deleted_by_hand() {
    let etcd = EtcdServer::start().unwrap();
    let (holder, taker) = (client(etcd.endpoint()), client(etcd.endpoint()));
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let (a, b) = (SessionId::new("a").unwrap(), SessionId::new("b").unwrap());
    let released = holder.acquire(&a, &alice).await.unwrap();
    let kept = holder.acquire(&b, &alice).await.unwrap();

    delete_guard(&etcd, "a").await;
    holder.release(&released).await.unwrap();

    // Three TTLs of attempts: a release that worked frees it at once.
    let taken = take_while_renewing(&holder, kept, &taker, &a, &bob, 9).await;
    assert!(taken.token() > released.token(), "{taken:?}");
    let err = holder.renew(&released).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
}

/// A hold its holder neither renews nor releases is swept by its client
/// after the TTL plus the grace, guard or no guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_hold_whose_guard_was_deleted_is_still_swept() {
    let etcd = EtcdServer::start().unwrap();
    let (holder, taker) = (client(etcd.endpoint()), client(etcd.endpoint()));
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let (a, b) = (SessionId::new("a").unwrap(), SessionId::new("b").unwrap());
    let abandoned = holder.acquire(&a, &alice).await.unwrap();
    let kept = holder.acquire(&b, &alice).await.unwrap();

    delete_guard(&etcd, "a").await;

    // The sweep frees it a TTL and a grace after its last renewal: within
    // about two TTLs here. Bounded: six TTLs.
    let taken = take_while_renewing(&holder, kept, &taker, &a, &bob, 18).await;
    assert!(taken.token() > abandoned.token(), "{taken:?}");
}

/// A release that got no answer (etcd unreachable for it) may or may not
/// have landed; the client keeps the hold in its bookkeeping until a
/// delete of it is confirmed, and its sweep sends that delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_got_no_answer_is_completed_by_the_sweep_after_the_guard_was_deleted() {
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(etcd.addr()).unwrap();
    let holder = client(format!("http://{}", proxy.addr()));
    let taker = client(etcd.endpoint());
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let (a, b) = (SessionId::new("a").unwrap(), SessionId::new("b").unwrap());
    let released = holder.acquire(&a, &alice).await.unwrap();
    let kept = holder.acquire(&b, &alice).await.unwrap();

    delete_guard(&etcd, "a").await;
    proxy.set_mode(ProxyMode::Blackhole);
    let err = holder.release(&released).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    proxy.set_mode(ProxyMode::Pass);

    // Nothing reached etcd: the sweep must delete it. Bounded: six TTLs.
    let taken = take_while_renewing(&holder, kept, &taker, &a, &bob, 18).await;
    assert!(taken.token() > released.token(), "{taken:?}");
}
