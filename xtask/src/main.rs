//! Project automation, in Rust so it runs wherever cargo does.
//!
//! ```text
//! cargo xtask ci                      everything CI checks, in order
//! cargo xtask conformance [--backend NAME]
//!                                     the behaviour suite against one or every backend
//! cargo xtask services [--backend NAME]
//!                                     install what the tests start (Redis, etcd, …)
//! cargo xtask bench [--quick] [FILTER]
//!                                     criterion benches, then one table of ours / limit ratios
//! cargo xtask proto [--check | --bless]
//!                                     regenerate the gRPC code; check it and wire compatibility
//! ```

mod backends;
mod bench;
mod ci;
mod proto;
mod services;
#[cfg(test)]
mod tidy;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, String>;

const USAGE: &str = "usage: cargo xtask <ci | conformance [--backend NAME] | \
                     services [--backend NAME] | bench [--quick] [FILTER] | \
                     proto [--check | --bless]>";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::ci(),
        Some("conformance") => conformance(&args[1..]),
        Some("services") => services(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        Some("proto") => proto::proto(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cargo that runs us (not a rustup proxy), in the workspace root.
fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn run(step: &str, cmd: &mut Command) -> Result {
    println!("\n==> {step}");
    let status = cmd
        .status()
        .map_err(|e| format!("{step}: cannot start {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

/// `--backend NAME` → that backend; nothing → every backend.
fn chosen_backends(args: &[String], usage: &str) -> Result<Vec<&'static backends::Backend>> {
    match args {
        [] => Ok(backends::BACKENDS.iter().collect()),
        [flag, name] if flag == "--backend" => {
            backends::find(name).map(|b| vec![b]).ok_or_else(|| {
                format!(
                    "unknown backend {name:?}; known: {}",
                    backends::names().join(", ")
                )
            })
        }
        _ => Err(usage.into()),
    }
}

fn conformance(args: &[String]) -> Result {
    let chosen = chosen_backends(args, "usage: cargo xtask conformance [--backend NAME]")?;
    let needed: Vec<_> = chosen
        .iter()
        .flat_map(|b| b.services.iter().copied())
        .collect();
    services::ensure(&needed)?;
    for backend in chosen {
        run(
            &format!("conformance suite on {}", backend.name),
            cargo().args(["test", "-p", backend.name, "--test", "conformance*"]),
        )?;
    }
    Ok(())
}

fn services(args: &[String]) -> Result {
    let needed = match args {
        [] => backends::all_services(),
        _ => chosen_backends(args, "usage: cargo xtask services [--backend NAME]")?
            .iter()
            .flat_map(|b| b.services.iter().copied())
            .collect(),
    };
    services::ensure(&needed)
}
