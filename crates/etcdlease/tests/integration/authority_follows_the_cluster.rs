//! A client's authority names one cluster, and its tokens must come from
//! that cluster only. Endpoints that reach a second cluster once the first
//! is gone (a stale endpoint list, a rebuilt cluster at an old address)
//! would hand out the second cluster's revisions as tokens of the first
//! authority, which a store fenced by the first would take. The client
//! refuses every answer of another cluster as a configuration error.

use std::time::Duration;

use etcdlease::{EtcdError, EtcdLease};
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

fn client(endpoints: Vec<String>) -> EtcdLease {
    EtcdLease::builder(endpoints)
        .prefix("/authority/")
        .ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_another_cluster_are_refused_never_turned_into_tokens() {
    let mut first = EtcdServer::start().unwrap();
    let second = EtcdServer::start().unwrap();
    let long_lived = client(vec![first.endpoint(), second.endpoint()]);
    let alice = OwnerId::new("alice").unwrap();
    let before = long_lived.authority().await.unwrap();
    long_lived
        .acquire(&SessionId::new("s").unwrap(), &alice)
        .await
        .unwrap();
    let second_authority = client(vec![second.endpoint()]).authority().await.unwrap();
    assert_ne!(before, second_authority, "the two clusters must differ");

    first.kill();
    // Every call from here on reaches the second cluster (the first is
    // gone): none may answer with a lease.
    let mut refused = 0;
    for _ in 0..20 {
        match long_lived
            .acquire(&SessionId::new("t").unwrap(), &alice)
            .await
        {
            Ok(lease) => {
                panic!("a token of the second cluster under the first's authority: {lease:?}")
            }
            Err(e) if e.kind() == LeaseErrorKind::Invalid => {
                let source =
                    std::error::Error::source(&e).and_then(|s| s.downcast_ref::<EtcdError>());
                assert!(
                    matches!(source, Some(EtcdError::ClusterChanged { .. })),
                    "{e:?}"
                );
                refused += 1;
            }
            // The dead member, until the client moves on.
            Err(e) => assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e:?}"),
        }
    }
    assert!(refused > 0, "the second cluster was never reached");
    assert_eq!(long_lived.authority().await.unwrap(), before);
}
