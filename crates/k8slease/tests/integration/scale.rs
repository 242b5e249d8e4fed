//! Many sessions on one owner lease: what a process holding thousands of
//! sessions sends per renewal period (counted by the emulator), and what
//! becomes of its sessions when its owner lease is lost, expires, or
//! belongs to a previous incarnation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_emulator::{RequestCounters, Verb};
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8slease::{ExpiryJudgement, K8sLease, object_name};
use kube::api::{Api, DeleteParams, ListParams};
use lease_port::{Clock, Lease, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

/// Lease times run on a manual clock; the TTL still bounds each request in
/// real time (a quarter of it), and a list of ten thousand leases from the
/// emulator on a loaded CI machine once took longer than 15 s allows.
const TTL: Duration = Duration::from_secs(60);
/// How long an owner lease holds unrenewed at that TTL (a third longer):
/// what a taker must see it unchanged for.
const HOLD: Duration = Duration::from_secs(80);
/// What the lease keeper puts in one `renew_many` call by default.
const KEEPER_BATCH: usize = 256;
const OWNER_LABEL: &str = "mecatl.dev/owner-lease";

async fn client(cluster: &Cluster, clock: &ManualClock) -> K8sLease {
    watching_from(cluster, clock, k8slease::DEFAULT_WATCH_FROM).await
}

async fn watching_from(cluster: &Cluster, clock: &ManualClock, sessions: usize) -> K8sLease {
    K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(TTL)
        .expiry(ExpiryJudgement::SkewSafe)
        .clock(Arc::new(clock.clone()))
        .watch_from(sessions)
        .build()
        .unwrap()
}

fn owner(name: &str) -> OwnerId {
    OwnerId::new(name).unwrap()
}

fn sessions(prefix: &str, n: usize) -> Vec<SessionId> {
    (0..n)
        .map(|i| SessionId::new(format!("{prefix}-{i}")).unwrap())
        .collect()
}

/// Acquires every one of `sessions` for `owner`, a few dozen at a time.
async fn acquire_all(leases: &K8sLease, sessions: &[SessionId], owner: &OwnerId) -> Vec<Lease> {
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, s) in sessions.iter().enumerate() {
        let (leases, s, owner, gate) = (leases.clone(), s.clone(), owner.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            (i, leases.acquire(&s, &owner).await.expect("acquire"))
        });
    }
    let mut out: Vec<Option<Lease>> = vec![None; sessions.len()];
    while let Some(done) = tasks.join_next().await {
        let (i, lease) = done.unwrap();
        out[i] = Some(lease);
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// One renewal period as the lease keeper spends it: the held leases
/// renewed in keeper-sized batches, spread over a third of the TTL.
async fn renewal_period(leases: &K8sLease, clock: &ManualClock, held: &mut [Lease]) {
    let batches = held.len().div_ceil(KEEPER_BATCH);
    let step = TTL / 3 / u32::try_from(batches).unwrap();
    for batch in held.chunks_mut(KEEPER_BATCH) {
        clock.advance(step);
        let called = clock.now();
        let answers = leases.renew_many(batch).await;
        for (lease, answer) in batch.iter_mut().zip(answers) {
            let renewed = answer.expect("a held lease renews");
            assert_eq!(renewed.token(), lease.token());
            // The keeper counts a whole TTL from the call, whether or not
            // the owner lease was written for it.
            assert!(
                renewed.expiry() >= called + TTL,
                "a batch renewal gave less than a TTL from its call"
            );
            *lease = renewed;
        }
    }
}

/// Renewal periods until one proves the sessions without a list: the
/// first after the grants lists and starts the watch, which lists once
/// itself before it runs. Fails if that never happens.
async fn until_watched(
    leases: &K8sLease,
    clock: &ManualClock,
    held: &mut [Lease],
    counts: &RequestCounters,
) {
    for _ in 0..20 {
        counts.reset();
        renewal_period(leases, clock, held).await;
        if counts.get(Verb::List, "leases") == 0 {
            return;
        }
        // Give the watch's own list and its start a moment.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("every renewal period still listed: the watch never took over");
}

fn expect_held(answer: &Result<Lease, lease_port::LeaseError>, step: &str) {
    match answer {
        Err(e) if e.kind() == LeaseErrorKind::Held => {}
        other => panic!("{step}: expected Held, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sessions_cost_one_request_per_renewal_period_once_watched() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let leases = client(&cluster, &clock).await;
    let me = owner("pod-a/1");
    let all = sessions("many", 10_000);
    let started = Instant::now();
    let mut held = acquire_all(&leases, &all, &me).await;
    eprintln!(
        "acquired {} sessions in {:?}",
        held.len(),
        started.elapsed()
    );
    let counts = cluster.emulator().requests();
    until_watched(&leases, &clock, &mut held, counts).await;
    for period in 0..3 {
        counts.reset();
        let before = held[0].expiry();
        renewal_period(&leases, &clock, &mut held).await;
        let seen = counts.snapshot();
        let total = counts.resource_total("leases");
        eprintln!("period {period}: {total} requests for 10,000 sessions: {seen:?}");
        // One write renews them all; the watch, already running, proves
        // they are still ours.
        assert_eq!(
            total, 1,
            "period {period}: {total} requests for 10,000 sessions: {seen:?}"
        );
        assert_eq!(counts.get(Verb::Update, "leases"), 1, "{seen:?}");
        assert!(held[0].expiry() > before, "the period moved no expiry");
    }
    // Still every one of them ours: another owner is refused.
    let other = client(&cluster, &ManualClock::new()).await;
    let err = other.acquire(&all[9_999], &owner("pod-b/1")).await;
    expect_held(&err, "another owner after the renewals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_one_session_leaves_the_others_held() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let leases = client(&cluster, &clock).await;
    let (me, them) = (owner("pod-a/1"), owner("pod-b/1"));
    let all = sessions("release-one", 20);
    let held = acquire_all(&leases, &all, &me).await;
    leases.release(&held[3]).await.unwrap();
    let other = client(&cluster, &ManualClock::new()).await;
    let taken = other
        .acquire(&all[3], &them)
        .await
        .expect("the released one is free");
    assert!(taken.token() > held[3].token());
    clock.advance(TTL / 2);
    let answers = leases.renew_many(&held).await;
    for (i, answer) in answers.iter().enumerate() {
        if i == 3 {
            expect_held(answer, "the released session");
        } else {
            answer.as_ref().expect("every other session stays held");
        }
    }
    expect_held(
        &other.acquire(&all[4], &them).await,
        "a neighbour of the released session",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_sessions_are_taken_only_once_its_owner_lease_is_seen_expired() {
    let cluster = Cluster::emulated().await;
    let (hc, rc) = (ManualClock::new(), ManualClock::new());
    let holder = client(&cluster, &hc).await;
    let (me, them) = (owner("pod-a/1"), owner("pod-b/1"));
    let all = sessions("crash", 10);
    let held = acquire_all(&holder, &all, &me).await;
    // The holder stops renewing. Another process sees its owner lease
    // first now, and must see it unchanged for its whole hold on its clock.
    let taker = client(&cluster, &rc).await;
    expect_held(&taker.acquire(&all[0], &them).await, "at first sight");
    rc.advance(HOLD - Duration::from_secs(1));
    expect_held(
        &taker.acquire(&all[1], &them).await,
        "a second short of the owner lease's hold",
    );
    rc.advance(Duration::from_secs(2));
    let taken = taker
        .acquire(&all[0], &them)
        .await
        .expect("the owner lease's hold after first sight");
    assert!(taken.token() > held[0].token());
    // The taker revoked the owner lease: the holder, coming back, loses
    // every session on it, not just the one taken, and is told so.
    hc.advance(HOLD * 2);
    for answer in holder.renew_many(&held).await {
        expect_held(&answer, "the crashed holder's batch renewal");
    }
    expect_held(&holder.renew(&held[5]).await, "the crashed holder's renew");
    // Its sessions are free for the taking, and its next grants hang on an
    // owner lease of its own again.
    let again = holder.acquire(&all[5], &me).await.expect("re-acquire");
    assert!(again.token() > held[5].token());
    expect_held(
        &taker.acquire(&all[5], &them).await,
        "a session re-acquired on a new owner lease",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_owner_lease_loses_every_session_and_is_never_hung_on_again() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let leases = client(&cluster, &clock).await;
    let (me, them) = (owner("pod-a/1"), owner("pod-b/1"));
    let all = sessions("deleted-owner", 6);
    let held = acquire_all(&leases, &all[..5], &me).await;
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let session_object = api.get(&object_name(&all[0])).await.unwrap();
    let owner_lease = session_object.metadata.labels.as_ref().unwrap()[OWNER_LABEL].clone();
    // `kubectl delete lease` of the owner lease.
    api.delete(&owner_lease, &DeleteParams::default())
        .await
        .unwrap();
    let other = client(&cluster, &ManualClock::new()).await;
    let taken = other
        .acquire(&all[0], &them)
        .await
        .expect("a session on a deleted owner lease is free");
    assert!(taken.token() > held[0].token());
    // The holder's next grant must not hang on the deleted owner lease it
    // remembers: it would be free for anyone from the start.
    let fresh = leases.acquire(&all[5], &me).await.expect("a new grant");
    expect_held(
        &other.acquire(&all[5], &them).await,
        "a grant made after the owner lease was deleted",
    );
    clock.advance(TTL / 2);
    let answers = leases.renew_many(&held).await;
    for answer in &answers {
        expect_held(answer, "a session on the deleted owner lease");
    }
    leases.renew(&fresh).await.expect("the new grant renews");
    assert!(
        api.get_opt(&owner_lease).await.unwrap().is_none(),
        "the deleted owner lease was brought back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_incarnation_never_renews_the_previous_ones_sessions() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let before = client(&cluster, &clock).await;
    let me = owner("pod-a/1");
    let all = sessions("incarnation", 4);
    let held = acquire_all(&before, &all, &me).await;
    // The process restarts under the same owner id.
    let after = client(&cluster, &clock).await;
    expect_held(
        &after.renew(&held[0]).await,
        "renew of the previous incarnation's lease",
    );
    for answer in after.renew_many(&held[1..]).await {
        expect_held(
            &answer,
            "batch renewal of the previous incarnation's leases",
        );
    }
    // The contract lets the same owner acquire again: a new, greater token
    // on the new incarnation's owner lease.
    let again = after
        .acquire(&all[0], &me)
        .await
        .expect("same-owner re-acquire");
    assert!(again.token() > held[0].token());
    // The previous incarnation, were it still running, loses that session
    // alone.
    clock.advance(TTL / 2);
    let answers = before.renew_many(&held).await;
    expect_held(
        &answers[0],
        "the session re-acquired by the new incarnation",
    );
    for answer in &answers[1..] {
        answer
            .as_ref()
            .expect("the others stay with the previous incarnation");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_the_holder_on_each_session_and_the_renewal_on_its_owner_lease() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let leases = client(&cluster, &clock).await;
    let me = owner("pod-a/1");
    let all = sessions("shown", 3);
    let held = acquire_all(&leases, &all, &me).await;
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let renew_time = |o: &LeaseObject| o.spec.as_ref().unwrap().renew_time.clone().unwrap();
    let session_object = api.get(&object_name(&all[1])).await.unwrap();
    let spec = session_object.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("pod-a/1"));
    assert_eq!(spec.lease_duration_seconds, Some(60));
    let owner_lease = session_object.metadata.labels.as_ref().unwrap()[OWNER_LABEL].clone();
    let listed = api
        .list(&ListParams::default().labels(&format!("{OWNER_LABEL}={owner_lease}")))
        .await
        .unwrap();
    // The owner lease carries its own name in the label, for the watch.
    assert_eq!(
        listed.items.len(),
        4,
        "`kubectl get leases -l` finds the sessions and their owner lease"
    );
    let first = api.get(&owner_lease).await.unwrap();
    let owner_spec = first.spec.as_ref().unwrap();
    assert_eq!(owner_spec.holder_identity.as_deref(), Some("pod-a/1"));
    assert_eq!(owner_spec.lease_duration_seconds, Some(80));
    clock.advance(TTL / 2);
    for answer in leases.renew_many(&held).await {
        answer.unwrap();
    }
    let renewed = api.get(&owner_lease).await.unwrap();
    assert!(renew_time(&renewed).0 > renew_time(&first).0);
    // The session objects were not written by the renewal.
    let unchanged = api.get(&object_name(&all[1])).await.unwrap();
    assert_eq!(
        unchanged.metadata.resource_version,
        session_object.metadata.resource_version
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_object_deleted_while_held_is_lost_at_the_next_batch_renewal() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let leases = client(&cluster, &clock).await;
    let me = owner("pod-a/1");
    let all = sessions("deleted-session", 3);
    let held = acquire_all(&leases, &all, &me).await;
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    api.delete(&object_name(&all[2]), &DeleteParams::default())
        .await
        .unwrap();
    clock.advance(TTL / 2);
    let answers = leases.renew_many(&held).await;
    answers[0].as_ref().unwrap();
    answers[1].as_ref().unwrap();
    expect_held(&answers[2], "a deleted session object");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_owner_loses_a_session_deleted_or_given_to_another_holder() {
    let cluster = Cluster::emulated().await;
    let clock = ManualClock::new();
    let leases = watching_from(&cluster, &clock, 4).await;
    let me = owner("pod-a/1");
    let all = sessions("watched", 6);
    let mut held = acquire_all(&leases, &all, &me).await;
    let counts = cluster.emulator().requests();
    until_watched(&leases, &clock, &mut held, counts).await;
    // An operator deletes one session's object and gives another to a
    // different holder, leaving its owner-lease label: the watch shows
    // both, and only those two are lost.
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    api.delete(&object_name(&all[2]), &DeleteParams::default())
        .await
        .unwrap();
    let mut edited = api.get(&object_name(&all[4])).await.unwrap();
    edited.spec.as_mut().unwrap().holder_identity = Some("pod-z/1".to_owned());
    api.replace(&object_name(&all[4]), &Default::default(), &edited)
        .await
        .unwrap();
    counts.reset();
    clock.advance(TTL / 2);
    let answers = leases.renew_many(&held).await;
    for (i, answer) in answers.iter().enumerate() {
        match i {
            2 => expect_held(answer, "a deleted session object"),
            4 => expect_held(answer, "a session given to another holder"),
            _ => {
                answer.as_ref().expect("every other session stays held");
            }
        }
    }
    // Proven by the watch: no list was sent.
    let seen = counts.snapshot();
    assert_eq!(counts.get(Verb::List, "leases"), 0, "{seen:?}");
}
