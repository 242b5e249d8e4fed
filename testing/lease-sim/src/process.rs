//! A session server process as the simulation runs it: the real keeper
//! over the real gRPC client, taking sessions, writing under their fences
//! and giving them back, with the pauses a real process has. Each start of
//! the host is a new incarnation, as a restarted process is.

use std::sync::Arc;
use std::time::Duration;

use grpcdriver::GrpcLease;
use lease_keeper::{LeaseGuard, LeaseKeeper};
use lease_port::{Clock, OwnerId, SessionId, WriteFence};
use memlease::MemLease;

use crate::authority::{LEASE_PORT, holder, now};
use crate::clock::{Rng, SimClock, mix};
use crate::store::{self, WriteOutcome};
use crate::world::World;
use crate::{Config, Variant, net};

/// What every incarnation of one process shares.
pub(crate) struct Process {
    pub index: usize,
    pub config: Config,
    pub world: Arc<World>,
    /// The authority's table, looked at (never changed) to judge what the
    /// process counts on.
    pub table: MemLease,
    /// Wall clocks of this process, one per incarnation in turn; the fault
    /// schedule steps the newest.
    pub clocks: Arc<std::sync::Mutex<Vec<SimClock>>>,
}

impl Process {
    /// One incarnation: runs until the host is crashed.
    pub(crate) async fn run(self: Arc<Self>) -> turmoil::Result {
        let p = self.index;
        let ttl = self.config.ttl;
        // Each incarnation draws from a seed of its own, and its clock is
        // the one the fault schedule steps from now on.
        let (incarnation, clock) = {
            let mut clocks = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
            let n = clocks.len() as u64;
            let clock = SimClock::new(mix(self.config.seed
                ^ ((p as u64) << 40)
                ^ (n << 20)
                ^ 0xc10c));
            clocks.push(clock.clone());
            (n, clock)
        };
        let me = format!("p{p}.{incarnation}");
        let client = GrpcLease::builder(format!("http://leased:{LEASE_PORT}"))
            .transport(net::channel_to(format!("leased:{LEASE_PORT}")))
            .clock(Arc::new(clock.clone()))
            .min_grant(ttl)
            .call_timeout(ttl / 4)
            .build()?;
        let keeper = LeaseKeeper::builder(Arc::new(client), OwnerId::new(format!("p{p}"))?, ttl)
            .clock(Arc::new(clock.clone()))
            .build()?;
        self.world
            .event(now(), format!("{me}: started as {}", keeper.writer()));
        let keeper = Arc::new(keeper);
        let workers: Vec<_> = (0..self.config.workers)
            .map(|w| {
                let (this, keeper) = (Arc::clone(&self), Arc::clone(&keeper));
                let (me, rng) = (format!("{me}.{w}"), Rng::new(clock.random()));
                tokio::spawn(async move { this.work(&keeper, &me, rng).await })
            })
            .collect();
        for worker in workers {
            worker.await??;
        }
        Ok(())
    }

    /// Whether the worker counts on its lease now: while its keeper says
    /// time is left, or, broken, until the keeper says it is lost.
    fn counts_on(&self, guard: &LeaseGuard) -> bool {
        if self.config.variant == Variant::CountsOnLeaseUntilLost {
            guard.is_leased() && !guard.is_lost()
        } else {
            guard.safe_for().is_some_and(|d| !d.is_zero())
        }
    }

    /// One worker: takes a session, writes under it, gives it back, and
    /// again, until the host is crashed.
    async fn work(&self, keeper: &LeaseKeeper, me: &str, mut rng: Rng) -> Result<(), String> {
        let (p, ttl) = (self.index, self.config.ttl);
        let mut written = 0u64;
        loop {
            let session = format!("s{}", rng.below(self.config.sessions as u64));
            let id = SessionId::new(session.clone()).map_err(|e| e.to_string())?;
            let guard = match keeper.acquire(&id).await {
                Ok(guard) => guard,
                Err(e) => {
                    self.world
                        .event(now(), format!("{me}: {session} refused: {:?}", e.kind()));
                    // A server tells its client to come back later; the
                    // worker turns to another session after a pause.
                    tokio::time::sleep(rng.between(ttl / 100, ttl / 10)).await;
                    continue;
                }
            };
            let token = guard.token().map_or(0, |t| t.get());
            self.world
                .event(now(), format!("{me}: holds {session} token {token}"));
            // Most runs are a burst of writes; some are long, spanning
            // renewals, which is where a lease is lost while counted on.
            let (writes, gap) = if rng.chance(200) {
                (2 + rng.below(12), ttl / 2)
            } else {
                (1 + rng.below(5), ttl / 300)
            };
            for _ in 0..writes {
                tokio::time::sleep(rng.between(Duration::ZERO, gap)).await;
                if self.counts_on(&guard) {
                    let held = holder(&self.table, &id);
                    self.world
                        .belief(now(), &session, &format!("p{p}"), token, held);
                }
                // Now and then the write stalls between reading its fence
                // and sending it, as a paused process would.
                let stall = if rng.chance(30) {
                    rng.between(ttl / 2, ttl * 2)
                } else {
                    Duration::ZERO
                };
                let tag = format!("{me}.{written}");
                written += 1;
                let running = self.world.write_begins(&session, token);
                let (s, t) = (session.clone(), tag.clone());
                let write = move |fence: WriteFence| async move {
                    let _running = running;
                    tokio::time::sleep(stall).await;
                    store::write(&s, &fence, &t, ttl).await
                };
                // Now and then the run ends with its write still running:
                // the release must wait for it.
                if self.config.variant == Variant::WriteNotTracked {
                    drop(tokio::spawn(write(guard.fence())));
                    break;
                }
                let Ok(task) = guard.spawn_write(write) else {
                    self.world.event(now(), format!("{me}: {session} lost"));
                    break;
                };
                if rng.chance(50) {
                    drop(task);
                    break;
                }
                let outcome = task.await;
                self.world
                    .event(now(), format!("{me}: write {tag} {outcome:?}"));
                if outcome == WriteOutcome::Fenced {
                    break;
                }
            }
            let released = guard.finish().await;
            self.world.event(
                now(),
                format!("{me}: released {session}: {}", released.is_ok()),
            );
        }
    }
}
