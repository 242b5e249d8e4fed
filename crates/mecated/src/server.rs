//! Start-up and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lease_keeper::LeaseKeeper;
use lease_port::{LeaseError, OwnerId};
use session_store::JsonlStore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::agent::{Agent, EchoAgent};
use crate::auth::{Reloaded, TokenFile, TokenFileError};
use crate::backend::{self, LeaseChoice, Opened, StoreChoice};
use crate::engine::Engine;
use crate::http::Auth;
use crate::lease_view::LeaseView;
use crate::metrics::Metrics;

/// How long a draining server lets its runs in progress finish, unless
/// told otherwise (`--drain-timeout`). With the shutdown bound that follows
/// (10 s) and a preStop pause of a few seconds, it fits inside the grace
/// period of the Kubernetes manifests (60 s).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything the server needs, independent of how it was given.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Where sessions are stored.
    pub store: StoreChoice,
    /// Where leases come from.
    pub lease: LeaseChoice,
    /// Lease TTL.
    pub lease_ttl: Duration,
    /// This process's owner identity.
    pub owner: OwnerId,
    /// The agent driving runs.
    pub agent: Arc<dyn Agent>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Memory bound of the transcripts kept between runs; 0 keeps none.
    pub transcript_cache_bytes: usize,
    /// How long [`Server::drain`] lets the runs in progress finish before
    /// it shuts down (which cancels the rest).
    pub drain_timeout: Duration,
    /// Run the input of a run that recorded no end again, at most this
    /// many times per input (see [`Engine::resume_interrupted`]); `None`
    /// only ends such runs as `interrupted`. With it, the server also looks
    /// once through the store at start-up for runs left open.
    pub resume_interrupted: Option<u32>,
    /// Bound on graceful shutdown.
    pub shutdown_timeout: Duration,
    /// Accept a lease directory on tmpfs or ramfs (lost on reboot).
    pub allow_volatile_lease_dir: bool,
    /// The file of hashed bearer tokens with their names and roles
    /// ([`crate::auth`]); `None` serves every caller as anonymous, with
    /// every role, which [`Server::start`] refuses beyond loopback unless
    /// `allow_unauthenticated`.
    pub token_file: Option<PathBuf>,
    /// How often the token file is looked at for a change (its
    /// modification time, length or inode) and read again if it changed;
    /// zero only reads it again on [`Server::reload_tokens`] (SIGHUP).
    pub token_file_check_interval: Duration,
    /// Serve a non-loopback `listen` without a token file.
    pub allow_unauthenticated: bool,
    /// Names besides IP addresses and `localhost` that a server without a
    /// token file answers requests addressed to ([`crate::http::AllowedHosts`]).
    pub allowed_hosts: Vec<String>,
    /// How many follows one token may hold open at once; 0 bounds nothing
    /// ([`crate::http::HttpOptions::max_follows_per_client`]).
    pub max_follows_per_client: usize,
    /// Serve `/metrics`, open, on this address too: for scrapers that hold
    /// no token. It carries counts and latencies, no session id.
    pub metrics_listen: Option<SocketAddr>,
}

impl ServerConfig {
    /// Defaults for a store directory: loopback on a free port, the JSONL
    /// store syncing every append, file leases under `<dir>/.session-leases`,
    /// 15 s TTL, the echo agent.
    pub fn for_store(dir: impl Into<PathBuf>) -> Self {
        let store = StoreChoice::jsonl(dir);
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease: store.default_leases(),
            store,
            lease_ttl: Duration::from_secs(15),
            owner: default_owner(),
            agent: Arc::new(EchoAgent::default()),
            max_body_bytes: 1 << 20,
            transcript_cache_bytes: crate::transcript::DEFAULT_TRANSCRIPT_CACHE_BYTES,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            resume_interrupted: None,
            shutdown_timeout: Duration::from_secs(10),
            allow_volatile_lease_dir: false,
            token_file: None,
            token_file_check_interval: TOKEN_FILE_CHECK_INTERVAL,
            allow_unauthenticated: false,
            allowed_hosts: Vec::new(),
            max_follows_per_client: crate::http::DEFAULT_MAX_FOLLOWS_PER_CLIENT,
            metrics_listen: None,
        }
    }
}

