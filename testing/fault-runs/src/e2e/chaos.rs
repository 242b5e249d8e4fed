//! Faults on the replicas (SIGSTOP past the lease TTL, SIGKILL and
//! restart, clean restart) and, through the rig's own [`Chaos`], on the
//! services behind them.

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
        if roll < 40 {
            // Past the TTL: the session is taken over while the holder
            // sleeps, and it wakes believing it still holds it.
            let fault = rec.fault(FaultKind::ServicePause, &name);
            replicas.pause(i)?;
            sleep(rng.between(self.ttl * 3 / 2, self.ttl * 5 / 2)).await;
            replicas.resume(i)?;
            rec.heal(fault);
        } else if roll < 80 {
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
