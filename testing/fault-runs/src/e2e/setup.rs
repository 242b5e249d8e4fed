//! What each end-to-end run starts: the services behind the replicas, the
//! replicas' command lines, and the faults those services can take.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use test_services::{EtcdCluster, FaultProxy, PostgresServer, RedisServer};

use super::replicas::Launch;
use super::{
    Breakage, DRAIN_TIMEOUT, ETCD_TTL, Plan, REDIS_PREFIX, REPLICAS, TTL, binary, lock,
    share_session_files, store,
};
use crate::injectors::Action;
use crate::rigs::service_actions;

/// The prefix of the PostgreSQL store's tables (and its leases').
const PG_PREFIX: &str = "faults";

/// The services a run's replicas use; dropped after them.
#[derive(Default)]
pub(super) struct Services {
    pub(super) redis: Option<Arc<Mutex<RedisServer>>>,
    _emulator: Option<k8s_emulator::Emulator>,
    _etcd: Option<Arc<Mutex<EtcdCluster>>>,
    postgres: Option<Arc<Mutex<PostgresServer>>>,
    _proxy: Option<Arc<FaultProxy>>,
    pub(super) store_dirs: Vec<PathBuf>,
}

impl Services {
    /// The writer of every event of `session`, from the store itself.
    pub(super) async fn writers(&self, session: &str) -> Result<HashMap<u64, Arc<str>>, String> {
        if let Some(redis) = &self.redis {
            let url = lock(redis).url();
            return store::redis_writers(&url, REDIS_PREFIX, session).await;
        }
        if let Some(pg) = &self.postgres {
            return tokio::task::block_in_place(|| {
                store::postgres_writers(&lock(pg), PG_PREFIX, session)
            });
        }
        store::jsonl_writers(&self.store_dirs[0], session)
    }
}

/// A run ready to start.
pub(super) struct Setup {
    /// The replicas' lease TTL.
    pub(super) ttl: Duration,
    /// Each replica's name and how it is started.
    pub(super) launches: Vec<(String, Launch)>,
    pub(super) services: Services,
    /// The faults of the services behind the replicas.
    pub(super) faults: Vec<Action>,
}

/// Starts the services of run `name` and says how its replicas start,
/// each running the agent `faults effect-agent …` for its turns.
pub(super) async fn setup(
    name: &str,
    plan: &Plan,
    dir: &Path,
    sessions: &[String],
    agent: &[String],
) -> Result<Setup, String> {
    let mut setup = Setup {
        ttl: if name == "mecated-etcd" {
            ETCD_TTL
        } else {
            TTL
        },
        launches: Vec::new(),
        services: Services::default(),
        faults: Vec::new(),
    };
    let (flags, jsonl) = match name {
        "mecated" => (Vec::new(), true),
        "mecated-etcd" => (etcd(&mut setup)?, true),
        "mecated-postgres" => (postgres(&mut setup, dir)?, false),
        "mecak8s" => {
            mecak8s(&mut setup, dir, agent).await?;
            return Ok(setup);
        }
        other => return Err(format!("no end-to-end run named {other:?}")),
    };
    let flags: Vec<String> = flags.into_iter().chain(agent_flags(agent)?).collect();
    mecated(&mut setup, plan, dir, sessions, &flags, jsonl).await?;
    Ok(setup)
}

/// The flags that make a replica run this executable, with `args`, as
/// its agent, handed the turn's input alone.
fn agent_flags(args: &[String]) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let mut flags: Vec<String> = vec![
        "--agent".into(),
        "exec".into(),
        "--agent-command".into(),
        exe.display().to_string(),
        "--agent-transcript".into(),
        "claim-only".into(),
    ];
    for arg in args {
        flags.extend(["--agent-arg".into(), arg.clone()]);
    }
    Ok(flags)
}

/// The flags every replica takes; `owner`, when the server takes it as a
/// flag.
fn common(ttl: Duration, owner: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--session-lease-ttl",
        &format!("{}ms", ttl.as_millis()),
        // A restart drains: runs in progress may finish (they take 400 ms)
        // while new ones go to the other replicas; a run stuck on a faulted
        // service is cancelled after this.
        "--drain-timeout",
        DRAIN_TIMEOUT,
        // A replica killed mid-run leaves its run open: the next owner,
        // a restarted replica's start-up look, or a follower's replica
        // ends it and runs its input again.
        "--resume-interrupted",
    ]
    .map(String::from)
    .to_vec();
    if let Some(owner) = owner {
        args.extend(["--owner".into(), owner.into()]);
    }
    args
}

/// A three-member etcd cluster, its faults, and the replicas' flags for
/// it.
fn etcd(setup: &mut Setup) -> Result<Vec<String>, String> {
    let cluster = tokio::task::block_in_place(EtcdCluster::start)
        .map_err(|e| format!("start the etcd cluster: {e}"))?;
    let endpoints = cluster.endpoints().join(",");
    let cluster = Arc::new(Mutex::new(cluster));
    setup.faults.extend([
        Action::EtcdKillLeader {
            cluster: Arc::clone(&cluster),
            longest: setup.ttl,
        },
        Action::EtcdPauseMember {
            cluster: Arc::clone(&cluster),
            longest: setup.ttl,
        },
        Action::EtcdRestartAll {
            cluster: Arc::clone(&cluster),
        },
    ]);
    setup.services._etcd = Some(cluster);
    Ok(vec!["--session-lease-etcd".into(), endpoints])
}

