//! The fault schedule: between steps of the simulation, drawn from the
//! run's seed, faults are injected and later healed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use turmoil::Sim;

use crate::clock::{Rng, SimClock};
use crate::world::World;

/// Something to undo at a simulated time.
#[derive(Debug)]
enum Heal {
    Repair(String, String),
    Release(String),
    Restart(String),
    ServerRate,
    Latency(String, String),
    RepairOneWay(String, String),
}

/// The schedule of one run.
pub(crate) struct Schedule {
    rng: Rng,
    ttl: Duration,
    max_latency: Duration,
    processes: usize,
    /// One fault every this many steps, on average.
    mean_steps: u64,
    server_clock: SimClock,
    process_clocks: Vec<Arc<Mutex<Vec<SimClock>>>>,
    pending: Vec<(Duration, Heal)>,
}

impl Schedule {
    pub(crate) fn new(
        seed: u64,
        config: &crate::Config,
        server_clock: SimClock,
        process_clocks: Vec<Arc<Mutex<Vec<SimClock>>>>,
    ) -> Self {
        Self {
            rng: Rng::new(seed ^ 0xfa17),
            ttl: config.ttl,
            max_latency: config.max_latency,
            processes: config.processes,
            mean_steps: (config.mean_fault_interval.as_micros() / config.tick.as_micros().max(1))
                .max(1) as u64,
            server_clock,
            process_clocks,
            pending: Vec::new(),
        }
    }

    /// Heals what is due at `at`, and perhaps injects a new fault.
    pub(crate) fn tick(&mut self, sim: &mut Sim<'_>, at: Duration, world: &World) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(when, _)| *when <= at);
        self.pending = later;
        for (_, heal) in due {
            self.heal(sim, at, heal, world);
        }
        if self.rng.below(self.mean_steps) == 0 {
            self.inject(sim, at, world);
        }
    }

    fn heal(&mut self, sim: &mut Sim<'_>, at: Duration, heal: Heal, world: &World) {
        match &heal {
            Heal::Repair(a, b) => sim.repair(a.as_str(), b.as_str()),
            Heal::Release(p) => {
                sim.release(p.as_str(), "leased");
                sim.release(p.as_str(), "store");
            }
            Heal::Restart(p) => sim.bounce(p.as_str()),
            Heal::ServerRate => self.server_clock.set_rate(at, 1000),
            Heal::RepairOneWay(from, to) => sim.repair_oneway(from.as_str(), to.as_str()),
            Heal::Latency(a, b) => {
                sim.set_link_max_message_latency(a.as_str(), b.as_str(), self.max_latency)
            }
        }
        world.event(at, format!("heal: {heal:?}"));
    }

