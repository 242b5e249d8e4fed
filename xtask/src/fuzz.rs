//! `cargo xtask fuzz`: the coverage-guided fuzz targets in `fuzz/` (cargo
//! fuzz, libFuzzer), each for a time, with the executions and findings of
//! each run printed.
//!
//! cargo fuzz wants a nightly compiler for its sanitizer flags; without a
//! sanitizer (`-s none`) it needs only the coverage instrumentation, which
//! the stable compiler has behind `RUSTC_BOOTSTRAP`. cargo-fuzz itself is
//! installed from crates.io when missing.

use std::process::Command;

use crate::{Result, cargo, run, workspace_root};

/// Every target in `fuzz/fuzz_targets`.
const TARGETS: [&str; 5] = [
    "ids",
    "flock_record",
    "jsonl_reader",
    "grpc_requests",
    "http_requests",
];

pub(crate) fn fuzz(args: &[String]) -> Result {
    let mut seconds = 60u64;
    let mut targets = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&s| s > 0)
                    .ok_or("--seconds takes a positive number")?;
            }
            t if TARGETS.contains(&t) => targets.push(t),
            other => {
                return Err(format!(
                    "unknown fuzz argument {other:?}; targets: {}",
                    TARGETS.join(", ")
                ));
            }
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    let has_cargo_fuzz = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cargo_fuzz {
        run(
            "install cargo-fuzz",
            cargo().args(["install", "cargo-fuzz", "--locked"]),
        )?;
    }
    let dir = workspace_root().join("fuzz");
    let mut report = Vec::new();
    for target in targets {
        let mut cmd = cargo();
        cmd.current_dir(&dir).env("RUSTC_BOOTSTRAP", "1").args([
            "fuzz",
            "run",
            "--sanitizer",
            "none",
            target,
        ]);
        // Checked-in seeds (`fuzz/seeds/TARGET`) start a target at the
        // inputs worth varying, which random bytes reach only slowly: a
        // well-formed request under a client's own token, say. New inputs
        // go to the first directory, the untracked corpus.
        let seeds = dir.join("seeds").join(target);
        if seeds.is_dir() {
            let corpus = dir.join("corpus").join(target);
            std::fs::create_dir_all(&corpus)
                .map_err(|e| format!("creating {}: {e}", corpus.display()))?;
            cmd.arg(corpus).arg(seeds);
        }
        cmd.arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg("-print_final_stats=1");
        let output = command_output(&format!("fuzz {target} for {seconds} s"), &mut cmd)?;
        let executions = output
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .map_or("?".to_owned(), |n| n.trim().to_owned());
        report.push((target, executions, output.contains("SUMMARY: libFuzzer")));
    }
    println!(
        "\n{:<16} {:>14}  {:>8}  findings",
        "target", "executions", "seconds"
    );
    let mut failed = false;
    for (target, executions, crashed) in report {
        println!(
            "{target:<16} {executions:>14}  {seconds:>8}  {}",
            if crashed {
                "a crash (see fuzz/artifacts)"
            } else {
                "none"
            }
        );
        failed |= crashed;
    }
    if failed {
        return Err("a fuzz target found a crash".into());
    }
    Ok(())
}

/// Runs `cmd` and returns what it printed on stderr (where libFuzzer
/// reports), after showing its last lines.
fn command_output(step: &str, cmd: &mut Command) -> Result<String> {
    println!("\n==> {step}");
    let output = cmd
        .output()
        .map_err(|e| format!("{step}: cannot start {:?}: {e}", cmd.get_program()))?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    for line in &lines[lines.len().saturating_sub(8)..] {
        println!("    {line}");
    }
    Ok(stderr)
}
