//! The scale table, and its section of the performance page.

use std::fmt::Write as _;
use std::fs;
use std::time::Duration;

use super::Measured;
use super::followers::FollowerFigure;
use super::live::{LiveFigure, find};
use super::rig::Backend;
use super::takeover::{SHUTDOWN_TIMEOUT, TakeoverFigure};
use crate::{Result, workspace_root};

const PAGE: &str = "docs/performance.md";

/// The section of [`PAGE`] `cargo xtask scale` owns, like the bench table's.
const BEGIN: &str = "<!-- scale-table:begin (written by cargo xtask scale; do not edit) -->";
const END: &str = "<!-- scale-table:end -->";

fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ratio(small: f64, large: f64) -> String {
    match large / small {
        r if !r.is_finite() => "—".into(),
        r if r < 10.0 => format!("{r:.2}×"),
        r => format!("{r:.0}×"),
    }
}

/// Each live-run figure of each backend at both sizes, with the ratio.
fn live_rows(sizes: [usize; 2], live: &[LiveFigure], out: &mut String) {
    let [small, large] = sizes;
    let _ = writeln!(
        out,
        "| backend | figure | {} runs | {} runs | ratio |\n|---|---|---|---|---|",
        count(small),
        count(large)
    );
    let backends: Vec<Backend> = live.iter().map(|f| f.backend).fold(Vec::new(), |mut v, b| {
        if !v.contains(&b) {
            v.push(b);
        }
        v
    });
    for backend in backends {
        let (Some(s), Some(l)) = (find(live, backend, small), find(live, backend, large)) else {
            continue;
        };
        let above = |f: &LiveFigure| {
            find(live, Backend::Unleased, f.runs).map(|u| f.cpu_percent() - u.cpu_percent())
        };
        let per_run = |f: &LiveFigure| f.cpu_share * 1e6 / f.runs as f64;
        let rss = |f: &LiveFigure| f.rss_growth_kib as f64 / f.runs as f64;
        let name = backend.name();
        let mut row = |figure: &str, a: f64, b: f64, unit: &str| {
            let _ = writeln!(
                out,
                "| {name} | {figure} | {a:.2}{unit} | {b:.2}{unit} | {} |",
                ratio(a, b)
            );
        };
        row(
            "mecated CPU, % of one core",
            s.cpu_percent(),
            l.cpu_percent(),
            " %",
        );
        if backend.leased()
            && let (Some(a), Some(b)) = (above(s), above(l))
        {
            row("above unleased, % of one core", a, b, " %");
        }
        row(
            "CPU per held run, µs per second",
            per_run(s),
            per_run(l),
            "",
        );
        row("RSS per held run, KiB", rss(s), rss(l), "");
        if let (Some(a), Some(b)) = (s.api_requests_per_period, l.api_requests_per_period) {
            row("API requests per renewal period", a, b, "");
        }
    }
}

fn seconds(d: Duration) -> String {
    match d.as_secs_f64() {
        s if s < 1.0 => format!("{:.0} ms", s * 1e3),
        s => format!("{s:.2} s"),
    }
}

fn ttls(share: f64) -> String {
    if share < 0.01 {
        "< 0.01".into()
    } else {
        format!("{share:.2}")
    }
}

fn takeover_rows(takeovers: &[TakeoverFigure], out: &mut String) {
    out.push_str(
        "\n| backend | TTL | after SIGKILL | in TTLs | after SIGTERM | in TTLs |\n\
         |---|---|---|---|---|---|\n",
    );
    let mut seen = Vec::new();
    for f in takeovers {
        if seen.contains(&f.backend) {
            continue;
        }
        seen.push(f.backend);
        let by = |sig| {
            takeovers
                .iter()
                .find(|t| t.backend == f.backend && t.signal == sig)
        };
        let cell = |t: Option<&TakeoverFigure>| {
            t.map_or("— | —".into(), |t| {
                format!("{} | {}", seconds(t.median()), ttls(t.in_ttls()))
            })
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            f.backend.name(),
            seconds(f.ttl),
            cell(by(nix::sys::signal::Signal::SIGKILL)),
            cell(by(nix::sys::signal::Signal::SIGTERM)),
        );
    }
}