/// One PostgreSQL, reached by every replica through a fault proxy (the
/// password in a file, as a deployment passes it), its faults — the
/// proxy's, replies lost after commit among them, and restarts, kills and
/// stops of the server — and the replicas' flags for it: the sessions in
/// its tables, and with no lease flag their leases there too (pglease
/// under the same prefix, checked by every append).
fn postgres(setup: &mut Setup, dir: &Path) -> Result<Vec<String>, String> {
    let pg = tokio::task::block_in_place(PostgresServer::start)
        .map_err(|e| format!("start postgres: {e}"))?;
    let proxy = Arc::new(FaultProxy::start(pg.addr()).map_err(|e| format!("proxy: {e}"))?);
    let password_file = dir.join("postgres-password");
    std::fs::write(&password_file, pg.password())
        .map_err(|e| format!("{}: {e}", password_file.display()))?;
    let url = format!("postgres://{}@{}/postgres", pg.user(), proxy.addr());
    let pg = Arc::new(Mutex::new(pg));
    setup.faults.push(Action::Proxy {
        proxy: Arc::clone(&proxy),
        name: "proxy to postgres",
        longest: setup.ttl,
    });
    setup
        .faults
        .extend(service_actions(Arc::clone(&pg) as _, "postgres", setup.ttl));
    setup.services.postgres = Some(pg);
    setup.services._proxy = Some(proxy);
    Ok(vec![
        "--store-postgres".into(),
        url,
        "--store-postgres-password-file".into(),
        password_file.display().to_string(),
        "--store-postgres-table-prefix".into(),
        PG_PREFIX.into(),
    ])
}

/// Three `mecated` replicas with `flags`, on one JSONL store when `jsonl`;
/// for the broken variant, unleased, each on a directory of its own
/// holding the same session files.
async fn mecated(
    setup: &mut Setup,
    plan: &Plan,
    dir: &Path,
    sessions: &[String],
    flags: &[String],
    jsonl: bool,
) -> Result<(), String> {
    let bin = binary("mecated", "MECATL_MECATED_BIN")?;
    let shared = dir.join("store");
    for i in 0..REPLICAS {
        let owner = format!("replica-{i}");
        let mut args = common(setup.ttl, Some(&owner));
        if jsonl {
            let store = if plan.unleased() {
                dir.join(format!("store-{i}"))
            } else {
                shared.clone()
            };
            std::fs::create_dir_all(&store).map_err(|e| e.to_string())?;
            args.push("--store-dir".into());
            args.push(store.display().to_string());
            setup.services.store_dirs.push(store);
        }
        if plan.unleased() {
            args.push("--no-session-lease".into());
        }
        args.extend(flags.iter().cloned());
        let env = match plan.broken {
            Some(Breakage::ResumptionUnguarded) => {
                vec![("MECATED_BROKEN_RESUME_UNGUARDED".into(), "1".into())]
            }
            _ => Vec::new(),
        };
        setup.launches.push((
            owner,
            Launch {
                binary: bin.clone(),
                log: dir.join(format!("replica-{i}.log")),
                args,
                env,
            },
        ));
    }
    if plan.unleased() {
        share_session_files(&setup.services.store_dirs, sessions).await?;
    }
    Ok(())
}

/// Three `mecak8s` replicas on one Redis (their store), with their leases
/// in the Kubernetes API emulator; faults of both.
async fn mecak8s(setup: &mut Setup, dir: &Path, agent: &[String]) -> Result<(), String> {
    let bin = binary("mecak8s", "MECATL_MECAK8S_BIN")?;
    let redis = tokio::task::block_in_place(RedisServer::start_persistent)
        .map_err(|e| format!("start redis-server: {e}"))?;
    let url = redis.url();
    let redis = Arc::new(Mutex::new(redis));
    let emulator = k8s_emulator::Emulator::start(k8s_emulator::EmulatorConfig::default())
        .await
        .map_err(|e| format!("start the API emulator: {e}"))?;
    let kubeconfig = emulator.kubeconfig_path().display().to_string();
    for i in 0..REPLICAS {
        let pod = format!("mecak8s-{i}");
        let mut args = common(setup.ttl, None);
        args.extend(["--session-lease-k8s-kubeconfig".into(), kubeconfig.clone()]);
        args.extend(agent_flags(agent)?);
        setup.launches.push((
            pod.clone(),
            Launch {
                binary: bin.clone(),
                log: dir.join(format!("replica-{i}.log")),
                args,
                env: vec![
                    ("POD_NAMESPACE".into(), "default".into()),
                    ("POD_NAME".into(), pod),
                    ("REDIS_URL".into(), url.clone()),
                ],
            },
        ));
    }
    setup
        .faults
        .extend([false, true].map(|kill| Action::Service {
            service: Arc::clone(&redis) as _,
            name: "redis",
            kill,
            longest: TTL,
        }));
    setup.faults.push(Action::Emulator {
        faults: emulator.faults().clone(),
        longest: TTL * 2,
    });
    setup.services.redis = Some(redis);
    setup.services._emulator = Some(emulator);
    Ok(())
}
