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

/// The page holding the performance table, from the workspace root (the
/// README points to it).
const TABLE_FILE: &str = "docs/performance.md";

/// The section of [`TABLE_FILE`] `cargo xtask bench` owns: everything
/// between these markers is rewritten by a full run, so the figures have
/// one source.
const TABLE_BEGIN: &str = "<!-- bench-table:begin (written by cargo xtask bench; do not edit) -->";
const TABLE_END: &str = "<!-- bench-table:end -->";

pub(crate) fn bench(args: &[String]) -> Result {
    let quick = args.iter().any(|a| a == "--quick");
    let filter: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let criterion_dir = workspace_root().join("target/criterion");
    // Stale results from removed benches must not reach the table.
    let _ = fs::remove_dir_all(&criterion_dir);
    let mut cmd = cargo();
    // `--bench '*'`: bench targets only. Library and binary targets run on
    // libtest, which rejects criterion's flags.
    cmd.args(["bench", "--workspace", "--locked", "--bench", "*", "--"]);
    if quick {
        cmd.args(["--warm-up-time", "0.5", "--measurement-time", "1"]);
    }
    cmd.args(filter.iter().map(|s| s.as_str()));
    run("criterion benches", &mut cmd)?;

    let mut all = Vec::new();
    collect(&criterion_dir, &mut all)?;
    let table = render(&all);
    println!("\n{table}");
    if filter.is_empty() {
        let header = format!(
            "Measured by `cargo xtask bench{}` on commit {}, {} ({} cores). Criterion \
             medians; each limit is measured in the same run as the row it bounds.",
            if quick { " --quick" } else { "" },
            commit()?,
            today()?,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
        write_table(&format!("{header}\n\n{table}"))?;
        println!("{TABLE_FILE}: performance table rewritten");
        crate::scale::scale(&[])?;
    } else {
        println!("(a filtered run leaves {TABLE_FILE} as it is)");
    }
    Ok(())
}

fn render(all: &[Measurement]) -> String {
    let mut groups: BTreeMap<&str, BTreeMap<&str, f64>> = BTreeMap::new();
    for m in all {
        groups
            .entry(&m.group)
            .or_default()
            .insert(&m.function, m.median_ns);
    }
    let mut out = String::from(
        "| operation | ours (median) | limit (median) | ours / limit |\n|---|---|---|---|\n",
    );
    for (group, fns) in &groups {
        match (fns.get("ours"), fns.get("limit")) {
            (Some(&ours), Some(&limit)) => out.push_str(&format!(
                "| {group} | {} | {} | {:.2}× |\n",
                human(ours),
                human(limit),
                ours / limit
            )),
            _ => {
                for (f, ns) in fns {
                    out.push_str(&format!("| {group}/{f} | {} | — | — |\n", human(*ns)));
                }
            }
        }
    }
    out
}

/// The commit measured, marked when the tree had uncommitted changes.
pub(crate) fn commit() -> Result<String> {
    let out = |args: &[&str]| -> Result<String> {
        let o = std::process::Command::new("git")
            .current_dir(workspace_root())
            .args(args)
            .output()
            .map_err(|e| format!("git: {e}"))?;
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let hash = out(&["rev-parse", "--short=10", "HEAD"])?;
    let dirty = !out(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(if dirty {
        format!("`{hash}` with uncommitted changes")
    } else {
        format!("`{hash}`")
    })
}

pub(crate) fn today() -> Result<String> {
    let o = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .map_err(|e| format!("date: {e}"))?;
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

fn write_table(section: &str) -> Result {
    let path = workspace_root().join(TABLE_FILE);
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (Some(begin), Some(end)) = (text.find(TABLE_BEGIN), text.find(TABLE_END)) else {
        return Err(format!(
            "{TABLE_FILE} has no bench-table markers ({TABLE_BEGIN} … {TABLE_END})"
        ));
    };
    let new = format!("{}{TABLE_BEGIN}\n{section}{}", &text[..begin], &text[end..]);
    fs::write(&path, new).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full `cargo xtask bench` run must find where its table goes: the
    /// page exists and holds each marker once, begin before end.
    #[test]
    fn the_table_page_has_its_markers() {
        let path = workspace_root().join(TABLE_FILE);
        let text = fs::read_to_string(&path).expect("the performance page exists");
        let once = |marker| text.matches(marker).count() == 1;
        assert!(
            once(TABLE_BEGIN) && once(TABLE_END),
            "{TABLE_FILE}: one of each marker"
        );
        assert!(
            text.find(TABLE_BEGIN) < text.find(TABLE_END),
            "{TABLE_FILE}: begin first"
        );
    }
}
