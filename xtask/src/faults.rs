//! `cargo xtask faults`: every backend under injected faults, each history
//! checked for two owners acting on one session, then the deliberately
//! broken variants, which the checker must catch.
//!
//! The runs live in the `fault-runs` crate (`testing/fault-runs`, its
//! binary `faults`), which depends on every backend (xtask depends on
//! none); this makes sure the services exist, then builds and runs it.

use std::path::PathBuf;

use crate::services::{self, Service};
use crate::{Result, cargo, run};

/// The target directory cargo builds into (`CARGO_TARGET_DIR`, the
/// configuration, or the workspace's `target`), as cargo itself reports it.
pub(crate) fn target_dir() -> Result<PathBuf> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata: no target_directory".into())
}

const USAGE: &str = "usage: cargo xtask faults [--backend NAME|all] [--ops N] [--seed S] \
                     [--profile short|long] [--out DIR] [--skip-broken] [--broken-only] \
                     [--variant NAME]";

/// The session server's end-to-end runs, which start its binaries.
const SERVERS: &[&str] = &["mecated", "mecated-etcd", "mecated-postgres", "mecak8s"];

/// Services the broken variants start, whichever backend runs: some run
/// on a backend's own rig.
const BROKEN_NEEDS: &[Service] = &[Service::Redis, Service::Postgres];

/// Backends whose runs start a service.
const NEEDS: &[(&str, Service)] = &[
    ("redis", Service::Redis),
    ("mecak8s", Service::Redis),
    ("postgres", Service::Postgres),
    ("mecated-postgres", Service::Postgres),
    ("etcd", Service::Etcd),
    ("grpc-etcd", Service::Etcd),
    ("etcd-partitions", Service::Etcd),
    ("mecated-etcd", Service::Etcd),
    ("etcd-partitions", Service::Iproute2),
];

pub(crate) fn faults(args: &[String]) -> Result {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let backend = args
        .iter()
        .position(|a| a == "--backend")
        .map(|i| args.get(i + 1).map(String::as_str).ok_or(USAGE))
        .transpose()?
        .unwrap_or("all");
    let broken_only = args
        .iter()
        .any(|a| a == "--broken-only" || a == "--variant");
    let mut wanted: Vec<Service> = NEEDS
        .iter()
        .filter(|(name, _)| !broken_only && (backend == "all" || backend == *name))
        .map(|(_, s)| *s)
        .collect();
    if !args.iter().any(|a| a == "--skip-broken") {
        wanted.extend(BROKEN_NEEDS);
    }
    wanted.sort();
    wanted.dedup();
    services::ensure(&wanted)?;
    // The session server runs start real server processes: build them
    // first and say where they are.
    let servers = broken_only || backend == "all" || SERVERS.contains(&backend);
    let mut faults = cargo();
    if servers {
        run(
            "build the server binaries",
            cargo().args([
                "build",
                "--locked",
                "--quiet",
                "--package",
                "mecated",
                "--bins",
                // The broken variants are asked for by environment, in
                // their runs alone; without it the binary behaves as one
                // built without the feature.
                "--features",
                "broken-variants",
            ]),
        )?;
        let bin = target_dir()?.join("debug");
        faults
            .env("MECATL_MECATED_BIN", bin.join("mecated"))
            .env("MECATL_MECAK8S_BIN", bin.join("mecak8s"));
    }
    run(
        &format!("fault injection ({})", args.join(" ")),
        faults
            .args([
                "run",
                "--locked",
                "--quiet",
                "--package",
                "fault-runs",
                "--bin",
                "faults",
                "--",
            ])
            .args(args),
    )
}
