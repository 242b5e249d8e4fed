//! The watch that proves an owner's sessions after each renewal in place
//! of a list (`Builder::watch_from`): storage that went back where no
//! watch event shows it, or behind an API server restart, and a Role that
//! does not grant `watch`.

use std::sync::Arc;
use std::time::Duration;

use k8s_emulator::Verb;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8slease::{ExpiryJudgement, K8sLease, object_name};
use kube::api::{Api, PostParams};
use lease_port::{Lease, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};
use test_services::{FaultProxy, ProxyMode};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(60);

fn builder(kube: kube::Client, cluster: &Cluster, clock: &ManualClock) -> k8slease::Builder {
    K8sLease::builder(kube, &cluster.namespace)
        .ttl(TTL)
        .expiry(ExpiryJudgement::SkewSafe)
        .clock(Arc::new(clock.clone()))
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

/// One renewal period later, every one of `held` renewed.
async fn period(c: &K8sLease, clock: &ManualClock, held: &mut [Lease]) {
    clock.advance(TTL / 3);
    let answers = c.renew_many(held).await;
    for (lease, answer) in held.iter_mut().zip(answers) {
        *lease = answer.expect("a held lease renews");
    }
}

/// The Lease storage goes back to a snapshot taken between an acquire's
/// owner-lease write and its session write, and other processes, which
/// never saw the lost versions, then write until the version counter is
/// past every version the holder saw. The holder's next renewal, based
/// on the owner-lease version the restore kept, succeeds, and no watch
/// event shows the lost grant: the watch still shows the session as held.
/// It must not be renewed on that, however the proof is taken.
async fn renewal_after_a_restore_the_watch_cannot_see(watch_from: usize) -> String {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let clock = ManualClock::new();
    let c = builder(cluster.kube().await, &cluster, &clock)
        .watch_from(watch_from)
        .build()
        .unwrap();
    let a = OwnerId::new("pod-a/1").unwrap();
    let mut held = vec![
        c.acquire(&sid("y0"), &a).await.unwrap(),
        c.acquire(&sid("y1"), &a).await.unwrap(),
    ];
    // x's object exists, free, and the client saw it.
    let x = c.acquire(&sid("x"), &a).await.unwrap();
    c.release(&x).await.unwrap();
    let counts = emulator.requests();
    for _ in 0..20 {
        counts.reset();
        period(&c, &clock, &mut held).await;
        if watch_from == usize::MAX || counts.get(Verb::List, "leases") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Acquire x slowly, and snapshot once the owner-lease write committed
    // and before the session's write is handled. A second on, so that
    // owner-lease write changes something.
    clock.advance(Duration::from_secs(1));
    emulator.faults().set_latency(Duration::from_millis(300));
    let before = emulator.revision();
    let acquiring = {
        let (c, a) = (c.clone(), a.clone());
        tokio::spawn(async move { c.acquire(&sid("x"), &a).await })
    };
    while emulator.revision() == before {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(emulator.revision(), before + 1, "only the owner lease yet");
    let snapshot = emulator.snapshot();
    let x = acquiring.await.unwrap().unwrap();
    emulator.faults().set_latency(Duration::ZERO);
    // Let the watch show x's grant.
    tokio::time::sleep(Duration::from_millis(300)).await;
    emulator.restore(&snapshot);
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    for i in 0..5 {
        let mut other = LeaseObject::default();
        other.metadata.name = Some(format!("unrelated-{i}"));
        api.create(&PostParams::default(), &other).await.unwrap();
    }
    let stored = api.get(&object_name(&sid("x"))).await.unwrap();
    assert_eq!(
        stored.spec.and_then(|s| s.holder_identity),
        None,
        "the restore undid x's grant"
    );
    clock.advance(TTL / 3);
    let mut all = held.clone();
    all.push(x);
    let answers = c.renew_many(&all).await;
    answers[0]
        .as_ref()
        .expect("y0 was granted before the snapshot");
    match &answers[2] {
        Ok(lease) => format!("renewed under token {}", lease.token()),
        Err(e) => format!("{:?}", e.kind()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_no_watch_event_shows_is_rewound_when_listing() {
    let answer = renewal_after_a_restore_the_watch_cannot_see(usize::MAX).await;
    assert_eq!(answer, format!("{:?}", LeaseErrorKind::Rewound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_no_watch_event_shows_is_rewound_when_watching() {
    let answer = renewal_after_a_restore_the_watch_cannot_see(1).await;
    assert_eq!(answer, format!("{:?}", LeaseErrorKind::Rewound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_watch_is_asked_once_and_renewals_list() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let user = "system:serviceaccount:default:mecatl";
    let kubeconfig = emulator.kubeconfig_for(user).unwrap();
    emulator.rbac().allow(
        user,
        &[Verb::Get, Verb::List, Verb::Create, Verb::Update],
        "leases",
    );
    let kube = k8slease::client_from_kubeconfig(&kubeconfig).await.unwrap();
    let clock = ManualClock::new();
    let c = builder(kube, &cluster, &clock)
        .watch_from(1)
        .build()
        .unwrap();
    let a = OwnerId::new("pod-a/1").unwrap();
    let mut held = vec![c.acquire(&sid("s0"), &a).await.unwrap()];
    let counts = emulator.requests();
    counts.reset();
    // Long enough for a watch retried after each refusal (from half a
    // second, doubling) to be sent three times or more.
    for _ in 0..6 {
        period(&c, &clock, &mut held).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let seen = counts.snapshot();
    assert_eq!(counts.get(Verb::Watch, "leases"), 1, "{seen:?}");
    assert_eq!(
        counts.get(Verb::List, "leases"),
        7,
        "six renewals and the watch's list: {seen:?}"
    );
}

/// The Lease storage goes back to a snapshot while the holder's watch has
/// seen versions past it; the API server restarts (the watch breaks and
/// cannot reconnect), the owner's next incarnation takes a session over
/// under versions the lost history had used, and other writers push the
/// counter past every version the watch saw. A watch resumed from its
/// last version would never be sent that takeover, and the holder's
/// renewal, based on an owner-lease version the restore kept, succeeds:
/// what the holder then answers for the session taken over.
async fn renewal_after_a_restart_across_a_restore(watch_from: usize) -> String {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    // An API server restarted, as an etcd restore requires: every
    // connection closed, new ones refused until it is back.
    let p = FaultProxy::start(emulator.address()).unwrap();
    let text = std::fs::read_to_string(emulator.http_kubeconfig_path()).unwrap();
    let text = text.replace(emulator.url(), &format!("http://{}", p.addr()));
    assert!(text.contains(&p.addr().to_string()));
    let path = std::env::temp_dir().join(format!("k8slease-proxied-{}.yaml", p.addr().port()));
    std::fs::write(&path, text).unwrap();
    let kube_a = k8slease::client_from_kubeconfig(&path).await.unwrap();
    let clock = ManualClock::new();
    let a = K8sLease::builder(kube_a, &cluster.namespace)
        .ttl(TTL)
        .expiry(ExpiryJudgement::SkewSafe)
        .clock(Arc::new(clock.clone()))
        .watch_from(watch_from)
        .build()
        .unwrap();
    let o = OwnerId::new("pod-a/1").unwrap();
    let mut held: Vec<Lease> = Vec::new();
    for s in ["y0", "y1", "y2"] {
        held.push(a.acquire(&sid(s), &o).await.unwrap());
    }
    let counts = emulator.requests();
    for _ in 0..20 {
        counts.reset();
        clock.advance(TTL / 3);
        let answers = a.renew_many(&held).await;
        for (l, r) in held.iter_mut().zip(answers) {
            *l = r.unwrap();
        }
        if watch_from == usize::MAX || counts.get(k8s_emulator::Verb::List, "leases") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let snapshot = emulator.snapshot();
    // Writes under the owner-lease label that only the watch sees (on a
    // real API server, a bookmark moves it likewise), then lost.
    let admin: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    for i in 0..3 {
        let mut y2 = admin.get(&object_name(&sid("y2"))).await.unwrap();
        y2.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("example.com/edit".into(), i.to_string());
        admin
            .replace(&object_name(&sid("y2")), &PostParams::default(), &y2)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_old = emulator.revision();
    // The watch breaks (API server restarted with the restored etcd) and
    // cannot come back until the counter has passed its revision.
    p.set_mode(ProxyMode::Drop);
    emulator.restore(&snapshot);
    // The same owner's next incarnation takes y0 over, on the storage as
    // restored.
    let b = K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(TTL)
        .expiry(ExpiryJudgement::SkewSafe)
        .build()
        .unwrap();
    let taken = b.acquire(&sid("y0"), &o).await.unwrap();
    assert!(
        emulator.revision() <= at_old,
        "{} {}",
        emulator.revision(),
        at_old
    );
    for i in 0..5 {
        let mut other = LeaseObject::default();
        other.metadata.name = Some(format!("unrelated-{i}"));
        admin.create(&PostParams::default(), &other).await.unwrap();
    }
    assert!(emulator.revision() > at_old);
    p.set_mode(ProxyMode::Pass);
    // Time for the watch to come back.
    tokio::time::sleep(Duration::from_secs(4)).await;
    counts.reset();
    clock.advance(TTL / 3);
    let answers = a.renew_many(&held).await;
    let lists = counts.get(k8s_emulator::Verb::List, "leases");
    match &answers[0] {
        Ok(l) => format!(
            "y0 renewed under token {} while the other incarnation holds token {} (lists {lists})",
            l.token(),
            taken.token()
        ),
        Err(e) => format!("{:?}", e.kind()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_across_a_restore_is_held_when_listing() {
    let answer = renewal_after_a_restart_across_a_restore(usize::MAX).await;
    assert_eq!(answer, "Held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_across_a_restore_is_held_when_watching() {
    let answer = renewal_after_a_restart_across_a_restore(1).await;
    assert_eq!(answer, "Held");
}
