//! Every backend of the workspace under faults, each history checked, then
//! the broken variants, which the checker must catch. `cargo xtask faults`
//! runs this; see `--help`.

mod e2e;
mod holders;
mod injectors;
mod partitions;
mod rewinds;
mod rigs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_history::broken::{
    BrokenLease, BrokenStore, LeaseBreakage, SettingBreakage, StoreBreakage,
};
use lease_history::{History, Progress, Property, Verdict, Workload, check, run, write_svg};
use lease_port::{Clock, SessionLease};

const USAGE: &str = "usage: faults [--backend NAME|all] [--ops N] [--seed S] \
                     [--profile short|long] [--out DIR] [--skip-broken] [--broken-only] \
                     [--variant NAME]\n\
                     --variant runs that broken variant alone (a name of the summary, \
                     e.g. renew-ignores-loss or effect-fence-ignores-tokens)\n\
                     backends: memlease flocklease grpc-memlease grpc-flocklease grpc-etcd etcd redis \
                     postgres k8s etcd-partitions mecated mecated-etcd mecated-postgres mecak8s (the \
                     session server end to end; --ops counts requests)";

/// The backends, in the order `all` runs them.
const BACKENDS: &[&str] = &[
    "memlease",
    "flocklease",
    "grpc-memlease",
    "grpc-flocklease",
    "redis",
    "postgres",
    "k8s",
    "etcd",
    "grpc-etcd",
    "etcd-partitions",
    "mecated",
    "mecated-etcd",
    "mecated-postgres",
    "mecak8s",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Short,
    Long,
}

impl Profile {
    /// Operations per backend when `--ops` is not given.
    fn ops(self) -> u64 {
        match self {
            Profile::Short => 500,
            Profile::Long => 1_000_000,
        }
    }

    /// Shapes the workload: the long profile runs four times the workers
    /// over four times the sessions, so a million operations finish in
    /// hours rather than days, with more holders at once to go wrong.
    fn shape(self, w: &mut Workload) {
        if self == Profile::Long {
            w.workers *= 4;
            w.sessions *= 4;
            w.progress_every = Duration::from_secs(30);
        }
    }

    /// The budget each broken variant must be caught within.
    fn broken_ops(self) -> u64 {
        match self {
            Profile::Short => 800,
            Profile::Long => 20_000,
        }
    }
}

struct Args {
    backends: Vec<&'static str>,
    ops: Option<u64>,
    seed: u64,
    profile: Profile,
    out: PathBuf,
    broken: bool,
    /// The one broken variant to run, when asked for.
    variant: Option<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        backends: BACKENDS.to_vec(),
        ops: None,
        seed: 1,
        profile: Profile::Short,
        out: std::env::temp_dir().join("mecatl-faults"),
        broken: true,
        variant: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--backend" => {
                let name = value()?;
                parsed.backends = if name == "all" {
                    BACKENDS.to_vec()
                } else {
                    let found = BACKENDS
                        .iter()
                        .find(|b| *b == name)
                        .ok_or_else(|| format!("unknown backend {name:?}\n{USAGE}"))?;
                    vec![*found]
                };
            }
            "--ops" => {
                parsed.ops = Some(value()?.parse().map_err(|e| format!("--ops: {e}"))?);
            }
            "--seed" => parsed.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--profile" => {
                parsed.profile = match value()?.as_str() {
                    "short" => Profile::Short,
                    "long" => Profile::Long,
                    other => return Err(format!("unknown profile {other:?}\n{USAGE}")),
                }
            }
            "--out" => parsed.out = PathBuf::from(value()?),
            "--skip-broken" => parsed.broken = false,
            "--broken-only" => parsed.backends.clear(),
            "--variant" => {
                let name = value()?;
                let known = VARIANTS.iter().any(|v| v.name == name)
                    || e2e::Breakage::ALL.iter().any(|b| b.name() == name);
                if !known {
                    return Err(format!("unknown broken variant {name:?}\n{USAGE}"));
                }
                parsed.variant = Some(name.clone());
                parsed.backends.clear();
            }
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(parsed)
}

/// One line of the closing table.
struct Row {
    name: String,
    ops: usize,
    elapsed: Duration,
    verdict: Verdict,
    /// For a broken variant: the properties it must break, one of them at
    /// least; empty for a run that must keep every one.
    must_break: &'static [Property],
}

impl Row {
    fn passed(&self) -> bool {
        if self.must_break.is_empty() {
            self.verdict.is_clean()
        } else {
            caught(&self.verdict, self.must_break).is_some()
        }
    }
}

