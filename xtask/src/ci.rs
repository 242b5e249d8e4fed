//! `cargo xtask ci`: everything CI checks, in order, on a machine that may
//! never have built the project.

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use crate::{Result, backends, cargo, run, services};

/// The cargo-deny release CI installs when none is present; pinned so a
/// fresh machine gets one known to build with this toolchain.
const CARGO_DENY_VERSION: &str = "0.20.2";

/// The cargo-nextest release CI installs when `cargo nextest` is missing;
/// pinned for the same reason.
const CARGO_NEXTEST_VERSION: &str = "0.9.143";

pub(crate) fn ci() -> Result {
    for (tool, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        if !has_cargo_subcommand(tool) {
            return Err(format!(
                "cargo {tool} is missing: install it with `rustup component add {component}`"
            ));
        }
    }
    let deny = cargo_deny()?;
    cargo_nextest()?;
    services::ensure(&backends::all_services())?;
    run("format", cargo().args(["fmt", "--all", "--check"]))?;
    run(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // Default features are what a dependent builds; all features are what
    // docs.rs shows. A link to an item behind a feature breaks only one.
    for features in [None, Some("--all-features")] {
        run(
            &format!("rustdoc ({})", features.unwrap_or("default features")),
            cargo()
                .args(["doc", "--workspace", "--no-deps", "--locked"])
                .args(features)
                .env("RUSTDOCFLAGS", "-D warnings"),
        )?;
    }
    // The workspace always builds grpcdriver with its server (the daemon
    // wants it); build it as a client-only user does, lints and docs.
    run(
        "grpcdriver without its server: clippy",
        cargo()
            .args(["clippy", "--package", "grpcdriver", "--locked", "--"])
            .args(["-D", "warnings"]),
    )?;
    run(
        "grpcdriver without its server: rustdoc",
        cargo()
            .args(["doc", "--package", "grpcdriver", "--no-deps", "--locked"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    run(
        "gRPC contract: generated code fresh, wire-compatible with its baseline",
        cargo().args([
            "run",
            "--locked",
            "--quiet",
            "--package",
            "xtask",
            "--",
            "proto",
            "--check",
        ]),
    )?;
    deny_on_fresh_cargo_home(&deny)?;
    // Only what ships, in publish order, each built from its package.
    crate::publish::dry_run()?;
    // Each test in a process of its own, several at once: most of them
    // wait on real time. `.config/nextest.toml` says how many, and which
    // must never overlap.
    run(
        "tests (cargo-nextest)",
        cargo().args([
            "nextest",
            "run",
            "--workspace",
            "--all-features",
            "--locked",
            "--no-fail-fast",
            "--profile",
            "ci",
        ]),
    )?;
    // nextest does not run doctests.
    run(
        "doctests",
        cargo().args(["test", "--workspace", "--all-features", "--locked", "--doc"]),
    )?;
    // Criterion runs each benchmark once when started by `cargo test`, so
    // the benches cannot rot between measured runs.
    run(
        "benches, once each (criterion test mode)",
        cargo().args(["test", "--workspace", "--locked", "--bench", "*"]),
    )?;
    crate::faults::faults(&["--profile".into(), "short".into()])?;
    crate::sim::sim(&["--profile".into(), "short".into()])?;
    crate::scale::short()?;
    println!("\nci: all checks passed");
    Ok(())
}

fn has_cargo_subcommand(name: &str) -> bool {
    cargo()
        .args([name, "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The `cargo-deny` binary, installed first if this machine has none.
fn cargo_deny() -> Result<PathBuf> {
    if let Some(found) = find_cargo_deny() {
        return Ok(found);
    }
    run(
        &format!("install cargo-deny {CARGO_DENY_VERSION}"),
        cargo().args([
            "install",
            "--locked",
            "cargo-deny",
            "--version",
            CARGO_DENY_VERSION,
        ]),
    )?;
    find_cargo_deny().ok_or_else(|| "cargo install cargo-deny succeeded but no binary found".into())
}

/// `cargo nextest`, installed first if this machine has none.
fn cargo_nextest() -> Result {
    if has_cargo_subcommand("nextest") {
        return Ok(());
    }
    run(
        &format!("install cargo-nextest {CARGO_NEXTEST_VERSION}"),
        cargo().args([
            "install",
            "--locked",
            "cargo-nextest",
            "--version",
            CARGO_NEXTEST_VERSION,
        ]),
    )?;
    if has_cargo_subcommand("nextest") {
        Ok(())
    } else {
        Err("cargo install cargo-nextest succeeded but `cargo nextest` still fails".into())
    }
}

/// Where cargo itself looks for subcommands: `$CARGO_HOME/bin`, then `PATH`.
fn find_cargo_deny() -> Option<PathBuf> {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    cargo_home
        .map(|h| h.join("bin/cargo-deny"))
        .filter(|p| p.is_file())
        .or_else(|| services::on_path("cargo-deny"))
}

/// cargo-deny reads the metadata of every crate for every platform
/// (`windows-sys`, `wasm-bindgen`, …), which a Linux build never downloads.
/// Checking against an empty `CARGO_HOME` filled only by `cargo fetch`
/// proves, on every run, that what CI fetches is all a fresh machine needs:
/// drop the fetch and this step fails as it would there.
fn deny_on_fresh_cargo_home(deny: &std::path::Path) -> Result {
    let home = env::temp_dir().join(format!("xtask-fresh-cargo-home-{}", std::process::id()));
    let _ = fs::remove_dir_all(&home);
    fs::create_dir_all(&home).map_err(|e| format!("{}: {e}", home.display()))?;
    let result = (|| {
        run(
            "fetch every platform's crates into an empty CARGO_HOME",
            cargo().args(["fetch", "--locked"]).env("CARGO_HOME", &home),
        )?;
        let deny_dir = deny.parent().unwrap_or(std::path::Path::new("."));
        let path = env::join_paths(
            std::iter::once(deny_dir.to_path_buf())
                .chain(env::var_os("PATH").iter().flat_map(env::split_paths)),
        )
        .map_err(|e| e.to_string())?;
        run(
            "cargo-deny, offline, on that CARGO_HOME (licences, bans, sources)",
            Command::new(deny)
                .current_dir(crate::workspace_root())
                .args(["deny", "--offline", "check", "licenses", "bans", "sources"])
                .env("CARGO_HOME", &home)
                .env("PATH", path)
                .env(
                    "CARGO",
                    env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
                ),
        )
    })();
    let _ = fs::remove_dir_all(&home);
    result
}
