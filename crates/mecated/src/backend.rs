//! The one place a server's flags become its store and its lease backend.
//!
//! Everything else in the server sees an `Arc<dyn SessionStore>` and an
//! `Arc<dyn SessionLease>`. A new backend is wired here and nowhere else:
//!
//! 1. a variant of [`LeaseChoice`] (or [`StoreChoice`]), behind the cargo
//!    feature of the crate it pulls in when that crate is a network client,
//!    so a build can leave out what it does not deploy;
//! 2. its flags → variant in [`LeaseChoice::from_args`], where contradictory
//!    flags are refused;
//! 3. its opening in this module's `open`, the function the server calls
//!    (through the `open` of its `lease-backends` configuration).
//!
//! The settings of a network backend and its opening from them are
//! `lease-backends`' (shared with `mecatl-leased`, so both read one flag,
//! one password file, one TLS file alike); what is `mecated`'s own stays
//! here: which flag selects what, and what the store and the keeper demand
//! of the backend once open.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flocklease::{Durability, FlockLease, LeaseFileError, OwnerLock};
use lease_backends::OpenError;
use lease_port::{
    AuthorityId, Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease, SystemClock,
};
use nix::fcntl::{Flock, FlockArg};
use session_store::{
    DEFAULT_LEASE_DIR_NAME, FsyncPolicy, GenerationCheck, JsonlOptions, JsonlStore, SessionStore,
    StoreError, StoreErrorKind,
};
use tracing::{info, warn};

use crate::config::{FsyncChoice, ServeArgs};
use crate::engine::Exclusivity;
use crate::server::StartError;

/// File in the store directory whose exclusive lock proves, for an unleased
/// deployment, that this process is the only one serving the store.
pub const SINGLE_PROCESS_LOCK: &str = ".mecated.lock";

/// Where sessions are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// The JSONL directory store.
    Jsonl {
        /// The store directory.
        dir: PathBuf,
        /// Whether appends are synced before being acknowledged.
        fsync: bool,
    },
    /// The Redis store: sessions on a Redis server, shared by processes on
    /// any host.
    #[cfg(feature = "redis")]
    Redis {
        /// `redis://` or `rediss://` URL, credentials included.
        url: String,
        /// Key prefix shared by the servers.
        prefix: String,
    },
    /// The PostgreSQL store: sessions in tables of one database, shared by
    /// processes on any host.
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

/// Which PostgreSQL tables hold the sessions, for [`StoreChoice::Postgres`].
#[cfg(feature = "postgres")]
pub use lease_backends::PostgresStore;

impl StoreChoice {
    /// The JSONL store in `dir`, syncing every append.
    pub fn jsonl(dir: impl Into<PathBuf>) -> Self {
        StoreChoice::Jsonl {
            dir: dir.into(),
            fsync: true,
        }
    }

    /// The store these flags select, or why this build cannot serve it.
    pub fn from_args(args: &ServeArgs) -> Result<Self, String> {
        if let Some(url) = &args.store_redis {
            #[cfg(feature = "redis")]
            return Ok(StoreChoice::Redis {
                url: url.clone(),
                prefix: args.store_redis_prefix.clone(),
            });
            // Never the directory store instead: sessions a deployment
            // keeps in Redis would seem to vanish.
            #[cfg(not(feature = "redis"))]
            {
                let _ = url;
                return Err("--store-redis needs mecated built with the `redis` feature".into());
            }
        }
        if let Some(url) = &args.store_postgres {
            #[cfg(feature = "postgres")]
            return Ok(StoreChoice::Postgres(PostgresStore {
                url: url.clone(),
                password_file: args.store_postgres_password_file.clone(),
                table_prefix: args.store_postgres_table_prefix.clone(),
            }));
            #[cfg(not(feature = "postgres"))]
            {
                let _ = url;
                return Err(
                    "--store-postgres needs mecated built with the `postgres` feature".into(),
                );
            }
        }
        Ok(StoreChoice::Jsonl {
            dir: args.store_dir.clone(),
            fsync: args.store_fsync == FsyncChoice::Always,
        })
    }

