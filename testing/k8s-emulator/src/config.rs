//! Serves: both — every emulator starts from an `EmulatorConfig`.
//!
//! How an emulator is started.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
};

/// Settings for [`Emulator::start`](crate::Emulator::start).
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Where to listen; port 0 picks a free one. Default `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// The namespaces that exist; leases can be created only in these.
    /// Default `["default"]`. The first is the kubeconfig's namespace.
    pub namespaces: Vec<String>,
    /// The user the written kubeconfig authenticates as; it may do
    /// everything. Default `emulator-admin`.
    pub admin_user: String,
    /// That user's bearer token; a random one when `None`.
    pub admin_token: Option<String>,
    /// Where to write the kubeconfig; a private temporary directory, removed
    /// with the emulator, when `None`.
    pub kubeconfig_path: Option<PathBuf>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            namespaces: vec!["default".to_string()],
            admin_user: "emulator-admin".to_string(),
            admin_token: None,
            kubeconfig_path: None,
        }
    }
}

impl EmulatorConfig {
    /// Adds a namespace to the ones that exist.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespaces.push(namespace.into());
        self
    }

    /// Sets the listening address.
    pub fn listen(mut self, address: SocketAddr) -> Self {
        self.listen = address;
        self
    }

    /// Writes the kubeconfig at `path` instead of a temporary directory.
    pub fn kubeconfig_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig_path = Some(path.into());
        self
    }
}
