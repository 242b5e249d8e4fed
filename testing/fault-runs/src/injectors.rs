//! The faults each rig can inject, chosen from the run's seed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use grpcdriver::{LeaseServer, ServeError};
use k8s_emulator::{DroppedReply, Failure};
use lease_history::{ClockStepper, FaultInjector, FaultKind, Recorder, Rng};
use lease_port::{Clock, SessionLease};
use test_services::{
    Controls, EtcdCluster, EtcdServer, FaultProxy, PostgresServer, ProxyMode, RedisServer,
    ServiceError,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, block_in_place};
use tokio::time::sleep;

use crate::holders::{self, HolderSet};
use crate::partitions::Partitions;
use crate::rewinds::{EmulatorRewind, RedisMemory, RedisRewind, StoreSwap};

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A service process the faults kill, restart, stop and resume, whatever
/// the server: each rig hands its own to the same actions.
pub(crate) trait Service: Controls + Send {
    /// SIGKILL, as a crash would; [`restart`](Self::restart) brings it
    /// back.
    fn kill(&mut self);
    /// A clean stop, or none after a kill, and a start on the same port and
    /// data.
    fn restart(&mut self) -> Result<(), ServiceError>;
}

impl Service for RedisServer {
    fn kill(&mut self) {
        RedisServer::kill(self);
    }

    fn restart(&mut self) -> Result<(), ServiceError> {
        RedisServer::restart(self)
    }
}

impl Service for PostgresServer {
    fn kill(&mut self) {
        PostgresServer::kill(self);
    }

    fn restart(&mut self) -> Result<(), ServiceError> {
        PostgresServer::restart(self)
    }
}

/// A lease server on a fixed loopback port that can be restarted in place.
pub(crate) struct GrpcServer {
    backend: Arc<dyn SessionLease>,
    clock: Arc<dyn Clock>,
    pub(crate) addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl GrpcServer {
    pub(crate) async fn start(
        backend: Arc<dyn SessionLease>,
        clock: Arc<dyn Clock>,
    ) -> Result<GrpcServer, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind the lease server: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let mut server = GrpcServer {
            backend,
            clock,
            addr,
            stop: None,
            task: None,
        };
        server.serve(listener);
        Ok(server)
    }

    fn serve(&mut self, listener: TcpListener) {
        let server = LeaseServer::new(Arc::clone(&self.backend)).clock(Arc::clone(&self.clock));
        let (stop, stopped) = oneshot::channel::<()>();
        self.stop = Some(stop);
        self.task = Some(tokio::spawn(server.serve(listener, async {
            let _ = stopped.await;
        })));
    }