    /// How durable file leases used with this store need to be: as durable
    /// as the store's own writes. A store that syncs nothing gains nothing
    /// from synced lease files; unsynced ones still never repeat a token,
    /// as each boot's tokens lie above the last boot's (see flocklease's
    /// "Unsynced lease files").
    pub fn lease_durability(&self) -> Durability {
        match self {
            StoreChoice::Jsonl { fsync: false, .. } => Durability::Unsynced,
            _ => Durability::Synced,
        }
    }

    /// The lease backend a store brings when no lease flag is given: file
    /// leases beside a local JSONL store; a store on a server leases its
    /// sessions itself (PostgreSQL's through pglease in its own database).
    pub fn default_leases(&self) -> LeaseChoice {
        match self {
            StoreChoice::Jsonl { dir, .. } => LeaseChoice::Dir(dir.join(DEFAULT_LEASE_DIR_NAME)),
            #[cfg(feature = "redis")]
            StoreChoice::Redis { .. } => LeaseChoice::Store,
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(_) => LeaseChoice::Store,
        }
    }
}

/// Where leases come from. Each lease backend is one variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseChoice {
    /// File leases in this directory: processes on one host.
    Dir(PathBuf),
    /// No lease backend: runs are unleased, and writes need the
    /// single-process proof.
    Unleased,
    /// The store's own leases (a Redis store leases its sessions itself; a
    /// PostgreSQL store through pglease in its database).
    Store,
    /// A remote lease service over gRPC: processes on several hosts.
    #[cfg(feature = "grpc")]
    Service(LeaseService),
    /// etcd v3: processes on several hosts that reach one etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(EtcdLeases),
    /// Tables in one PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres(PostgresLeases),
    /// Kubernetes Lease objects in one namespace.
    #[cfg(feature = "k8s")]
    K8s(K8sLeases),
    /// A backend the embedding program built itself (a test double, a
    /// backend this module does not wire): runs are leased through it and
    /// every write is fenced, exactly as with file leases. No flag selects
    /// it.
    Backend(LeaseBackend),
}

/// How to reach a remote lease service, for [`LeaseChoice::Service`].
#[cfg(feature = "grpc")]
pub use lease_backends::LeaseService;

/// How to reach etcd, for [`LeaseChoice::Etcd`].
#[cfg(feature = "etcd")]
pub use lease_backends::EtcdLeases;
/// Which PostgreSQL tables, for [`LeaseChoice::Postgres`].
#[cfg(feature = "postgres")]
pub use lease_backends::PostgresLeases;

/// Which namespace, for [`LeaseChoice::K8s`].
#[cfg(feature = "k8s")]
pub use lease_backends::K8sLeases;

/// The lease service `--session-lease-url` and its companions name, when a
/// URL is given.
#[cfg(feature = "grpc")]
fn service_from_args(args: &ServeArgs) -> Option<LeaseService> {
    Some(LeaseService {
        address: args.session_lease_url.clone()?,
        token_file: args.session_lease_token_file.clone(),
        ca: args.session_lease_ca.clone(),
        identity: args
            .session_lease_cert
            .clone()
            .zip(args.session_lease_key.clone()),
        tls_domain: args.session_lease_tls_domain.clone(),
        plaintext_token: args.session_lease_plaintext_token,
    })
}

/// A lease backend handed to the server in-process, for
/// [`LeaseChoice::Backend`]. Two are equal when they share one backend.
#[derive(Clone)]
pub struct LeaseBackend(pub Arc<dyn SessionLease>);

impl std::fmt::Debug for LeaseBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseBackend(..)")
    }
}

