//! Kubernetes Lease objects: the replicas of one deployment.

use std::path::PathBuf;
#[cfg(feature = "k8s")]
use std::time::Duration;

#[cfg(feature = "k8s")]
use crate::error::{OpenError, OpenErrorKind};

/// Which namespace, and how to reach its API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sLeases {
    /// The namespace the Lease objects live in.
    pub namespace: String,
    /// A kubeconfig; `None` infers the configuration (the pod's service
    /// account inside a cluster, else `$KUBECONFIG` or `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
}

impl K8sLeases {
    /// `Kubernetes leases in namespace NS`, for messages.
    pub fn describe(&self) -> String {
        format!("Kubernetes leases in namespace {}", self.namespace)
    }

    /// The backend, granting `ttl`: the client configuration is loaded
    /// now (a kubeconfig that cannot be read fails here).
    #[cfg(feature = "k8s")]
    pub async fn open(&self, ttl: Duration) -> Result<k8slease::K8sLease, OpenError> {
        let backend = |e| OpenError::new(OpenErrorKind::Backend, self.describe(), e);
        let client = match &self.kubeconfig {
            Some(path) => k8slease::client_from_kubeconfig(path)
                .await
                .map_err(|e| OpenError::new(OpenErrorKind::File, self.describe(), e).at(path))?,
            None => k8slease::client_infer().await.map_err(backend)?,
        };
        k8slease::K8sLease::builder(client, self.namespace.clone())
            .ttl(ttl)
            .build()
            .map_err(backend)
    }
}