/// The first of `props` the checker found broken, and after how many
/// operations.
fn caught(verdict: &Verdict, props: &[Property]) -> Option<(Property, usize)> {
    props
        .iter()
        .filter_map(|p| Some((*p, *verdict.ops_to_first_by.get(p)?)))
        .min_by_key(|(_, n)| *n)
}

/// `props` as a message names them.
fn either(props: &[Property]) -> String {
    props
        .iter()
        .map(Property::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some(holders::HOLDER_PROCESS) {
        return holders::holder_main(&argv[1..]);
    }
    if argv.first().map(String::as_str) == Some(e2e::agent::AGENT_PROCESS) {
        return e2e::agent::agent_main(&argv[1..]);
    }
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("faults: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for &backend in &args.backends {
        if e2e::BACKENDS.contains(&backend) {
            match runtime.block_on(run_e2e(backend, &args, None)) {
                Ok(row) => rows.push(row),
                Err(e) => errors.push(format!("{backend}: {e}")),
            }
            continue;
        }
        let ops = args.ops.unwrap_or(args.profile.ops());
        println!("\n== {backend}: {ops} operations, seed {}", args.seed);
        match runtime.block_on(run_backend(backend, ops, &args)) {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("{backend}: {e}");
                errors.push(format!("{backend}: {e}"));
            }
        }
    }
    if args.broken {
        let asked = |name: &str| args.variant.as_deref().is_none_or(|v| v == name);
        for variant in VARIANTS.iter().filter(|v| asked(v.name)) {
            println!("\n== broken variant: {}", variant.name);
            match runtime.block_on(run_broken(variant, &args)) {
                Ok(row) => rows.push(row),
                Err(e) => errors.push(format!("{}: {e}", variant.name)),
            }
        }
    }
    // With the session server's run, or with the broken variants alone.
    if args.broken && (args.backends.contains(&"mecated") || args.backends.is_empty()) {
        let asked = |name: &str| args.variant.as_deref().is_none_or(|v| v == name);
        for breakage in e2e::Breakage::ALL.into_iter().filter(|b| asked(b.name())) {
            match runtime.block_on(run_e2e("mecated", &args, Some(breakage))) {
                Ok(row) => rows.push(row),
                Err(e) => errors.push(format!("mecated {}: {e}", breakage.name())),
            }
        }
    }
    print_table(&rows, args.seed);
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.passed()).collect();
    for r in &failed {
        if r.must_break.is_empty() {
            eprintln!("FAIL {}: {} violations", r.name, r.verdict.total());
        } else {
            eprintln!(
                "FAIL {}: no {} violation found",
                r.name,
                either(r.must_break)
            );
        }
    }
    for e in &errors {
        eprintln!("ERROR {e}");
    }
    if failed.is_empty() && errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run_backend(name: &'static str, ops: u64, args: &Args) -> Result<Row, String> {
    let mut workload = Workload::new(ops, args.seed);
    args.profile.shape(&mut workload);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rig = rigs::setup(name, &mut workload, dir.path()).await?;
    let started = Instant::now();
    let mut progress = progress_line(name);
    let history = run(
        &workload,
        // Moved in: the holders in it are gone before the services they
        // use.
        rig.target,
        rig.faults,
        Some(&mut progress),
    )
    .await
    .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    drop(rig.keep);
    let verdict = report(name, &history, &args.out)?;
    Ok(Row {
        name: name.into(),
        ops: history.ops.len(),
        elapsed,
        verdict,
        must_break: &[],
    })
}

/// The session server end to end ([`e2e`]); `broken`: one of its broken
/// variants, which the checker must catch.
async fn run_e2e(
    name: &'static str,
    args: &Args,
    broken: Option<e2e::Breakage>,
) -> Result<Row, String> {
    let plan = e2e::Plan::new(args.profile == Profile::Long, args.ops, args.seed, broken);
    let label = match broken {
        Some(b) => format!("broken-{name}-{}", b.name()),
        None => name.to_owned(),
    };
    println!(
        "\n== {label}: {} requests (at most {}s), seed {}",
        plan.requests,
        plan.longest.as_secs(),
        args.seed
    );
    let finished = e2e::run(name, &plan).await?;
    e2e::write_report(&finished, &args.out.join(&label))?;
    let must_break: &'static [Property] = broken.map_or(&[], e2e::Breakage::must_break);
    if broken.is_some() {
        match caught(&finished.verdict, must_break) {
            Some((p, n)) => println!("  caught: first {p} violation after {n} requests"),
            None => println!("  NOT caught: no {} violation", either(must_break)),
        }
    }
    Ok(Row {
        name: match broken {
            Some(b) => format!("broken: {name} {}", b.name().replace('-', " ")),
            None => name.into(),
        },
        ops: finished.requests,
        elapsed: finished.elapsed,
        verdict: finished.verdict,
        must_break,
    })
}

