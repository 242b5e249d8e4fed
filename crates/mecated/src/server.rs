//! Start-up, the single-process proof, and graceful shutdown.

use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flocklease::{FlockLease, OwnerLock};
use lease_keeper::LeaseKeeper;
use lease_port::{Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use nix::fcntl::{Flock, FlockArg};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::agent::{Agent, EchoAgent};
use crate::app::{App, Exclusivity};
use crate::config::{LeaseChoice, STORE_LEASE_SUBDIR};
use crate::metrics::Metrics;

/// File in the store directory whose exclusive lock proves, for an unleased
/// deployment, that this process is the only one serving the store.
pub const SINGLE_PROCESS_LOCK: &str = ".mecated.lock";

/// Everything the server needs, independent of how it was given.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The JSONL store directory.
    pub store_dir: PathBuf,
    /// Where leases come from.
    pub lease: LeaseChoice,
    /// Lease TTL.
    pub lease_ttl: Duration,
    /// This process's owner identity.
    pub owner: OwnerId,
    /// The agent driving runs.
    pub agent: Arc<dyn Agent>,
    /// Whether appends are synced before being acknowledged.
    pub fsync: bool,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Bound on graceful shutdown.
    pub shutdown_timeout: Duration,
}

impl ServerConfig {
    /// Defaults for a store directory: loopback on a free port, file leases
    /// under `<dir>/.session-leases`, 15 s TTL, the echo agent.
    pub fn for_store(dir: impl Into<PathBuf>) -> Self {
        let store_dir = dir.into();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease: LeaseChoice::Dir(store_dir.join(STORE_LEASE_SUBDIR)),
            store_dir,
            lease_ttl: Duration::from_secs(15),
            owner: default_owner(),
            agent: Arc::new(EchoAgent::default()),
            fsync: true,
            max_body_bytes: 1 << 20,
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened.
    #[error("cannot open the session store in {dir}")]
    Store {
        /// The store directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: session_store::StoreError,
    },
    /// The lease backend could not be opened.
    #[error("cannot open file leases in {dir}")]
    Lease {
        /// The lease directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: LeaseError,
    },
    /// The lease keeper rejected its configuration.
    #[error("invalid lease configuration")]
    Keeper(#[source] lease_keeper::KeeperError),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another process on this host already leases under this owner id.
    #[error("owner id {owner} is already in use by another process on this host")]
    OwnerInUse {
        /// The owner id.
        owner: OwnerId,
    },
    /// A lock file could not be opened.
    #[error("cannot open {path}")]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// `host/pid/random`: unique per process, readable in lease listings.
pub fn default_owner() -> OwnerId {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    let suffix =
        std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id());
    let owner = format!("{host}/{}/{:06x}", std::process::id(), suffix & 0xff_ffff);
    OwnerId::new(&owner)
        .or_else(|_| {
            OwnerId::new(format!(
                "mecated/{}/{:06x}",
                std::process::id(),
                suffix & 0xff_ffff
            ))
        })
        .expect("a generated owner id is valid")
}

/// The lease backend of an unleased deployment: answers `Unsupported`, so
/// the keeper stops consulting it after the first call and runs unleased.
#[derive(Debug)]
struct NoLeases;

#[async_trait]
impl SessionLease for NoLeases {
    async fn acquire(&self, _: &SessionId, _: &OwnerId) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported(
            "this deployment runs without session leases",
        ))
    }
    async fn renew(&self, _: &Lease) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported(
            "this deployment runs without session leases",
        ))
    }
    async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
        Ok(())
    }
}

/// Tries to take the store's single-process lock; the lock lives as long as
/// the returned value.
fn single_process_lock(store_dir: &Path) -> Result<Option<Flock<File>>, StartError> {
    exclusive_lock(store_dir.join(SINGLE_PROCESS_LOCK))
}

/// Takes the owner id's lock in the lease directory for the life of the
/// process ([`FlockLease::lock_owner`]), so two processes on this host never
/// lease under one owner id: the backend would treat the second as the live
/// holder re-acquiring, and both would run the session under one token. The
/// lock is found through the opened directory, so any spelling of its path
/// meets the same lock.
fn owner_lock(leases: &FlockLease, owner: &OwnerId) -> Result<OwnerLock, StartError> {
    leases.lock_owner(owner).map_err(|source| {
        if source.kind() == LeaseErrorKind::Held {
            StartError::OwnerInUse {
                owner: owner.clone(),
            }
        } else {
            StartError::Lease {
                dir: leases.dir().to_path_buf(),
                source,
            }
        }
    })
}

/// A lock held for the server's life.
#[derive(Debug)]
enum ProcessLock {
    /// The store's single-process lock (unleased).
    Single(#[allow(dead_code)] Flock<File>),
    /// This process's owner id on the lease directory (file leases).
    Owner(#[allow(dead_code)] OwnerLock),
}

fn exclusive_lock(path: PathBuf) -> Result<Option<Flock<File>>, StartError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| StartError::LockFile { path, source })?;
    Ok(Flock::lock(file, FlockArg::LockExclusiveNonblock).ok())
}

