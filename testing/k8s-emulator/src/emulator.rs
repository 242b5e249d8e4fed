//! Serves: both — the handle; `snapshot`, `restore`, `wipe` are for k8slease tests and fault runs.
//!
//! The running emulator and its handles.

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    config::EmulatorConfig,
    counters::{ConnectionCounters, RequestCounters},
    faults::Faults,
    kubeconfig,
    rbac::Rbac,
    server::{Shared, serve},
    store::{Store, StoreSnapshot},
    tls,
    validation::dns_subdomain_problems,
};

/// What went wrong starting or configuring an emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EmulatorErrorKind {
    /// The configuration is unusable (a bad namespace name, say).
    Config,
    /// The listening socket could not be bound.
    Bind,
    /// A kubeconfig or its directory could not be written.
    Kubeconfig,
    /// The TLS certificate or configuration could not be made.
    Tls,
}

/// An error from [`Emulator`], with its [`kind`](Self::kind) and the
/// underlying I/O error as its source when there is one.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct EmulatorError {
    kind: EmulatorErrorKind,
    message: String,
    #[source]
    source: Option<std::io::Error>,
}

impl EmulatorError {
    fn new(
        kind: EmulatorErrorKind,
        message: impl Into<String>,
        source: Option<std::io::Error>,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source,
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> EmulatorErrorKind {
        self.kind
    }
}

/// The Lease storage of an [`Emulator`] at one moment, taken by
/// [`Emulator::snapshot`] and put back by [`Emulator::restore`]: a fault
/// for tests of clients that must notice an API server whose storage went
/// back (restored from a backup, failed over to a lagging member).
///
/// ```
/// use k8s_emulator::{Emulator, EmulatorConfig};
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let emulator = Emulator::start(EmulatorConfig::default()).await?;
/// let url = format!("{}/apis/coordination.k8s.io/v1/namespaces/default/leases", emulator.url());
/// let client = reqwest::Client::new();
/// let create = |name: &'static str| {
///     client
///         .post(&url)
///         .bearer_auth(emulator.admin_token())
///         .json(&serde_json::json!({"metadata": {"name": name}}))
///         .send()
/// };
/// let before = emulator.snapshot();
/// assert_eq!(create("a").await.unwrap().status(), 201);
/// let after_a = emulator.revision();
///
/// emulator.restore(&before);
/// assert_eq!(emulator.revision(), before.revision());
/// // "a" is gone, and the next write reuses the version "a" had.
/// assert_eq!(create("b").await.unwrap().status(), 201);
/// assert_eq!(emulator.revision(), after_a);
///
/// emulator.wipe();
/// assert_eq!(emulator.revision(), 0);
/// # Ok::<(), k8s_emulator::EmulatorError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Snapshot {
    store: StoreSnapshot,
}

impl Snapshot {
    /// The revision counter when it was taken: the `resourceVersion` of the
    /// newest write it holds.
    pub fn revision(&self) -> u64 {
        self.store.revision
    }

    /// How many Lease objects it holds, in every namespace.
    pub fn lease_count(&self) -> usize {
        self.store.lease_count()
    }
}

