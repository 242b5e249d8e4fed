//! Project automation, in Rust so it runs wherever cargo does.
//!
//! ```text
//! cargo xtask ci                      everything CI checks, in order
//! cargo xtask conformance [--backend NAME] [--kubeconfig PATH [--namespace NS]]
//!                                     the behaviour suite against one or every backend;
//!                                     with --kubeconfig, k8slease against a real cluster
//! cargo xtask services [--backend NAME]
//!                                     install what the tests start (Redis, etcd, …)
//! cargo xtask bench [--quick] [FILTER]
//!                                     criterion benches, then one table of ours / limit ratios
//! cargo xtask proto [--check | --bless]
//!                                     regenerate the gRPC code; check it and wire compatibility
//! cargo xtask faults [--backend NAME|all] [--ops N] [--seed S] [--profile short|long] [--out DIR]
//!                                     every backend under injected faults, histories checked
//! cargo xtask fuzz [--seconds N] [TARGET…]
//!                                     the coverage-guided fuzz targets in fuzz/, N seconds each
//! cargo xtask publish --dry-run       the publish order; every publishable crate packaged
//!                                     and built against the packages before it
//! cargo xtask scale [--short] [--only live|takeover] [--backend NAME]
//!                                     live runs per process and takeover latency on the
//!                                     release servers, into docs/performance.md
//! cargo xtask sim [--profile short|long] [--operations N] | --seed N [--variant NAME] [--release]
//!                                     the real lease code under a simulated network and
//!                                     clock; broken variants caught; replay one seed
//! ```

mod backends;
mod bench;
mod ci;
mod faults;
#[cfg(test)]
mod fn_length;
mod fuzz;
mod proto;
mod publish;
mod scale;
mod services;
mod sim;
#[cfg(test)]
mod tidy;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, String>;

const USAGE: &str = "usage: cargo xtask <ci | conformance [--backend NAME] \
                     [--kubeconfig PATH [--namespace NS]] | \
                     services [--backend NAME] | bench [--quick] [FILTER] | \
                     proto [--check | --bless] | faults [--backend NAME] [--ops N] \
                     [--seed S] [--profile short|long] [--out DIR] | \
                     fuzz [--seconds N] [TARGET…] | publish --dry-run | \
                     scale [--short] [--only live|takeover] [--backend NAME] | \
                     sim [--profile short|long] [--operations N] | --seed N [--variant NAME]>";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::ci(),
        Some("conformance") => conformance(&args[1..]),
        Some("services") => services(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        Some("proto") => proto::proto(&args[1..]),
        Some("faults") => faults::faults(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("publish") => publish::publish(&args[1..]),
        Some("scale") => scale::scale(&args[1..]),
        Some("sim") => sim::sim(&args[1..]),
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

/// The backend that can run against a real cluster, and the variables its
/// conformance test reads to do so.
const CLUSTER_BACKEND: &str = "k8slease";
const KUBECONFIG_ENV: &str = "MECATL_K8S_KUBECONFIG";
const NAMESPACE_ENV: &str = "MECATL_K8S_NAMESPACE";
const CONFORMANCE_USAGE: &str = "usage: cargo xtask conformance [--backend NAME] \
                                 [--kubeconfig PATH [--namespace NS]]";

/// A real cluster to run `k8slease`'s suite against instead of the emulator.
#[derive(Debug, PartialEq, Eq)]
struct RealCluster {
    kubeconfig: PathBuf,
    namespace: Option<String>,
}

/// Splits `--kubeconfig PATH` and `--namespace NS` from the other arguments.
fn cluster_flags(args: &[String]) -> Result<(Vec<String>, Option<RealCluster>)> {
    let (mut rest, mut kubeconfig, mut namespace) = (Vec::new(), None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let slot = match arg.as_str() {
            "--kubeconfig" => &mut kubeconfig,
            "--namespace" => &mut namespace,
            _ => {
                rest.push(arg.clone());
                continue;
            }
        };
        *slot = Some(it.next().ok_or(CONFORMANCE_USAGE)?.clone());
    }
    let cluster = match (kubeconfig, namespace) {
        (Some(path), namespace) => Some(RealCluster {
            kubeconfig: PathBuf::from(path),
            namespace,
        }),
        (None, Some(_)) => return Err("--namespace needs --kubeconfig".into()),
        (None, None) => None,
    };
    Ok((rest, cluster))
}

fn conformance(args: &[String]) -> Result {
    let (args, cluster) = cluster_flags(args)?;
    let chosen = chosen_backends(&args, CONFORMANCE_USAGE)?;
    if let Some(cluster) = &cluster {
        if chosen.len() != 1 || chosen[0].name != CLUSTER_BACKEND {
            return Err(format!(
                "--kubeconfig runs only --backend {CLUSTER_BACKEND} against a real cluster"
            ));
        }
        if !cluster.kubeconfig.is_file() {
            return Err(format!(
                "kubeconfig {} is not a readable file",
                cluster.kubeconfig.display()
            ));
        }
        let mut cmd = cargo();
        cmd.args(["test", "-p", CLUSTER_BACKEND, "--test", "conformance"])
            .env(KUBECONFIG_ENV, &cluster.kubeconfig);
        if let Some(ns) = &cluster.namespace {
            cmd.env(NAMESPACE_ENV, ns);
        }
        return run(
            &format!(
                "conformance suite on {CLUSTER_BACKEND} against the cluster of {}",
                cluster.kubeconfig.display()
            ),
            &mut cmd,
        );
    }
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

#[cfg(test)]
mod cluster_flag_tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kubeconfig_and_namespace_are_split_from_the_backend() {
        let (rest, cluster) = cluster_flags(&args(&[
            "--backend",
            "k8slease",
            "--kubeconfig",
            "/k",
            "--namespace",
            "ns",
        ]))
        .unwrap();
        assert_eq!(rest, args(&["--backend", "k8slease"]));
        assert_eq!(
            cluster,
            Some(RealCluster {
                kubeconfig: "/k".into(),
                namespace: Some("ns".into())
            })
        );
        assert_eq!(
            cluster_flags(&args(&["--backend", "memlease"])).unwrap().1,
            None
        );
        assert!(cluster_flags(&args(&["--kubeconfig"])).is_err());
        assert!(cluster_flags(&args(&["--namespace", "ns"])).is_err());
    }

    #[test]
    fn a_cluster_is_only_for_k8slease() {
        let err = conformance(&args(&["--backend", "memlease", "--kubeconfig", "/k"]));
        assert!(err.unwrap_err().contains("only --backend k8slease"));
        let err = conformance(&args(&["--kubeconfig", "/k"]));
        assert!(err.is_err());
    }
}