fn progress_line(name: &'static str) -> impl FnMut(&Progress) + Send {
    move |p: &Progress| {
        println!(
            "  {name}: {}/{} operations, {:.0} ops/s, {} faults so far, ~{}s left",
            p.ops,
            p.target,
            p.rate(),
            p.faults,
            p.remaining().as_secs()
        );
    }
}

/// Checks `history`, writes the verdict and the timeline under `out`, and
/// prints where.
fn report(name: &str, history: &History, out: &Path) -> Result<Verdict, String> {
    let verdict = check(history);
    let dir = out.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let text = dir.join("verdict.txt");
    std::fs::write(&text, verdict.to_string()).map_err(|e| format!("{}: {e}", text.display()))?;
    let svg = dir.join("timeline.svg");
    write_svg(history, &verdict, &svg).map_err(|e| format!("{}: {e}", svg.display()))?;
    if let Some(first) = &verdict.first {
        let around = dir.join("around.txt");
        std::fs::write(&around, around_violation(history, first.at))
            .map_err(|e| format!("{}: {e}", around.display()))?;
        println!("  around:   {}", around.display());
    }
    print!("{verdict}");
    print!("{}", state_gone_back(history));
    println!(
        "  verdict:  {}\n  timeline: {}",
        text.display(),
        svg.display()
    );
    Ok(verdict)
}

/// What became of the calls made on state that went back, or might: per
/// rewind, the calls of the clients in use then, after it, refused or
/// not, and who accepted it; for the evicting policies, the calls made
/// meanwhile.
fn state_gone_back(history: &History) -> String {
    use lease_history::{FaultKind, Outcome};
    use std::fmt::Write as _;
    let mut text = String::new();
    for r in &history.rewinds {
        let after: Vec<_> = history
            .ops
            .iter()
            .filter(|op| {
                op.invoked > r.ended
                    && history.epoch_start(op.epoch) < r.started
                    && r.accepted_by.is_none_or(|e| op.epoch < e)
            })
            .collect();
        let refused = after
            .iter()
            .filter(|op| op.outcome == Outcome::Rewound)
            .count();
        let _ = writeln!(
            text,
            "rewind of {} at {:.0}ms (copy of {:.0}ms): {} calls after it by the clients before, {refused} refused as rewound; {}",
            r.target,
            r.ended.as_secs_f64() * 1e3,
            r.copy_ended.as_secs_f64() * 1e3,
            after.len(),
            match r.accepted_by {
                Some(e) => format!(
                    "accepted by the clients of epoch {e} at {:.0}ms",
                    history.epoch_start(e).as_secs_f64() * 1e3
                ),
                None => "never accepted".into(),
            }
        );
    }
    let windows: Vec<_> = history
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::EvictingPolicy)
        .collect();
    if !windows.is_empty() {
        let during: Vec<_> = history
            .ops
            .iter()
            .filter(|op| {
                windows
                    .iter()
                    .any(|f| op.invoked >= f.started && op.invoked <= f.ended)
            })
            .collect();
        let refused = during
            .iter()
            .filter(|op| op.outcome == Outcome::Rewound)
            .count();
        let _ = writeln!(
            text,
            "evicting policies: {} spells, {} calls made meanwhile, {refused} refused as rewound",
            windows.len(),
            during.len()
        );
    }
    let unaccepted = history.restarts.len()
        - history
            .rewinds
            .iter()
            .filter(|r| r.accepted_by.is_some())
            .count();
    if unaccepted > 0 {
        let _ = writeln!(text, "client restarts accepting no rewind: {unaccepted}");
    }
    text
}

/// Every operation of every session, and every fault with its amount,
/// from three seconds before `at` to one after: what a post-mortem of a
/// violation needs, where the verdict shows only the session's own
/// operations nearby.
fn around_violation(history: &History, at: Duration) -> String {
    use std::fmt::Write as _;
    let from = at.saturating_sub(Duration::from_secs(3));
    let to = at + Duration::from_secs(1);
    let mut text = String::new();
    for f in &history.faults {
        if f.ended >= from && f.started <= to {
            let _ = writeln!(
                text,
                "fault {:>10.3}..{:<10.3}ms {:?} on {}",
                f.started.as_secs_f64() * 1e3,
                f.ended.as_secs_f64() * 1e3,
                f.kind,
                f.target
            );
        }
    }
    for op in &history.ops {
        if op.completed >= from && op.invoked <= to {
            let _ = writeln!(text, "{op}");
        }
    }
    text
}