impl PartialEq for LeaseBackend {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LeaseBackend {}

impl LeaseChoice {
    /// The lease backend these flags select, or why they contradict each
    /// other.
    pub fn from_args(args: &ServeArgs) -> Result<Self, String> {
        #[cfg(feature = "grpc")]
        if let Some(service) = service_from_args(args) {
            // clap refuses the other lease flags beside the URL.
            return Ok(LeaseChoice::Service(service));
        }
        #[cfg(not(feature = "grpc"))]
        if args.session_lease_url.is_some() {
            return Err("--session-lease-url needs mecated built with the `grpc` feature".into());
        }
        if !args.session_lease_etcd.is_empty() {
            #[cfg(feature = "etcd")]
            return Ok(LeaseChoice::Etcd(
                args.etcd.leases(args.session_lease_etcd.clone()),
            ));
            #[cfg(not(feature = "etcd"))]
            return Err("--session-lease-etcd needs mecated built with the `etcd` feature".into());
        }
        if let Some(url) = &args.session_lease_postgres {
            #[cfg(feature = "postgres")]
            return Ok(LeaseChoice::Postgres(args.postgres.leases(url.clone())));
            #[cfg(not(feature = "postgres"))]
            {
                let _ = url;
                return Err(
                    "--session-lease-postgres needs mecated built with the `postgres` feature"
                        .into(),
                );
            }
        }
        if let Some(namespace) = &args.session_lease_k8s_namespace {
            #[cfg(feature = "k8s")]
            return Ok(LeaseChoice::K8s(args.k8s.leases(namespace.clone())));
            #[cfg(not(feature = "k8s"))]
            return Err(format!(
                "--session-lease-k8s-namespace {namespace} needs mecated built with the `k8s` feature"
            ));
        }
        match (&args.session_lease_dir, args.no_session_lease) {
            (Some(_), true) => {
                Err("--session-lease-dir and --no-session-lease contradict each other".into())
            }
            (Some(dir), false) => Ok(LeaseChoice::Dir(dir.clone())),
            (None, true) => Ok(LeaseChoice::Unleased),
            (None, false) => Ok(StoreChoice::from_args(args)?.default_leases()),
        }
    }
}

impl LeaseChoice {
    /// The flag that selects this backend, for messages that say what to
    /// fix.
    pub fn flag(&self) -> &'static str {
        match self {
            LeaseChoice::Dir(_) => "--session-lease-dir",
            LeaseChoice::Unleased => "--no-session-lease",
            LeaseChoice::Store => "the store's own leases",
            #[cfg(feature = "grpc")]
            LeaseChoice::Service(_) => "--session-lease-url",
            #[cfg(feature = "etcd")]
            LeaseChoice::Etcd(_) => "--session-lease-etcd",
            #[cfg(feature = "k8s")]
            LeaseChoice::K8s(_) => "--session-lease-k8s-namespace",
            #[cfg(feature = "postgres")]
            LeaseChoice::Postgres(_) => "--session-lease-postgres",
            LeaseChoice::Backend(_) => "the in-process lease backend",
        }
    }
}

/// A store and a lease backend, opened and checked against each other.
pub(crate) struct Opened {
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) leases: Arc<dyn SessionLease>,
    /// The directory of file leases, whose records tell who holds what.
    pub(crate) lease_dir: Option<PathBuf>,
    pub(crate) exclusivity: Exclusivity,
    /// Locks held for the server's life: the store's single-process lock
    /// (exclusive when unleased, shared when leased) and the owner lock
    /// (file leases).
    pub(crate) process_locks: Vec<ProcessLock>,
    /// The directory store, whose generation the server advances while it
    /// runs and at shutdown (see [`session_store::GenerationCheck`]).
    pub(crate) generations: Option<Arc<JsonlStore>>,
    /// The owner id to lease under: the one asked for, or, when a lease
    /// service's identity for this process does not admit it, that id
    /// under the identity's own prefix.
    pub(crate) owner: OwnerId,
}

/// A lock held for the server's life; released when dropped.
#[derive(Debug)]
pub enum ProcessLock {
    /// The store's single-process lock: exclusive for the one unleased
    /// server, shared by leased servers, so the two never serve one store.
    Store(Flock<File>),
    /// This process's owner id on the lease directory (file leases).
    Owner(OwnerLock),
}