/// Idle followers at each size: the server's CPU without and with them,
/// what they add, and their memory.
fn follower_rows(followers: &[FollowerFigure], out: &mut String) {
    if followers.is_empty() {
        return;
    }
    out.push_str(
        "\n| followers | of sessions | mecated CPU, runs alone | with the followers idle | \
         added, % of one core | RSS per follower, KiB |\n|---|---|---|---|---|---|\n",
    );
    for f in followers {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} % | {:.2} % | {:.2} % | {:.1} |",
            count(f.size.followers),
            count(f.size.sessions),
            f.cpu_without * 100.0,
            f.cpu_with * 100.0,
            f.added_cpu_percent(),
            f.rss_per_follower_kib(),
        );
    }
}

pub(super) fn render(sizes: [usize; 2], measured: &Measured<'_>) -> String {
    let mut out = String::new();
    if !measured.live.is_empty() {
        live_rows(sizes, measured.live, &mut out);
    }
    if !measured.takeovers.is_empty() {
        takeover_rows(measured.takeovers, &mut out);
    }
    follower_rows(measured.followers, &mut out);
    out
}

/// The one-minute load average: the cores are shared, and what else ran
/// shows in the figures.
pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// Rewrites the scale section of [`PAGE`], appending one with its markers
/// when the page has none yet.
/// The commit the binaries were built from, and how busy the machine was
/// then.
pub(super) struct Built {
    pub(super) commit: String,
    pub(super) load: String,
}

pub(super) fn write(table: &str, window: Duration, repeats: usize, built: &Built) -> Result {
    let header = format!(
        "Measured by `cargo xtask scale` on commit {}, {} ({} cores), release binaries. \
         Live runs: echo runs of an hour held by one `mecated` (TTL 6 s), CPU over {} s \
         (one interval of the runs' cancel safety reads) once all had started and renewed (`/proc/<pid>/stat`), resident memory less the \
         idle server's; \"above unleased\" subtracts the unleased server's CPU at the \
         same size. Kubernetes leases are in the API emulator, reached in plain \
         HTTP through a proxy that counts the requests; a renewal period is a \
         third of the TTL. Takeover: the holder killed or stopped half a TTL into a run, the \
         time until another replica (asking with `?wait`) started its run; median of {}. \
         A stopped holder cancels its runs at once (`--drain-timeout 0s`) and releases \
         their leases (`--shutdown-timeout` {} s, the default, bounds it). Followers: idle SSE \
         followers of live runs on file leases, spread evenly over the sessions, each \
         a connection of its own; CPU over the same window. CPU is read in clock \
         ticks: {:.2} % of a core is one tick in {} s. Load average when the run \
         started: {}.",
        built.commit,
        crate::bench::today()?,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        window.as_secs(),
        repeats,
        SHUTDOWN_TIMEOUT.as_secs(),
        // A tick is 10 ms (`CLK_TCK` is 100 on Linux).
        1.0 / window.as_secs_f64(),
        window.as_secs(),
        built.load,
    );
    let section = format!("{header}\n\n{table}");
    let path = workspace_root().join(PAGE);
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let new = match (text.find(BEGIN), text.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!("{}{BEGIN}\n{section}{}", &text[..begin], &text[end..])
        }
        _ => format!(
            "{}\n## Scale\n\nWritten by `cargo xtask scale` (and a full `cargo xtask bench`).\n\n\
             {BEGIN}\n{section}{END}\n",
            text.trim_end()
        ),
    };
    fs::write(&path, new).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{PAGE}: scale table rewritten");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_have_thousands_separators() {
        assert_eq!(count(10), "10");
        assert_eq!(count(10_000), "10,000");
        assert_eq!(count(1_000_000), "1,000,000");
    }
}
