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
    counters::RequestCounters,
    faults::Faults,
    kubeconfig,
    rbac::Rbac,
    server::{Shared, serve},
    store::Store,
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

/// A running emulator. Dropping it stops serving: open connections and
/// watches are closed, and a temporary kubeconfig is removed.
pub struct Emulator {
    shared: Arc<Shared>,
    url: String,
    admin_token: String,
    namespace: String,
    kubeconfig: PathBuf,
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
            shutdown: shutdown.clone(),
            address,
        });
        let url = format!("http://{address}");
        let kubeconfig = config
            .kubeconfig_path
            .clone()
            .unwrap_or_else(|| directory.path().join("kubeconfig"));
        let mut emulator = Self {
            shared: shared.clone(),
            url,
            admin_token: admin_token.clone(),
            namespace: config.namespaces[0].clone(),
            kubeconfig: kubeconfig.clone(),
            directory,
            task: None,
        };
        emulator.write_kubeconfig(&kubeconfig, &config.admin_user, &admin_token)?;
        emulator.task = Some(tokio::spawn(serve(listener, shared)));
        Ok(emulator)
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.shared.address
    }

    /// The kubeconfig for the administrator (current context
    /// `k8s-emulator`, namespace the first configured one).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
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
        let text = kubeconfig::render(&self.url, user, token, &self.namespace);
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