/// Opens `store` and `lease` for `owner`. A lease directory on tmpfs or
/// ramfs is refused unless `allow_volatile_lease_dir`.
pub(crate) async fn open(
    store: &StoreChoice,
    lease: &LeaseChoice,
    ttl: Duration,
    owner: &OwnerId,
    allow_volatile_lease_dir: bool,
) -> Result<Opened, StartError> {
    let unleased = *lease == LeaseChoice::Unleased;
    let files = FileLeases {
        allow_volatile: allow_volatile_lease_dir,
        durability: store.lease_durability(),
    };
    let OpenedStore {
        store,
        dir: store_dir,
        generations,
        leases: checked,
        name,
    } = open_store(store, lease, ttl).await?;
    let store_name = || name.clone();
    // Only a directory store can prove, by a lock, that one process serves
    // it; a store on a server has no such proof and is always leased.
    let lock_path = store_dir.as_ref().map(|d| d.join(SINGLE_PROCESS_LOCK));
    if unleased {
        // Unfenced writes are accepted only on sessions no lease ever
        // fenced; a store bound to an authority is served leased or not at
        // all.
        if let Some(authority) =
            store
                .recorded_authority()
                .await
                .map_err(|source| StartError::Store {
                    store: store_name(),
                    source,
                })?
        {
            return Err(StartError::UnleasedOnFencedStore { authority });
        }
    }
    let mut process_locks = Vec::new();
    if let (false, Some(lock_path)) = (unleased, &lock_path) {
        // Shared with every other leased server; an unleased server holds
        // it exclusively, and the two must never serve one store.
        match flock_file(lock_path.clone(), FlockArg::LockSharedNonblock)? {
            Some(lock) => process_locks.push(ProcessLock::Store(lock)),
            None => {
                return Err(StartError::UnleasedServerPresent {
                    lock: lock_path.clone(),
                });
            }
        }
    }

    // A store that leases its own sessions wins over any lease flag; so do
    // leases opened with the store, whose appends check them.
    let own = checked.or_else(|| store.session_lease());
    let (configured_by, lease_dir) = match (&own, lease) {
        (Some(_), _) => (lease.flag(), None),
        (None, LeaseChoice::Dir(dir)) => (lease.flag(), Some(dir.clone())),
        (None, _) => (lease.flag(), None),
    };
    let mut owner = owner.clone();
    let (leases, exclusivity) = match own {
        Some(own) => (own, Exclusivity::Leased),
        None => {
            let locks = &mut process_locks;
            open_leases(lease, ttl, &mut owner, files, lock_path, locks).await?
        }
    };
    // Every leased server, whatever its backend: the store must be fenced
    // by that backend's authority alone.
    if exclusivity == Exclusivity::Leased {
        bind_authority(&*store, &*leases, configured_by).await?;
    }
    Ok(Opened {
        store,
        leases,
        lease_dir,
        exclusivity,
        process_locks,
        generations,
        owner,
    })
}

/// How file leases are opened, when they are.
#[derive(Debug, Clone, Copy)]
struct FileLeases {
    /// Accept a lease directory on tmpfs or ramfs.
    allow_volatile: bool,
    durability: Durability,
}

/// The lease backend `lease` selects, and how exclusive the server's hold
/// on the store is with it; the locks it takes for the server's life go to
/// `process_locks`. `lock_path` is the store's single-process lock, for a
/// store that has one.
async fn open_leases(
    lease: &LeaseChoice,
    ttl: Duration,
    owner: &mut OwnerId,
    files: FileLeases,
    lock_path: Option<PathBuf>,
    process_locks: &mut Vec<ProcessLock>,
) -> Result<(Arc<dyn SessionLease>, Exclusivity), StartError> {
    let leased = |leases: Arc<dyn SessionLease>| Ok((leases, Exclusivity::Leased));
    match lease {
        LeaseChoice::Dir(dir) => {
            let leases = open_dir(dir, ttl, files)?;
            process_locks.push(ProcessLock::Owner(owner_lock(&leases, &*owner)?));
            leased(Arc::new(leases))
        }
        #[cfg(feature = "grpc")]
        LeaseChoice::Service(service) => leased(Arc::new(open_service(service, ttl, owner).await?)),
        #[cfg(feature = "etcd")]
        LeaseChoice::Etcd(etcd) => leased(Arc::new(etcd.open(ttl).map_err(not_opened)?)),
        #[cfg(feature = "k8s")]
        LeaseChoice::K8s(k8s) => leased(Arc::new(k8s.open(ttl).await.map_err(not_opened)?)),
        #[cfg(feature = "postgres")]
        LeaseChoice::Postgres(pg) => leased(Arc::new(pg.open(ttl).await.map_err(not_opened)?)),
        LeaseChoice::Store => Err(StartError::Lease {
            backend: "the store's own leases".into(),
            source: LeaseError::invalid("this store does not lease sessions itself"),
        }),
        LeaseChoice::Backend(LeaseBackend(leases)) => leased(Arc::clone(leases)),
        LeaseChoice::Unleased => {
            let Some(lock_path) = lock_path else {
                return Err(StartError::Lease {
                    backend: "--no-session-lease".into(),
                    source: LeaseError::invalid(
                        "a store on a server cannot prove one process serves it: run it leased",
                    ),
                });
            };
            let lock = flock_file(lock_path, FlockArg::LockExclusiveNonblock)?;
            let proof = if lock.is_some() {
                Exclusivity::ProvenSingleProcess
            } else {
                warn!(
                    "another server holds the store's single-process lock (an unleased \
                     one exclusively, or leased ones): this one serves reads only"
                );
                Exclusivity::Unproven
            };
            process_locks.extend(lock.map(ProcessLock::Store));
            Ok((Arc::new(Unleased), proof))
        }
    }
}

