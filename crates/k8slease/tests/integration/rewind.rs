//! An API server whose Lease storage went back — its etcd restored from a
//! backup, wiped, or failed over to a member missing writes — against the
//! emulator's `restore` and `wipe`: a client that saw newer versions
//! refuses the older state as `Rewound`, never `Transient` and never a
//! conflict to retry, so no token it hands out can repeat one issued
//! before.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8slease::{ExpiryJudgement, K8sLease, object_name};
use kube::api::Api;
use lease_port::{
    FencingToken, Lease, LeaseError, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease,
};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(10);

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

#[track_caller]
fn rewound<T: std::fmt::Debug>(result: Result<T, LeaseError>, step: &str) -> LeaseError {
    match result {
        Err(e) if e.kind() == LeaseErrorKind::Rewound => {
            assert!(!e.is_retryable(), "{step}: Rewound is never retryable");
            let text = e.to_string();
            assert!(text.contains("Lease storage went back"), "{step}: {text}");
            assert!(
                text.contains("--etcd-servers-overrides=coordination.k8s.io/leases"),
                "{step}: the message names the Leases etcd: {text}"
            );
            e
        }
        other => panic!("{step}: expected Rewound, got {other:?}"),
    }
}

async fn stored_version(cluster: &Cluster, session: &SessionId) -> u64 {
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let object = api.get(&object_name(session)).await.unwrap();
    object.metadata.resource_version.unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answered_below_a_version_seen_is_rewound() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let ca = lease(&cluster).await;
    let (s, a, b) = ids("written");
    let earlier = emulator.snapshot();
    let mut held = ca.acquire(&s, &a).await.unwrap();
    // Grants move the session's object on (renewals write the owner lease).
    for _ in 0..3 {
        ca.release(&held).await.unwrap();
        held = ca.acquire(&s, &a).await.unwrap();
    }
    let seen = emulator.revision();
    assert!(seen > earlier.revision());

    emulator.restore(&earlier);
    // Why it matters: a client that never saw the newer state is handed
    // the very token issued before, for the same session.
    let fresh = lease(&cluster).await;
    let repeated = fresh.acquire(&s, &b).await.unwrap();
    assert!(
        repeated.token() <= held.token(),
        "the rewound server hands out old tokens again: {} after {}",
        repeated.token(),
        held.token()
    );

    // The client that saw the newer state refuses it.
    rewound(ca.acquire(&s, &a).await, "acquire of the session it held");
    // A session it never touched: nothing to compare a read with, but the
    // create is answered with a version it saw long ago, and so is the
    // takeover that would follow it.
    let other = SessionId::new("written-other").unwrap();
    rewound(ca.acquire(&other, &a).await, "acquire of a new session");
    rewound(ca.acquire(&other, &a).await, "the same acquire again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_older_than_the_object_seen_is_rewound() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("read");
    let first = ca.acquire(&s, &a).await.unwrap();
    let earlier = emulator.snapshot();
    // Renewals write the owner lease, not the session's object: a release
    // and a new grant move the object on.
    ca.release(&first).await.unwrap();
    let held = ca.acquire(&s, &a).await.unwrap();
    // b saw the newer object too.
    assert_eq!(
        cb.acquire(&s, &b).await.unwrap_err().kind(),
        LeaseErrorKind::Held
    );

    let seen = stored_version(&cluster, &s).await;
    emulator.restore(&earlier);
    assert!(stored_version(&cluster, &s).await < seen);
    // The object is back at a version older than both clients saw.
    rewound(ca.current(&s).await, "current");
    // The renewal's write loses (the version it is conditioned on is gone),
    // and the read that decides shows the older object: not Held, not a
    // conflict to retry, not a renewal of a rewound record.
    rewound(ca.renew(&held).await, "renew");
    rewound(ca.acquire(&s, &a).await, "the holder's acquire");
    rewound(cb.acquire(&s, &b).await, "another client's acquire");
    rewound(ca.release(&held).await, "release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_lease_storage_is_rewound_and_a_restarted_client_resumes_above_the_mark() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("wiped");
    let mut issued: Vec<Lease> = Vec::new();
    for _ in 0..3 {
        let l = ca.acquire(&s, &a).await.unwrap();
        ca.release(&l).await.unwrap();
        issued.push(l);
    }
    let held = ca.acquire(&s, &a).await.unwrap();
    // What a store fenced by these tokens has accepted.
    let mark = held.token();
    // b sees the old versions too, through one read.
    let shown = cb.current(&s).await.unwrap().expect("held by a");
    assert_eq!((shown.owner(), shown.token()), (&a, held.token()));

    emulator.wipe();
    // The holder's object is gone: its renewal is a loss, as after a
    // deletion — it must stop at once.
    let err = ca.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
    // Acquiring again would start over at version 1.
    rewound(ca.acquire(&s, &a).await, "acquire after the wipe");
    rewound(cb.acquire(&s, &b).await, "another client that saw them");

    // Restarted clients accept the new storage; acquiring above the store's
    // mark, their tokens stay above every token issued before the wipe.
    let restarted = lease(&cluster).await;
    let resumed = restarted
        .acquire_above(&s, &b, mark)
        .await
        .expect("a restarted client acquires above the mark");
    assert!(resumed.token() > mark, "{resumed:?} not above {mark}");
    restarted.release(&resumed).await.unwrap();
    let next = lease(&cluster)
        .await
        .acquire(&s, &a)
        .await
        .expect("a later plain acquire");
    assert!(next.token() > resumed.token());
    assert!(issued.iter().all(|l| next.token() > l.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_seen_only_by_a_clone_count_for_the_whole_client() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let ca = lease(&cluster).await;
    let clone = ca.clone();
    let (s, a, _) = ids("cloned");
    let earlier = emulator.snapshot();
    let held = clone.acquire(&s, &a).await.unwrap();
    clone.renew(&held).await.unwrap();
    emulator.restore(&earlier);
    let other = SessionId::new("cloned-other").unwrap();
    rewound(
        ca.acquire(&other, &a).await,
        "the original after its clone saw more",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_changes_nothing_is_not_a_rewind() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let c = K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let (s, a, _) = ids("unchanged");
    let held = c.acquire(&s, &a).await.unwrap();
    let held = c.renew(&held).await.unwrap();
    // Another session's writes raise the versions this client saw.
    let other = SessionId::new("unchanged-other").unwrap();
    let o = c.acquire(&other, &a).await.unwrap();
    c.renew(&o).await.unwrap();
    // The clock has not moved: this renewal writes what is stored, which
    // the API server answers with the version the object already had.
    let revision = cluster.emulator().revision();
    let again = c.renew(&held).await.expect("an unchanged renewal");
    assert_eq!(
        cluster.emulator().revision(),
        revision,
        "the renewal changed nothing, so nothing was written"
    );
    assert_eq!(again.token(), held.token());
    clock.advance(Duration::from_secs(1));
    c.renew(&again)
        .await
        .expect("a renewal that changes something");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_operations_of_one_client_are_never_taken_for_a_rewind() {
    let cluster = Cluster::emulated().await;
    let c = lease(&cluster).await;
    let mut tasks = Vec::new();
    for task in 0..8 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let owner = OwnerId::new(format!("owner-{task}")).unwrap();
            for round in 0..10 {
                // Sessions shared between tasks, so reads, losing writes
                // and winning writes of one object interleave.
                let s = SessionId::new(format!("busy-{}", (task + round) % 4)).unwrap();
                match c.acquire(&s, &owner).await {
                    Ok(l) => {
                        let l = c.renew(&l).await?;
                        c.release(&l).await?;
                    }
                    Err(e) if e.kind() == LeaseErrorKind::Held => {}
                    Err(e) => return Err(e),
                }
                let _ = c.current(&s).await?;
            }
            Ok::<(), LeaseError>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("no operation fails");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_is_no_way_around_a_rewind() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let ca = lease(&cluster).await;
    let (s, a, _) = ids("floored");
    let earlier = emulator.snapshot();
    let held = ca.acquire(&s, &a).await.unwrap();
    ca.renew(&held).await.unwrap();
    emulator.restore(&earlier);
    // A client that saw the newer state refuses it even when asked for a
    // token above a floor: only a restart accepts the older state.
    rewound(
        ca.acquire_above(&s, &a, FencingToken::new(held.token().get() + 100))
            .await,
        "acquire above a floor",
    );
}
