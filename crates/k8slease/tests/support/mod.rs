//! Where the tests' Lease objects live: a k8s-emulator started per test,
//! or — when `MECATL_K8S_KUBECONFIG` names a kubeconfig — a real cluster
//! (namespace `MECATL_K8S_NAMESPACE`, default `default`).

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_emulator::{Emulator, EmulatorConfig};
use k8slease::{ExpiryJudgement, K8sLease};

pub const KUBECONFIG_ENV: &str = "MECATL_K8S_KUBECONFIG";
pub const NAMESPACE_ENV: &str = "MECATL_K8S_NAMESPACE";

/// One API server and the kubeconfig that reaches it.
pub struct Cluster {
    /// `None` on a real cluster.
    pub emulator: Option<Emulator>,
    pub kubeconfig: PathBuf,
    pub namespace: String,
}

impl Cluster {
    /// The real cluster named by the environment, else a new emulator.
    pub async fn start() -> Arc<Cluster> {
        match std::env::var_os(KUBECONFIG_ENV) {
            Some(path) => Arc::new(Cluster {
                emulator: None,
                kubeconfig: PathBuf::from(path),
                namespace: std::env::var(NAMESPACE_ENV).unwrap_or_else(|_| "default".into()),
            }),
            None => Self::emulated().await,
        }
    }

    /// Always an emulator (tests that inject faults or count requests).
    pub async fn emulated() -> Arc<Cluster> {
        let emulator = Emulator::start(EmulatorConfig::default())
            .await
            .expect("start the Kubernetes API emulator");
        Arc::new(Cluster {
            kubeconfig: emulator.kubeconfig_path().to_owned(),
            emulator: Some(emulator),
            namespace: "default".into(),
        })
    }

    pub fn emulator(&self) -> &Emulator {
        self.emulator
            .as_ref()
            .expect("this test needs the emulator")
    }

    /// A kube client of its own, as a separate process would have.
    pub async fn kube(&self) -> kube::Client {
        k8slease::client_from_kubeconfig(&self.kubeconfig)
            .await
            .expect("a client from the kubeconfig")
    }

    /// A lease client with its own connection and its own memory.
    pub async fn lease(&self, ttl: Duration, expiry: ExpiryJudgement) -> K8sLease {
        self.lease_watching_from(ttl, expiry, k8slease::DEFAULT_WATCH_FROM)
            .await
    }

    /// The same, whose owner watches its sessions once it holds `sessions`.
    pub async fn lease_watching_from(
        &self,
        ttl: Duration,
        expiry: ExpiryJudgement,
        sessions: usize,
    ) -> K8sLease {
        K8sLease::builder(self.kube().await, &self.namespace)
            .ttl(ttl)
            .request_timeout(ttl / 3)
            .expiry(expiry)
            .watch_from(sessions)
            .build()
            .expect("valid settings")
    }
}