    /// Stops serving, then serves again on the same address.
    pub(crate) async fn restart(&mut self, down_for: Duration) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            // In-flight calls finish first; a blackholed one must not hold
            // the restart for ever.
            match tokio::time::timeout(Duration::from_secs(5), task).await {
                Ok(joined) => {
                    joined
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                }
                Err(_) => return Err("the lease server did not stop within 5 s".into()),
            }
        }
        sleep(down_for).await;
        let mut last = None;
        for _ in 0..100 {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => {
                    self.serve(listener);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            sleep(Duration::from_millis(20)).await;
        }
        Err(format!("rebind {}: {last:?}", self.addr))
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One way to hurt a rig.
pub(crate) enum Action {
    /// Step the authority's wall clock.
    Clock(ClockStepper),
    /// Delay, drop, blackhole or lose the replies of a proxy's traffic for
    /// up to `longest`.
    Proxy {
        proxy: Arc<FaultProxy>,
        name: &'static str,
        longest: Duration,
    },
    /// Restart the lease server, down for up to `longest`.
    GrpcRestart {
        server: Arc<tokio::sync::Mutex<GrpcServer>>,
        longest: Duration,
    },
    /// Restart a service cleanly or kill it (SIGKILL) and start it again.
    Service {
        service: Arc<Mutex<dyn Service>>,
        name: &'static str,
        kill: bool,
        longest: Duration,
    },
    /// Stop a service with SIGSTOP for up to `longest` (past the TTL at
    /// times), then SIGCONT: connections stay open and nothing is answered.
    ServicePause {
        service: Arc<Mutex<dyn Service>>,
        name: &'static str,
        longest: Duration,
    },
    /// Kill etcd (SIGKILL) and start it again.
    EtcdServerKill {
        etcd: Arc<Mutex<EtcdServer>>,
        longest: Duration,
    },
    /// Kill the cluster's leader, restart it after up to `longest`.
    EtcdKillLeader {
        cluster: Arc<Mutex<EtcdCluster>>,
        longest: Duration,
    },
    /// SIGSTOP a member for up to `longest`, then SIGCONT.
    EtcdPauseMember {
        cluster: Arc<Mutex<EtcdCluster>>,
        longest: Duration,
    },
    /// Restart every member.
    EtcdRestartAll { cluster: Arc<Mutex<EtcdCluster>> },
    /// The API emulator's own faults: latency, 5xx, replies lost after
    /// commit.
    Emulator {
        faults: k8s_emulator::Faults,
        longest: Duration,
    },
    /// Holders in processes of their own: stopped past their TTL, killed
    /// and replaced, or a descriptor churned in them.
    Holders(HolderSet),
    /// Links of a private network cut and healed.
    Partitions(Box<Partitions>),
    /// Redis restarted from an older snapshot, its clients restarted once
    /// they refuse it.
    RedisRewind(Box<RedisRewind>),
    /// Redis under memory pressure with each evicting policy in turn.
    RedisMemory(Box<RedisMemory>),
    /// The API emulator's Lease storage rewound to a snapshot or wiped.
    EmulatorRewind(Box<EmulatorRewind>),
    /// Every holder stopped, the store directory backed up or put back
    /// from the backup, every holder started again.
    StoreSwap(Box<StoreSwap>),
}

/// Picks one action per fault, uniformly, from the run's seed — except
/// the actions in `sure`, which come on a schedule of their own: in the
/// order given at every other fault from the first (so that a short run
/// injects each at least once), then in the same order again at every
/// fourth; the other faults are drawn from the remaining actions.
pub(crate) struct Chaos {
    pub(crate) actions: Vec<Action>,
    /// Indices into `actions`, in the order they are due.
    pub(crate) sure: Vec<usize>,
    /// Faults injected so far.
    pub(crate) injected: usize,
}

impl Chaos {
    /// Uniform choices among `actions`.
    pub(crate) fn new(actions: Vec<Action>) -> Chaos {
        Chaos {
            actions,
            sure: Vec::new(),
            injected: 0,
        }
    }

    /// The actions of indices `sure` come on their schedule (see
    /// [`Chaos`]), never drawn.
    pub(crate) fn with_sure(mut self, sure: Vec<usize>) -> Chaos {
        self.sure = sure
            .into_iter()
            .filter(|&i| i < self.actions.len())
            .collect();
        self
    }

    /// The scheduled action due at fault `n`, if one is.
    fn due(&self, n: usize) -> Option<usize> {
        let first = 2 * self.sure.len();
        if self.sure.is_empty() {
            None
        } else if n < first {
            n.is_multiple_of(2).then(|| self.sure[n / 2])
        } else {
            let k = n - first;
            k.is_multiple_of(4)
                .then(|| self.sure[(k / 4) % self.sure.len()])
        }
    }
}

#[async_trait]
impl FaultInjector for Chaos {
    async fn inject(&mut self, rng: &mut Rng, rec: &Recorder) -> Result<(), String> {
        if self.actions.is_empty() {
            return Ok(());
        }
        let due = self.due(self.injected);
        self.injected += 1;
        let i = match due {
            Some(i) => i,
            None => {
                let drawn: Vec<usize> = (0..self.actions.len())
                    .filter(|i| !self.sure.contains(i))
                    .collect();
                if drawn.is_empty() {
                    rng.below(self.actions.len() as u64) as usize
                } else {
                    drawn[rng.below(drawn.len() as u64) as usize]
                }
            }
        };
        match &mut self.actions[i] {
            Action::Clock(stepper) => stepper.inject(rng, rec).await,
            Action::Proxy {
                proxy,
                name,
                longest,
            } => proxy_fault(proxy, name, *longest, rng, rec).await,
            Action::GrpcRestart { server, longest } => {
                let fault = rec.fault(FaultKind::ServiceRestart, "lease-server");
                let down = rng.between(Duration::ZERO, *longest);
                server.lock().await.restart(down).await?;
                rec.heal(fault);
                Ok(())
            }
            Action::Service {
                service,
                name,
                kill,
                longest,
            } => {
                let kind = if *kill {
                    FaultKind::ServiceKill
                } else {
                    FaultKind::ServiceRestart
                };
                let fault = rec.fault(kind, name);
                if *kill {
                    block_in_place(|| lock(service).kill());
                    sleep(rng.between(Duration::ZERO, *longest)).await;
                }
                block_in_place(|| lock(service).restart()).map_err(|e| e.to_string())?;
                rec.heal(fault);
                Ok(())
            }
            Action::ServicePause {
                service,
                name,
                longest,
            } => {
                let fault = rec.fault(FaultKind::ServicePause, name);
                block_in_place(|| lock(service).pause()).map_err(|e| e.to_string())?;
                sleep(rng.between(*longest / 4, *longest)).await;
                block_in_place(|| lock(service).resume()).map_err(|e| e.to_string())?;
                rec.heal(fault);
                Ok(())
            }
            Action::EtcdServerKill { etcd, longest } => {
                let fault = rec.fault(FaultKind::ServiceKill, "etcd");
                block_in_place(|| lock(etcd).kill());
                sleep(rng.between(Duration::ZERO, *longest)).await;
                block_in_place(|| lock(etcd).restart()).map_err(|e| e.to_string())?;
                rec.heal(fault);
                Ok(())
            }
            Action::EtcdKillLeader { cluster, longest } => {
                // Right after an earlier fault the cluster may be electing.
                let leader = block_in_place(|| lock(cluster).wait_for_leader())
                    .map_err(|e| e.to_string())?;
                let fault = rec.fault(FaultKind::ServiceKill, &format!("etcd-{leader} (leader)"));
                block_in_place(|| lock(cluster).kill(leader));
                sleep(rng.between(*longest / 4, *longest)).await;
                block_in_place(|| lock(cluster).start_member(leader)).map_err(|e| e.to_string())?;
                rec.heal(fault);
                Ok(())
            }
            Action::EtcdPauseMember { cluster, longest } => {
                let member = rng.below(3) as usize;
                let fault = rec.fault(FaultKind::ServicePause, &format!("etcd-{member}"));
                block_in_place(|| lock(cluster).pause(member)).map_err(|e| e.to_string())?;
                sleep(rng.between(*longest / 4, *longest)).await;
                block_in_place(|| lock(cluster).resume(member)).map_err(|e| e.to_string())?;
                rec.heal(fault);
                Ok(())
            }
            Action::EtcdRestartAll { cluster } => {
                let fault = rec.fault(FaultKind::ServiceRestart, "etcd (every member)");
                block_in_place(|| lock(cluster).restart_all()).map_err(|e| e.to_string())?;
                rec.heal(fault);
                Ok(())
            }
            Action::Emulator { faults, longest } => {
                let kind = match rng.below(3) {
                    0 => {
                        faults.set_latency(rng.between(Duration::from_millis(5), *longest / 4));
                        FaultKind::ServiceLatency
                    }
                    1 => {
                        let failure = match rng.below(3) {
                            0 => Failure::InternalError,
                            1 => Failure::ServiceUnavailable,
                            _ => Failure::GatewayTimeout,
                        };
                        faults.fail_next(1 + rng.below(4) as u32, failure, None);
                        FaultKind::ServiceErrors
                    }
                    _ => {
                        let how = if rng.below(2) == 0 {
                            DroppedReply::CloseConnection
                        } else {
                            DroppedReply::Timeout
                        };
                        faults.drop_reply_after_commit(1 + rng.below(3) as u32, how, None);
                        FaultKind::ServiceDropsReplies
                    }
                };
                let fault = rec.fault(kind, "k8s-emulator");
                sleep(rng.between(*longest / 4, *longest)).await;
                faults.clear();
                rec.heal(fault);
                Ok(())
            }
            Action::Holders(holders) => holders::hurt(&holders::current(holders), rng, rec).await,
            Action::Partitions(partitions) => partitions.inject(rng, rec).await,
            Action::RedisRewind(rewind) => rewind.inject(rec).await,
            Action::RedisMemory(memory) => memory.inject(rec).await,
            Action::EmulatorRewind(rewind) => rewind.inject(rec).await,
            Action::StoreSwap(swap) => swap.inject(rec).await,
        }
    }
}

/// Delays, drops, blackholes or loses the replies of `proxy`'s traffic
/// for up to `longest`, then passes it again.
async fn proxy_fault(
    proxy: &FaultProxy,
    name: &str,
    longest: Duration,
    rng: &mut Rng,
    rec: &Recorder,
) -> Result<(), String> {
    let (mode, kind) = match rng.below(4) {
        0 => (
            ProxyMode::delay(rng.between(Duration::from_millis(2), longest / 4)),
            FaultKind::ProxyDelay,
        ),
        1 => (ProxyMode::Drop, FaultKind::ProxyDrop),
        2 => (ProxyMode::Blackhole, FaultKind::ProxyBlackhole),
        _ => (ProxyMode::DropReplies, FaultKind::ProxyDropReplies),
    };
    let fault = rec.fault(kind, name);
    proxy.set_mode(mode);
    sleep(rng.between(longest / 4, longest)).await;
    proxy.set_mode(ProxyMode::Pass);
    rec.heal(fault);
    Ok(())
}
