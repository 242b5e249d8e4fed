//! Serves: kubectl only — the emulator as a process, for a person (or the kubectl test).
//!
//! Runs the Kubernetes Lease API emulator until interrupted, with a
//! kubeconfig for kubectl.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::Parser;
use k8s_emulator::{Emulator, EmulatorConfig};

/// A Kubernetes API server stand-in for coordination.k8s.io/v1 Leases.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write a kubeconfig for the administrator.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// A namespace that exists (repeatable; default: `default`).
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// The administrator's bearer token (random when absent).
    #[arg(long, env = "K8S_EMULATOR_TOKEN")]
    token: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("k8s-emulator: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mut config = EmulatorConfig {
            listen: args.listen,
            admin_token: args.token,
            kubeconfig_path: args.kubeconfig,
            ..EmulatorConfig::default()
        };
        if !args.namespaces.is_empty() {
            config.namespaces = args.namespaces;
        }
        let emulator = match Emulator::start(config).await {
            Ok(emulator) => emulator,
            Err(e) => {
                eprintln!("k8s-emulator: {e}");
                if let Some(source) = std::error::Error::source(&e) {
                    eprintln!("  caused by: {source}");
                }
                return ExitCode::FAILURE;
            }
        };
        // One line a script can read: where to connect and the kubeconfig.
        println!(
            "listening on {} kubeconfig {}",
            emulator.url(),
            emulator.kubeconfig_path().display()
        );
        if let Err(e) = tokio::signal::ctrl_c().await {
            eprintln!("k8s-emulator: cannot wait for a signal: {e}");
        }
        emulator.shutdown().await;
        ExitCode::SUCCESS
    })
}