struct Variant {
    name: &'static str,
    lease: Option<LeaseBreakage>,
    store: Option<StoreBreakage>,
    /// Over file leases with every holder a process of its own, the
    /// store's breakage in the holders; else in-process over memlease.
    processes: bool,
    /// A real client configured with a detection off, in the rig of its
    /// backend, under the one fault the detection is for.
    setting: Option<SettingBreakage>,
    /// The wrappers over this backend's rig, under all its faults, rather
    /// than over memlease.
    backend: Option<&'static str>,
    /// One of these at least, whichever the run shows first.
    must_break: &'static [Property],
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "store-without-fencing",
        lease: None,
        store: Some(StoreBreakage::NoFence),
        processes: false,
        setting: None,
        backend: None,
        must_break: &[Property::StoreFencing],
    },
    Variant {
        name: "store-accepts-equal-token-from-other",
        // Equal tokens from two owners reach a store only when something
        // before it failed; a lease that never bumps its token feeds the
        // store a twin at every takeover.
        lease: Some(LeaseBreakage::NoTokenBump),
        store: Some(StoreBreakage::EqualTokenFromOther),
        processes: false,
        setting: None,
        backend: None,
        must_break: &[Property::StoreFencing],
    },
    Variant {
        name: "no-token-bump-on-takeover",
        lease: Some(LeaseBreakage::NoTokenBump),
        store: None,
        processes: false,
        setting: None,
        backend: None,
        must_break: &[Property::TokenOrder],
    },
    Variant {
        name: "renew-ignores-loss",
        lease: Some(LeaseBreakage::RenewIgnoresLoss),
        store: None,
        processes: false,
        setting: None,
        backend: None,
        must_break: &[Property::TokenOrder],
    },
    Variant {
        name: "release-of-another-owners-hold",
        lease: Some(LeaseBreakage::ReleaseOthersHold),
        store: None,
        processes: false,
        setting: None,
        backend: None,
        must_break: &[Property::SingleHolder],
    },
    Variant {
        // Stale writes from holder processes stopped or killed for real,
        // not only from workers that pause themselves.
        name: "holder-processes-over-store-without-fencing",
        lease: None,
        store: Some(StoreBreakage::NoFence),
        processes: true,
        setting: None,
        backend: None,
        must_break: &[Property::StoreFencing],
    },
    Variant {
        // Redis under memory pressure with each evicting policy, its
        // clients never reading the policy again after connecting: they
        // go on, Redis evicts lease grants under them, and a second owner
        // takes a session its holder still holds — or evicts a token
        // record, and a token is handed out again. Which shows first
        // depends on what Redis evicts first: under load, the token
        // records went first in one run of three.
        name: "redis-policy-never-rechecked",
        lease: None,
        store: None,
        processes: false,
        setting: Some(SettingBreakage::PolicyNeverRechecked),
        backend: None,
        must_break: &[Property::SingleHolder, Property::TokenOrder],
    },
    Variant {
        // The store directory put back from an older copy between
        // restarts of every holder, opened without a generation check:
        // nobody notices, and what was acknowledged after the copy is
        // gone.
        name: "store-directory-swap-without-generation-check",
        lease: None,
        store: None,
        processes: true,
        setting: Some(SettingBreakage::GenerationCheckOff),
        backend: None,
        must_break: &[Property::StoreFencing],
    },
    Variant {
        // Kubernetes leases whose renewals judge a session live from the
        // client's memory of its owner lease: a holder paused past its TTL
        // comes back and renews a session another owner took after
        // revoking that owner lease.
        name: "k8s-renewal-trusts-a-stale-owner-record",
        lease: None,
        store: None,
        processes: false,
        setting: Some(SettingBreakage::OwnerRecordTrusted),
        backend: None,
        must_break: &[Property::SingleHolder, Property::TokenOrder],
    },
    Variant {
        // PostgreSQL's own refusal of a renewal (the row taken over while
        // its holder paused), answered as a success: the stale holder
        // believes it holds beside the new one, through kills, stops and
        // lost replies of the real server. The lie shows as two holds at
        // once or, when the new holder's grant is in doubt, as the old
        // token renewed after the new one was granted: timing decides.
        name: "postgres-renew-ignores-loss",
        lease: Some(LeaseBreakage::RenewIgnoresLoss),
        store: None,
        processes: false,
        setting: None,
        backend: Some("postgres"),
        must_break: &[Property::SingleHolder, Property::TokenOrder],
    },
];

