//! The simulation of the real code: the code as built keeps every rule
//! under the fault schedule, a seed replays the same run, and broken
//! variants are caught with the events that led to the violation. (`cargo
//! xtask sim` runs every broken variant over more seeds, and its long
//! profile ten million operations.)

use std::process::Command;
use std::time::Duration;

use lease_sim::{Config, Rule, Variant, run};

fn simulate(seed: u64, seconds: u64, variant: Variant) -> lease_sim::Report {
    let config = Config {
        duration: Duration::from_secs(seconds),
        variant,
        ..Config::new(seed)
    };
    run(&config).expect("the simulation runs")
}

/// The `lease-sim` runner's output and whether it succeeded. It runs each
/// seed in a process of its own, with that process's clocks on simulated
/// time, which is what makes a replay exact.
fn lease_sim(args: &[&str]) -> (String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_lease-sim"))
        .args(args)
        .output()
        .expect("lease-sim starts");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (text, out.status.success())
}

fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn the_code_as_built_keeps_every_rule_under_faults() {
    for seed in [1, 2] {
        let report = simulate(seed, 30, Variant::Correct);
        assert!(report.violation.is_none(), "{report}");
        assert!(report.simulated >= Duration::from_secs(30), "{report}");
        let c = report.counts;
        assert!(
            c.faults > 30 && c.writes() > 100 && c.grants > 50 && c.renewals > 10,
            "{report}"
        );
    }
}

/// Every event of seed `seed`'s run (`--trace` prints them to standard
/// error), then the end of its report (digest and verdict). `wrapper`, if
/// any, is a command that runs the simulation.
fn events(seed: &str, seconds: &str, wrapper: &[&str]) -> String {
    let exe = env!("CARGO_BIN_EXE_lease-sim");
    let args = ["--seed", seed, "--seconds", seconds, "--trace"];
    let mut command = match wrapper {
        [] => Command::new(exe),
        [program, rest @ ..] => {
            let mut c = Command::new(program);
            c.args(rest).arg(exe);
            c
        }
    };
    let out = command
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{wrapper:?} {exe} does not start: {e}"));
    let report = String::from_utf8_lossy(&out.stdout);
    let events = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{report}{events}");
    assert!(events.lines().count() > 100, "{events}");
    events
        + lines_with(&report, "digest")[0]
            .split(", digest")
            .nth(1)
            .unwrap()
}

/// Fails, showing where they part, unless `a` and `b` are the same run.
fn assert_same_run(what: &str, a: &str, b: &str) {
    if let Some(at) = a.lines().zip(b.lines()).position(|(x, y)| x != y) {
        let around = |text: &str| {
            let lines: Vec<&str> = text.lines().collect();
            lines[at.saturating_sub(20)..(at + 5).min(lines.len())].join("\n")
        };
        panic!(
            "{what}: the runs part at event {at}:\n--- first\n{}\n--- second\n{}",
            around(a),
            around(b)
        );
    }
    assert_eq!(a, b, "{what}: one run went on past the other's end");
}

#[test]
fn a_seed_replays_the_same_run_and_another_seed_does_not() {
    let first = events("5", "20", &[]);
    assert_same_run("seed 5 twice", &first, &events("5", "20", &[]));
    assert_ne!(events("6", "20", &[]).lines().last(), first.lines().last());
}

/// A run does not depend on how fast the machine runs it. Under
/// `faketime` the process's clocks run 100,000 times fast: what a machine
/// that much slower would show the libraries that read them. h2 forgets a
/// stream it reset after a second of that time; before the binary put
/// those reads on simulated time, this seed's run parted from the plain
/// one within its 60 s, at a point that varied from run to run (and seed
/// 5's 20 s run, on loaded CI machines, from itself).
#[test]
fn a_run_does_not_depend_on_the_speed_of_the_machine() {
    let installed = Command::new("faketime")
        .args(["-f", "+0", "true"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        installed,
        "faketime is not installed: `cargo xtask services` installs it \
         (Debian's `faketime` package)"
    );
    let fast = ["faketime", "-f", "+0 x100000"];
    assert_same_run(
        "seed 2 at real speed, then with clocks 100,000 times fast",
        &events("2", "60", &[]),
        &events("2", "60", &fast),
    );
}

#[test]
fn an_unfenced_store_is_caught_and_its_seed_replays_to_the_same_violation() {
    let args = ["--seconds", "120", "--variant", "store-without-fencing"];
    let (out, ok) = lease_sim(&[&["--seeds", "10", "--expect-violation"], &args[..]].concat());
    assert!(ok, "{out}");
    let broken = lines_with(&out, "broken at");
    assert!(
        broken[0].starts_with("store-order") || broken[0].starts_with("one-writer-per-token"),
        "{out}"
    );
    assert!(lines_with(&out, "VIOLATION").len() == 1, "{out}");
    let shown = out.lines().filter(|l| l.starts_with("  ")).count();
    assert!(
        shown > 40,
        "the events before the violation are shown: {out}"
    );

    let replay = lines_with(&out, "replay: cargo xtask sim")[0];
    let seed = replay
        .split("--seed ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let (again, ok) = lease_sim(&[&["--seed", seed], &args[..]].concat());
    assert!(!ok, "a violation fails the run: {again}");
    assert_eq!(lines_with(&again, "broken at"), broken, "{again}");
}

#[test]
fn a_takeover_that_keeps_the_token_is_caught() {
    for seed in 1..10 {
        if let Some(v) = simulate(seed, 60, Variant::TakeoverKeepsToken).violation {
            assert_eq!(v.rule, Rule::OneOwnerPerToken, "{v}");
            return;
        }
    }
    panic!("a takeover that keeps the token went unnoticed");
}
