//! Explores the model and prints what it found: `cargo run --release -p
//! lease-model --example explore [processes sessions max_time max_ops]`.

use std::time::Instant;

use lease_model::{Bounds, LeaseSystem, Variant};
use stateright::{Checker, Model};

fn main() {
    let args: Vec<u8> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a small number"))
        .collect();
    let mut bounds = Bounds::SMALL;
    if let [processes, sessions, max_time, max_ops] = args[..] {
        bounds = Bounds {
            processes,
            sessions,
            max_time,
            max_ops,
            ..bounds
        };
    }
    for variant in std::iter::once(Variant::Correct).chain(Variant::BROKEN) {
        let started = Instant::now();
        let checker = LeaseSystem::new(bounds, variant)
            .checker()
            .threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
            .spawn_bfs()
            .join();
        let found: Vec<String> = checker
            .discoveries()
            .into_iter()
            .map(|(name, path)| format!("{name} in {} steps", path.into_actions().len()))
            .collect();
        println!(
            "{variant:?}: {} states ({} unique) in {:.2?}; found: {}",
            checker.state_count(),
            checker.unique_state_count(),
            started.elapsed(),
            found.join(", ")
        );
    }
}
