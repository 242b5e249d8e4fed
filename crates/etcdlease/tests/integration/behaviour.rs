//! What the conformance suite does not reach: authorities of different
//! clusters and prefixes, a crashed or frozen etcd, and a session its
//! holder abandoned while the same client keeps renewing others.

use std::time::Duration;

use etcdlease::{EtcdError, EtcdLease};
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::{Controls, EtcdServer};

const TTL: Duration = Duration::from_secs(2);

fn client(etcd: &EtcdServer, prefix: &str) -> EtcdLease {
    EtcdLease::builder([etcd.endpoint()])
        .prefix(prefix)
        .ttl(TTL)
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorities_name_the_cluster_and_the_prefix() {
    let (one, two) = (EtcdServer::start().unwrap(), EtcdServer::start().unwrap());
    let a = client(&one, "/leases/").authority().await.unwrap();
    assert_eq!(a, client(&one, "/leases/").authority().await.unwrap());
    let other_prefix = client(&one, "/other/").authority().await.unwrap();
    let other_cluster = client(&two, "/leases/").authority().await.unwrap();
    // Both test clusters are formed from the same member name, so only the
    // stored marker tells them apart.
    assert_ne!(a, other_cluster, "two clusters share an authority");
    assert_ne!(a, other_prefix, "two prefixes share an authority");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_rising_after_etcd_is_killed_and_started_again() {
    let mut etcd = EtcdServer::start().unwrap();
    let (s, a, b) = (
        SessionId::new("crash").unwrap(),
        OwnerId::new("a").unwrap(),
        OwnerId::new("b").unwrap(),
    );
    let before = client(&etcd, "/t/").acquire(&s, &a).await.unwrap();
    etcd.kill();
    etcd.restart().unwrap();
    let c = client(&etcd, "/t/");
    let held = c.acquire(&s, &b).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held, "{held:?}");
    assert_eq!(held.holder(), Some(&a));
    c.release(&before).await.unwrap();
    let after = c.acquire(&s, &b).await.unwrap();
    assert!(
        after.token() > before.token(),
        "token went back across a crash: {before:?} then {after:?}"
    );
}

fn etcd_source(e: &lease_port::LeaseError) -> &EtcdError {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<EtcdError>())
        .unwrap_or_else(|| panic!("no etcd error kept as the source: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_frozen_etcd_is_a_transient_error_with_its_cause() {
    let mut etcd = EtcdServer::start().unwrap();
    let c = client(&etcd, "/t/");
    let (s, a) = (SessionId::new("down").unwrap(), OwnerId::new("a").unwrap());
    let lease = c.acquire(&s, &a).await.unwrap();

    etcd.pause().unwrap();
    let err = c.renew(&lease).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(
        matches!(etcd_source(&err), EtcdError::Timeout { .. }),
        "{err:?}"
    );
    etcd.resume().unwrap();
    c.renew(&lease)
        .await
        .expect("renews once etcd answers again");

    etcd.kill();
    for err in [
        c.acquire(&SessionId::new("other").unwrap(), &a)
            .await
            .unwrap_err(),
        c.renew(&lease).await.unwrap_err(),
        c.release(&lease).await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
        etcd_source(&err);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_its_holder_abandoned_is_freed_while_the_client_renews_others() {
    let etcd = EtcdServer::start().unwrap();
    let (ca, cb) = (client(&etcd, "/t/"), client(&etcd, "/t/"));
    let (a, b) = (OwnerId::new("a").unwrap(), OwnerId::new("b").unwrap());
    let (kept, abandoned) = (
        SessionId::new("kept").unwrap(),
        SessionId::new("abandoned").unwrap(),
    );
    let mut live = ca.acquire(&kept, &a).await.unwrap();
    let left = ca.acquire(&abandoned, &a).await.unwrap();
    // The shared etcd lease stays alive all along; only the bookkeeping of
    // which key was renewed can free the abandoned one. Bounded: 40 rounds
    // of a third of a TTL, far past the TTL plus the grace.
    let mut taken = None;
    for _ in 0..40 {
        tokio::time::sleep(TTL / 3).await;
        live = ca
            .renew_many(std::slice::from_ref(&live))
            .await
            .remove(0)
            .unwrap();
        match cb.acquire(&abandoned, &b).await {
            Ok(lease) => {
                taken = Some(lease);
                break;
            }
            Err(e) if e.kind() == LeaseErrorKind::Held => {}
            Err(e) => panic!("b: {e:?}"),
        }
    }
    let taken = taken.expect("the abandoned session was never freed");
    assert!(taken.token() > left.token());
    let err = ca.renew(&left).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    assert_eq!(err.holder(), Some(&b));
    ca.renew(&live)
        .await
        .expect("the renewed session is still held");
}

/// A hold that lapsed without a release is taken over only once the
/// acquiring client has seen it lapsed for the TTL plus the grace; a
/// client that does not wait is answered held, naming the previous
/// holder, until then. A release of the lapsed hold frees it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_holds_are_waited_out_unless_released() {
    let etcd = EtcdServer::start().unwrap();
    let grace = etcdlease::DEFAULT_GRACE;
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let holder = client(&etcd, "/lapsed/");
    let impatient = EtcdLease::builder([etcd.endpoint()])
        .prefix("/lapsed/")
        .ttl(TTL)
        .request_timeout(Duration::from_millis(500))
        .lapsed_hold_wait(Duration::ZERO)
        .build()
        .unwrap();

    // Alice stops renewing; etcd deletes her key after the TTL, the grace
    // and its next expiry check.
    let (s, released) = (
        SessionId::new("lapsed").unwrap(),
        SessionId::new("lapsed-then-released").unwrap(),
    );
    let first = holder.acquire(&s, &alice).await.unwrap();
    let second = holder.acquire(&released, &alice).await.unwrap();
    tokio::time::sleep(TTL + grace + Duration::from_millis(1500)).await;

    // The first call that met the lapsed hold began before its sighting,
    // so the takeover must come at least the wait after that call began.
    let mut first_sighting_before = None;
    let taken = loop {
        let calling = std::time::Instant::now();
        match impatient.acquire(&s, &bob).await {
            Ok(lease) => break lease,
            Err(e) => {
                assert_eq!(e.kind(), LeaseErrorKind::Held, "{e:?}");
                assert_eq!(e.holder(), Some(&alice), "{e:?}");
                if matches!(etcd_source(&e), EtcdError::LapsedHold { .. }) {
                    first_sighting_before.get_or_insert(calling);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let sighted = first_sighting_before.expect("the lapsed hold was taken at first sight");
    assert!(
        sighted.elapsed() >= TTL + grace,
        "taken {:?} after it was first seen lapsed",
        sighted.elapsed()
    );
    assert!(taken.token() > first.token());

    // Released after it lapsed: nothing left to wait for.
    holder.release(&second).await.unwrap();
    let after_release = impatient.acquire(&released, &bob).await.unwrap();
    assert!(after_release.token() > second.token());
}

/// A release that times out may still land. If its owner acquires the
/// session again meanwhile, the new hold must be a new write (a greater
/// token), so that the late release, which names the old one, removes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_never_removes_the_hold_its_owner_took_again() {
    use test_services::{FaultProxy, ProxyMode};
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(etcd.addr()).unwrap();
    // The proxy first, then etcd itself: after the release times out at
    // the proxy, the client moves on to the direct endpoint.
    let holder = EtcdLease::builder([format!("http://{}", proxy.addr()), etcd.endpoint()])
        .prefix("/late-release/")
        .ttl(Duration::from_secs(4))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let other = client(&etcd, "/late-release/");
    let (s, alice, bob) = (
        SessionId::new("late").unwrap(),
        OwnerId::new("alice").unwrap(),
        OwnerId::new("bob").unwrap(),
    );
    let first = holder.acquire(&s, &alice).await.unwrap();

    let delay = Duration::from_millis(1500);
    proxy.set_mode(ProxyMode::Delay {
        to_upstream: delay,
        to_client: Duration::ZERO,
    });
    let err = holder.release(&first).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    let again = holder.acquire(&s, &alice).await.unwrap();
    assert!(
        again.token() > first.token(),
        "re-acquired under the token a release in flight names: {again:?}"
    );
    // The release reaches etcd now.
    tokio::time::sleep(delay * 2).await;
    let held = other.acquire(&s, &bob).await.unwrap_err();
    assert_eq!(held.holder(), Some(&alice), "{held:?}");
    holder.renew(&again).await.unwrap();
}
