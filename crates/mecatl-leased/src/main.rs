//! `mecatl-leased`: the lease service daemon. See `--help`, and the
//! workspace's `docs/server.md` for calling it from other languages.

mod cli;
mod reload;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use grpcdriver::{IdentityStore, LeaseServer, ServerStats};
use lease_backends::read_tls_file;
use lease_port::{Clock, MonotonicWallClock, SessionLease};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info, warn};

use cli::{BackendSpec, Cli, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the runtime: {e}"))
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("mecatl-leased: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MECATL_LEASED_LOG")
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

type SharedClock = Arc<dyn Clock>;

/// The backend and the clock its expiries are read on. The service judges
/// the expiry of what it grants itself, so it reads a clock that a step of
/// the host's wall clock cannot move: a forward step would otherwise expire
/// every grant at once while each holder, rightly timing its lease on its
/// own monotonic clock, still acts.
async fn open_backend(cli: &Cli) -> Result<(Arc<dyn SessionLease>, SharedClock), String> {
    let clock: Arc<dyn Clock> = Arc::new(MonotonicWallClock::new());
    let ttl = cli.ttl;
    let backend: Arc<dyn SessionLease> = match &cli.backend {
        BackendSpec::Memory => {
            warn!("memory backend: leases and tokens are lost when this process exits");
            Arc::new(lease_backends::open_memory(ttl, Arc::clone(&clock)))
        }
        BackendSpec::Dir(path) => {
            let dir = lease_backends::DirLeases {
                dir: path.clone(),
                allow_volatile: cli.allow_volatile_lease_dir,
            };
            Arc::new(
                dir.open(ttl, Arc::clone(&clock))
                    .map_err(|e| e.to_string())?,
            )
        }
        // etcd and Kubernetes judge expiry themselves, on their own clocks;
        // the service reports what they granted from when it asked.
        BackendSpec::Etcd(endpoints) => {
            let etcd = cli.etcd.leases(endpoints.clone());
            Arc::new(etcd.open(ttl).map_err(|e| e.to_string())?)
        }
        BackendSpec::Redis(url) => {
            let redis = cli.redis.leases(url.clone());
            Arc::new(redis.open(ttl).await.map_err(|e| e.to_string())?)
        }
        // PostgreSQL judges expiry on its own clock too.
        BackendSpec::Postgres(url) => {
            let postgres = cli.postgres.leases(url.clone());
            Arc::new(postgres.open(ttl).await.map_err(|e| e.to_string())?)
        }
        BackendSpec::K8s(namespace) => {
            let k8s = cli.k8s.leases(namespace.clone());
            Arc::new(k8s.open(ttl).await.map_err(|e| e.to_string())?)
        }
    };
    Ok((backend, clock))
}

fn configure(
    cli: &Cli,
    backend: Arc<dyn SessionLease>,
    clock: Arc<dyn Clock>,
    identities: Option<&IdentityStore>,
) -> Result<LeaseServer, String> {
    let mut server = LeaseServer::new(backend)
        .clock(clock)
        .ttl(cli.ttl)
        .get_access(cli.get_access.into())
        .allow_insecure(cli.allow_insecure)
        .max_batch(cli.max_batch)
        .max_message_bytes(cli.max_message_bytes)
        .concurrency_per_connection(cli.concurrency_per_connection);
    let token = match (&cli.bearer_token, &cli.bearer_token_file) {
        (Some(t), _) => Some(t.trim().to_owned()),
        (None, Some(path)) => Some(
            lease_backends::read_token_file(path, "bearer token file")
                .map_err(|e| e.to_string())?,
        ),
        (None, None) => None,
    };
    if let Some(token) = token {
        if token.is_empty() {
            return Err("the bearer token is empty".into());
        }
        server = server.bearer_token(token);
    }
    if let Some(identities) = identities {
        server = server.identities(identities.clone());
    }
    if let (Some(cert), Some(key)) = (&cli.tls_cert, &cli.tls_key) {
        let mut tls = grpcdriver::ServerTls::new(
            read_tls_file(cert, "TLS certificate").map_err(|e| e.to_string())?,
            read_tls_file(key, "TLS key").map_err(|e| e.to_string())?,
        );
        if let Some(ca) = &cli.tls_client_ca {
            tls = tls
                .require_client_certs(read_tls_file(ca, "client CA").map_err(|e| e.to_string())?);
        }
        server = server.tls(tls);
    }
    Ok(server)
}

async fn run(cli: Cli) -> Result<(), String> {
    let (backend, clock) = open_backend(&cli).await?;
    let authority = backend
        .authority()
        .await
        .map_err(|e| format!("the backend names no authority: {e}"))?;
    let identities = match &cli.identities_file {
        Some(path) => {
            let store = IdentityStore::from_file(path).map_err(|e| e.to_string())?;
            info!(credentials = store.current().len(), path = %path.display(), "identities read");
            Some(store)
        }
        None => None,
    };
    let server = configure(&cli, Arc::clone(&backend), clock, identities.as_ref())?;
    server
        .check_exposure(cli.listen)
        .map_err(|e| e.to_string())?;
    let stats = server.stats();

    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = watch::channel(false);

    let metrics = match cli.metrics_listen {
        Some(at) => {
            let l = TcpListener::bind(at)
                .await
                .map_err(|e| format!("cannot listen for metrics on {at}: {e}"))?;
            let maddr = l.local_addr().map_err(|e| e.to_string())?;
            println!("mecatl-leased metrics on http://{maddr}/metrics");
            Some(tokio::spawn(serve_metrics(l, stats, stop_rx.clone())))
        }
        None => None,
    };

    let reloading =
        identities.map(|store| tokio::spawn(reload::watch_identities(store, stop_rx.clone())));

    // Machine-readable: tests and scripts started with port 0 read it.
    println!("mecatl-leased listening on {addr}");
    info!(%addr, %authority, backend = %cli.backend, ttl = ?cli.ttl, "lease service started");

    let mut stopped = stop_rx.clone();
    let mut serving = tokio::spawn(server.serve(listener, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let signal_name = tokio::select! {
        name = shutdown_signal() => name?,
        ended = &mut serving => {
            return match ended {
                Ok(Ok(())) => Err("the server stopped on its own".into()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("the server task failed: {e}")),
            };
        }
    };
    info!(signal = signal_name, grace = ?cli.shutdown_grace, "shutting down: no new calls, letting calls in flight finish");
    let _ = stop_tx.send(true);
    match tokio::time::timeout(cli.shutdown_grace, &mut serving).await {
        Ok(Ok(Ok(()))) => info!("all calls finished"),
        Ok(Ok(Err(e))) => return Err(e.to_string()),
        Ok(Err(e)) => return Err(format!("the server task failed: {e}")),
        Err(_) => {
            warn!("calls still open after the grace period (KeepAlive streams); closing them");
            serving.abort();
        }
    }
    if let Some(m) = metrics {
        m.abort();
    }
    if let Some(r) = reloading {
        r.abort();
    }
    Ok(())
}

async fn shutdown_signal() -> Result<&'static str, String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

async fn serve_metrics(
    listener: TcpListener,
    stats: Arc<ServerStats>,
    mut stop: watch::Receiver<bool>,
) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let stats = Arc::clone(&stats);
                async move {
                    (
                        [("content-type", "text/plain; version=0.0.4")],
                        stats.render_prometheus(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = served {
        warn!(error = %e, "the metrics endpoint stopped");
    }
}