/// A broken variant over the in-memory backend and the JSONL store, or
/// over the rig its setting or backend names.
async fn run_broken(variant: &Variant, args: &Args) -> Result<Row, String> {
    let mut workload = Workload::new(args.profile.broken_ops(), args.seed);
    // Most variants need a stale holder to show; pausing holders more
    // often finds them sooner.
    workload.pause_per_mille = if variant.processes { 0 } else { 50 };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rig = match variant.setting {
        Some(setting @ SettingBreakage::PolicyNeverRechecked) => {
            rigs::redis(&mut workload, Some(setting)).await?
        }
        Some(setting @ SettingBreakage::GenerationCheckOff) => {
            rigs::flock_swaps(&mut workload, dir.path(), Some(setting))?
        }
        Some(setting @ SettingBreakage::OwnerRecordTrusted) => {
            rigs::k8s(&mut workload, dir.path(), Some(setting)).await?
        }
        None if variant.processes => {
            rigs::flock_holders(&mut workload, dir.path(), variant.store.is_some())?
        }
        None => {
            let backend = variant.backend.unwrap_or("memlease");
            rigs::setup(backend, &mut workload, dir.path()).await?
        }
    };
    if variant.setting == Some(SettingBreakage::OwnerRecordTrusted) {
        // A stale owner record shows once a holder pauses past its TTL and
        // a rival revokes its owner lease meanwhile: pause more often.
        workload.pause_per_mille = 100;
    } else if variant.setting.is_some() {
        // The fault the detection is for, and nothing else.
        workload.pause_per_mille = 0;
    } else if variant.processes {
        // A stale write needs a stop to catch a holder mid-hold, with a
        // write about to go and a rival taking over meanwhile: a few stops
        // in a hundred operations do. Faults come one after another, more
        // of them find it sooner, and the budget is four times the others'.
        workload.fault_every = workload.ttl / 3;
        workload.ops *= 4;
    } else if variant.backend.is_some() {
        // The lie needs a rival to take the session over while its holder
        // pauses: with the service down a third of the time rivals rarely
        // can. Its faults come less often, the pauses more.
        workload.fault_every = workload.ttl * 2;
        workload.pause_per_mille = 100;
    }
    let mut target = rig.target.clone();
    let clock: Arc<dyn Clock> = Arc::clone(&target.clock);
    if let Some(breakage) = variant.lease {
        let inner = Arc::clone(&target.leases[0]);
        let broken: Arc<dyn SessionLease> =
            Arc::new(BrokenLease::new(inner, breakage, workload.ttl, clock));
        target.leases = vec![broken];
    }
    if let Some(breakage) = variant.store.filter(|_| !variant.processes) {
        target.store = Arc::new(BrokenStore::new(Arc::clone(&target.store), breakage));
    }
    let started = Instant::now();
    // The process variant's only stale writers are holders the injector
    // stops or kills: workers never pause themselves there. A variant on a
    // backend's rig must be caught under that backend's faults too.
    let faults = if variant.processes || variant.setting.is_some() || variant.backend.is_some() {
        rig.faults
    } else {
        None
    };
    let history = run(&workload, target, faults, None)
        .await
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    drop(rig.keep);
    let verdict = report(&format!("broken-{}", variant.name), &history, &args.out)?;
    match caught(&verdict, variant.must_break) {
        Some((p, n)) => println!("  caught: first {p} violation after {n} operations"),
        None => println!("  NOT caught: no {} violation", either(variant.must_break)),
    }
    Ok(Row {
        name: format!("broken: {}", variant.name),
        ops: history.ops.len(),
        elapsed,
        verdict,
        must_break: variant.must_break,
    })
}

fn print_table(rows: &[Row], seed: u64) {
    println!("\n== summary (seed {seed})");
    println!(
        "{:<52} {:>9} {:>8} {:>7} {:>11}  {:<}",
        "run", "ops", "ops/s", "faults", "violations", "faults by kind / first violation"
    );
    for r in rows {
        let kinds: BTreeMap<_, _> = r.verdict.faults.clone();
        let detail = if r.must_break.is_empty() {
            kinds
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            match caught(&r.verdict, r.must_break) {
                Some((p, n)) => format!("{p} caught after {n} ops"),
                None => format!("{} NOT caught", either(r.must_break)),
            }
        };
        println!(
            "{:<52} {:>9} {:>8.0} {:>7} {:>11}  {}",
            r.name,
            r.ops,
            r.ops as f64 / r.elapsed.as_secs_f64().max(1e-9),
            r.verdict.fault_total(),
            r.verdict.total(),
            detail
        );
    }
}
