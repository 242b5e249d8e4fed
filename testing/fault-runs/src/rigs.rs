//! One rig per backend: the real services, the lease handles the workers
//! use, the store they write to, and the faults that fit.

use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcdlease::EtcdLease;
use flocklease::FlockLease;
use grpcdriver::GrpcLease;
use k8s_emulator::{Emulator, EmulatorConfig};
use k8slease::K8sLease;
use lease_history::{Clients, ClockStepper, FaultInjector, SteppedClock, Target, Workload};
use lease_port::{Clock, SessionLease, SystemClock};
use memlease::MemLease;
use pglease::PgLease;
use redis_session_store::{RedisLease, RedisStore};
use session_store::{FsyncPolicy, GenerationCheck, JsonlOptions, JsonlStore, SessionStore};
use test_services::{EtcdCluster, EtcdServer, FaultProxy, PostgresServer, RedisServer};

use crate::holders::{self, Holder, HolderConfig, LeaseSpec};
use crate::injectors::{Action, Chaos, GrpcServer, Service};
use crate::rewinds::{EmulatorRewind, MakeClients, RedisMemory, RedisRewind, StoreSwap};
use lease_history::broken::{POLICY_NEVER_RECHECKED, SettingBreakage};

pub(crate) struct Rig {
    pub(crate) target: Target,
    pub(crate) faults: Option<Box<dyn FaultInjector>>,
    /// Services and directories that must live until the run ends.
    pub(crate) keep: Vec<Box<dyn Any + Send>>,
}

pub(crate) fn jsonl(dir: &Path) -> Result<Arc<dyn SessionStore>, String> {
    let store = JsonlStore::open(
        dir.join("store"),
        JsonlOptions::default().fsync(FsyncPolicy::Never),
    )
    .map_err(|e| format!("open the JSONL store: {e}"))?;
    Ok(Arc::new(store))
}

fn chaos(actions: Vec<Action>) -> Option<Box<dyn FaultInjector>> {
    Some(Box::new(Chaos::new(actions)))
}

/// A lease call gives up well within a third of the TTL, so a renewal
/// that meets a fault still leaves time for another.
fn call_timeout(ttl: Duration) -> Duration {
    ttl / 4
}

pub(crate) async fn setup(name: &str, w: &mut Workload, dir: &Path) -> Result<Rig, String> {
    match name {
        "memlease" => {
            let clock = SteppedClock::new();
            let leases = MemLease::builder()
                .ttl(w.ttl)
                .clock(Arc::new(clock.clone()))
                .build();
            Ok(Rig {
                target: Target::new(vec![Arc::new(leases)], jsonl(dir)?, Arc::new(clock.clone())),
                faults: chaos(vec![Action::Clock(ClockStepper::new(
                    clock, w.ttl, "memlease",
                ))]),
                keep: Vec::new(),
            })
        }
        "flocklease" => flock_swaps(w, dir, None),
        "grpc-memlease" | "grpc-flocklease" | "grpc-etcd" => grpc(name, w, dir).await,
        "redis" => redis(w, None).await,
        "postgres" => postgres(w, dir).await,
        "k8s" => k8s(w, dir, None).await,
        "etcd" => etcd(w, dir).await,
        "etcd-partitions" => crate::partitions::etcd_partitions(w, dir).await,
        other => Err(format!("unknown backend {other}")),
    }
}

/// Every worker's holder is a process of its own, opening the lease
/// directory and the store itself, as session servers on one host do; the
/// faults stop and kill those processes. With `broken_store`, the holders
/// write through a store without fencing (a broken variant).
pub(crate) fn flock_holders(
    w: &mut Workload,
    dir: &Path,
    broken_store: bool,
) -> Result<Rig, String> {
    let (target, holders) = start_holders(w, dir, broken_store, None)?;
    Ok(Rig {
        target,
        faults: chaos(vec![Action::Holders(holders)]),
        keep: Vec::new(),
    })
}

