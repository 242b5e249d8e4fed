//! What the `mecated` binary runs (and `mecak8s`, which only fills in
//! flags from the pod's environment first): the session server and its
//! operator commands.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::SystemTime;

use crate::agent::{Agent, EchoAgent, ExecAgent};
use crate::backend::LeaseChoice;
use crate::config::{
    AdoptStoreArgs, AgentKind, Cli, Command, GcArgs, HashTokenArgs, LeasesAction, LeasesArgs,
    ServeArgs,
};
use crate::server::default_owner;
use crate::{Server, ServerConfig};
use clap::Parser;
use lease_port::{OwnerId, SessionId};
use session_store::{DEFAULT_LEASE_DIR_NAME, JsonlOptions, JsonlStore, SessionStore};
use tokio::signal::unix::{SignalKind, signal};

/// Parses the command line and runs what it asks for.
pub fn main() -> ExitCode {
    main_with(Cli::parse())
}

/// Runs what `cli` asks for: the server (until SIGTERM or SIGINT) or an
/// operator command. Logs go to standard error at the level `MECATED_LOG`
/// names (default `info`).
pub fn main_with(cli: Cli) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("MECATED_LOG").ok()))
        // Colours only for a person at a terminal: a log file or a log
        // shipper reading the audit lines gets them as plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Some(Command::Leases(args)) => leases(&args),
        Some(Command::Gc(args)) => gc(&args),
        Some(Command::AdoptStore(args)) => adopt_store(&args),
        Some(Command::HashToken(args)) => hash_token(&args),
        None => tokio::runtime::Runtime::new()
            .map_err(|e| format!("cannot start the runtime: {e}"))
            .and_then(|rt| rt.block_on(serve(cli.serve))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mecated: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads a token from standard input and prints what the token file holds
/// for it.
fn hash_token(args: &HashTokenArgs) -> Result<(), String> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
        .map_err(|e| format!("cannot read the token from standard input: {e}"))?;
    let token = crate::auth::token_from_text(&text)
        .map_err(|e| format!("{e}: give the token on standard input, as clients send it"))?;
    let hash = crate::auth::hash_token(token);
    let (Some(name), Some(roles)) = (&args.name, &args.roles) else {
        println!("{hash}");
        return Ok(());
    };
    let line = format!("{name} {roles} {hash}");
    // Checked as the server will read it.
    crate::auth::TokenSet::parse(&line, std::path::Path::new("<this line>"))
        .map_err(|e| e.to_string())?;
    println!("{line}");
    Ok(())
}

/// The log filter `MECATED_LOG` names (default `info`), with the audit
/// trail at `info` unless the variable names its target: a quieter level
/// for the rest must not silence who deleted what.
fn log_filter(spec: Option<String>) -> tracing_subscriber::EnvFilter {
    let spec = spec.unwrap_or_else(|| "info".into());
    let names_audit = spec.contains(crate::http::AUDIT_TARGET);
    let filter = tracing_subscriber::EnvFilter::try_new(&spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if names_audit {
        return filter;
    }
    match format!("{}=info", crate::http::AUDIT_TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

fn gc(args: &GcArgs) -> Result<(), String> {
    let store = JsonlStore::open(&args.store_dir, JsonlOptions::default()).map_err(|e| {
        format!(
            "cannot open {}: {}",
            args.store_dir.display(),
            crate::error::error_chain(&e)
        )
    })?;
    let report = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?
        .block_on(store.reclaim_deleted(args.older_than))
        .map_err(|e| crate::error::error_chain(&e))?;
    // A local command, not a request: its caller is the account it runs
    // as, and it has no HTTP status (0).
    let who = format!(
        "local:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    for session in &report.reclaimed {
        tracing::info!(target: crate::http::AUDIT_TARGET, who, what = "gc", session = session.as_str(), status = 0u16, code = "", "audit");
        println!("reclaimed {session}");
    }
    for session in &report.busy {
        println!("busy {session} (locked; left for a later run)");
    }
    println!(
        "{} session files reclaimed ({} bytes), {} busy, {} temporary files removed",
        report.reclaimed.len(),
        report.bytes,
        report.busy.len(),
        report.temporary_files
    );
    Ok(())
}

/// Takes `store`'s single-process lock exclusively without waiting: held,
/// no server serves the store.
fn lock_quiet_store(store: &std::path::Path) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    let path = store.join(crate::backend::SINGLE_PROCESS_LOCK);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        format!(
            "a server is serving {} (it holds {}): stop every server of this store first",
            store.display(),
            path.display()
        )
    })
}