/// A backend that could not be opened, as the server reports it.
fn not_opened(e: OpenError) -> StartError {
    StartError::Lease {
        backend: e.backend().to_owned(),
        source: e.into(),
    }
}

/// File leases in `dir`, on the system clock; on tmpfs or ramfs only when
/// allowed, and then with a warning.
fn open_dir(dir: &Path, ttl: Duration, files: FileLeases) -> Result<FlockLease, StartError> {
    let leases = FlockLease::builder(dir)
        .ttl(ttl)
        .clock(Arc::new(SystemClock))
        .refuse_volatile(!files.allow_volatile)
        .durability(files.durability)
        .open()
        .map_err(|source| {
            let volatile = std::error::Error::source(&source)
                .and_then(|s| s.downcast_ref::<LeaseFileError>())
                .is_some_and(|s| matches!(s, LeaseFileError::Volatile { .. }));
            if volatile {
                StartError::VolatileLeaseDir {
                    dir: dir.to_path_buf(),
                }
            } else {
                StartError::Lease {
                    backend: format!("file leases in {}", dir.display()),
                    source,
                }
            }
        })?;
    if leases.is_volatile() {
        warn!(
            dir = %dir.display(),
            "the session lease directory is on tmpfs or ramfs: a reboot \
             empties it, and this store then refuses to start with it \
             (its authority is gone); allowed by --allow-volatile-lease-dir"
        );
    }
    Ok(leases)
}

/// The lease service's client, once the service has said it grants leases
/// at least `ttl` long, and `owner` made one the service lets this process
/// act for.
#[cfg(feature = "grpc")]
async fn open_service(
    service: &LeaseService,
    ttl: Duration,
    owner: &mut OwnerId,
) -> Result<grpcdriver::GrpcLease, StartError> {
    let leases = service.open(ttl).map_err(not_opened)?;
    // The keeper counts on every grant living `ttl`: a service that grants
    // less would let a takeover overlap a holder that still acts. Refuse to
    // start rather than find out on the first run.
    let refused = |source| StartError::Lease {
        backend: service.describe(),
        source,
    };
    let info = leases.service_info().await.map_err(refused)?;
    if let Some(granted) = info.ttl.filter(|granted| *granted < ttl) {
        return Err(refused(LeaseError::invalid(format!(
            "it grants leases of {granted:?}, shorter than --session-lease-ttl \
             {ttl:?}: lower --session-lease-ttl to at most {granted:?}"
        ))));
    }
    // The service tells each client which owner ids it may act for; an id
    // it does not admit would be refused on every acquire, so it goes
    // under the identity's prefix instead. A service older than the
    // question admits any.
    if let Some(me) = leases.who_am_i().await.map_err(refused)?
        && !me.admits(owner)
    {
        let derived = me.owner_id(owner.as_str()).map_err(refused)?;
        tracing::info!(
            client = %me.client,
            asked = %owner,
            owner = %derived,
            "the lease service's identity for this process names its owner ids"
        );
        *owner = derived;
    }
    Ok(leases)
}