/// How often a server looks whether its token file changed, unless told
/// otherwise (`--token-file-check-interval`): a token added or removed is
/// in force within this long, without a SIGHUP.
pub const TOKEN_FILE_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A non-loopback address without authentication.
    #[error(
        "refusing to serve on {addr} without authentication: anyone who reaches it could \
         start runs (with --agent exec, run commands), cancel them, delete sessions and read \
         every transcript. Give a --token-file, listen on loopback, or allow unauthenticated \
         serving explicitly with --allow-unauthenticated"
    )]
    Unauthenticated {
        /// The address.
        addr: SocketAddr,
    },
    /// The token file was refused.
    #[error("cannot authenticate callers")]
    TokenFile(#[source] crate::auth::TokenFileError),
    /// The store could not be opened.
    #[error("cannot open the session store {store}")]
    Store {
        /// Which store.
        store: String,
        /// Why.
        #[source]
        source: session_store::StoreError,
    },
    /// A store on a server could not be opened from its configuration: a
    /// password file that cannot be used, or the store's refusal.
    #[error("cannot open {}", .0.backend())]
    OpenStore(#[source] lease_backends::OpenError),
    /// The store directory is an older copy of itself (put back from a
    /// backup or an older disk image), or a copy in another place.
    #[error(
        "refusing the session store {}: it is not the newest state of itself. If no newer \
         copy exists and losing what was written since is accepted, adopt it as it is with \
         every server of it stopped: `mecated adopt-store --store-dir {}{}`",
        store.display(),
        store.display(),
        witness.as_ref().map(|w| format!(" --session-lease-dir {}", w.display())).unwrap_or_default()
    )]
    StoreRewound {
        /// The store directory.
        store: PathBuf,
        /// The lease directory mirroring its generation, when there is one.
        witness: Option<PathBuf>,
        /// What the store found.
        #[source]
        source: session_store::StoreError,
    },
    /// The lease backend could not be opened.
    #[error("cannot open {backend}")]
    Lease {
        /// Which backend.
        backend: String,
        /// Why.
        #[source]
        source: LeaseError,
    },
    /// The store is fenced by another lease authority than the configured
    /// backend: their tokens are unrelated, so serving would let two owners
    /// write one session.
    #[error(
        "the store ({location}) is fenced by lease authority {recorded}, but {flag} names \
         authority {offered}: point {flag} at the lease backend that fences this store \
         (for file leases, the directory whose .authority file holds {recorded}; by default \
         <STORE_DIR>/.session-leases), or serve another --store-dir"
    )]
    AuthorityMismatch {
        /// Where the store records its authority.
        location: String,
        /// The authority the store is fenced by.
        recorded: lease_port::AuthorityId,
        /// The configured backend's authority.
        offered: lease_port::AuthorityId,
        /// The flag that chose the backend.
        flag: String,
    },
    /// An unleased server was asked to serve a store that a lease authority
    /// fences.
    #[error(
        "the store is fenced by lease authority {authority}: serve it leased (drop \
         --no-session-lease, and give the lease backend of that authority)"
    )]
    UnleasedOnFencedStore {
        /// The store's authority.
        authority: lease_port::AuthorityId,
    },
    /// A leased server was asked to serve a store an unleased server serves.
    #[error(
        "an unleased server serves this store (it holds {lock} exclusively): stop it, or \
         serve the store unleased"
    )]
    UnleasedServerPresent {
        /// The store's single-process lock file.
        lock: PathBuf,
    },
    /// The lease directory is on tmpfs or ramfs.
    #[error(
        "the session lease directory {dir} is on tmpfs or ramfs: a reboot empties it, and \
         with it the authority that fences the store, so the store could not be served \
         again; put it on a disk, or pass --allow-volatile-lease-dir"
    )]
    VolatileLeaseDir {
        /// The lease directory.
        dir: PathBuf,
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

/// Six hex digits that differ between processes (and between runs of one
/// pid), to tell incarnations of one configured owner apart.
pub fn incarnation_suffix() -> String {
    let r = std::hash::BuildHasher::hash_one(
        &std::hash::RandomState::new(),
        (std::process::id(), std::time::SystemTime::now()),
    );
    format!("{:06x}", r & 0xff_ffff)
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

/// A running server.
pub struct Server {
    app: Engine,
    addr: SocketAddr,
    serve: JoinHandle<std::io::Result<()>>,
    drain_timeout: Duration,
    shutdown_timeout: Duration,
    /// The single-process lock (unleased) or the owner lock (file leases),
    /// held for the server's life.
    _process_locks: Vec<backend::ProcessLock>,
    /// The directory store, its generation advanced while serving (by
    /// `advancing`) and once more at shutdown.
    generations: Option<Arc<JsonlStore>>,
    advancing: Option<Background>,
    /// The start-up look for interrupted runs to resume.
    _sweeping: Option<Background>,
    /// The token file, when callers are authenticated.
    tokens: Option<Arc<TokenFile>>,
    /// Reading the token file again when it changes.
    _watching_tokens: Option<Background>,
    /// The metrics listener, and where it listens.
    _metrics: Option<(Background, SocketAddr)>,
    metrics_addr: Option<SocketAddr>,
}

/// A task of the server's own (advancing the generation, looking for
/// interrupted runs); stopped when dropped, so a server dropped without a
/// shutdown leaves nothing running.
struct Background(JoinHandle<()>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often a serving process advances its directory store's
/// generation: a copy of the store taken longer ago than this is refused
/// once put back, even when no server stopped cleanly since.
pub const GENERATION_INTERVAL: Duration = Duration::from_secs(60);

/// Advances the store's generation every [`GENERATION_INTERVAL`]. A store
/// found gone back under this server refuses every call from then on, and
/// `/readyz` fails; the next start refuses it until it is adopted.
fn advance_generations(store: Arc<JsonlStore>, app: Engine) -> Background {
    Background(tokio::spawn(async move {
        let mut every = tokio::time::interval(GENERATION_INTERVAL);
        every.tick().await;
        loop {
            every.tick().await;
            if let Err(e) = store.advance_generation().await {
                // A store found gone back refuses every call from now on;
                // readiness says so at once.
                app.note_store_failure(&e);
                error!(error = %crate::error::error_chain(&e), "cannot advance the store's generation");
            }
        }
    }))
}

/// The token file of `config`, read, or why it cannot be used; refuses a
/// non-loopback address without one unless allowed.
fn open_tokens(config: &ServerConfig) -> Result<Option<Arc<TokenFile>>, StartError> {
    let exposed = !config.listen.ip().is_loopback();
    let Some(path) = &config.token_file else {
        if exposed {
            if !config.allow_unauthenticated {
                return Err(StartError::Unauthenticated {
                    addr: config.listen,
                });
            }
            warn!(addr = %config.listen, "serving without authentication on a non-loopback address");
        }
        return Ok(None);
    };
    let tokens = TokenFile::open(path).map_err(StartError::TokenFile)?;
    if exposed {
        warn!(
            addr = %config.listen,
            "the bearer tokens cross the network in clear text: serve behind a proxy that \
             terminates TLS"
        );
    }
    Ok(Some(Arc::new(tokens)))
}

/// Reads the token file again (when it changed, unless `forced`), logging
/// and counting the outcome.
fn reload_tokens(
    tokens: &TokenFile,
    app: &Engine,
    forced: bool,
) -> Result<Reloaded, TokenFileError> {
    let result = if forced {
        tokens.reload()
    } else {
        tokens.reload_if_changed()
    };
    match &result {
        Ok(Reloaded::Tokens(count)) => {
            app.metrics().token_file_read(*count);
            info!(file = %tokens.path().display(), tokens = count, "token file read: its tokens are in force");
        }
        Ok(Reloaded::Unchanged) => {}
        Err(e) => {
            app.metrics().token_file_refused();
            error!(
                error = %crate::error::error_chain(e),
                "token file refused: the tokens read before stay in force"
            );
        }
    }
    result
}

/// Reads the token file again whenever it changed, looking every `every`.
fn watch_tokens(tokens: Arc<TokenFile>, app: Engine, every: Duration) -> Option<Background> {
    if every.is_zero() {
        return None;
    }
    Some(Background(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let _ = reload_tokens(&tokens, &app, false);
        }
    })))
}

