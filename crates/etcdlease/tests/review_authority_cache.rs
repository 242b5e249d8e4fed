//! Review reproduction (fails on the code it was written against): a
//! client learns its authority once and keeps it for ever, while the
//! tokens it hands out come from whichever cluster answers now. When the
//! cluster behind its endpoints is replaced (data wiped and rebuilt, or, as
//! here, an endpoint list that reaches a second cluster once the first
//! member is gone), the client keeps naming the first cluster's authority
//! for tokens of the second: a store fenced by the first authority takes
//! them, and two clients of the one cluster now answering name different
//! authorities.

use std::time::Duration;

use etcdlease::EtcdLease;
use lease_port::{OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

fn client(endpoints: Vec<String>) -> EtcdLease {
    EtcdLease::builder(endpoints)
        .prefix("/review-authority/")
        .ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authority_reported_is_that_of_the_cluster_issuing_the_tokens() {
    let mut first = EtcdServer::start().unwrap();
    let second = EtcdServer::start().unwrap();
    let long_lived = client(vec![first.endpoint(), second.endpoint()]);
    let (session, alice) = (SessionId::new("s").unwrap(), OwnerId::new("alice").unwrap());
    let before = long_lived.authority().await.unwrap();
    long_lived.acquire(&session, &alice).await.unwrap();

    first.kill();
    // The next calls fail over to the second cluster.
    let mut lease = None;
    for _ in 0..20 {
        if let Ok(l) = long_lived
            .acquire(&SessionId::new("t").unwrap(), &alice)
            .await
        {
            lease = Some(l);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease = lease.expect("the client moved on to the cluster still answering");
    let now_issuing = client(vec![second.endpoint()]).authority().await.unwrap();
    let reported = long_lived.authority().await.unwrap();
    assert_ne!(before, now_issuing, "the two clusters must differ");
    assert_eq!(
        reported,
        now_issuing,
        "token {:?} comes from the second cluster, the client still names the first",
        lease.token()
    );
}
