//! Real `mecated` processes sharing one store directory and leasing Lease
//! objects (`--session-lease-k8s-namespace`) from the Kubernetes API
//! emulator, served over real HTTPS in this test process and reached
//! through its kubeconfig.

#![cfg(feature = "k8s")]

use std::time::Duration;

use k8s_emulator::{Emulator, EmulatorConfig};
use k8slease::K8sLease;

use crate::support::*;

/// Whole seconds, as `leaseDurationSeconds` counts. Each API request gets
/// a quarter of it, which a loaded machine needs more of than 1 s allows.
const TTL_SECS: u64 = 3;
const TTL: &str = "3s";

const NAMESPACE: &str = "default";

struct Cluster {
    emulator: Emulator,
    kubeconfig: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let emulator = Emulator::start(EmulatorConfig::default())
            .await
            .expect("start the Kubernetes API emulator");
        let kubeconfig = emulator
            .kubeconfig_path()
            .to_str()
            .expect("a UTF-8 kubeconfig path")
            .to_owned();
        Cluster {
            emulator,
            kubeconfig,
        }
    }

    fn flags(&self) -> [&str; 4] {
        [
            "--session-lease-k8s-namespace",
            NAMESPACE,
            "--session-lease-k8s-kubeconfig",
            &self.kubeconfig,
        ]
    }

    /// A client of the same Lease objects as the servers, to ask the API
    /// server itself.
    async fn client(&self) -> K8sLease {
        let client = k8slease::client_from_kubeconfig(self.emulator.kubeconfig_path())
            .await
            .expect("a client from the emulator's kubeconfig");
        K8sLease::builder(client, NAMESPACE)
            .ttl(Duration::from_secs(TTL_SECS))
            .build()
            .expect("Kubernetes lease client")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_competitor_gets_409_naming_the_holder() {
    let cluster = Cluster::start().await;
    let direct = cluster.client().await;
    let backend = scenarios::Backend {
        flags: cluster.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-k8s-namespace",
        direct: &direct,
    };
    scenarios::competitor_gets_409_naming_the_holder(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let cluster = Cluster::start().await;
    let direct = cluster.client().await;
    let backend = scenarios::Backend {
        flags: cluster.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-k8s-namespace",
        direct: &direct,
    };
    scenarios::sigkill_mid_run_is_taken_over_with_a_higher_token(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_writes_are_refused() {
    let cluster = Cluster::start().await;
    let direct = cluster.client().await;
    let backend = scenarios::Backend {
        flags: cluster.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-k8s-namespace",
        direct: &direct,
    };
    scenarios::a_paused_holders_late_writes_are_refused(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_kubernetes() {
    let cluster = Cluster::start().await;
    let direct = cluster.client().await;
    let backend = scenarios::Backend {
        flags: cluster.flags().to_vec(),
        ttl: TTL,
        flag: "--session-lease-k8s-namespace",
        direct: &direct,
    };
    scenarios::a_store_fenced_by_another_authority_refuses_it(&backend).await;
}