/// A running server.
pub struct Server {
    app: App,
    addr: SocketAddr,
    serve: JoinHandle<std::io::Result<()>>,
    shutdown_timeout: Duration,
    /// The single-process lock (unleased) or the owner lock (file leases),
    /// held for the server's life.
    _process_lock: Option<ProcessLock>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Opens the store and the lease backend, binds, and starts serving.
    pub async fn start(config: ServerConfig) -> Result<Self, StartError> {
        let unleased = config.lease == LeaseChoice::Unleased;
        let fsync = if config.fsync {
            FsyncPolicy::Always
        } else {
            FsyncPolicy::Never
        };
        let store = JsonlStore::open(
            &config.store_dir,
            JsonlOptions::default()
                .fsync(fsync)
                .allow_unfenced(unleased),
        )
        .map_err(|source| StartError::Store {
            dir: config.store_dir.clone(),
            source,
        })?;
        let store: Arc<dyn SessionStore> = Arc::new(store);

        let (backend, exclusivity, lock): (Arc<dyn SessionLease>, _, _) =
            match (store.session_lease(), &config.lease) {
                (Some(own), _) => (own, Exclusivity::Leased, None),
                (None, LeaseChoice::Dir(dir)) => {
                    let leases = FlockLease::open(dir, config.lease_ttl).map_err(|source| {
                        StartError::Lease {
                            dir: dir.clone(),
                            source,
                        }
                    })?;
                    if leases.is_volatile() {
                        warn!(
                            dir = %dir.display(),
                            "the session lease directory is on tmpfs or ramfs: a reboot \
                             empties it and restarts every session's fencing tokens below \
                             the store's marks, so sessions are refused after a reboot; \
                             put it on a disk"
                        );
                    }
                    let owner = owner_lock(&leases, &config.owner)?;
                    (
                        Arc::new(leases),
                        Exclusivity::Leased,
                        Some(ProcessLock::Owner(owner)),
                    )
                }
                (None, LeaseChoice::Unleased) => {
                    let lock = single_process_lock(&config.store_dir)?;
                    let proof = if lock.is_some() {
                        Exclusivity::ProvenSingleProcess
                    } else {
                        warn!(
                            "another unleased process holds the store's single-process lock: \
                         this one serves reads only"
                        );
                        Exclusivity::Unproven
                    };
                    (Arc::new(NoLeases), proof, lock.map(ProcessLock::Single))
                }
            };
        let metrics = Arc::new(Metrics::default());
        // Runs finish within the first half of the shutdown budget (they are
        // cancelled at once); releases get the second half.
        let keeper = LeaseKeeper::builder(backend, config.owner.clone(), config.lease_ttl)
            .metrics(metrics.clone())
            .shutdown_timeout(config.shutdown_timeout / 2)
            .build()
            .map_err(StartError::Keeper)?;
        let app = App::new(store, keeper, config.agent.clone(), metrics, exclusivity);

        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;
        let router = crate::http::router(app.clone(), config.max_body_bytes);
        let stop = app.shutdown_signal();
        let serve = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        });
        info!(%addr, owner = %config.owner, lease = ?config.lease, "mecated serving");
        Ok(Self {
            app,
            addr,
            serve,
            shutdown_timeout: config.shutdown_timeout,
            _process_lock: lock,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Graceful shutdown: stop accepting, cancel runs, release every lease,
    /// all within the configured bound. True when everything finished in
    /// time.
    pub async fn shutdown(self) -> bool {
        let start = tokio::time::Instant::now();
        let clean = self.app.shutdown(start + self.shutdown_timeout / 2).await;
        // Responses of the cancelled runs are already on their way; the
        // listener closes once they are written, within what is left.
        let served = tokio::time::timeout_at(start + self.shutdown_timeout, self.serve).await;
        clean && matches!(served, Ok(Ok(Ok(()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One lease directory spelled two ways (a trailing slash, a symlinked
    /// parent) is one directory: a second process under the same owner id
    /// must be refused whichever spelling it was given.
    #[test]
    fn the_owner_lock_follows_the_directory_not_its_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("leases");
        std::fs::create_dir(&dir).unwrap();
        let link = tmp.path().join("parent-link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        let owner = OwnerId::new("host/one").unwrap();
        let open = |d: &Path| FlockLease::open(d, Duration::from_secs(15)).unwrap();
        let _held = owner_lock(&open(&dir), &owner).unwrap();
        let mut slash = dir.clone().into_os_string();
        slash.push("/");
        for other in [PathBuf::from(slash), link.join("leases")] {
            let second = owner_lock(&open(&other), &owner);
            assert!(
                matches!(second, Err(StartError::OwnerInUse { .. })),
                "{} got its own owner lock: {second:?}",
                other.display()
            );
        }
    }
}
