//! The lease contract, checked by the shared conformance suite against the
//! Kubernetes API emulator — or a real cluster when `MECATL_K8S_KUBECONFIG`
//! is set (`cargo xtask conformance --backend k8slease --kubeconfig PATH`).
//!
//! Time is real: the API server keeps no lease time, each client judges
//! expiry itself, so the suite sleeps past a one-second TTL.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8slease::{ExpiryJudgement, K8sLease};
use leaseconformance::RealTimeFactory;
use support::Cluster;

const TTL: Duration = Duration::from_secs(1);

/// Every client is a separate process: its own connection, its own memory
/// of what it saw. Judging expiry by the records' timestamps lets a client
/// take over a lease it never saw change, as the suite expects.
async fn independent_clients() -> RealTimeFactory<K8sLease> {
    let cluster = Cluster::start().await;
    RealTimeFactory::new_async(TTL, move || {
        let cluster = cluster.clone();
        async move { cluster.lease(TTL, ExpiryJudgement::RecordTime).await }
    })
    .restart_by_new_clients()
}

/// Skew-safe judgement needs a client to have seen a record unchanged for
/// a TTL, so the suite's clients are the clones of one process's
/// `K8sLease`; each restart starts a new process with nothing seen. An
/// owner watches its sessions once it holds `watch_from`.
async fn one_process(watch_from: usize) -> RealTimeFactory<K8sLease> {
    let cluster = Cluster::start().await;
    let process = move |cluster: Arc<Cluster>| async move {
        cluster
            .lease_watching_from(TTL, ExpiryJudgement::SkewSafe, watch_from)
            .await
    };
    let first = process(cluster.clone()).await;
    let current = Arc::new(Mutex::new(first));
    let shared = current.clone();
    RealTimeFactory::new(TTL, move || shared.lock().unwrap().clone()).restart_with(move || {
        let (cluster, current) = (cluster.clone(), current.clone());
        async move {
            let restarted = process(cluster).await;
            *current.lock().unwrap() = restarted;
        }
    })
}

leaseconformance::suite!(independent_clients());

mod skew_safe {
    leaseconformance::suite!(super::one_process(k8slease::DEFAULT_WATCH_FROM));
}

/// Every owner watches its sessions from the first: the proof after a
/// renewal comes from the watch wherever it keeps up.
mod watching {
    leaseconformance::suite!(super::one_process(1));
}