    fn inject(&mut self, sim: &mut Sim<'_>, at: Duration, world: &World) {
        let ttl = self.ttl;
        let p = format!("p{}", self.rng.below(self.processes as u64));
        let later = |rng: &mut Rng, lo: Duration, hi: Duration| at + rng.between(lo, hi);
        match self.rng.below(11) {
            0 | 1 => {
                let peer = if self.rng.chance(500) {
                    "leased"
                } else {
                    "store"
                };
                if self.already_cut(&p, peer) {
                    return;
                }
                sim.partition(p.as_str(), peer);
                world.fault(at, format!("partition {p} from {peer}"));
                let until = later(&mut self.rng, ttl / 4, ttl * 2);
                self.pending.push((until, Heal::Repair(p, peer.to_owned())));
            }
            2 => {
                // A pause as the network sees it: nothing in or out, then
                // everything held back arrives at once.
                if self
                    .pending
                    .iter()
                    .any(|(_, h)| matches!(h, Heal::Release(q) if *q == p))
                {
                    return;
                }
                sim.hold(p.as_str(), "leased");
                sim.hold(p.as_str(), "store");
                world.fault(at, format!("hold {p}"));
                let until = later(&mut self.rng, ttl / 4, ttl * 3 / 2);
                self.pending.push((until, Heal::Release(p)));
            }
            3 => {
                if self
                    .pending
                    .iter()
                    .any(|(_, h)| matches!(h, Heal::Restart(q) if *q == p))
                {
                    return;
                }
                sim.crash(p.as_str());
                world.fault(at, format!("crash {p}"));
                let until = later(&mut self.rng, Duration::ZERO, ttl);
                self.pending.push((until, Heal::Restart(p)));
            }
            4 => {
                sim.bounce("leased");
                world.fault(at, "restart the lease service");
            }
            kind @ 5..=8 => self.clock_fault(kind, at, &p, world),
            10 => {
                // Requests arrive and are handled; their answers are lost.
                let peer = if self.rng.chance(500) {
                    "leased"
                } else {
                    "store"
                };
                if self
                    .pending
                    .iter()
                    .any(|(_, h)| matches!(h, Heal::RepairOneWay(a, b) if a == peer && *b == p))
                {
                    return;
                }
                sim.partition_oneway(peer, p.as_str());
                world.fault(at, format!("answers from {peer} to {p} lost"));
                let until = later(&mut self.rng, ttl / 4, ttl * 2);
                self.pending
                    .push((until, Heal::RepairOneWay(peer.to_owned(), p)));
            }
            _ => {
                let peer = if self.rng.chance(500) {
                    "leased"
                } else {
                    "store"
                };
                let latency = self.rng.between(Duration::from_millis(50), ttl / 2);
                sim.set_link_max_message_latency(p.as_str(), peer, latency);
                world.fault(at, format!("latency {p}–{peer} up to {latency:?}"));
                let until = later(&mut self.rng, ttl / 2, ttl * 3);
                self.pending
                    .push((until, Heal::Latency(p, peer.to_owned())));
            }
        }
    }

    /// A clock fault of kind 5 to 8: the authority's clock stepped forward
    /// or back or run at another rate, or process `p`'s wall clock stepped.
    fn clock_fault(&mut self, kind: u64, at: Duration, p: &str, world: &World) {
        let ttl = self.ttl;
        // Half the forward steps become backward ones: forward steps are
        // beyond the keeper's bound, and beliefs in leases granted before
        // one are not judged for a TTL.
        let kind = if kind == 5 && self.rng.chance(500) {
            6
        } else {
            kind
        };
        let later = |rng: &mut Rng, lo: Duration, hi: Duration| at + rng.between(lo, hi);
        match kind {
            5 => {
                // Beyond what the keeper assumes: the authority's clock
                // jumps ahead and its leases end early. Only the store's
                // fence protects the session while a holder still counts
                // on its lease.
                let by = self.rng.between(ttl / 2, ttl * 2);
                self.server_clock.step(at, true, by);
                world.forward_step(at);
                world.fault(at, format!("authority clock forward {by:?}"));
            }
            6 => {
                let by = self.rng.between(ttl / 2, ttl * 2);
                self.server_clock.step(at, false, by);
                world.fault(at, format!("authority clock back {by:?}"));
            }
            7 => {
                if self
                    .pending
                    .iter()
                    .any(|(_, h)| matches!(h, Heal::ServerRate))
                {
                    return;
                }
                // Within the bound: a lease counted on for two thirds of
                // its TTL from when it was asked for lasts at least five
                // sixths of it on an authority clock 20 % fast.
                let per_mille = 800 + self.rng.below(401);
                self.server_clock.set_rate(at, per_mille);
                world.fault(at, format!("authority clock rate {per_mille}‰"));
                let until = later(&mut self.rng, ttl, ttl * 4);
                self.pending.push((until, Heal::ServerRate));
            }
            8 => {
                let index = p[1..].parse::<usize>().unwrap_or(0);
                let forward = self.rng.chance(500);
                let by = self.rng.between(ttl / 2, ttl * 10);
                let clocks = self.process_clocks[index]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if let Some(clock) = clocks.last() {
                    clock.step(at, forward, by);
                }
                world.fault(
                    at,
                    format!(
                        "{p} wall clock {} {by:?}",
                        if forward { "forward" } else { "back" }
                    ),
                );
            }
            _ => {}
        }
    }

    fn already_cut(&self, p: &str, peer: &str) -> bool {
        self.pending
            .iter()
            .any(|(_, h)| matches!(h, Heal::Repair(a, b) if a == p && b == peer))
    }
}
