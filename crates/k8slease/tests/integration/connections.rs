//! A process holding many sessions reaches its API server over a bounded
//! number of TCP connections, however many requests are in flight: the
//! emulator counts every connection it accepted and the most it held open
//! at once.
//!
//! The bound is on connections open at once. A connection that closes (a
//! request dropped mid-flight on a loaded machine closes its own) is
//! replaced by a new one, so the count of connections accepted over a run
//! may pass the bound; it must stay far below one per session, which is
//! what an unshared client opens.

use std::time::Duration;

use k8slease::{DEFAULT_MAX_CONNECTIONS, K8sLease, client_from_config};
use lease_port::{Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

/// Long enough that no request times out waiting its turn for a
/// connection on a loaded machine: a request dropped mid-flight closes its
/// connection, and the next one opened would be counted too.
const TTL: Duration = Duration::from_secs(60);

fn leases(client: &kube::Client, cluster: &Cluster, n: usize) -> Vec<K8sLease> {
    (0..n)
        .map(|_| {
            K8sLease::builder(client.clone(), &cluster.namespace)
                .ttl(TTL)
                .request_timeout(TTL / 3)
                .build()
                .unwrap()
        })
        .collect()
}

/// Acquires `sessions` sessions all at once, spread over `leases`, then
/// renews every one of them all at once; the calls that failed.
async fn hold_all_at_once(leases: &[K8sLease], sessions: usize) -> Vec<LeaseError> {
    let owner = OwnerId::new("pod-a").unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..sessions {
        let (leases, owner) = (leases[i % leases.len()].clone(), owner.clone());
        tasks.spawn(async move {
            let s = SessionId::new(format!("many-{i}")).unwrap();
            (i, leases.acquire(&s, &owner).await)
        });
    }
    let (mut held, mut failed) = (Vec::<(usize, Lease)>::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (i, Ok(lease)) => held.push((i, lease)),
            (_, Err(e)) => failed.push(e),
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, lease) in held {
        // Through the client that acquired it: its owner lease is that
        // client's.
        let leases = leases[i % leases.len()].clone();
        tasks.spawn(async move { leases.renew(&lease).await });
    }
    while let Some(done) = tasks.join_next().await {
        failed.extend(done.unwrap().err());
    }
    failed
}

/// Four lease clients of one process on clones of one kube client, as the
/// crate's kubeconfig helper builds it: a thousand concurrent acquires and
/// a thousand concurrent renewals open at most the default bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_sessions_at_once_share_the_default_bound() {
    let cluster = Cluster::emulated().await;
    let client = cluster.kube().await;
    let connections = cluster.emulator().connections();
    connections.reset();
    let failed = hold_all_at_once(&leases(&client, &cluster, 4), 1000).await;
    let (accepted, peak) = (connections.accepted(), connections.peak_open());
    let bound = DEFAULT_MAX_CONNECTIONS as u64;
    assert!(
        (1..=bound).contains(&peak),
        "{peak} connections open at once, bound {bound}"
    );
    assert!(
        accepted <= 2 * bound,
        "{accepted} connections accepted for 1,000 sessions: connections are not reused"
    );
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}",
        failed.len(),
        failed.first()
    );
}

/// A bound chosen by the caller holds too, and none at all is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chosen_bound_holds_and_zero_is_refused() {
    let cluster = Cluster::emulated().await;
    let config = || async {
        let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap()
    };
    match client_from_config(config().await, 0) {
        Err(e) => assert_eq!(e.kind(), LeaseErrorKind::Invalid),
        Ok(_) => panic!("a bound of zero connections was accepted"),
    }

    let client = client_from_config(config().await, 2).unwrap();
    let connections = cluster.emulator().connections();
    connections.reset();
    let failed = hold_all_at_once(&leases(&client, &cluster, 2), 250).await;
    let (accepted, peak) = (connections.accepted(), connections.peak_open());
    assert!(
        (1..=2).contains(&peak),
        "{peak} connections open at once, bound 2"
    );
    assert!(
        accepted <= 4,
        "{accepted} connections accepted for 250 sessions: connections are not reused"
    );
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}",
        failed.len(),
        failed.first()
    );
}

/// A burst of acquires fills every connection of the pool and queues far
/// past the request timeout; renewals of a session held meanwhile still
/// get through, since requests about sessions' objects take turns a few
/// at a time and leave connections for the owner lease's renewal and
/// list. (Before, the renewal queued behind the burst and timed out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewals_are_not_starved_by_a_burst_of_acquires() {
    let cluster = Cluster::emulated().await;
    let client = cluster.kube().await;
    let leases = K8sLease::builder(client, &cluster.namespace)
        .ttl(Duration::from_secs(15))
        .request_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let owner = OwnerId::new("pod-a").unwrap();
    let mut lease = leases
        .acquire(&SessionId::new("held").unwrap(), &owner)
        .await
        .unwrap();
    // Every request answered 20 ms late: a thousand acquires (two requests
    // each at least) over eight connections queue for seconds.
    cluster
        .emulator()
        .faults()
        .set_latency(Duration::from_millis(20));
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let (leases, owner) = (leases.clone(), owner.clone());
        burst.spawn(async move {
            let s = SessionId::new(format!("burst-{i}")).unwrap();
            leases.acquire(&s, &owner).await.map(drop)
        });
    }
    let mut renewals = 0;
    while !burst.is_empty() {
        lease = leases
            .renew(&lease)
            .await
            .unwrap_or_else(|e| panic!("renewal {renewals} during the burst: {e}"));
        renewals += 1;
        while burst.try_join_next().is_some() {}
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(renewals >= 2, "the burst ended after {renewals} renewals");
    cluster.emulator().faults().set_latency(Duration::ZERO);
    leases.release(&lease).await.unwrap();
}
