//! `lease-sim`: runs simulations seed after seed, on as many threads as
//! asked, until a number of operations or of seeds is reached, and stops
//! at the first violation with the command that replays it.
//!
//! Each seed runs in a process of its own: tokio numbers tasks across the
//! whole process, and the numbers decide the order in which a crashed
//! host's tasks are dropped, so only a run that is its process's first
//! replays exactly. That process also answers the clock reads of the
//! libraries under simulation from the simulation's time (see
//! `logical_clock.rs`), so a run does not depend on how fast the machine
//! runs it.
//!
//! ```text
//! lease-sim [--seed N] [--seeds N | --operations N] [--seconds S]
//!           [--variant NAME] [--jobs N] [--expect-violation] [--trace]
//! ```

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_sim::{Config, Variant, run};

mod logical_clock;

struct Args {
    seed: u64,
    seeds: Option<u64>,
    operations: Option<u64>,
    seconds: u64,
    variant: Variant,
    jobs: u64,
    expect_violation: bool,
    trace: bool,
    /// Run `seed` alone, here, and end with a summary line for the parent.
    one: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seed: 1,
        seeds: None,
        operations: None,
        seconds: 60,
        variant: Variant::Correct,
        jobs: 1,
        expect_violation: false,
        trace: false,
        one: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--expect-violation" {
            args.expect_violation = true;
            continue;
        }
        if flag == "--trace" {
            args.trace = true;
            continue;
        }
        if flag == "--one" {
            args.one = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--seed" => args.seed = number()?,
            "--seeds" => args.seeds = Some(number()?),
            "--operations" => args.operations = Some(number()?),
            "--seconds" => args.seconds = number()?,
            "--jobs" => args.jobs = number()?.max(1),
            "--variant" => {
                args.variant = Variant::named(&value).ok_or_else(|| {
                    let names: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
                    format!("--variant: one of {}", names.join(", "))
                })?
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.seeds.is_none() && args.operations.is_none() {
        args.seeds = Some(1);
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => Arc::new(args),
        Err(e) => {
            eprintln!("lease-sim: {e}");
            return ExitCode::from(2);
        }
    };
    if args.one {
        return one(&args);
    }
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(args.seed));
    let done_ops = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..args.jobs)
        .map(|_| {
            let (args, next, done_ops, stop) = (
                Arc::clone(&args),
                Arc::clone(&next),
                Arc::clone(&done_ops),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || worker(&args, &next, &done_ops, &stop))
        })
        .collect();
    let mut reports: Vec<Summary> = Vec::new();
    let mut failed = false;
    for w in workers {
        match w.join() {
            Ok(Ok(mut r)) => reports.append(&mut r),
            Ok(Err(e)) => {
                eprintln!("lease-sim: {e}");
                failed = true;
            }
            Err(_) => failed = true,
        }
    }
    let operations: u64 = reports.iter().map(|r| r.operations).sum();
    let simulated: Duration = reports.iter().map(|r| r.simulated).sum();
    let faults: u64 = reports.iter().map(|r| r.faults).sum();
    let violations: Vec<&Summary> = reports.iter().filter(|r| r.violated).collect();
    let elapsed = started.elapsed();
    println!(
        "{} runs of {}: {operations} operations, {faults} faults, {:.0} s simulated, in {:.1} s \
         on {} threads: {:.0} operations/s; {} with a violation",
        reports.len(),
        args.variant.name(),
        simulated.as_secs_f64(),
        elapsed.as_secs_f64(),
        args.jobs,
        operations as f64 / elapsed.as_secs_f64(),
        violations.len()
    );
    if let Some(first) = violations.iter().min_by_key(|r| r.seed) {
        // A seed replays exactly within one build: say which.
        println!(
            "replay: cargo xtask sim{} --seed {} --seconds {} --variant {}",
            if cfg!(debug_assertions) {
                ""
            } else {
                " --release"
            },
            first.seed,
            args.seconds,
            args.variant.name()
        );
    }
    let as_expected = violations.is_empty() != args.expect_violation;
    if failed || !as_expected {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// What a seed's run reported, read from its summary line.
struct Summary {
    seed: u64,
    operations: u64,
    faults: u64,
    simulated: Duration,
    violated: bool,
}

const SUMMARY: &str = "summary:";

/// `--one`: runs the seed here, prints its report, then its summary.
fn one(args: &Args) -> ExitCode {
    let config = Config {
        duration: Duration::from_secs(args.seconds),
        variant: args.variant,
        trace: args.trace,
        on_step: Some(logical_clock::at_simulated),
        ..Config::new(args.seed)
    };
    let started = logical_clock::real_monotonic();
    logical_clock::enable();
    match run(&config) {
        Ok(mut report) => {
            report.elapsed = logical_clock::real_monotonic().saturating_sub(started);
            println!("{report}");
            println!(
                "{SUMMARY} {} {} {} {}",
                report.operations(),
                report.counts.faults,
                report.simulated.as_millis(),
                u8::from(report.violation.is_some())
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lease-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs seeds, each in a process of its own, until the budget is spent or
/// a violation is found.
fn worker(
    args: &Args,
    next: &AtomicU64,
    done_ops: &AtomicU64,
    stop: &AtomicBool,
) -> Result<Vec<Summary>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let mut summaries = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let seed = next.fetch_add(1, Ordering::SeqCst);
        if args.seeds.is_some_and(|n| seed >= args.seed + n)
            || args
                .operations
                .is_some_and(|n| done_ops.load(Ordering::SeqCst) >= n)
        {
            break;
        }
        let mut child = Command::new(&exe);
        child.args(["--one", "--seed", &seed.to_string()]);
        child.args(["--seconds", &args.seconds.to_string()]);
        child.args(["--variant", args.variant.name()]);
        if args.trace {
            child.arg("--trace");
        }
        let out = child
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("seed {seed}: cannot start: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text
            .lines()
            .find_map(|l| l.strip_prefix(SUMMARY))
            .and_then(|l| parse_summary(seed, l))
            .ok_or_else(|| format!("seed {seed}: no summary ({})", out.status))?;
        for line in text.lines().filter(|l| !l.starts_with(SUMMARY)) {
            println!("{line}");
        }
        done_ops.fetch_add(summary.operations, Ordering::SeqCst);
        if summary.violated {
            stop.store(true, Ordering::SeqCst);
        }
        summaries.push(summary);
    }
    Ok(summaries)
}

fn parse_summary(seed: u64, line: &str) -> Option<Summary> {
    let mut numbers = line.split_whitespace().map(|n| n.parse::<u64>().ok());
    Some(Summary {
        seed,
        operations: numbers.next()??,
        faults: numbers.next()??,
        simulated: Duration::from_millis(numbers.next()??),
        violated: numbers.next()?? == 1,
    })
}
