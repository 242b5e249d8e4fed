//! Deterministic simulation of the real lease code: millions of faulted
//! operations in minutes, and any failure replayed from its seed.
//!
//! # What it is for
//!
//! The fault runs drive real processes and real services, so they are
//! bounded by real time (tens to hundreds of operations a second), and a
//! failure they find cannot be replayed step by step. This crate runs the
//! real code instead under [turmoil](https://docs.rs/turmoil)'s simulated
//! network and time, on one thread, every choice drawn from one seed:
//!
//! - the lease service: `grpcdriver`'s real server, over a `memlease`
//!   table on a simulated clock, reached over the simulated network by
//! - processes, each running `lease-keeper`'s real keeper over
//!   `grpcdriver`'s real client, taking sessions, writing under their
//!   fences and releasing them; and
//! - a fenced store, a host of its own, whose high-water mark is bound to
//!   the writer that set it.
//!
//! Between steps, a schedule drawn from the seed partitions processes from
//! the service or the store, both ways or only their answers, holds a
//! process's traffic back and lets it through at once (a stall, as the
//! network sees it), raises link latencies (which reorders messages
//! between connections), crashes and restarts processes (a new
//! incarnation each time), restarts the lease service, steps the
//! authority's clock both ways, runs it up to 20 % fast or slow, and steps
//! the processes' wall clocks (which the keeper must not read). A write now
//! and then stalls between reading its fence and sending it, as a paused
//! process's would, and a run now and then ends with its write running.
//!
//! The simulation sees what no process can, and checks as things happen:
//!
//! - [`Rule::OneOwnerPerToken`]: the authority never grants one token of a
//!   session to two owners;
//! - [`Rule::StoreOrder`]: the store never applies a write with a lower
//!   token than one it applied: after a takeover, nothing the old owner
//!   does changes the session;
//! - [`Rule::OneWriterPerToken`]: one token, one writer, and that writer's
//!   owner was granted the token;
//! - [`Rule::HolderBelief`]: whenever a process counts on its lease (its
//!   keeper says time is left), the authority's table holds that lease for
//!   it — unless the authority last granted or renewed that lease before
//!   a forward step of its clock less than a TTL ago, which is beyond what
//!   the keeper assumes;
//! - [`Rule::ReleaseBeforeWritesSettle`]: the authority never handles the
//!   release of a lease while a write made under it is still running.
//!
//! The first violation stops the run and is reported with the events
//! around it. Each [`Variant`] other than [`Variant::Correct`] breaks one
//! rule, and must be caught.
//!
//! # Replaying a seed
//!
//! A run is a function of its [`Config`] and the build, provided it is the
//! first run in its process and that process's clocks do not move with
//! the machine's speed:
//!
//! - tokio numbers tasks across the whole process, and those numbers
//!   decide the order in which a crashed host's tasks are dropped;
//! - some libraries under simulation read the machine's clocks
//!   themselves (h2 forgets a stream it reset after one real second), so
//!   on a slow enough machine a late frame is handled otherwise.
//!
//! The `lease-sim` binary therefore runs every seed in a process of its
//! own, which answers the wall and monotonic clock reads of everything in
//! it from a logical clock on simulated time ([`Config::on_step`]: h2's
//! second is then a simulated second), prints the command that replays a violation
//! (`cargo xtask sim --seed N …`), and a replay prints the same events to
//! the same violation; `--trace` prints every event of the run. A run
//! through [`run`] in a process of the caller's keeps the real clocks and
//! replays only as far as the machine's speed allows.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use lease_sim::{Config, Variant, run};
//!
//! let config = Config {
//!     duration: Duration::from_secs(20),
//!     ..Config::new(7)
//! };
//! let report = run(&config)?;
//! assert!(report.violation.is_none(), "{report}");
//! assert!(report.operations() > 0 && report.counts.faults > 0);
//!
//! let broken = Config {
//!     variant: Variant::StoreWithoutFencing,
//!     duration: Duration::from_secs(600),
//!     ..Config::new(7)
//! };
//! let caught = run(&broken)?.violation.expect("an unfenced store is caught");
//! println!("{caught}"); // the rule, the instant, the events around it
//! # Ok::<(), lease_sim::SimError>(())
//! ```

mod authority;
mod clock;
mod faults;
mod net;
mod process;
mod store;
mod world;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_history::broken::{BrokenLease, LeaseBreakage};
use lease_port::{AuthorityId, SessionLease};
use memlease::MemLease;

pub use clock::{Rng, SimClock};
pub use store::StoreRule;
pub use world::{Counts, Rule, Violation, World};

use authority::Observed;
use process::Process;

