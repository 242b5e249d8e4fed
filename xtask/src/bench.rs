//! `cargo xtask bench`: the criterion benches, then one table of our cost
//! against the limit measured beside it in the same run.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use crate::{Result, cargo, run, workspace_root};

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

pub(crate) fn bench(args: &[String]) -> Result {
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
