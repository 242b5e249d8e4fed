//! Explores the model and prints what it found: `cargo run --release -p
//! lease-model --example explore [processes sessions max_time max_ops]
//! [--symmetry] [--correct-only] [--no-crash] [--no-loss]`. With `--symmetry` the search is depth
//! first over one state of each class of renamed processes and sessions
//! (stateright reduces only depth-first searches), so its
//! counterexamples are not the shortest.

use std::time::Instant;

use lease_model::{Bounds, LeaseSystem, Variant};
use stateright::{Checker, Model};

fn main() {
    let (flags, numbers): (Vec<String>, Vec<String>) =
        std::env::args().skip(1).partition(|a| a.starts_with("--"));
    let numbers: Vec<u8> = numbers
        .iter()
        .map(|a| a.parse().expect("a small number"))
        .collect();
    let symmetry = flags.iter().any(|f| f == "--symmetry");
    let correct_only = flags.iter().any(|f| f == "--correct-only");
    let mut bounds = Bounds::SMALL;
    if flags.iter().any(|f| f == "--no-crash") {
        bounds.crashes = 0;
    }
    if flags.iter().any(|f| f == "--no-loss") {
        bounds.losses = 0;
    }
    if let [processes, sessions, max_time, max_ops] = numbers[..] {
        bounds = Bounds {
            processes,
            sessions,
            max_time,
            max_ops,
            ..bounds
        };
    }
    let given = numbers.len() == 4;
    let variants = std::iter::once(Variant::Correct)
        .chain(Variant::BROKEN)
        .take(if correct_only {
            1
        } else {
            1 + Variant::BROKEN.len()
        });
    for variant in variants {
        // A variant that needs bounds of its own gets them unless bounds
        // were given.
        let bounds = if given || variant == Variant::Correct {
            bounds
        } else {
            variant.bounds()
        };
        let started = Instant::now();
        let builder = LeaseSystem::new(bounds, variant)
            .checker()
            .threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
        let (states, unique, found) = if symmetry {
            summary(builder.symmetry().spawn_dfs().join())
        } else {
            summary(builder.spawn_bfs().join())
        };
        println!(
            "{variant:?}: {states} states ({unique} unique) in {:.2?}; found: {}",
            started.elapsed(),
            found.join(", ")
        );
    }
}

/// States visited, unique states, and what was found (with path lengths).
fn summary(checker: impl Checker<LeaseSystem>) -> (usize, usize, Vec<String>) {
    let found = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| format!("{name} in {} steps", path.into_actions().len()))
        .collect();
    (checker.state_count(), checker.unique_state_count(), found)
}