/// Opens the store; its directory when it has one, and the directory
/// store itself for advancing its generation.
///
/// A directory store checks at open that it is not an older copy of
/// itself: its generation, advanced by every server start, must not be
/// below the one mirrored in the lease directory (a witness a restore of
/// the store does not reach when the lease directory lives elsewhere), nor
/// its directory another than the one it was written in.
async fn open_store(
    store: &StoreChoice,
    lease: &LeaseChoice,
    ttl: Duration,
) -> Result<OpenedStore, StartError> {
    #[cfg(not(any(feature = "redis", feature = "postgres")))]
    let _ = ttl;
    let unleased = *lease == LeaseChoice::Unleased;
    match store {
        StoreChoice::Jsonl { dir, fsync } => {
            let fsync = if *fsync {
                FsyncPolicy::Always
            } else {
                FsyncPolicy::Never
            };
            let witness = match lease {
                LeaseChoice::Dir(leases) => Some(leases.clone()),
                _ => None,
            };
            let generation = witness
                .clone()
                .map_or(GenerationCheck::InStore, GenerationCheck::Witness);
            let jsonl = JsonlStore::open(
                dir,
                JsonlOptions::default()
                    .fsync(fsync)
                    .allow_unfenced(unleased)
                    .generation(generation),
            )
            .map_err(|source| match source.kind() {
                StoreErrorKind::Rewound => StartError::StoreRewound {
                    store: dir.clone(),
                    witness,
                    source,
                },
                _ => StartError::Store {
                    store: dir.display().to_string(),
                    source,
                },
            })?;
            let jsonl = Arc::new(jsonl);
            Ok(OpenedStore {
                store: jsonl.clone(),
                dir: Some(dir.clone()),
                generations: Some(jsonl),
                leases: None,
                name: dir.display().to_string(),
            })
        }
        #[cfg(feature = "redis")]
        StoreChoice::Redis { url, prefix } => {
            let mut b =
                redis_session_store::RedisStore::builder(url.clone()).prefix(prefix.clone());
            if *lease == LeaseChoice::Store {
                b = b.leases(ttl);
            }
            let redis = b.connect().await.map_err(|source| StartError::Store {
                store: format!("Redis ({prefix})"),
                source,
            })?;
            Ok(OpenedStore {
                store: Arc::new(redis),
                dir: None,
                generations: None,
                leases: None,
                name: "the Redis store".to_owned(),
            })
        }
        #[cfg(feature = "postgres")]
        StoreChoice::Postgres(pg) => open_postgres_store(pg, lease, ttl).await,
    }
}

/// The PostgreSQL store, checking the live lease row in each append when
/// the leases are pglease's in its database under its prefix: its own
/// (no lease flag), or tables named by --session-lease-postgres that the
/// store's database proves to be the same (their authority recorded
/// there). Those leases are opened first — they make the table the check
/// reads — and served from here.
#[cfg(feature = "postgres")]
async fn open_postgres_store(
    pg: &PostgresStore,
    lease: &LeaseChoice,
    ttl: Duration,
) -> Result<OpenedStore, StartError> {
    let config = match lease {
        LeaseChoice::Store => pg.own_leases(),
        LeaseChoice::Postgres(leases) => leases.clone(),
        _ => {
            let store = pg.open(false).await.map_err(StartError::OpenStore)?;
            return Ok(postgres_opened(pg, Arc::new(store), None));
        }
    };
    let leases = config.open(ttl).await.map_err(not_opened)?;
    let (store, checked) = pg
        .open_beside(&leases, &config.table_prefix)
        .await
        .map_err(StartError::OpenStore)?;
    if checked {
        info!("every append checks the live lease row in the same statement");
    } else {
        warn!(
            "the leases are not in the store's database under its prefix: appends are fenced by \
             the store's marks alone, not checked against the live lease row"
        );
    }
    Ok(postgres_opened(pg, Arc::new(store), Some(Arc::new(leases))))
}

#[cfg(feature = "postgres")]
fn postgres_opened(
    pg: &PostgresStore,
    store: Arc<dyn SessionStore>,
    leases: Option<Arc<dyn SessionLease>>,
) -> OpenedStore {
    OpenedStore {
        store,
        dir: None,
        generations: None,
        leases,
        name: pg.describe(),
    }
}

