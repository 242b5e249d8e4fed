//! Expiry judgement under clock skew. The API server keeps no lease time:
//! each client judges another holder's expiry with its own clocks, so each
//! client here gets its own injected clock, against the real emulator.

use std::sync::Arc;
use std::time::Duration;

use k8slease::{ExpiryJudgement, K8sLease};
use lease_port::{Clock, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(10);
/// How long an owner lease holds unrenewed at that TTL (a third longer, in
/// whole seconds): what a reader judges a holder's expiry by.
const HOLD: Duration = Duration::from_secs(13);

async fn client(cluster: &Cluster, clock: &ManualClock, judgement: ExpiryJudgement) -> K8sLease {
    K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(TTL)
        .expiry(judgement)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap()
}

fn ids(session: &str) -> (SessionId, OwnerId, OwnerId) {
    (
        SessionId::new(session).unwrap(),
        OwnerId::new("holder").unwrap(),
        OwnerId::new("reader").unwrap(),
    )
}

fn held(r: Result<lease_port::Lease, lease_port::LeaseError>, step: &str) {
    match r {
        Err(e) if e.kind() == LeaseErrorKind::Held => {}
        other => panic!("{step}: expected Held, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skew_safe_waits_one_ttl_from_its_first_sight() {
    let cluster = Cluster::emulated().await;
    let (hc, rc) = (ManualClock::new(), ManualClock::new());
    let holder = client(&cluster, &hc, ExpiryJudgement::SkewSafe).await;
    let (s, h, r) = ids("first-sight");
    let lease = holder.acquire(&s, &h).await.unwrap();
    // The holder died an hour ago by every clock...
    hc.advance(Duration::from_secs(3600));
    rc.advance(Duration::from_secs(3600));
    // ...but a process that never saw its owner lease must watch it
    // unchanged for its whole hold first.
    let reader = client(&cluster, &rc, ExpiryJudgement::SkewSafe).await;
    held(reader.acquire(&s, &r).await, "first sight");
    rc.advance(HOLD - Duration::from_secs(1));
    held(reader.acquire(&s, &r).await, "one second short of the hold");
    rc.advance(Duration::from_secs(2));
    let taken = reader
        .acquire(&s, &r)
        .await
        .expect("the hold after first sight");
    assert!(taken.token() > lease.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skew_safe_ignores_wall_clocks_and_restarts_its_wait_on_every_renewal() {
    let cluster = Cluster::emulated().await;
    let (hc, rc) = (ManualClock::new(), ManualClock::new());
    // The holder's wall clock is a day behind, the reader's a day ahead.
    hc.set_wall(hc.now() - Duration::from_secs(86_400));
    rc.set_wall(rc.now() + Duration::from_secs(86_400));
    let holder = client(&cluster, &hc, ExpiryJudgement::SkewSafe).await;
    let reader = client(&cluster, &rc, ExpiryJudgement::SkewSafe).await;
    let (s, h, r) = ids("skewed");
    let mut lease = holder.acquire(&s, &h).await.unwrap();
    held(
        reader.acquire(&s, &r).await,
        "live, wall clocks a day apart",
    );
    for round in 0..3 {
        // Renewed every 0.6 TTL: the reader sees a change each time and
        // never reaches a full TTL without one.
        rc.advance(TTL * 3 / 5);
        hc.advance(TTL * 3 / 5);
        lease = holder.renew(&lease).await.unwrap();
        held(reader.acquire(&s, &r).await, &format!("renewal {round}"));
    }
    // The holder stops renewing: its owner lease's hold after the last
    // change, it is free.
    rc.advance(HOLD + Duration::from_secs(1));
    let taken = reader
        .acquire(&s, &r)
        .await
        .expect("the hold after the last renewal");
    assert!(taken.token() > lease.token());
    held(
        holder.renew(&lease).await,
        "the old holder after the takeover",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_time_takes_over_at_once_and_trusts_the_wall_clocks() {
    let cluster = Cluster::emulated().await;
    let (hc, rc) = (ManualClock::new(), ManualClock::new());
    let holder = client(&cluster, &hc, ExpiryJudgement::RecordTime).await;
    let (s, h, r) = ids("record-time");
    let lease = holder.acquire(&s, &h).await.unwrap();

    // Synchronised clocks: a new process judges from the record at once.
    let reader = client(&cluster, &rc, ExpiryJudgement::RecordTime).await;
    rc.advance(TTL / 2);
    held(reader.acquire(&s, &r).await, "half a TTL after the renewal");
    rc.advance(HOLD - TTL / 2 + Duration::from_secs(1));
    let taken = reader
        .acquire(&s, &r)
        .await
        .expect("past renewTime + duration");
    assert!(taken.token() > lease.token());

    // The documented hazard: a reader whose wall clock runs a TTL ahead
    // takes over a lease its holder renewed a moment ago. SkewSafe does not.
    let (s2, _, _) = ids("record-time-skewed");
    let lease = holder.acquire(&s2, &h).await.unwrap();
    let ahead = ManualClock::new();
    ahead.set_wall(hc.now() + HOLD + Duration::from_secs(1));
    let skewed = client(&cluster, &ahead, ExpiryJudgement::RecordTime).await;
    let careful = client(&cluster, &ahead, ExpiryJudgement::SkewSafe).await;
    held(
        careful.acquire(&s2, &r).await,
        "skew-safe, clock a TTL ahead",
    );
    let stolen = skewed
        .acquire(&s2, &r)
        .await
        .expect("record time trusts the skewed clock");
    assert!(stolen.token() > lease.token(), "even then the token rises");
    held(
        holder.renew(&lease).await,
        "the holder learns of the loss at once",
    );
}
