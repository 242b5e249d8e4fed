//! `cargo xtask faults`: every backend under injected faults, each history
//! checked for two owners acting on one session, then the deliberately
//! broken variants, which the checker must catch.
//!
//! The runs live in `lease-history`'s `faults` example, where the backends
//! are dev-dependencies (xtask depends on no backend); this makes sure the
//! services exist, then builds and runs it.

use crate::services::{self, Service};
use crate::{Result, cargo, run};

const USAGE: &str = "usage: cargo xtask faults [--backend NAME|all] [--ops N] [--seed S] \
                     [--profile short|long] [--out DIR] [--skip-broken] [--broken-only]";

/// Backends whose runs start a service.
const NEEDS: &[(&str, Service)] = &[
    ("redis", Service::Redis),
    ("etcd", Service::Etcd),
    ("grpc-etcd", Service::Etcd),
    ("etcd-partitions", Service::Etcd),
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
    let broken_only = args.iter().any(|a| a == "--broken-only");
    let mut wanted: Vec<Service> = NEEDS
        .iter()
        .filter(|(name, _)| !broken_only && (backend == "all" || backend == *name))
        .map(|(_, s)| *s)
        .collect();
    wanted.dedup();
    services::ensure(&wanted)?;
    run(
        &format!("fault injection ({})", args.join(" ")),
        cargo()
            .args([
                "run",
                "--locked",
                "--quiet",
                "--package",
                "lease-history",
                "--example",
                "faults",
                "--",
            ])
            .args(args),
    )
}
