//! Faults on the replicas (SIGSTOP past the lease TTL, of the replica
//! alone or of it and its agents, SIGKILL and restart, clean restart) and,
//! through the rig's own [`Chaos`], on the services behind them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lease_history::{FaultInjector, FaultKind, Recorder, Rng};
use tokio::task::block_in_place;
use tokio::time::sleep;

use super::replicas::Replicas;
use crate::injectors::Chaos;

pub(crate) struct ReplicaChaos {
    pub(crate) replicas: Arc<Replicas>,
    /// Faults of the services (Redis, the API emulator, etcd), when there
    /// are.
    pub(crate) services: Option<Chaos>,
    /// Of every hundred faults, how many hit the services.
    pub(crate) services_share: u64,
    pub(crate) ttl: Duration,
    /// Mean time between faults.
    pub(crate) every: Duration,
    /// Of every hundred faults on the replicas, how many are of each kind.
    pub(crate) mix: ReplicaMix,
}

/// How the faults on the replicas are shared out, in hundredths; restarts
/// take what is left.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaMix {
    /// SIGSTOP of the replica alone.
    pub(crate) pauses: u64,
    /// The replica frozen with its agents, its agents let go first.
    pub(crate) freezes: u64,
    pub(crate) kills: u64,
}

impl ReplicaMix {
    /// The mix of every run.
    pub(crate) const USUAL: ReplicaMix = ReplicaMix {
        pauses: 25,
        freezes: 15,
        kills: 40,
    };
    /// Mostly freezes: the one fault that sends a lost owner's effects
    /// after the next owner's, for the variant whose destination must be
    /// caught performing them.
    pub(crate) const FREEZES: ReplicaMix = ReplicaMix {
        pauses: 0,
        freezes: 90,
        kills: 10,
    };
}

impl ReplicaChaos {
    /// Injects faults one after another until `stop` is set; every fault
    /// is healed before the next and before returning.
    pub(crate) async fn run(
        mut self,
        seed: u64,
        rec: Recorder,
        stop: Arc<AtomicBool>,
    ) -> Result<(), String> {
        let mut rng = Rng::new(seed ^ 0x5eed_fa17);
        // Let the clients get going first.
        sleep(self.every / 2).await;
        while !stop.load(Ordering::Relaxed) {
            self.inject(&mut rng, &rec).await?;
            let pause = rng.between(self.every / 2, self.every * 3 / 2);
            let step = Duration::from_millis(50);
            let mut waited = Duration::ZERO;
            while waited < pause && !stop.load(Ordering::Relaxed) {
                sleep(step).await;
                waited += step;
            }
        }
        Ok(())
    }

    async fn inject(&mut self, rng: &mut Rng, rec: &Recorder) -> Result<(), String> {
        let i = rng.below(self.replicas.len() as u64) as usize;
        let name = self.replicas.name(i);
        let roll = rng.below(100);
        let services = if self.services.is_some() {
            self.services_share
        } else {
            0
        };
        if roll < services
            && let Some(chaos) = self.services.as_mut()
        {
            return chaos.inject(rng, rec).await;
        }
        let roll = rng.below(100);
        let replicas = Arc::clone(&self.replicas);
        let ReplicaMix {
            pauses,
            freezes,
            kills,
        } = self.mix;
        if roll < pauses {
            // Past the TTL: the session is taken over while the holder
            // sleeps, and it wakes believing it still holds it. Its agents
            // run on meanwhile.
            let fault = rec.fault(FaultKind::ServicePause, &name);
            replicas.pause(i)?;
            sleep(rng.between(self.ttl * 3 / 2, self.ttl * 5 / 2)).await;
            replicas.resume(i)?;
            rec.heal(fault);
        } else if roll < pauses + freezes {
            // Frozen whole past the TTL, then its agents are let go a
            // moment before the replica: they act on, under the lost
            // lease, after the next owner's agents have, before their
            // replica can notice the loss and stop them. Only the effects'
            // destination can refuse them.
            // A replica with a run in progress, when one has: frozen
            // idle, it has no agent to act late.
            let busy: Vec<usize> = (0..replicas.len())
                .filter(|&r| replicas.runs_agents(r))
                .collect();
            let i = match busy.len() as u64 {
                0 => i,
                n => busy[rng.below(n) as usize],
            };
            let name = replicas.name(i);
            let fault = rec.fault(FaultKind::HolderStopped, &format!("{name} with its agents"));
            let agents = replicas.freeze(i)?;
            sleep(rng.between(self.ttl * 3 / 2, self.ttl * 5 / 2)).await;
            Replicas::thaw_agents(&agents);
            sleep(rng.between(Duration::from_millis(100), Duration::from_millis(400))).await;
            replicas.resume(i)?;
            rec.heal(fault);
        } else if roll < pauses + freezes + kills {
            let fault = rec.fault(FaultKind::ServiceKill, &name);
            block_in_place(|| replicas.kill(i));
            sleep(rng.between(Duration::ZERO, self.ttl)).await;
            block_in_place(|| replicas.start_again(i))?;
            rec.heal(fault);
        } else {
            let fault = rec.fault(FaultKind::ServiceRestart, &name);
            block_in_place(|| replicas.stop(i, Duration::from_secs(20)))?;
            block_in_place(|| replicas.start_again(i))?;
            rec.heal(fault);
        }
        Ok(())
    }
}