/// The start-up look through the store for interrupted runs to resume.
fn sweep_interrupted(app: Engine) -> Background {
    Background(tokio::spawn(async move {
        let report = app.resume_interrupted_runs().await;
        app.metrics().resume_sweep_done();
        info!(
            ?report,
            "looked through the store for interrupted runs to resume"
        );
    }))
}

/// A listening socket on `addr`, and the address it got.
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
    Ok((listener, bound))
}

/// Serves `router` on `listener` until the engine shuts down.
fn serve_on(
    listener: TcpListener,
    router: axum::Router,
    app: &Engine,
) -> JoinHandle<std::io::Result<()>> {
    let stop = app.shutdown_signal();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    })
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
        let tokens = open_tokens(&config)?;
        let Opened {
            store,
            leases,
            lease_dir,
            exclusivity,
            process_locks,
            generations,
            owner,
        } = backend::open(
            &config.store,
            &config.lease,
            config.lease_ttl,
            &config.owner,
            config.allow_volatile_lease_dir,
        )
        .await?;
        let metrics = Arc::new(Metrics::default());
        if let Some(tokens) = &tokens {
            metrics.token_file_read(tokens.current().len());
        }
        // Runs finish within the first half of the shutdown budget (they are
        // cancelled at once); releases get the second half.
        let view = LeaseView::new(leases.clone(), lease_dir);
        let keeper = LeaseKeeper::builder(leases, owner.clone(), config.lease_ttl)
            .allow_unleased(exclusivity.may_run_unleased())
            .metrics(metrics.clone())
            .shutdown_timeout(config.shutdown_timeout / 2)
            .build()
            .map_err(StartError::Keeper)?;
        let app = Engine::new(store, keeper, config.agent.clone(), metrics, exclusivity)
            .with_transcript_cache_bytes(config.transcript_cache_bytes)
            .with_resumption(config.resume_interrupted.unwrap_or(0));
        app.set_lease_view(view);

        let (listener, addr) = bind(config.listen).await?;
        let auth = tokens.clone().map_or(Auth::Off, Auth::Tokens);
        let options = crate::http::HttpOptions {
            max_body_bytes: config.max_body_bytes,
            allowed_hosts: crate::http::AllowedHosts::new(&config.allowed_hosts),
            max_follows_per_client: config.max_follows_per_client,
        };
        let router = crate::http::router_configured(app.clone(), auth, options);
        let serve = serve_on(listener, router, &app);
        let metrics_listener = match config.metrics_listen {
            Some(at) => {
                let (listener, at) = bind(at).await?;
                let router = crate::http::metrics_router(app.clone());
                let stop = app.shutdown_signal();
                // A task of the server's: stopped if it is dropped unshut.
                let serving = Background(tokio::spawn(async move {
                    let served = axum::serve(listener, router)
                        .with_graceful_shutdown(async move { stop.cancelled().await })
                        .await;
                    if let Err(e) = served {
                        error!(error = %e, "the metrics listener failed");
                    }
                }));
                info!(addr = %at, "serving /metrics");
                Some((serving, at))
            }
            None => None,
        };
        info!(%addr, %owner, lease = ?config.lease, authenticated = tokens.is_some(), "mecated serving");
        let advancing = generations
            .clone()
            .map(|store| advance_generations(store, app.clone()));
        let sweeping = config
            .resume_interrupted
            .map(|_| sweep_interrupted(app.clone()));
        let watching_tokens = tokens.as_ref().and_then(|tokens| {
            watch_tokens(
                Arc::clone(tokens),
                app.clone(),
                config.token_file_check_interval,
            )
        });
        Ok(Self {
            app,
            addr,
            serve,
            drain_timeout: config.drain_timeout,
            shutdown_timeout: config.shutdown_timeout,
            _process_locks: process_locks,
            advancing,
            generations,
            _sweeping: sweeping,
            tokens,
            _watching_tokens: watching_tokens,
            metrics_addr: metrics_listener.as_ref().map(|(_, at)| *at),
            _metrics: metrics_listener,
        })
    }

    /// Reads the token file again (what SIGHUP asks for): its tokens are
    /// in force from now on, or, if it is refused, the ones read before
    /// stay in force and the refusal is logged. `None` without a token
    /// file.
    pub fn reload_tokens(&self) -> Option<Result<Reloaded, TokenFileError>> {
        let tokens = self.tokens.as_ref()?;
        Some(reload_tokens(tokens, &self.app, true))
    }

    /// Where `/metrics` is served on its own (`metrics_listen`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drains, then shuts down: what a rolling deploy's SIGTERM asks for.
    ///
    /// From the call on, `/readyz` answers 503 (so a load balancer stops
    /// sending runs here) and new runs are refused as `draining` (503,
    /// `Retry-After`), while the runs in progress go on to their ends, each
    /// releasing its session as it ends, so a run sent to another replica
    /// takes the session then. Reads, follows and cancels keep working.
    /// Once no run is left, or after the drain timeout, or as soon as
    /// `cut_short` resolves (a second signal), [`shutdown`](Self::shutdown)
    /// cancels what is still running. True when everything finished in
    /// time.
    pub async fn drain(self, cut_short: impl std::future::Future<Output = ()>) -> bool {
        self.app.begin_drain();
        let running = self.app.runs_in_progress();
        info!(
            runs = running,
            timeout = ?self.drain_timeout,
            "draining: new runs are refused, the runs in progress may finish"
        );
        tokio::select! {
            () = self.app.runs_drained() => info!("drained: no run in progress"),
            () = tokio::time::sleep(self.drain_timeout) => info!(
                runs = self.app.runs_in_progress(),
                "the drain timeout passed; cancelling the runs still in progress"
            ),
            () = cut_short => info!(
                runs = self.app.runs_in_progress(),
                "draining cut short; cancelling the runs still in progress"
            ),
        }
        self.shutdown().await
    }

    /// Graceful shutdown without a drain: stop accepting, cancel runs,
    /// release every lease, all within the configured bound. True when
    /// everything finished in time.
    pub async fn shutdown(self) -> bool {
        let start = tokio::time::Instant::now();
        let clean = self.app.shutdown(start + self.shutdown_timeout / 2).await;
        // Responses of the cancelled runs are already on their way; the
        // listener closes once they are written, within what is left.
        let served = tokio::time::timeout_at(start + self.shutdown_timeout, self.serve).await;
        drop(self.advancing);
        // A copy taken while this server ran is older than the store it
        // leaves behind.
        if let Some(store) = &self.generations
            && let Err(e) = store.advance_generation().await
        {
            error!(error = %crate::error::error_chain(&e), "cannot advance the store's generation at shutdown");
        }
        clean && matches!(served, Ok(Ok(Ok(()))))
    }
}
