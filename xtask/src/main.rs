//! Project automation, in Rust so it runs wherever cargo does.
//!
//! ```text
//! cargo xtask ci                      everything CI checks, in order
//! cargo xtask conformance [--backend NAME]
//!                                     the behaviour suite against one or every backend
//! cargo xtask bench [--quick] [FILTER]
//!                                     criterion benches, then one table of ours / limit ratios
//! ```

use std::collections::BTreeMap;
use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, String>;

/// Crates whose `tests/conformance.rs` runs the behaviour suite.
const BACKENDS: &[&str] = &["memlease", "flocklease"];

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("conformance") => conformance(&args[1..]),
        Some("bench") => bench(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <ci | conformance [--backend NAME] | bench [--quick] [FILTER]>"
            );
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

fn has_cargo_subcommand(name: &str) -> bool {
    cargo()
        .args([name, "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ci() -> Result {
    for (tool, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        if !has_cargo_subcommand(tool) {
            return Err(format!(
                "cargo {tool} is missing: install it with `rustup component add {component}`"
            ));
        }
    }
    if !has_cargo_subcommand("deny") {
        run(
            "install cargo-deny",
            cargo().args(["install", "--locked", "cargo-deny"]),
        )?;
    }
    run("format", cargo().args(["fmt", "--all", "--check"]))?;
    run(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run(
        "rustdoc",
        cargo()
            .args(["doc", "--workspace", "--no-deps", "--all-features"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    run(
        "cargo-deny (licences, bans, sources)",
        cargo().args(["deny", "--offline", "check", "licenses", "bans", "sources"]),
    )?;
    run(
        "package every publishable crate",
        cargo().args([
            "package",
            "--workspace",
            "--no-verify",
            "--allow-dirty",
            "--quiet",
        ]),
    )?;
    run(
        "tests",
        cargo().args(["test", "--workspace", "--all-features", "--no-fail-fast"]),
    )?;
    println!("\nci: all checks passed");
    Ok(())
}

fn conformance(args: &[String]) -> Result {
    let chosen: Vec<&str> = match args {
        [] => BACKENDS.to_vec(),
        [flag, name] if flag == "--backend" => {
            let name = name.as_str();
            if !BACKENDS.contains(&name) {
                return Err(format!(
                    "unknown backend {name:?}; known: {}",
                    BACKENDS.join(", ")
                ));
            }
            vec![name]
        }
        _ => return Err("usage: cargo xtask conformance [--backend NAME]".into()),
    };
    for backend in chosen {
        run(
            &format!("conformance suite on {backend}"),
            cargo().args(["test", "-p", backend, "--test", "conformance*"]),
        )?;
    }
    Ok(())
}

/// One criterion measurement: group, function, median in nanoseconds.
#[derive(Debug)]
struct Measurement {
    group: String,
    function: String,
    median_ns: f64,
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Walks target/criterion for `<bench>/new/{benchmark,estimates}.json`.
fn collect(dir: &Path, out: &mut Vec<Measurement>) -> Result {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name() == Some(OsStr::new("new")) {
            let meta = read_json(&path.join("benchmark.json"))?;
            let est = read_json(&path.join("estimates.json"))?;
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let median = est["median"]["point_estimate"]
                .as_f64()
                .ok_or_else(|| format!("{}: no median", path.display()))?;
            out.push(Measurement {
                group: text(&meta["group_id"]),
                function: text(&meta["function_id"]),
                median_ns: median,
            });
        } else if path.file_name() != Some(OsStr::new("report")) {
            collect(&path, out)?;
        }
    }
    Ok(())
}

fn human(ns: f64) -> String {
    match ns {
        n if n < 1e3 => format!("{n:.1} ns"),
        n if n < 1e6 => format!("{:.2} µs", n / 1e3),
        n if n < 1e9 => format!("{:.2} ms", n / 1e6),
        n => format!("{:.2} s", n / 1e9),
    }
}

fn bench(args: &[String]) -> Result {
    let quick = args.iter().any(|a| a == "--quick");
    let filter: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let criterion_dir = workspace_root().join("target/criterion");
    // Stale results from removed benches must not reach the table.
    let _ = fs::remove_dir_all(&criterion_dir);
    let mut cmd = cargo();
    cmd.args(["bench", "--workspace", "--benches", "--"]);
    if quick {
        cmd.args(["--warm-up-time", "0.5", "--measurement-time", "1"]);
    }
    cmd.args(filter.iter().map(|s| s.as_str()));
    run("criterion benches", &mut cmd)?;

    let mut all = Vec::new();
    collect(&criterion_dir, &mut all)?;
    let mut groups: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for m in all {
        groups
            .entry(m.group)
            .or_default()
            .insert(m.function, m.median_ns);
    }
    println!("\n| operation | ours (median) | limit (median) | ours / limit |");
    println!("|---|---|---|---|");
    for (group, fns) in &groups {
        match (fns.get("ours"), fns.get("limit")) {
            (Some(&ours), Some(&limit)) => println!(
                "| {group} | {} | {} | {:.2}× |",
                human(ours),
                human(limit),
                ours / limit
            ),
            _ => {
                for (f, ns) in fns {
                    println!("| {group}/{f} | {} | — | — |", human(*ns));
                }
            }
        }
    }
    Ok(())
}
