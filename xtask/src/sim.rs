//! `cargo xtask sim`: the deterministic simulation of the real lease code
//! (`testing/lease-sim`).
//!
//! - `--profile short` (CI): the code as built over a few seeds, then each
//!   broken variant, which must be caught within its seeds.
//! - `--profile long`: the code as built until `--operations` (default ten
//!   million) on every core, then the broken variants as in `short`. Built
//!   in release: the figure in the README comes from this.
//! - `--seed N [--variant NAME] [--seconds S] [--release] [--trace]`: one
//!   run, to replay a seed a run printed (`--release` when that run was a
//!   release build: a seed replays exactly within one build); `--trace`
//!   prints every event.

use crate::{Result, cargo, run};

const USAGE: &str = "usage: cargo xtask sim [--profile short|long] [--operations N] | \
                     --seed N [--variant NAME] [--seconds S] [--release] [--trace]";

/// The variants that must be caught.
const BROKEN: [&str; 7] = [
    "store-without-fencing",
    "takeover-keeps-token",
    "renew-of-lost-lease-granted",
    "release-frees-others",
    "store-accepts-equal-token",
    "counts-on-lease-until-lost",
    "write-not-tracked",
];

/// Seeds tried per broken variant before it counts as missed; each stops at
/// its first violation, which comes within ten seeds of 120 s for every
/// variant at the time of writing.
const SEEDS_PER_VARIANT: &str = "40";

pub(crate) fn sim(args: &[String]) -> Result {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(seed) = flag("--seed") {
        let mut one = vec!["--seed".to_owned(), seed];
        for name in ["--variant", "--seconds"] {
            if let Some(value) = flag(name) {
                one.extend([name.to_owned(), value]);
            }
        }
        if args.iter().any(|a| a == "--trace") {
            one.push("--trace".to_owned());
        }
        let release = args.iter().any(|a| a == "--release");
        return simulate("replay", release, &one);
    }
    let jobs = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .to_string();
    match flag("--profile").as_deref() {
        Some("short") | None => {
            simulate(
                "the code as built, 8 seeds of 60 s",
                false,
                &["--seeds", "8", "--seconds", "60", "--jobs", &jobs],
            )?;
            broken_variants(false, &jobs)
        }
        Some("long") => {
            let operations = flag("--operations").unwrap_or_else(|| "10000000".to_owned());
            simulate(
                &format!("the code as built, until {operations} operations"),
                true,
                &[
                    "--operations",
                    &operations,
                    "--seconds",
                    "120",
                    "--jobs",
                    &jobs,
                ],
            )?;
            broken_variants(true, &jobs)
        }
        Some(other) => Err(format!("unknown profile {other:?}; {USAGE}")),
    }
}

fn broken_variants(release: bool, jobs: &str) -> Result {
    for variant in BROKEN {
        simulate(
            &format!("broken variant {variant}: must be caught"),
            release,
            &[
                "--variant",
                variant,
                "--seeds",
                SEEDS_PER_VARIANT,
                "--seconds",
                "120",
                "--jobs",
                jobs,
                "--expect-violation",
            ],
        )?;
    }
    Ok(())
}

fn simulate(step: &str, release: bool, args: &[impl AsRef<std::ffi::OsStr>]) -> Result {
    let mut cmd = cargo();
    cmd.args(["run", "--locked", "--quiet", "--package", "lease-sim"]);
    if release {
        cmd.arg("--release");
    }
    cmd.arg("--").args(args);
    run(&format!("simulation: {step}"), &mut cmd)
}