/// An opened store and what came with it.
struct OpenedStore {
    store: Arc<dyn SessionStore>,
    /// Its directory, when it has one.
    dir: Option<PathBuf>,
    /// The directory store, for advancing its generation.
    generations: Option<Arc<JsonlStore>>,
    /// Leases opened with the store because its appends check them.
    leases: Option<Arc<dyn SessionLease>>,
    /// The store, for messages.
    name: String,
}

/// Ties the store to the lease authority whose tokens fence it: recorded on
/// the first leased start, compared on every later one. Tokens of two
/// authorities are unrelated numbers (two lease directories both issue
/// token 1), so a server whose backend is not the store's authority must not
/// write a single event.
async fn bind_authority(
    store: &dyn SessionStore,
    leases: &dyn SessionLease,
    configured_by: &str,
) -> Result<(), StartError> {
    let authority = leases
        .authority()
        .await
        .map_err(|source| StartError::Lease {
            backend: format!("the lease authority of {configured_by}"),
            source,
        })?;
    match store.bind_authority(&authority).await {
        Ok(()) => Ok(()),
        Err(StoreError::AuthorityMismatch {
            location,
            recorded,
            offered,
        }) => Err(StartError::AuthorityMismatch {
            location,
            recorded,
            offered,
            flag: configured_by.to_owned(),
        }),
        Err(source) => Err(StartError::Store {
            store: "binding its lease authority".into(),
            source,
        }),
    }
}

/// The lease backend of an unleased deployment: answers `Unsupported`, so
/// the keeper stops consulting it after the first call and runs unleased.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unleased;

const UNLEASED: &str = "this deployment runs without session leases";

#[async_trait]
impl SessionLease for Unleased {
    async fn acquire(&self, _: &SessionId, _: &OwnerId) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported(UNLEASED))
    }
    async fn renew(&self, _: &Lease) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported(UNLEASED))
    }
    async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
        Ok(())
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        Err(LeaseError::unsupported(UNLEASED))
    }
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
                backend: format!("file leases in {}", leases.dir().display()),
                source,
            }
        }
    })
}

