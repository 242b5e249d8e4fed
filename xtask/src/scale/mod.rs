//! `cargo xtask scale`: what grows with the number of live runs, and how
//! long a takeover takes, measured on the real server binaries against
//! real services.
//!
//! - **Live runs**: N runs held by one `mecated` process on each lease
//!   backend and unleased; its CPU over a steady window (from
//!   `/proc/<pid>/stat`) and its resident memory (`VmRSS`, less the idle
//!   process's), at two sizes.
//! - **Takeover**: a holder killed (SIGKILL) or stopped (SIGTERM) mid-run,
//!   and the time until another replica, asking all along, has its first
//!   run of the session: on every backend, against the TTL.
//! - **Followers**: idle SSE followers of live runs, several per session;
//!   what they add to the server's CPU and memory, at two sizes, and that
//!   each received its run's end.
//!
//! The full form (`cargo xtask scale`, also run by a full `cargo xtask
//! bench`) builds release binaries and writes its table into
//! docs/performance.md. The short form (`--short`, run by `cargo xtask ci`)
//! uses small sizes and the debug binaries and checks behaviour only:
//! every run started was held and ended cancelled, every takeover
//! happened under a greater token, every follower received its run's end. It never judges a duration.

mod counting_proxy;
mod followers;
mod http;
mod live;
mod process;
mod report;
mod rig;
mod takeover;

use std::time::Duration;

use followers::{FollowerFigure, FollowerSize};
use live::{LiveFigure, LivePlan};
use process::Binaries;
use rig::Backend;
use takeover::{TakeoverFigure, TakeoverPlan};

use crate::services::{self, Service};
use crate::{Result, cargo, run};

const USAGE: &str =
    "usage: cargo xtask scale [--short] [--only live|takeover|followers] [--backend NAME]";

/// The live-run backends, the unleased baseline last.
const LIVE: &[Backend] = &[
    Backend::File,
    Backend::Etcd,
    Backend::LeaseService,
    Backend::Redis,
    Backend::K8s,
    Backend::Unleased,
];

const TAKEOVER: &[Backend] = &[
    Backend::File,
    Backend::Etcd,
    Backend::LeaseService,
    Backend::Redis,
    Backend::Postgres,
    Backend::K8s,
];

/// The sizes and lengths of one form.
struct Form {
    short: bool,
    /// Which parts run.
    live_runs: bool,
    takeovers: bool,
    followers: bool,
    /// One backend only: file, etcd, leased, redis, postgres, k8s or
    /// unleased.
    backend: Option<String>,
    sizes: [usize; 2],
    follower_sizes: [FollowerSize; 2],
    live: LivePlan,
    takeover: TakeoverPlan,
}

impl Form {
    fn full() -> Form {
        Form {
            short: false,
            live_runs: true,
            takeovers: true,
            followers: true,
            backend: None,
            sizes: [10, 10_000],
            follower_sizes: [
                FollowerSize {
                    sessions: 10,
                    followers: 100,
                },
                FollowerSize {
                    sessions: 1_000,
                    followers: 10_000,
                },
            ],
            live: LivePlan {
                ttl: Duration::from_secs(6),
                // A held run reads its cancel requests on an interval of
                // its own besides the store's notification: `mecated`'s
                // `CANCEL_SAFETY_READ`, 30 s. Runs started together read
                // together, so a shorter window shows either none of
                // those reads or a burst of them; one whole interval
                // holds each run's reads once, whatever its phase.
                window: Duration::from_secs(30),
            },
            takeover: TakeoverPlan {
                ttl: Duration::from_secs(6),
                repeats: 3,
            },
        }
    }

    fn short() -> Form {
        Form {
            short: true,
            live_runs: true,
            takeovers: true,
            followers: true,
            backend: None,
            sizes: [10, 100],
            follower_sizes: [
                FollowerSize {
                    sessions: 2,
                    followers: 4,
                },
                FollowerSize {
                    sessions: 10,
                    followers: 40,
                },
            ],
            // Two renewal periods in the window, for the request counts.
            live: LivePlan {
                ttl: Duration::from_secs(3),
                window: Duration::from_secs(2),
            },
            // etcd grants no lease shorter than two seconds.
            takeover: TakeoverPlan {
                ttl: Duration::from_secs(2),
                repeats: 1,
            },
        }
    }
}

impl Form {
    fn wants(&self, backend: Backend) -> bool {
        self.backend
            .as_deref()
            .is_none_or(|name| name == backend.key())
    }
}

pub(crate) fn scale(args: &[String]) -> Result {
    let mut form = Form::full();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--short" => {
                form = Form {
                    live_runs: form.live_runs,
                    takeovers: form.takeovers,
                    followers: form.followers,
                    backend: form.backend.take(),
                    ..Form::short()
                };
            }
            "--only" => {
                let part = it.next().map(String::as_str);
                if !matches!(part, Some("live" | "takeover" | "followers")) {
                    return Err(USAGE.into());
                }
                form.live_runs = part == Some("live");
                form.takeovers = part == Some("takeover");
                form.followers = part == Some("followers");
            }
            "--backend" => form.backend = Some(it.next().ok_or(USAGE)?.clone()),
            _ => return Err(USAGE.into()),
        }
    }
    measure(&form)
}

/// The short form, as CI runs it.
pub(crate) fn short() -> Result {
    measure(&Form::short())
}