/// A running emulator. Dropping it stops serving: open connections and
/// watches are closed, and a temporary kubeconfig is removed.
pub struct Emulator {
    shared: Arc<Shared>,
    url: String,
    https_url: String,
    ca_pem: String,
    admin_token: String,
    namespace: String,
    kubeconfig: PathBuf,
    http_kubeconfig: PathBuf,
    directory: tempfile::TempDir,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for Emulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Emulator")
            .field("url", &self.url)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl Emulator {
    /// Binds, starts serving on the current tokio runtime and writes the
    /// kubeconfig.
    pub async fn start(config: EmulatorConfig) -> Result<Self, EmulatorError> {
        check(&config)?;
        let listener = TcpListener::bind(config.listen).await.map_err(|e| {
            EmulatorError::new(
                EmulatorErrorKind::Bind,
                format!("cannot listen on {}", config.listen),
                Some(e),
            )
        })?;
        let address = listener.local_addr().map_err(|e| {
            EmulatorError::new(
                EmulatorErrorKind::Bind,
                "cannot read the bound address",
                Some(e),
            )
        })?;
        let directory = tempfile::Builder::new()
            .prefix("k8s-emulator-")
            .tempdir()
            .map_err(|e| {
                EmulatorError::new(
                    EmulatorErrorKind::Kubeconfig,
                    "cannot create a temporary directory",
                    Some(e),
                )
            })?;
        let admin_token = config
            .admin_token
            .clone()
            .unwrap_or_else(|| format!("emu-{}", uuid::Uuid::new_v4().simple()));
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            store: Store::new(&config.namespaces),
            rbac: Rbac::new(&config.admin_user, &admin_token),
            faults: Faults::default(),
            counters: RequestCounters::default(),
            connections: ConnectionCounters::default(),
            shutdown: shutdown.clone(),
            address,
        });
        // A wildcard listener is reached through loopback.
        let reachable = if address.ip().is_unspecified() {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), address.port())
        } else {
            address
        };
        let tls = tls::generate(reachable.ip())
            .map_err(|e| EmulatorError::new(EmulatorErrorKind::Tls, e.to_string(), None))?;
        let kubeconfig = config
            .kubeconfig_path
            .clone()
            .unwrap_or_else(|| directory.path().join("kubeconfig"));
        let mut emulator = Self {
            shared: shared.clone(),
            url: format!("http://{reachable}"),
            https_url: format!("https://{reachable}"),
            ca_pem: tls.ca_pem.clone(),
            admin_token: admin_token.clone(),
            namespace: config.namespaces[0].clone(),
            kubeconfig: kubeconfig.clone(),
            http_kubeconfig: directory.path().join("kubeconfig-http"),
            directory,
            task: None,
        };
        emulator.write_kubeconfig(&kubeconfig, &config.admin_user, &admin_token)?;
        let plain = kubeconfig::render(
            &emulator.url,
            None,
            &config.admin_user,
            &admin_token,
            &emulator.namespace,
        );
        kubeconfig::write(&emulator.http_kubeconfig, &plain).map_err(|e| {
            EmulatorError::new(
                EmulatorErrorKind::Kubeconfig,
                format!(
                    "cannot write kubeconfig {}",
                    emulator.http_kubeconfig.display()
                ),
                Some(e),
            )
        })?;
        emulator.task = Some(tokio::spawn(serve(listener, shared, tls.acceptor)));
        Ok(emulator)
    }

    /// The plain HTTP base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The same server over TLS, `https://127.0.0.1:PORT` (one port serves
    /// both); its certificate is signed by [`Self::ca_certificate_pem`].
    pub fn https_url(&self) -> &str {
        &self.https_url
    }

    /// The PEM certificate of the authority that signed the server's
    /// certificate (made fresh at start).
    pub fn ca_certificate_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.shared.address
    }

    /// The kubeconfig for the administrator: the HTTPS URL with the CA
    /// data, bearer token, current context `k8s-emulator`, namespace the
    /// first configured one. Use this one with kubectl: client-go sends
    /// tokens only over TLS.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The same kubeconfig with the plain HTTP URL, for clients built
    /// without TLS (kube-rs sends the token over HTTP too; client-go and
    /// kubectl do not, so they reach the server as `system:anonymous`).
    pub fn http_kubeconfig_path(&self) -> &Path {
        &self.http_kubeconfig
    }

    /// The administrator's bearer token, for raw HTTP requests.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Writes a kubeconfig at `path` that authenticates as `user` with
    /// `token` (make one with [`Rbac::add_user`]).
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        token: &str,
    ) -> Result<(), EmulatorError> {
        let text = kubeconfig::render(
            &self.https_url,
            Some(&self.ca_pem),
            user,
            token,
            &self.namespace,
        );
        kubeconfig::write(path, &text).map_err(|e| {
            EmulatorError::new(
                EmulatorErrorKind::Kubeconfig,
                format!("cannot write kubeconfig {}", path.display()),
                Some(e),
            )
        })
    }

    /// Creates `user` with a new token and writes a kubeconfig for it in
    /// the emulator's temporary directory. The user may do nothing until
    /// [`Rbac::allow`] grants it.
    pub fn kubeconfig_for(&self, user: &str) -> Result<PathBuf, EmulatorError> {
        let token = self.shared.rbac.add_user(user);
        let file: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = self
            .directory
            .path()
            .join(format!("kubeconfig-{file}-{}", &token[token.len() - 8..]));
        self.write_kubeconfig(&path, user, &token)?;
        Ok(path)
    }

    /// Request counts per verb and resource.
    pub fn requests(&self) -> &RequestCounters {
        &self.shared.counters
    }

    /// TCP connections accepted and open.
    pub fn connections(&self) -> &ConnectionCounters {
        &self.shared.connections
    }

    /// The fault injection handle.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Users, tokens and their permissions.
    pub fn rbac(&self) -> &Rbac {
        &self.shared.rbac
    }

    /// Makes `namespace` exist (idempotent).
    pub fn add_namespace(&self, namespace: &str) {
        self.shared.store.add_namespace(namespace);
    }

    /// The store's current revision: the resourceVersion of the newest
    /// write.
    pub fn revision(&self) -> u64 {
        self.shared.store.revision()
    }

    /// The Lease objects and the revision counter as they are now, to
    /// [`restore`](Self::restore) later: what a backup of an etcd that
    /// holds the Leases would capture.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            store: self.shared.store.snapshot(),
        }
    }

    /// Rewinds the Lease storage to `snapshot`, as restoring an etcd from a
    /// backup (or failing over to a member that lagged) would: every Lease
    /// is back as it was then — objects created since are gone, objects
    /// deleted since are back, each with its old `resourceVersion` and
    /// `uid` — and the revision counter restarts from the snapshot's, so
    /// the next write gets [`Snapshot::revision`]` + 1` and versions handed
    /// out after the snapshot are handed out again. A watch started later
    /// replays the snapshot's history, not the writes it undid.
    ///
    /// Takes effect at once, between two requests; requests in flight
    /// finish against one state or the other. Namespaces, faults, RBAC and
    /// request counters are untouched (an `--etcd-servers-overrides` etcd
    /// for `coordination.k8s.io/leases` holds only the Leases). Watches
    /// already open are not told: they stay connected and report the
    /// writes that follow. A snapshot is meant for the emulator it was
    /// taken from.
    pub fn restore(&self, snapshot: &Snapshot) {
        self.shared.store.restore(&snapshot.store);
    }

    /// Empties the Lease storage, as a Leases etcd wiped and started anew
    /// would be: no Lease objects, no history, and the revision counter
    /// back at zero, so the next write gets `resourceVersion` 1. The same
    /// limits as [`restore`](Self::restore) apply.
    pub fn wipe(&self) {
        self.shared.store.wipe();
    }

    /// Stops serving and waits until the listener is closed.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(task) = self.task.take() {
            // The serving task only ends by cancellation; its result says
            // nothing more.
            let _ = task.await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// Refuses a configuration no API server would run with.
fn check(config: &EmulatorConfig) -> Result<(), EmulatorError> {
    if config.namespaces.is_empty() {
        return Err(EmulatorError::new(
            EmulatorErrorKind::Config,
            "at least one namespace is needed",
            None,
        ));
    }
    for namespace in &config.namespaces {
        let bad = namespace.len() > 63
            || namespace.contains('.')
            || !dns_subdomain_problems(namespace).is_empty();
        if bad {
            return Err(EmulatorError::new(
                EmulatorErrorKind::Config,
                format!("namespace {namespace:?} is not a DNS label"),
                None,
            ));
        }
    }
    if config.admin_user.is_empty() {
        return Err(EmulatorError::new(
            EmulatorErrorKind::Config,
            "the admin user needs a name",
            None,
        ));
    }
    Ok(())
}
