//! `lease-sim`: runs simulations seed after seed, on as many threads as
//! asked, until a number of operations or of seeds is reached, and stops
//! at the first violation with the command that replays it.
//!
//! ```text
//! lease-sim [--seed N] [--seeds N | --operations N] [--seconds S]
//!           [--variant NAME] [--jobs N] [--expect-violation] [--trace]
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_sim::{Config, Report, Variant, run};

struct Args {
    seed: u64,
    seeds: Option<u64>,
    operations: Option<u64>,
    seconds: u64,
    variant: Variant,
    jobs: u64,
    expect_violation: bool,
    trace: bool,
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
    let mut reports: Vec<Report> = Vec::new();
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
    let operations: u64 = reports.iter().map(Report::operations).sum();
    let simulated: Duration = reports.iter().map(|r| r.simulated).sum();
    let faults: u64 = reports.iter().map(|r| r.counts.faults).sum();
    let violations: Vec<&Report> = reports.iter().filter(|r| r.violation.is_some()).collect();
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
    if let Some(first) = violations.iter().min_by_key(|r| r.config.seed) {
        println!(
            "replay: cargo xtask sim --seed {} --seconds {} --variant {}",
            first.config.seed,
            first.config.duration.as_secs(),
            first.config.variant.name()
        );
    }
    let as_expected = violations.is_empty() != args.expect_violation;
    if failed || !as_expected {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs seeds until the budget is spent or a violation is found.
fn worker(
    args: &Args,
    next: &AtomicU64,
    done_ops: &AtomicU64,
    stop: &AtomicBool,
) -> Result<Vec<Report>, lease_sim::SimError> {
    let mut reports = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let seed = next.fetch_add(1, Ordering::SeqCst);
        if args.seeds.is_some_and(|n| seed >= args.seed + n)
            || args
                .operations
                .is_some_and(|n| done_ops.load(Ordering::SeqCst) >= n)
        {
            break;
        }
        let config = Config {
            duration: Duration::from_secs(args.seconds),
            variant: args.variant,
            trace: args.trace,
            ..Config::new(seed)
        };
        let report = run(&config)?;
        done_ops.fetch_add(report.operations(), Ordering::SeqCst);
        println!("{report}");
        if report.violation.is_some() {
            stop.store(true, Ordering::SeqCst);
        }
        reports.push(report);
    }
    Ok(reports)
}
