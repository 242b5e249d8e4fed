//! Prefixes nested in another prefix's directories (`{Q}s/`, `{Q}g/`) are
//! authorities of their own, and their keys must never meet the parent's.
//! A marker stored right under the prefix would be the session key or the
//! guard of the parent's session named `authority`:
//!
//! - under the guard, the session's acquire would take the marker for a
//!   lapsed hold, overwrite it, and its release delete it, so the nested
//!   prefix's authority would become unreadable and then change;
//! - under the session key, the marker would read as a value this crate
//!   did not write, so the session would be `Held` by nobody, for ever.

use std::time::{Duration, Instant};

use etcdlease::EtcdLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

const TTL: Duration = Duration::from_secs(2);

fn client(etcd: &EtcdServer, prefix: &str) -> EtcdLease {
    EtcdLease::builder([etcd.endpoint()])
        .prefix(prefix)
        .ttl(TTL)
        .request_timeout(Duration::from_millis(800))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_under_the_parent_prefix_never_changes_a_nested_prefixs_authority() {
    let etcd = EtcdServer::start().unwrap();
    let before = client(&etcd, "/nest/g/").authority().await.unwrap();

    let parent = client(&etcd, "/nest/");
    let (session, alice) = (
        SessionId::new("authority").unwrap(),
        OwnerId::new("alice").unwrap(),
    );
    let lease = parent.acquire(&session, &alice).await.unwrap();
    let during = client(&etcd, "/nest/g/").authority().await;
    parent.release(&lease).await.unwrap();
    let after = client(&etcd, "/nest/g/").authority().await;

    assert_eq!(
        during.as_ref().ok(),
        Some(&before),
        "while the parent's session is held: {during:?}"
    );
    assert_eq!(
        after.as_ref().ok(),
        Some(&before),
        "after the parent's session is released: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_prefixs_authority_never_makes_a_session_of_the_parent_untakeable() {
    let etcd = EtcdServer::start().unwrap();
    client(&etcd, "/nest/s/").authority().await.unwrap();

    let parent = client(&etcd, "/nest/");
    let (session, alice) = (
        SessionId::new("authority").unwrap(),
        OwnerId::new("alice").unwrap(),
    );
    // Nobody holds this session; give it several TTLs anyway.
    let stop = Instant::now() + TTL * 4;
    let mut last = None;
    while Instant::now() < stop {
        match parent.acquire(&session, &alice).await {
            Ok(_) => return,
            Err(e) => {
                assert_ne!(e.kind(), LeaseErrorKind::Invalid, "{e:?}");
                last = Some(e);
            }
        }
        tokio::time::sleep(TTL / 4).await;
    }
    panic!("a free session could never be acquired: {last:?}");
}
