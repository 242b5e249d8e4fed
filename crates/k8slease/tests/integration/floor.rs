//! Token continuity: `acquire_above` grants a token above a floor (a
//! store's high-water mark) even when the API server's versions are below
//! it, and every later takeover — by any client, after release or expiry —
//! stays above the raised token.

use std::sync::Arc;
use std::time::Duration;

use k8s_emulator::Verb;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8slease::{ExpiryJudgement, K8sLease, object_name};
use kube::api::Api;
use lease_port::{FencingToken, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(10);
const TOKEN: &str = "mecatl.dev/fencing-token";

fn ids(session: &str) -> (SessionId, OwnerId, OwnerId) {
    (
        SessionId::new(session).unwrap(),
        OwnerId::new("owner-a").unwrap(),
        OwnerId::new("owner-b").unwrap(),
    )
}

async fn lease(cluster: &Cluster) -> K8sLease {
    cluster.lease(TTL, ExpiryJudgement::SkewSafe).await
}

async fn stored(cluster: &Cluster, session: &SessionId) -> LeaseObject {
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    api.get(&object_name(session)).await.unwrap()
}

fn version(object: &LeaseObject) -> u64 {
    object
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

fn stored_token(object: &LeaseObject) -> u64 {
    object.metadata.annotations.as_ref().unwrap()[TOKEN]
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_above_grants_above_the_floor_and_later_takeovers_stay_above() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("raised");
    let first = ca.acquire(&s, &a).await.unwrap();
    ca.release(&first).await.unwrap();
    let rv = version(&stored(&cluster, &s).await);
    let floor = FencingToken::new(rv + 1000);

    let raised = cb
        .acquire_above(&s, &b, floor)
        .await
        .expect("a raised grant");
    assert!(raised.token() > floor, "{raised:?} not above {floor}");
    let object = stored(&cluster, &s).await;
    assert_eq!(stored_token(&object), raised.token().get());
    assert!(
        version(&object) < raised.token().get(),
        "the token is above the server's versions"
    );
    let raised = cb.renew(&raised).await.expect("the raised grant renews");

    // Another owner, through a client that never saw the raise.
    cb.release(&raised).await.unwrap();
    let fresh = lease(&cluster).await;
    let next = fresh.acquire(&s, &a).await.unwrap();
    assert!(
        next.token() > raised.token(),
        "{} after {}",
        next.token(),
        raised.token()
    );
    // And by expiry, through the client that raised it.
    let clock = ManualClock::new();
    let late = K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    assert_eq!(
        late.acquire(&s, &b).await.unwrap_err().kind(),
        LeaseErrorKind::Held
    );
    // Past the owner lease's hold (a third longer than the TTL).
    clock.advance(TTL * 4 / 3 + Duration::from_secs(1));
    let expired = late.acquire(&s, &b).await.expect("takeover after expiry");
    assert!(expired.token() > next.token());
    // The annotation carries the raise: current reports what was granted.
    let shown = cb.current(&s).await.unwrap().expect("held");
    assert_eq!(shown.token(), expired.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_never_leased_is_acquired_above_a_floor() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("raised-new");
    let floor = FencingToken::new(1_000_000);
    let counts = cluster.emulator().requests();
    counts.reset();
    let raised = ca.acquire_above(&s, &a, floor).await.unwrap();
    assert!(raised.token() > floor);
    assert_eq!(
        (
            counts.get(Verb::Get, "leases"),
            counts.get(Verb::Create, "leases"),
            counts.get(Verb::Update, "leases"),
        ),
        (1, 2, 1),
        "as a plain first acquire of a new session: get, create (owner lease and object), update"
    );
    ca.release(&raised).await.unwrap();
    let next = cb.acquire(&s, &b).await.unwrap();
    assert!(next.token() > raised.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_holder_below_the_floor_gets_a_new_greater_token() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("raised-live");
    let old = ca.acquire(&s, &a).await.unwrap();
    let floor = FencingToken::new(old.token().get() + 10);
    let raised = ca.acquire_above(&s, &a, floor).await.unwrap();
    assert!(raised.token() > floor);
    assert_eq!(
        ca.renew(&old).await.unwrap_err().kind(),
        LeaseErrorKind::Held,
        "the old token no longer renews"
    );
    let raised = ca.renew(&raised).await.unwrap();
    let err = cb.acquire_above(&s, &b, floor).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "a floor takes nothing");
    assert_eq!(err.holder(), Some(&a));
    let shown = cb.current(&s).await.unwrap().expect("held");
    assert_eq!(shown.token(), raised.token());
    // Same holder, so no change of holder is counted.
    let object = stored(&cluster, &s).await;
    assert_eq!(object.spec.unwrap().lease_transitions, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_below_the_token_changes_nothing() {
    let cluster = Cluster::emulated().await;
    let ca = lease(&cluster).await;
    let (s, a, _) = ids("low-floor");
    let held = ca.acquire(&s, &a).await.unwrap();
    let below = FencingToken::new(held.token().get() - 1);
    let again = ca.acquire_above(&s, &a, below).await.unwrap();
    assert_eq!(
        again.token(),
        held.token(),
        "the live holder keeps its token"
    );
    ca.renew(&held).await.expect("the grant is the same");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_no_token_can_exceed_is_invalid_and_sends_nothing() {
    let cluster = Cluster::emulated().await;
    let ca = lease(&cluster).await;
    let (s, a, _) = ids("max-floor");
    let counts = cluster.emulator().requests();
    counts.reset();
    let err = ca
        .acquire_above(&s, &a, FencingToken::new(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert_eq!(counts.resource_total("leases"), 0);
}