/// What is simulated, and for how long.
#[derive(Debug, Clone)]
pub struct Config {
    /// Every choice of the run derives from it.
    pub seed: u64,
    /// Simulated time to run for.
    pub duration: Duration,
    /// Session server processes.
    pub processes: usize,
    /// Runs each process drives at once, each on sessions of its own
    /// choosing.
    pub workers: usize,
    /// Sessions they compete for.
    pub sessions: usize,
    /// The lease TTL, granted by the service and reckoned by the keepers.
    pub ttl: Duration,
    /// How far each step of the simulation moves time: the resolution of
    /// every timer and message.
    pub tick: Duration,
    /// A message's latency is drawn up to this, unless a fault raises it.
    pub max_latency: Duration,
    /// One fault is injected every this long, on average.
    pub mean_fault_interval: Duration,
    /// The code as built, or one rule broken.
    pub variant: Variant,
    /// Print every event to standard error as it happens.
    pub trace: bool,
    /// Told the simulation's elapsed time before each step: how the
    /// `lease-sim` binary keeps its logical clock on simulated time (see
    /// [Replaying a seed](crate#replaying-a-seed)).
    pub on_step: Option<fn(Duration)>,
}

impl Config {
    /// Four processes of four workers each competing for eight sessions,
    /// TTL 3 s, steps of 2 ms, messages up to 10 ms, a fault every 300 ms on average, for 60
    /// simulated seconds.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            duration: Duration::from_secs(60),
            processes: 4,
            workers: 4,
            sessions: 8,
            ttl: Duration::from_secs(3),
            tick: Duration::from_millis(2),
            max_latency: Duration::from_millis(10),
            mean_fault_interval: Duration::from_millis(300),
            variant: Variant::Correct,
            trace: false,
            on_step: None,
        }
    }
}

/// The code as built, or with one rule broken: each broken variant must be
/// caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Nothing broken.
    Correct,
    /// The store applies every write, whatever its fence.
    StoreWithoutFencing,
    /// The authority hands a takeover the previous holder's token.
    TakeoverKeepsToken,
    /// The authority answers a renewal of a lease it gave to another owner
    /// as granted.
    RenewOfLostLeaseGranted,
    /// A release frees the session whoever holds it.
    ReleaseFreesOthers,
    /// The store accepts the mark's token from any writer.
    StoreAcceptsEqualTokenFromAnyWriter,
    /// Processes count on a lease until their keeper finds it lost,
    /// keeping no margin for the authority's clock.
    CountsOnLeaseUntilLost,
    /// Processes write on tasks of their own, beside the keeper, and end
    /// the run without waiting for them.
    WriteNotTracked,
}

impl Variant {
    /// Every variant, the correct one first.
    pub const ALL: [Variant; 8] = [
        Variant::Correct,
        Variant::StoreWithoutFencing,
        Variant::TakeoverKeepsToken,
        Variant::RenewOfLostLeaseGranted,
        Variant::ReleaseFreesOthers,
        Variant::StoreAcceptsEqualTokenFromAnyWriter,
        Variant::CountsOnLeaseUntilLost,
        Variant::WriteNotTracked,
    ];

    /// The variant's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Correct => "correct",
            Variant::StoreWithoutFencing => "store-without-fencing",
            Variant::TakeoverKeepsToken => "takeover-keeps-token",
            Variant::RenewOfLostLeaseGranted => "renew-of-lost-lease-granted",
            Variant::ReleaseFreesOthers => "release-frees-others",
            Variant::StoreAcceptsEqualTokenFromAnyWriter => "store-accepts-equal-token",
            Variant::CountsOnLeaseUntilLost => "counts-on-lease-until-lost",
            Variant::WriteNotTracked => "write-not-tracked",
        }
    }

    /// The variant named `name`.
    pub fn named(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }

    fn store_rule(self) -> StoreRule {
        match self {
            Variant::StoreWithoutFencing => StoreRule::Unfenced,
            Variant::StoreAcceptsEqualTokenFromAnyWriter => StoreRule::EqualTokenFromAnyWriter,
            _ => StoreRule::Fenced,
        }
    }

    fn lease_breakage(self) -> Option<LeaseBreakage> {
        match self {
            Variant::TakeoverKeepsToken => Some(LeaseBreakage::NoTokenBump),
            Variant::RenewOfLostLeaseGranted => Some(LeaseBreakage::RenewIgnoresLoss),
            Variant::ReleaseFreesOthers => Some(LeaseBreakage::ReleaseOthersHold),
            _ => None,
        }
    }
}

/// What one run did and found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The run's configuration, seed included: enough to replay it.
    pub config: Config,
    /// Simulated time run.
    pub simulated: Duration,
    /// Real time taken.
    pub elapsed: Duration,
    /// Lease calls, store writes and faults.
    pub counts: Counts,
    /// The first rule broken, if any.
    pub violation: Option<Violation>,
    /// A digest of every event in order: a replay gives the same, under
    /// the conditions [Replaying a seed](crate#replaying-a-seed) names.
    pub digest: u64,
}