/// A holder process per worker over the lease directory `dir/leases` and
/// the store `dir/store`, opened with a generation check witnessed in
/// `witness` when given (as a server opens it), and the target over them.
fn start_holders(
    w: &mut Workload,
    dir: &Path,
    broken_store: bool,
    witness: Option<&Path>,
) -> Result<(Target, holders::HolderSet), String> {
    w.ttl = Duration::from_millis(300);
    let generation = witness.map_or(GenerationCheck::Off, GenerationCheck::witness);
    let store = holders::open_store(&dir.join("store"), &generation)
        .map_err(|e| format!("open the JSONL store: {e}"))?;
    let holders = (0..w.workers)
        .map(|i| {
            Holder::start(
                format!("w{i}"),
                HolderConfig {
                    leases: LeaseSpec::Flock(dir.join("leases")),
                    store: dir.join("store"),
                    ttl: w.ttl,
                    broken_store,
                    generation_witness: witness.map(Path::to_path_buf),
                    host: None,
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let target = holders::target_of(&holders, Arc::new(store));
    Ok((target, holders::set_of(holders)))
}

/// The file-lease rig with store directory swaps: holder processes that
/// open the store with a generation check witnessed in the lease
/// directory — or, with [`SettingBreakage::GenerationCheckOff`], without
/// one — stopped, killed and churned, and every so often all stopped
/// while the store directory is backed up or put back from that backup.
/// The broken variant injects only the swaps.
pub(crate) fn flock_swaps(
    w: &mut Workload,
    dir: &Path,
    breakage: Option<SettingBreakage>,
) -> Result<Rig, String> {
    let lease_dir = dir.join("leases");
    let check = breakage != Some(SettingBreakage::GenerationCheckOff);
    let witness = check.then_some(lease_dir.as_path());
    let (target, holders) = start_holders(w, dir, false, witness)?;
    let swap = Action::StoreSwap(Box::new(StoreSwap {
        holders: Arc::clone(&holders),
        restarts: target.restarts.clone(),
        store_dir: dir.join("store"),
        lease_dir: lease_dir.clone(),
        generation: witness.map_or(GenerationCheck::Off, GenerationCheck::witness),
        backup_dir: dir.join("store-backup"),
        backup: None,
    }));
    let faults = if breakage.is_some() {
        Chaos::new(vec![swap])
    } else {
        // A backup and a swap in every run, however short.
        Chaos::new(vec![Action::Holders(holders), swap]).with_sure(vec![1, 1])
    };
    Ok(Rig {
        target,
        faults: Some(Box::new(faults)),
        keep: Vec::new(),
    })
}

/// A lease server over a backend, reached by every worker through a fault
/// proxy with a client (and connection) of its own.
async fn grpc(name: &str, w: &mut Workload, dir: &Path) -> Result<Rig, String> {
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let mut actions = Vec::new();
    let system: Arc<dyn Clock> = Arc::new(SystemClock);
    let (backend, server_clock): (Arc<dyn SessionLease>, Arc<dyn Clock>) = match name {
        "grpc-memlease" => {
            w.ttl = Duration::from_millis(600);
            let clock = SteppedClock::new();
            actions.push(Action::Clock(ClockStepper::new(
                clock.clone(),
                w.ttl,
                "lease-server clock",
            )));
            let backend = MemLease::builder()
                .ttl(w.ttl)
                .clock(Arc::new(clock.clone()))
                .build();
            (Arc::new(backend), Arc::new(clock))
        }
        "grpc-flocklease" => {
            w.ttl = Duration::from_millis(600);
            let backend = FlockLease::builder(dir.join("leases"))
                .ttl(w.ttl)
                .open()
                .map_err(|e| format!("open the lease directory: {e}"))?;
            (Arc::new(backend), Arc::clone(&system))
        }
        _ => {
            w.ttl = Duration::from_secs(2);
            let etcd = tokio::task::block_in_place(EtcdServer::start)
                .map_err(|e| format!("start etcd: {e}"))?;
            let backend = EtcdLease::builder([etcd.endpoint()])
                .prefix("/faults/")
                .ttl(w.ttl)
                .request_timeout(call_timeout(w.ttl))
                .build()
                .map_err(|e| format!("etcd lease: {e}"))?;
            let etcd = Arc::new(Mutex::new(etcd));
            actions.push(Action::EtcdServerKill {
                etcd: Arc::clone(&etcd),
                longest: w.ttl,
            });
            keep.push(Box::new(etcd));
            (Arc::new(backend), Arc::clone(&system))
        }
    };
    let server = GrpcServer::start(backend, server_clock).await?;
    let proxy = Arc::new(FaultProxy::start(server.addr).map_err(|e| format!("proxy: {e}"))?);
    let leases = (0..w.workers)
        .map(|_| {
            GrpcLease::builder(proxy.addr().to_string())
                .call_timeout(call_timeout(w.ttl))
                .build()
                .map(|l| Arc::new(l) as Arc<dyn SessionLease>)
                .map_err(|e| format!("gRPC client: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let server = Arc::new(tokio::sync::Mutex::new(server));
    actions.push(Action::Proxy {
        proxy: Arc::clone(&proxy),
        name: "proxy to the lease server",
        longest: w.ttl,
    });
    actions.push(Action::GrpcRestart {
        server: Arc::clone(&server),
        longest: w.ttl / 2,
    });
    keep.push(Box::new(server));
    keep.push(Box::new(proxy));
    Ok(Rig {
        target: Target::new(leases, jsonl(dir)?, system),
        faults: chaos(actions),
        keep,
    })
}

/// How the Redis rig's clients are made: one lease connection per worker
/// and one store connection, all through the fault proxy, the memory
/// policy read on every call — or, with
/// [`SettingBreakage::PolicyNeverRechecked`], only at connect.
#[derive(Debug, Clone)]
struct RedisClients {
    url: String,
    workers: usize,
    ttl: Duration,
    policy_check: Duration,
}

impl RedisClients {
    async fn connect(&self) -> Result<Clients, String> {
        let mut leases: Vec<Arc<dyn SessionLease>> = Vec::new();
        for _ in 0..self.workers {
            let lease = RedisLease::builder(self.url.clone())
                .ttl(self.ttl)
                .request_timeout(call_timeout(self.ttl))
                .policy_check_interval(self.policy_check)
                .connect()
                .await
                .map_err(|e| format!("redis lease: {e}"))?;
            leases.push(Arc::new(lease));
        }
        let store = RedisStore::builder(self.url.clone())
            .request_timeout(call_timeout(self.ttl))
            .policy_check_interval(self.policy_check)
            .connect()
            .await
            .map_err(|e| format!("redis store: {e}"))?;
        Ok(Clients {
            leases,
            store: Arc::new(store),
            writers: Vec::new(),
        })
    }

    fn maker(self) -> MakeClients {
        let clients = Arc::new(self);
        Arc::new(move || {
            let clients = Arc::clone(&clients);
            Box::pin(async move { clients.connect().await })
        })
    }
}

/// Leases and the store in one persistent Redis, reached through a fault
/// proxy: a partition cuts both, as it would in a deployment. Besides
/// proxy faults, restarts, kills and stops, Redis is restarted from an
/// older snapshot, and put under memory pressure with each evicting
/// policy. The broken variant ([`SettingBreakage::PolicyNeverRechecked`])
/// injects only the memory pressure.
pub(crate) async fn redis(
    w: &mut Workload,
    breakage: Option<SettingBreakage>,
) -> Result<Rig, String> {
    w.ttl = Duration::from_millis(600);
    let redis = tokio::task::block_in_place(RedisServer::start_persistent)
        .map_err(|e| format!("start redis: {e}"))?;
    let proxy = Arc::new(FaultProxy::start(redis.addr()).map_err(|e| format!("proxy: {e}"))?);
    let made = RedisClients {
        url: format!("redis://{}", proxy.addr()),
        workers: w.workers,
        ttl: w.ttl,
        policy_check: match breakage {
            Some(SettingBreakage::PolicyNeverRechecked) => POLICY_NEVER_RECHECKED,
            _ => Duration::ZERO,
        },
    };
    let clients = made.connect().await?;
    let target = Target::new(clients.leases, clients.store, Arc::new(SystemClock));
    let make = made.maker();
    let redis = Arc::new(Mutex::new(redis));
    let memory = Action::RedisMemory(Box::new(RedisMemory {
        redis: Arc::clone(&redis),
        restarts: target.restarts.clone(),
        make: Arc::clone(&make),
        window: w.ttl / 4,
        workers: w.workers,
    }));
    let faults = if breakage.is_some() {
        Chaos::new(vec![memory])
    } else {
        let mut actions = vec![Action::Proxy {
            proxy: Arc::clone(&proxy),
            name: "proxy to redis",
            longest: w.ttl,
        }];
        actions.extend(service_actions(Arc::clone(&redis) as _, "redis", w.ttl));
        actions.extend([
            Action::RedisRewind(Box::new(RedisRewind {
                redis: Arc::clone(&redis),
                restarts: target.restarts.clone(),
                make,
                workers: w.workers,
                snapshot: None,
            })),
            memory,
        ]);
        // A snapshot, the memory pressure, the restart from the snapshot.
        Chaos::new(actions).with_sure(vec![4, 5, 4])
    };
    Ok(Rig {
        target,
        faults: Some(Box::new(faults)),
        keep: vec![Box::new(redis), Box::new(proxy)],
    })
}

/// `service` restarted cleanly, killed and started again, each down for
/// up to `longest`, and stopped for up to twice that: past the TTL at
/// times, its clients' connections left open and unanswered.
pub(crate) fn service_actions(
    service: Arc<Mutex<dyn Service>>,
    name: &'static str,
    longest: Duration,
) -> Vec<Action> {
    [false, true]
        .map(|kill| Action::Service {
            service: Arc::clone(&service),
            name,
            kill,
            longest,
        })
        .into_iter()
        .chain([Action::ServicePause {
            service,
            name,
            longest: longest * 2,
        }])
        .collect()
}

/// `pglease` on one PostgreSQL reached through a fault proxy, every
/// worker with a client (and connections) of its own; the store a JSONL
/// directory. Besides the proxy's faults (replies lost after the commit
/// among them), PostgreSQL is restarted, SIGKILLed (it recovers from its
/// WAL) and stopped with every backend of its.
async fn postgres(w: &mut Workload, dir: &Path) -> Result<Rig, String> {
    // A call gives up after a quarter of the TTL, and a call after a fault
    // reconnects: the password exchange of a debug build on a loaded
    // machine must fit in that quarter.
    w.ttl = Duration::from_secs(1);
    let pg = tokio::task::block_in_place(PostgresServer::start)
        .map_err(|e| format!("start postgres: {e}"))?;
    let proxy = Arc::new(FaultProxy::start(pg.addr()).map_err(|e| format!("proxy: {e}"))?);
    let url = format!(
        "postgres://{}:{}@{}/postgres",
        pg.user(),
        pg.password(),
        proxy.addr()
    );
    let mut leases: Vec<Arc<dyn SessionLease>> = Vec::new();
    for _ in 0..w.workers {
        let lease = PgLease::builder(url.clone())
            .ttl(w.ttl)
            .request_timeout(call_timeout(w.ttl))
            .connect()
            .await
            .map_err(|e| format!("pglease: {e}"))?;
        leases.push(Arc::new(lease));
    }
    let pg = Arc::new(Mutex::new(pg));
    let mut actions = vec![Action::Proxy {
        proxy: Arc::clone(&proxy),
        name: "proxy to postgres",
        longest: w.ttl,
    }];
    actions.extend(service_actions(Arc::clone(&pg) as _, "postgres", w.ttl));
    Ok(Rig {
        target: Target::new(leases, jsonl(dir)?, Arc::new(SystemClock)),
        faults: chaos(actions),
        keep: vec![Box::new(pg), Box::new(proxy)],
    })
}

/// The Kubernetes API emulator, every worker with a kube client of its
/// own; faults are the emulator's (latency, 5xx, replies lost after the
/// write committed) and its Lease storage rewound to a snapshot or wiped,
/// after which the lease clients are restarted and the store's marks,
/// which did not go back, make the workers acquire above them.
///
/// With [`SettingBreakage::OwnerRecordTrusted`], the clients renew from
/// their memory of their owner leases (the broken variant).
pub(crate) async fn k8s(
    w: &mut Workload,
    dir: &Path,
    breakage: Option<SettingBreakage>,
) -> Result<Rig, String> {
    let trusted = breakage == Some(SettingBreakage::OwnerRecordTrusted);
    w.ttl = Duration::from_secs(1);
    let emulator = Arc::new(
        Emulator::start(EmulatorConfig::default())
            .await
            .map_err(|e| format!("start the API emulator: {e}"))?,
    );
    let kubeconfig = emulator.kubeconfig_path().to_path_buf();
    let (workers, ttl, store_dir) = (w.workers, w.ttl, dir.to_path_buf());
    let make: MakeClients = Arc::new(move || {
        let (kubeconfig, store_dir) = (kubeconfig.clone(), store_dir.clone());
        Box::pin(async move {
            let mut leases: Vec<Arc<dyn SessionLease>> = Vec::new();
            for _ in 0..workers {
                let client = k8slease::client_from_kubeconfig(&kubeconfig)
                    .await
                    .map_err(|e| format!("kube client: {e}"))?;
                // Every owner watches its sessions, so the faults reach the
                // watch and the lists it falls back to.
                let mut builder = K8sLease::builder(client, "default")
                    .ttl(ttl)
                    .request_timeout(call_timeout(ttl))
                    .watch_from(1);
                if trusted {
                    builder = builder.broken_trust_remembered_owner_lease();
                }
                let lease = builder.build().map_err(|e| format!("k8s lease: {e}"))?;
                leases.push(Arc::new(lease));
            }
            Ok(Clients {
                leases,
                store: jsonl(&store_dir)?,
                writers: Vec::new(),
            })
        })
    });
    let clients = make().await?;
    let target = Target::new(clients.leases, clients.store, Arc::new(SystemClock));
    let faults = emulator.faults().clone();
    let rewind = Action::EmulatorRewind(Box::new(EmulatorRewind {
        emulator: Arc::clone(&emulator),
        restarts: target.restarts.clone(),
        make,
        workers: w.workers,
        step: 0,
        snapshot: None,
        since: Duration::ZERO,
    }));
    Ok(Rig {
        target,
        faults: Some(Box::new(
            Chaos::new(vec![
                Action::Emulator {
                    faults,
                    longest: w.ttl,
                },
                rewind,
            ])
            // A snapshot, its restore, a wipe.
            .with_sure(vec![1, 1, 1]),
        )),
        keep: vec![Box::new(emulator)],
    })
}

/// A three-member etcd cluster, every worker with a client of its own
/// holding every endpoint.
async fn etcd(w: &mut Workload, dir: &Path) -> Result<Rig, String> {
    w.ttl = Duration::from_secs(2);
    let cluster = tokio::task::block_in_place(EtcdCluster::start)
        .map_err(|e| format!("start the etcd cluster: {e}"))?;
    let mut leases: Vec<Arc<dyn SessionLease>> = Vec::new();
    for _ in 0..w.workers {
        let lease = EtcdLease::builder(cluster.endpoints())
            .prefix("/faults/")
            .ttl(w.ttl)
            .request_timeout(call_timeout(w.ttl))
            .build()
            .map_err(|e| format!("etcd lease: {e}"))?;
        leases.push(Arc::new(lease));
    }
    let cluster = Arc::new(Mutex::new(cluster));
    Ok(Rig {
        target: Target::new(leases, jsonl(dir)?, Arc::new(SystemClock)),
        faults: chaos(vec![
            Action::EtcdKillLeader {
                cluster: Arc::clone(&cluster),
                longest: w.ttl,
            },
            Action::EtcdPauseMember {
                cluster: Arc::clone(&cluster),
                longest: w.ttl,
            },
            Action::EtcdRestartAll {
                cluster: Arc::clone(&cluster),
            },
        ]),
        keep: vec![Box::new(cluster)],
    })
}