fn adopt_store(args: &AdoptStoreArgs) -> Result<(), String> {
    let store = &args.store_dir;
    let _quiet = lock_quiet_store(store)?;
    let witness = args.session_lease_dir.clone().or_else(|| {
        let default = store.join(DEFAULT_LEASE_DIR_NAME);
        default.is_dir().then_some(default)
    });
    let generation = session_store::adopt_store_dir(store, witness.as_deref()).map_err(|e| {
        format!(
            "cannot adopt {}: {}",
            store.display(),
            crate::error::error_chain(&e)
        )
    })?;
    println!(
        "{} adopted as store {} at generation {}{}",
        store.display(),
        generation.store_id(),
        generation.get(),
        witness
            .map(|w| format!(", mirrored in {}", w.display()))
            .unwrap_or_default()
    );
    Ok(())
}

/// The highest token `store_dir`'s store accepted for `session` (0 when
/// none).
fn store_high_water(store_dir: &std::path::Path, session: &SessionId) -> Result<u64, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async {
        let store = JsonlStore::open(store_dir, JsonlOptions::default())
            .map_err(|e| format!("cannot open the store {}: {e}", store_dir.display()))?;
        let high_water = store
            .high_water(session)
            .await
            .map_err(|e| format!("cannot read {session}'s high-water token: {e}"))?;
        Ok(high_water.map_or(0, |t| t.get()))
    })
}

fn leases(args: &LeasesArgs) -> Result<(), String> {
    let dir = match (&args.session_lease_dir, &args.store_dir) {
        (Some(dir), _) => dir.clone(),
        (None, Some(store)) => store.join(DEFAULT_LEASE_DIR_NAME),
        (None, None) => return Err("give --session-lease-dir or --store-dir".into()),
    };
    if let Some(LeasesAction::Adopt { store_dir }) = &args.action {
        let store = store_dir
            .as_ref()
            .or(args.store_dir.as_ref())
            .ok_or("adopt needs the store the directory fences: --store-dir")?;
        // Servers of the store hold its single-process lock (shared when
        // leased): while one runs, its directory is not retired.
        let _quiet = lock_quiet_store(store)?;
        let authority = flocklease::adopt(&dir).map_err(|e| {
            format!(
                "cannot adopt {}: {}",
                dir.display(),
                crate::error::error_chain(&e)
            )
        })?;
        println!("{} now holds lease authority {authority}", dir.display());
        return Ok(());
    }
    if let Some(LeasesAction::Repair {
        session,
        min_token,
        force,
    }) = &args.action
    {
        let session = SessionId::new(session).map_err(|e| format!("--session: {e}"))?;
        if !force {
            let live = flocklease::list_leases(&dir, SystemTime::now())
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
                .into_iter()
                .filter_map(|entry| entry.lease.ok())
                .find(|l| l.session.as_ref() == Some(&session))
                .filter(|l| l.state == flocklease::LeaseState::Live);
            if let Some(live) = live {
                return Err(format!(
                    "{session} is held live by {}: stop its holder first (or --force, which \
                     ends the hold)",
                    live.owner
                        .as_ref()
                        .map_or("an unknown holder", |o| o.as_str())
                ));
            }
        }
        // Only a directory a server leased from: a wrong path must not
        // sprout lease files.
        if !dir.join(flocklease::AUTHORITY_FILE).is_file() {
            return Err(format!(
                "{} holds no {}: not a lease directory a server has used",
                dir.display(),
                flocklease::AUTHORITY_FILE
            ));
        }
        // Never below what the store accepted: the next owner's writes
        // would be refused for good.
        let mut min_token = *min_token;
        if let Some(store_dir) = &args.store_dir {
            let high_water = store_high_water(store_dir, &session)?;
            if high_water > min_token {
                println!("the store accepted token {high_water} for {session}: repairing above it");
                min_token = high_water;
            }
        }
        let token = flocklease::repair(&dir, &session, min_token).map_err(|e| {
            format!(
                "cannot repair the lease of {session} in {}: {}",
                dir.display(),
                crate::error::error_chain(&e)
            )
        })?;
        println!(
            "repaired {session}: free, the next owner gets a token above {}",
            token.get()
        );
        return Ok(());
    }
    let entries = flocklease::list_leases(&dir, SystemTime::now()).map_err(|e| {
        format!(
            "cannot list {}: {}",
            dir.display(),
            crate::error::error_chain(&e)
        )
    })?;
    if !args.json {
        println!(
            "{:<32} {:<40} {:>8} {:<8} EXPIRES IN",
            "SESSION", "HOLDER", "TOKEN", "STATE"
        );
    }
    for entry in entries {
        match entry.lease {
            Ok(info) => {
                let session = info.session.as_ref().map_or("?", |s| s.as_str());
                let holder = info.owner.as_ref().map(|o| o.as_str());
                let token = info.token.map(|t| t.get());
                let state = format!("{:?}", info.state).to_lowercase();
                let left = info
                    .expiry
                    .and_then(|e| e.duration_since(SystemTime::now()).ok());
                if args.json {
                    let line = serde_json::json!({
                        "session": session,
                        "holder": holder,
                        "token": token,
                        "reserved_through": info.reserved.map(|t| t.get()),
                        "state": state,
                        "expires_in_ms": left.map(|d| d.as_millis() as u64),
                    });
                    println!("{line}");
                } else {
                    println!(
                        "{session:<32} {:<40} {:>8} {state:<8} {}",
                        holder.unwrap_or("-"),
                        token.map_or("-".into(), |t| t.to_string()),
                        left.map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64())),
                    );
                }
            }
            Err(e) => {
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({"file": entry.file_name, "error": e.to_string()})
                    );
                } else {
                    println!("{:<32} error: {e}", entry.file_name);
                }
            }
        }
    }
    Ok(())
}