/// Opens `path` (created if absent) and takes `how` on it without waiting;
/// `None` when another process holds a conflicting lock.
fn flock_file(path: PathBuf, how: FlockArg) -> Result<Option<Flock<File>>, StartError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| StartError::LockFile { path, source })?;
    Ok(Flock::lock(file, how).ok())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, Ordering};

    use lease_port::FencingToken;
    use session_store::{StoreErrorKind, WriteFence};

    use super::*;
    use crate::{Server, ServerConfig};

    /// Grants every acquire with the next token; counts calls.
    #[derive(Default)]
    struct Counting {
        acquired: AtomicU64,
        released: AtomicU64,
    }

    #[async_trait]
    impl SessionLease for Counting {
        async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
            let n = self.acquired.fetch_add(1, Ordering::SeqCst) + 1;
            let expiry = std::time::SystemTime::now() + Duration::from_secs(15);
            Ok(Lease::new(
                session.clone(),
                owner.clone(),
                FencingToken::new(100 + n),
                expiry,
            ))
        }
        async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            Ok(lease.clone())
        }
        async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
            self.released.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn authority(&self) -> Result<AuthorityId, LeaseError> {
            AuthorityId::new("counting")
        }
    }

    /// A backend given in-process is used like file leases: the store
    /// refuses unfenced writes, and every run is acquired, written under
    /// the backend's token and released.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_given_backend_leases_every_run_and_fences_its_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let counting = Arc::new(Counting::default());
        let choice = LeaseChoice::Backend(LeaseBackend(counting.clone()));
        let store = StoreChoice::Jsonl {
            dir: tmp.path().to_path_buf(),
            fsync: false,
        };
        let owner = OwnerId::new("host/test").unwrap();
        let opened = open(&store, &choice, Duration::from_secs(15), &owner, false)
            .await
            .unwrap();
        assert_eq!(opened.exclusivity, Exclusivity::Leased);
        let probe = SessionId::new("probe").unwrap();
        opened.store.create(&probe).await.unwrap();
        let unfenced = opened
            .store
            .append(&probe, WriteFence::Unfenced, &[serde_json::json!({})])
            .await
            .unwrap_err();
        assert_eq!(unfenced.kind(), StoreErrorKind::Unfenced);
        drop(opened);

        let mut config = ServerConfig::for_store(tmp.path());
        config.store = store;
        config.lease = choice;
        let server = Server::start(config).await.unwrap();
        let base = format!("http://{}", server.local_addr());
        let client = reqwest::Client::new();
        let created = client
            .post(format!("{base}/v1/sessions"))
            .json(&serde_json::json!({"id": "s"}))
            .send()
            .await
            .unwrap();
        assert!(created.status().is_success());
        for expected in [101, 102] {
            let run: serde_json::Value = client
                .post(format!("{base}/v1/sessions/s/runs"))
                .json(&serde_json::json!({"input": "hi"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(run["status"], "completed", "{run}");
            assert_eq!(run["token"], expected, "{run}");
            let events = run["events"].as_array().unwrap();
            assert!(events.len() >= 2, "{run}");
            assert!(events.iter().all(|e| e["token"] == expected), "{run}");
        }
        assert_eq!(counting.acquired.load(Ordering::SeqCst), 2);
        assert_eq!(counting.released.load(Ordering::SeqCst), 2);
        assert!(server.shutdown().await);
    }

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

    fn jsonl(dir: &Path) -> StoreChoice {
        StoreChoice::Jsonl {
            dir: dir.to_path_buf(),
            fsync: false,
        }
    }

    async fn start(store: &Path, lease: &LeaseChoice, owner: &str) -> Result<Opened, StartError> {
        let owner = OwnerId::new(owner).unwrap();
        open(&jsonl(store), lease, Duration::from_secs(15), &owner, false).await
    }

    /// Unfenced writes would land on sessions a lease fences; leased and
    /// unleased servers never serve one store together, whichever came
    /// first.
    #[tokio::test]
    async fn leased_and_unleased_servers_never_share_a_store() {
        let tmp = tempfile::tempdir().unwrap();
        let files = LeaseChoice::Dir(tmp.path().join(DEFAULT_LEASE_DIR_NAME));

        let unleased = start(tmp.path(), &LeaseChoice::Unleased, "u")
            .await
            .unwrap();
        assert_eq!(unleased.exclusivity, Exclusivity::ProvenSingleProcess);
        let refused = start(tmp.path(), &files, "l").await.err();
        assert!(
            matches!(refused, Some(StartError::UnleasedServerPresent { .. })),
            "{refused:?}"
        );
        drop(unleased);

        let leased = start(tmp.path(), &files, "l").await.unwrap();
        let second = start(tmp.path(), &files, "l2").await.unwrap();
        // While leased servers run, an unleased one cannot prove it is alone.
        drop(leased);
        drop(second);
        // Once a lease authority fences the store, it is never served unleased.
        let refused = start(tmp.path(), &LeaseChoice::Unleased, "u").await.err();
        assert!(
            matches!(refused, Some(StartError::UnleasedOnFencedStore { .. })),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn a_leased_server_holds_off_the_single_process_proof() {
        let tmp = tempfile::tempdir().unwrap();
        let files = LeaseChoice::Dir(tmp.path().join(DEFAULT_LEASE_DIR_NAME));
        let _leased = start(tmp.path(), &files, "l").await.unwrap();
        let lock = flock_file(
            tmp.path().join(SINGLE_PROCESS_LOCK),
            FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        assert!(
            lock.is_none(),
            "an exclusive lock was granted beside a leased server"
        );
    }

    #[tokio::test]
    async fn a_lease_directory_on_tmpfs_is_refused_unless_allowed() {
        let shm = Path::new("/dev/shm");
        assert!(shm.is_dir(), "this test needs /dev/shm (tmpfs)");
        let volatile = tempfile::tempdir_in(shm).unwrap();
        let store = tempfile::tempdir().unwrap();
        let lease = LeaseChoice::Dir(volatile.path().join("leases"));
        let owner = OwnerId::new("v").unwrap();
        let refused = open(
            &jsonl(store.path()),
            &lease,
            Duration::from_secs(15),
            &owner,
            false,
        )
        .await
        .err();
        assert!(
            matches!(refused, Some(StartError::VolatileLeaseDir { .. })),
            "{refused:?}"
        );
        open(
            &jsonl(store.path()),
            &lease,
            Duration::from_secs(15),
            &owner,
            true,
        )
        .await
        .unwrap();
    }
}