fn measure(form: &Form) -> Result {
    services::ensure(&[Service::Redis, Service::Etcd, Service::Postgres])?;
    // What is built, not what the tree holds once the run is over.
    let commit = crate::bench::commit()?;
    let bins = build(form.short)?;
    let built = report::Built {
        commit,
        load: report::load_average(),
    };
    let mut figures = Vec::new();
    // A full run goes on past a backend that failed, so one fault does not
    // cost the other figures; it still fails in the end.
    let mut failures = Vec::new();
    let sizes: &[usize] = if form.live_runs { &form.sizes } else { &[] };
    for &runs in sizes {
        for &backend in LIVE.iter().filter(|b| form.wants(**b)) {
            println!("\n==> scale: {runs} live runs, {}", backend.name());
            let figure = match live::live(backend, runs, &form.live, &bins) {
                Ok(figure) => figure,
                Err(e) if !form.short => {
                    eprintln!("  failed: {e}");
                    failures.push(format!("{runs} live runs, {}: {e}", backend.name()));
                    continue;
                }
                Err(e) => return Err(e),
            };
            println!(
                "  mecated CPU {:.2} % of a core, RSS +{} KiB",
                figure.cpu_percent(),
                figure.rss_growth_kib
            );
            figures.push(figure);
        }
    }
    let mut takeovers = Vec::new();
    let backends = if form.takeovers { TAKEOVER } else { &[] };
    for &backend in backends.iter().filter(|b| form.wants(**b)) {
        println!("\n==> scale: takeover, {}", backend.name());
        let measured = match takeover::takeovers(backend, &form.takeover, &bins) {
            Ok(measured) => measured,
            Err(e) if !form.short => {
                eprintln!("  failed: {e}");
                failures.push(format!("takeover, {}: {e}", backend.name()));
                continue;
            }
            Err(e) => return Err(e),
        };
        for figure in measured {
            println!(
                "  after {}: {:?} (median of {:?})",
                figure.signal,
                figure.median(),
                figure.times
            );
            takeovers.push(figure);
        }
    }
    let mut follower_figures = Vec::new();
    // Followers are measured on file leases: what they cost is the
    // server's, whatever the backend.
    let follower_sizes: &[FollowerSize] = if form.followers && form.wants(Backend::File) {
        &form.follower_sizes
    } else {
        &[]
    };
    for &size in follower_sizes {
        println!(
            "\n==> scale: {} idle followers of {} sessions",
            size.followers, size.sessions
        );
        let figure = match followers::followers(size, &form.live, &bins) {
            Ok(figure) => figure,
            Err(e) if !form.short => {
                eprintln!("  failed: {e}");
                failures.push(format!("{} followers: {e}", size.followers));
                continue;
            }
            Err(e) => return Err(e),
        };
        println!(
            "  they add {:.2} % of a core, {:.1} KiB each",
            figure.added_cpu_percent(),
            figure.rss_per_follower_kib()
        );
        follower_figures.push(figure);
    }
    let measured = Measured {
        live: &figures,
        takeovers: &takeovers,
        followers: &follower_figures,
    };
    finish(form, &measured, &built, &failures)
}

/// What a run measured, for the table.
struct Measured<'a> {
    live: &'a [LiveFigure],
    takeovers: &'a [TakeoverFigure],
    followers: &'a [FollowerFigure],
}

fn finish(
    form: &Form,
    measured: &Measured<'_>,
    built: &report::Built,
    failures: &[String],
) -> Result {
    let mut table = report::render(form.sizes, measured);
    if !failures.is_empty() {
        table.push_str("\nFailed in this run (no figure above):\n\n");
        for f in failures {
            let first = f.lines().next().unwrap_or_default();
            table.push_str(&format!("- {first}\n"));
        }
    }
    let failed = || Err(format!("scale: {} measurements failed", failures.len()));
    println!("\n{table}");
    if !(form.live_runs && form.takeovers && form.followers && form.backend.is_none()) {
        println!("(a partial run leaves the performance page as it is)");
        return if failures.is_empty() {
            Ok(())
        } else {
            failed()
        };
    }
    if form.short {
        println!("scale (short form): every run held and cancelled, every takeover seen");
        return Ok(());
    }
    report::write(&table, form.live.window, form.takeover.repeats, built)?;
    if failures.is_empty() {
        Ok(())
    } else {
        failed()
    }
}

/// Names a directory of binaries already built, to measure them as they
/// are (a build of the tree as it is now can take long on a busy machine).
const BINARIES_ENV: &str = "MECATL_SCALE_BINARIES";

/// Builds the server binaries of one profile, one package at a time (as
/// the fault runs do, so no build of a package's features undoes
/// another's), and says where they are.
fn build(short: bool) -> Result<Binaries> {
    if let Some(dir) = std::env::var_os(BINARIES_ENV) {
        println!(
            "scale: the binaries in {} ({BINARIES_ENV})",
            dir.to_string_lossy()
        );
        return Ok(Binaries {
            dir: dir.into(),
            _copy: None,
        });
    }
    let profile: &[&str] = if short { &[] } else { &["--release"] };
    for package in SERVERS {
        run(
            &format!("build {package}"),
            cargo()
                .args([
                    "build",
                    "--locked",
                    "--quiet",
                    "--bins",
                    "--package",
                    package,
                ])
                .args(profile),
        )?;
    }
    let dir = crate::faults::target_dir()?.join(if short { "debug" } else { "release" });
    Binaries::snapshot(&dir, &SERVERS)
}

/// The packages whose binaries are measured, each named as its binary.
const SERVERS: [&str; 3] = ["mecated", "mecatl-leased", "k8s-emulator"];
