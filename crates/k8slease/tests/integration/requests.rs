//! API requests per operation, counted by the emulator: what a cluster's
//! API server pays for each lease operation. `scale` counts a process
//! holding thousands of sessions.

use std::time::Duration;

use k8s_emulator::Verb;
use k8slease::ExpiryJudgement;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_operations_cost_a_few_requests() {
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
    let cost = |what: &str, get: u64, list: u64, create: u64, update: u64| {
        let seen = (
            counts.get(Verb::Get, "leases"),
            counts.get(Verb::List, "leases"),
            counts.get(Verb::Create, "leases"),
            counts.get(Verb::Update, "leases"),
        );
        assert_eq!(
            seen,
            (get, list, create, update),
            "{what}: (get, list, create, update)"
        );
        assert_eq!(
            counts.resource_total("leases"),
            get + list + create + update,
            "{what}"
        );
        counts.reset();
    };
    counts.reset();

    let la = ca.acquire(&s, &a).await.unwrap();
    // The client's owner lease is created with its first grant; the
    // session's object is created free and taken in an update that writes
    // the token with the holder.
    cost("first acquire, of a new session", 1, 0, 2, 1);
    let la = ca.renew(&la).await.unwrap();
    // One read proves the session still hangs on the owner lease, which
    // is renewed.
    cost("renew", 1, 0, 0, 1);
    let la = ca.renew_many(&[la]).await.remove(0).unwrap();
    // Renewed just now: no write, one list of the sessions on it.
    cost("batch renewal after a renew", 0, 1, 0, 0);
    let la = ca.renew_many(&[la]).await.remove(0).unwrap();
    cost("batch renewal within the same third of a TTL", 0, 0, 0, 0);
    ca.release(&la).await.unwrap();
    cost("release", 0, 0, 0, 1);
    let lb = cb.acquire(&s, &b).await.unwrap();
    cost(
        "first acquire by another client, of a free session",
        1,
        0,
        1,
        1,
    );
    let err = ca.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    // Its memory says free (it released last): the owner lease is renewed
    // for the grant, the write loses, a read shows the holder and one of
    // its owner lease shows it live.
    cost(
        "acquire of a session taken since this client saw it",
        2,
        0,
        0,
        2,
    );
    let err = ca.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    // Remembered held: read again (object and owner lease) before refusing.
    cost(
        "acquire of a session known to be held elsewhere",
        2,
        0,
        0,
        0,
    );
    cb.release(&lb).await.unwrap();
    cost("release", 0, 0, 0, 1);
    let la = ca.acquire(&s, &a).await.unwrap();
    // Its memory says held: it reads before refusing, finds it free, and
    // renews its owner lease for the grant.
    cost(
        "acquire of a session released since this client saw it",
        1,
        0,
        0,
        2,
    );
    ca.release(&la).await.unwrap();
    cost("release", 0, 0, 0, 1);
    let la = ca.acquire(&s, &a).await.unwrap();
    cost("acquire by the client that released it last", 0, 0, 0, 2);
    ca.release(&la).await.unwrap();
}