impl Report {
    /// Operations done: lease calls answered and writes that reached the
    /// store.
    pub fn operations(&self) -> u64 {
        self.counts.lease_calls() + self.counts.writes()
    }

    /// Operations per second of real time.
    pub fn rate(&self) -> f64 {
        self.operations() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        write!(
            f,
            "seed {} ({}): {:.1} s simulated in {:.2} s, {} operations at {:.0}/s (lease calls: \
             {} granted, {} renewed, {} released, {} refused; writes: {} applied, {} fenced), {} \
             faults, digest {:016x}",
            self.config.seed,
            self.config.variant.name(),
            self.simulated.as_secs_f64(),
            self.elapsed.as_secs_f64(),
            self.operations(),
            self.rate(),
            c.grants,
            c.renewals,
            c.releases,
            c.refusals,
            c.writes_applied,
            c.writes_refused,
            c.faults,
            self.digest,
        )?;
        match &self.violation {
            Some(v) => write!(f, "\n{v}"),
            None => write!(f, ", no violation"),
        }
    }
}

/// A run that could not be set up or whose simulation failed.
#[derive(Debug, thiserror::Error)]
#[error("simulation of seed {seed}: {message}")]
pub struct SimError {
    seed: u64,
    message: String,
}

/// Runs one simulation. It replays exactly only as the first run in its
/// process, with the process's clocks on simulated time, as the
/// `lease-sim` binary runs it (see [Replaying a seed](crate#replaying-a-seed)).
pub fn run(config: &Config) -> Result<Report, SimError> {
    let fail = |message: String| SimError {
        seed: config.seed,
        message,
    };
    let started = Instant::now();
    let world = Arc::new(World::new(config.ttl, config.trace));
    let server_clock = SimClock::new(clock::mix(config.seed ^ 0x5e7e));
    // One shard: the shard a session falls in is chosen by a randomly
    // keyed hash, and each shard numbers its own tokens.
    let table = MemLease::builder()
        .shards(1)
        .ttl(config.ttl)
        .clock(Arc::new(server_clock.clone()))
        .authority(AuthorityId::new("sim").map_err(|e| fail(e.to_string()))?)
        .build();
    let inner: Arc<dyn SessionLease> = match config.variant.lease_breakage() {
        Some(breakage) => Arc::new(BrokenLease::new(
            Arc::new(table.clone()),
            breakage,
            config.ttl,
            Arc::new(server_clock.clone()),
        )),
        None => Arc::new(table.clone()),
    };
    let backend: Arc<dyn SessionLease> = Arc::new(Observed {
        inner,
        world: Arc::clone(&world),
    });

    let mut sim = turmoil::Builder::new()
        .simulation_duration(config.duration + Duration::from_secs(3600))
        .tick_duration(config.tick)
        .min_message_latency(Duration::ZERO)
        .max_message_latency(config.max_latency)
        .rng_seed(config.seed)
        .enable_random_order()
        .build();
    {
        let (clock, ttl) = (server_clock.clone(), config.ttl);
        sim.host("leased", move || {
            authority::serve(Arc::clone(&backend), clock.clone(), ttl)
        });
    }
    {
        let (world, rule) = (Arc::clone(&world), config.variant.store_rule());
        sim.host("store", move || store::serve(Arc::clone(&world), rule));
    }
    let mut process_clocks = Vec::new();
    for index in 0..config.processes {
        let clocks = Arc::new(Mutex::new(Vec::new()));
        process_clocks.push(Arc::clone(&clocks));
        let process = Arc::new(Process {
            index,
            config: config.clone(),
            world: Arc::clone(&world),
            table: table.clone(),
            clocks,
        });
        sim.host(format!("p{index}"), move || {
            let process = Arc::clone(&process);
            async move { process.run().await }
        });
    }
    let duration = config.duration;
    sim.client("timer", async move {
        tokio::time::sleep(duration).await;
        Ok(())
    });

    let mut schedule = faults::Schedule::new(config.seed, config, server_clock, process_clocks);
    loop {
        let at = sim.elapsed();
        if let Some(on_step) = config.on_step {
            on_step(at);
        }
        schedule.tick(&mut sim, at, &world);
        if world.violation().is_some() {
            break;
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => return Err(fail(e.to_string())),
        }
    }
    Ok(Report {
        config: config.clone(),
        simulated: sim.elapsed(),
        elapsed: started.elapsed(),
        counts: world.counts(),
        violation: world.violation_now(),
        digest: world.digest(),
    })
}