/// Refuses flags about authentication that contradict each other. Checked
/// here rather than as a clap conflict: a conflict would also refuse
/// `MECATED_ALLOW_UNAUTHENTICATED=false`, which allows nothing.
fn check_auth_flags(args: &ServeArgs) -> Result<(), String> {
    if args.allow_unauthenticated && args.token_file.is_some() {
        return Err(
            "--allow-unauthenticated and --token-file contradict each other: give the token \
             file to authenticate callers, or neither to serve without authentication"
                .into(),
        );
    }
    if args.token_file.is_some() && !args.allowed_hosts.is_empty() {
        tracing::warn!(
            "--allowed-host has no effect with --token-file: an authenticated server answers \
             under any name"
        );
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    check_auth_flags(&args)?;
    let (store, lease) = args.choices()?;
    let owner = match &args.owner {
        // A network lease backend cannot tell two processes under one
        // owner id apart (a lease directory's owner lock can): both would
        // hold a session at once under one token. Each incarnation gets
        // its own.
        Some(o) if !matches!(lease, LeaseChoice::Dir(_) | LeaseChoice::Unleased) => {
            OwnerId::new(format!("{o}#{}", crate::server::incarnation_suffix()))
                .map_err(|e| format!("--owner: {e}"))?
        }
        Some(o) => OwnerId::new(o).map_err(|e| format!("--owner: {e}"))?,
        None => default_owner(),
    };
    let agent: Arc<dyn Agent> = match args.agent {
        AgentKind::Echo => Arc::new(EchoAgent::new(args.echo_delay, args.echo_steps)),
        AgentKind::Exec => Arc::new(
            ExecAgent::new(
                args.agent_command
                    .clone()
                    .ok_or("--agent exec needs --agent-command")?,
                args.agent_args.clone(),
            )
            .with_transcript_scope(args.agent_transcript.into()),
        ),
    };
    if lease == LeaseChoice::Unleased {
        tracing::warn!(
            "running without session leases: only safe as the one process serving this store"
        );
    }
    let config = ServerConfig {
        listen: args.listen,
        store,
        lease,
        lease_ttl: args.session_lease_ttl,
        owner,
        agent,
        max_body_bytes: args.max_body_bytes,
        transcript_cache_bytes: args.transcript_cache_bytes,
        drain_timeout: args.drain_timeout,
        resume_interrupted: args.resume_interrupted.then_some(args.resume_max_attempts),
        shutdown_timeout: args.shutdown_timeout,
        allow_volatile_lease_dir: args.allow_volatile_lease_dir,
        token_file: args.token_file.clone(),
        token_file_check_interval: args.token_file_check_interval,
        allow_unauthenticated: args.allow_unauthenticated,
        allowed_hosts: args.allowed_hosts.clone(),
        max_follows_per_client: args.max_follows_per_client,
        metrics_listen: args.metrics_listen,
    };
    let server = Server::start(config)
        .await
        .map_err(|e| crate::error::error_chain(&e))?;
    // Before the line below: whoever read it may signal at once.
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    // Tests and scripts read the bound address from this line.
    println!("listening on http://{}", server.local_addr());
    loop {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM: draining, then shutting down (a second signal cancels the runs in progress)");
                break;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: draining, then shutting down (a second signal cancels the runs in progress)");
                break;
            }
            // The outcome is logged and counted where the file is read.
            _ = hup.recv() => {
                if server.reload_tokens().is_none() {
                    tracing::info!("SIGHUP: no --token-file to read again");
                }
            }
        }
    }
    let second_signal = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    if server.drain(second_signal).await {
        tracing::info!("shut down cleanly; every lease released");
        Ok(())
    } else {
        Err("shutdown did not finish within --shutdown-timeout".into())
    }
}
