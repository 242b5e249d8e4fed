//! API requests per operation, counted by the emulator: what a cluster's
//! API server pays for each lease operation.

use std::time::Duration;

use k8s_emulator::Verb;
use k8slease::ExpiryJudgement;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_operations_cost_one_or_two_requests() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (
        cluster.lease(TTL, ExpiryJudgement::SkewSafe).await,
        cluster.lease(TTL, ExpiryJudgement::SkewSafe).await,
    );
    let counts = cluster.emulator().requests();
    let (s, a, b) = (
        SessionId::new("counted").unwrap(),
        OwnerId::new("a").unwrap(),
        OwnerId::new("b").unwrap(),
    );
    let cost = |what: &str, get: u64, create: u64, update: u64| {
        let seen = (
            counts.get(Verb::Get, "leases"),
            counts.get(Verb::Create, "leases"),
            counts.get(Verb::Update, "leases"),
        );
        assert_eq!(seen, (get, create, update), "{what}: (get, create, update)");
        assert_eq!(
            counts.resource_total("leases"),
            get + create + update,
            "{what}"
        );
        counts.reset();
    };
    counts.reset();

    let la = ca.acquire(&s, &a).await.unwrap();
    // The object is created free and taken in an update that writes the
    // token with the holder.
    cost("acquire of a new session", 1, 1, 1);
    let la = ca.renew(&la).await.unwrap();
    cost("renew", 0, 0, 1);
    let la = ca.renew(&la).await.unwrap();
    cost("second renew", 0, 0, 1);
    ca.release(&la).await.unwrap();
    cost("release", 0, 0, 1);
    let lb = cb.acquire(&s, &b).await.unwrap();
    cost("acquire of a free session seen by another client", 1, 0, 1);
    let err = ca.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    // Its memory says free (it released last): the write loses, a read
    // shows the holder.
    cost(
        "acquire of a session taken since this client saw it",
        1,
        0,
        1,
    );
    let err = ca.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    cost("acquire of a session known to be held elsewhere", 1, 0, 0);
    cb.release(&lb).await.unwrap();
    cost("release", 0, 0, 1);
    let la = ca.acquire(&s, &a).await.unwrap();
    // Its memory says held: it reads before refusing, and finds it free.
    cost(
        "acquire of a session released since this client saw it",
        1,
        0,
        1,
    );
    ca.release(&la).await.unwrap();
    cost("release", 0, 0, 1);
    let la = ca.acquire(&s, &a).await.unwrap();
    cost("acquire by the client that released it last", 0, 0, 1);
    ca.release(&la).await.unwrap();
}
