//! Faults where state goes back, or may: Redis restarted from an older
//! snapshot, Redis under memory pressure with each evicting policy, the
//! API emulator's Lease storage rewound or wiped, a store directory put
//! back from an older copy between restarts.
//!
//! State that went back is recorded as a [`Rewind`]. The clients that saw
//! the newer state are left running on the older one for a while — every
//! call they make must be refused (`Rewound`), which the checker verifies
//! — and, once one of them has said so, every client is restarted to
//! accept the older state, as an operator told by those errors would
//! ([`Restarts::restart`]). A rewind nobody notices is never accepted:
//! what it lost then counts against the run.

use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_emulator::{Emulator, Snapshot};
use lease_history::{Clients, FaultKind, Op, OpKind, Outcome, Recorder, Restarts, Rewind};
use lease_port::SessionLease;
use session_store::{GenerationCheck, SessionStore, StoreErrorKind, adopt_store_dir};
use test_services::{RedisServer, RedisSnapshot};
use tokio::task::block_in_place;
use tokio::time::sleep;

use crate::holders::{self, Holder, HolderSet};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes the clients of the next epoch: new connections, new instances,
/// nothing remembered from the clients before.
pub(crate) type MakeClients =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Clients, String>> + Send>> + Send + Sync>;

/// How long the clients that saw the newer state are left on the older
/// one, at most, when none of them refuses it sooner.
const REFUSAL_WAIT: Duration = Duration::from_secs(3);

/// How long a precondition on what the clients saw is waited for before
/// the fault is put off to a later turn.
const SEEN_WAIT: Duration = Duration::from_secs(5);

/// Waits until every one of `workers` had a call invoked after `ended`
/// refused as `Rewound`; false if not all had within `within`.
async fn refused_since(rec: &Recorder, ended: Duration, workers: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let ops = rec.ops_since(ended);
        let refused = (0..workers as u32).all(|w| {
            ops.iter()
                .any(|op| op.worker == w && op.invoked > ended && op.outcome == Outcome::Rewound)
        });
        if refused {
            return true;
        }
        // Nothing completed for a second: the workers are done (or all
        // stuck), and no refusal is coming.
        let idle = rec.now() > ended + IDLE && rec.ops_since(rec.now() - IDLE).is_empty();
        if idle || Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// How long without a completed call means nobody is calling.
const IDLE: Duration = Duration::from_secs(1);

/// An answer from the authority or the store (not a failure, not a
/// refusal of older state): the caller saw its state as of the call.
fn answered(op: &Op) -> bool {
    matches!(
        op.outcome,
        Outcome::Granted { .. } | Outcome::Done | Outcome::Held | Outcome::Fenced
    )
}

fn is_lease_call(op: &Op) -> bool {
    matches!(op.kind, OpKind::Acquire | OpKind::Renew | OpKind::Release)
}

/// Waits until each of `workers` has an operation invoked after `since`
/// for which `seen` holds, and `also` holds of some operation; false if
/// that did not happen within [`SEEN_WAIT`].
async fn every_worker_saw(
    rec: &Recorder,
    since: Duration,
    workers: usize,
    seen: impl Fn(&Op) -> bool,
    also: impl Fn(&Op) -> bool,
) -> bool {
    let deadline = Instant::now() + SEEN_WAIT;
    loop {
        let ops = rec.ops_since(since);
        let after: Vec<&Op> = ops.iter().filter(|op| op.invoked > since).collect();
        let all = (0..workers as u32).all(|w| after.iter().any(|op| op.worker == w && seen(op)));
        if all && after.iter().any(|op| also(op)) {
            return true;
        }
        let idle = rec.now() > since + IDLE && rec.ops_since(rec.now() - IDLE).is_empty();
        if idle || Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// Every client restarted with new ones, accepting `rewind`.
async fn restart(
    rec: &Recorder,
    restarts: &Restarts,
    make: &MakeClients,
    rewind: Option<usize>,
) -> Result<u32, String> {
    let clients = make().await?;
    restarts.restart(rec, clients, rewind).await
}

/// The operator's part after state went back: wait for the clients to
/// refuse it (each worker's, or until [`REFUSAL_WAIT`]), then restart them
/// all to accept it.
async fn accept(
    rec: &Recorder,
    restarts: &Restarts,
    make: &MakeClients,
    rewind: usize,
    ended: Duration,
    workers: usize,
) -> Result<(), String> {
    refused_since(rec, ended, workers, REFUSAL_WAIT).await;
    restart(rec, restarts, make, Some(rewind)).await.map(drop)
}

// ------------------------------------------------------------------ Redis

/// Redis (leases and store) restarted from a snapshot taken one turn
/// earlier, with the run going on in between.
pub(crate) struct RedisRewind {
    pub(crate) redis: Arc<Mutex<RedisServer>>,
    pub(crate) restarts: Restarts,
    pub(crate) make: MakeClients,
    pub(crate) workers: usize,
    /// The snapshot and when it was taken, until it is restored.
    pub(crate) snapshot: Option<(RedisSnapshot, Duration, Duration)>,
}

impl RedisRewind {
    pub(crate) async fn inject(&mut self, rec: &Recorder) -> Result<(), String> {
        let Some((snapshot, copy_started, copy_ended)) = self.snapshot.take() else {
            let from = rec.now();
            let snapshot = block_in_place(|| lock(&self.redis).snapshot())
                .map_err(|e| format!("snapshot redis: {e}"))?;
            self.snapshot = Some((snapshot, from, rec.now()));
            return Ok(());
        };
        // Going back must be going back for every client: each worker's
        // lease connection, and the store's, answered a call made after
        // the snapshot (every call advances Redis's change counter).
        let seen = every_worker_saw(
            rec,
            copy_ended,
            self.workers,
            |op| is_lease_call(op) && answered(op),
            |op| op.kind == OpKind::Write && answered(op),
        )
        .await;
        if !seen {
            self.snapshot = Some((snapshot, copy_started, copy_ended));
            return Ok(());
        }
        let fault = rec.fault(
            FaultKind::Rewind,
            "redis (restarted from an older snapshot)",
        );
        let started = rec.now();
        block_in_place(|| lock(&self.redis).restart_from(&snapshot))
            .map_err(|e| format!("restart redis from a snapshot: {e}"))?;
        let ended = rec.now();
        rec.heal(fault);
        let rewind = rec.rewind(Rewind {
            target: "redis".into(),
            leases: true,
            store: true,
            copy_started,
            copy_ended,
            started,
            ended,
            accepted_by: None,
        });
        accept(rec, &self.restarts, &self.make, rewind, ended, self.workers).await
    }
}

/// Every memory policy that evicts keys, in the order the fault sets them:
/// `volatile-ttl` first, which evicts lease grants (the keys with the
/// shortest time to live) before anything else.
pub(crate) const EVICTING_POLICIES: [&str; 7] = [
    "volatile-ttl",
    "volatile-random",
    "volatile-lru",
    "volatile-lfu",
    "allkeys-random",
    "allkeys-lru",
    "allkeys-lfu",
];

/// Room left above what Redis uses when the pressure begins.
const HEADROOM: u64 = 4 << 20;
/// The size of one filler value.
const FILLER_BYTES: usize = 32 << 10;

/// Redis under memory pressure with each evicting policy in turn: the
/// policy set, a backup taken, memory filled until keys are evicted, and
/// at the end the backup restored on the start-up configuration
/// (`noeviction`), as an operator who finds the policy changed would.
pub(crate) struct RedisMemory {
    pub(crate) redis: Arc<Mutex<RedisServer>>,
    pub(crate) restarts: Restarts,
    pub(crate) make: MakeClients,
    /// How long each policy stays, filling memory.
    pub(crate) window: Duration,
    pub(crate) workers: usize,
}

/// Names every filler key, across faults.
static FILLERS: AtomicU64 = AtomicU64::new(0);

fn config_set(redis: &RedisServer, name: &str, value: &str) -> Result<(), String> {
    match redis.command(&["CONFIG", "SET", name, value]) {
        Ok(reply) if reply == "+OK" => Ok(()),
        Ok(reply) => Err(format!("redis CONFIG SET {name} {value}: {reply}")),
        Err(e) => Err(format!("redis CONFIG SET {name} {value}: {e}")),
    }
}

fn info_number(redis: &RedisServer, section: &str, field: &str) -> Result<u64, String> {
    redis
        .info(section)
        .map_err(|e| format!("redis INFO {section}: {e}"))?
        .get(field)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("redis INFO {section} has no number {field}"))
}

/// Writes filler keys (with a long time to live, so every policy may evict
/// them) for `window`; answers how many keys Redis evicted meanwhile.
fn fill(redis: &RedisServer, window: Duration) -> Result<u64, String> {
    let before = info_number(redis, "stats", "evicted_keys")?;
    let value = "x".repeat(FILLER_BYTES);
    let deadline = Instant::now() + window;
    while Instant::now() < deadline {
        let key = format!("faults-filler:{}", FILLERS.fetch_add(1, Ordering::Relaxed));
        match redis.command(&["SET", &key, &value, "PX", "3600000"]) {
            // Full with nothing it may evict: the next write may find room.
            Ok(reply) if reply == "+OK" || reply.starts_with("-OOM") => {}
            Ok(reply) => return Err(format!("redis SET of a filler answered {reply}")),
            Err(e) => return Err(format!("redis SET of a filler: {e}")),
        }
    }
    Ok(info_number(redis, "stats", "evicted_keys")?.saturating_sub(before))
}

impl RedisMemory {
    pub(crate) async fn inject(&mut self, rec: &Recorder) -> Result<(), String> {
        let redis = Arc::clone(&self.redis);
        let first = EVICTING_POLICIES[0];
        block_in_place(|| config_set(&lock(&redis), "maxmemory-policy", first))?;
        let mut fault = rec.fault(FaultKind::EvictingPolicy, &format!("redis ({first})"));
        let since = rec.now();
        // A call that read the policy before it changed may still be on
        // its way: none may run once keys go.
        if !rec.settled(since, Duration::from_secs(10)).await {
            block_in_place(|| config_set(&lock(&redis), "maxmemory-policy", "noeviction"))?;
            rec.heal(fault);
            return Err("calls through Redis still running 10 s after its policy changed".into());
        }
        let copy_started = rec.now();
        let backup = block_in_place(|| lock(&redis).snapshot())
            .map_err(|e| format!("back redis up: {e}"))?;
        let copy_ended = rec.now();
        block_in_place(|| {
            let redis = lock(&redis);
            let used = info_number(&redis, "memory", "used_memory")?;
            config_set(&redis, "maxmemory", &(used + HEADROOM).to_string())
        })?;
        let mut evicted = Vec::new();
        for (i, policy) in EVICTING_POLICIES.iter().enumerate() {
            if i > 0 {
                block_in_place(|| config_set(&lock(&redis), "maxmemory-policy", policy))?;
                rec.heal(fault);
                fault = rec.fault(FaultKind::EvictingPolicy, &format!("redis ({policy})"));
            }
            let n = block_in_place(|| fill(&lock(&redis), self.window))?;
            evicted.push(format!("{policy} {n}"));
        }
        rec.heal(fault);
        let until = rec.now();
        // Back to a Redis that keeps everything: the backup, on the
        // start-up configuration.
        let restore = rec.fault(FaultKind::ServiceRestart, "redis (backup restored)");
        let started = rec.now();
        block_in_place(|| lock(&redis).restart_from(&backup))
            .map_err(|e| format!("restore the backup of redis: {e}"))?;
        let ended = rec.now();
        rec.heal(restore);
        println!(
            "  redis under memory pressure, keys evicted: {}",
            evicted.join(", ")
        );
        // The restore took back whatever was done on the evicting Redis:
        // nothing, when every call was refused as it must be; else state
        // went back for the clients that did it. (A call whose fate is
        // unknown tells nothing: a client that refuses sends nothing.)
        rec.settled(started, Duration::from_secs(10)).await;
        let acted = rec
            .ops_since(since)
            .iter()
            .any(|op| op.invoked >= since && op.invoked <= until && op.succeeded());
        if acted {
            let rewind = rec.rewind(Rewind {
                target: "redis (backup restored after evicting)".into(),
                leases: true,
                store: true,
                copy_started,
                copy_ended,
                started,
                ended,
                accepted_by: None,
            });
            accept(rec, &self.restarts, &self.make, rewind, ended, self.workers).await?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------ Kubernetes

/// The emulator's Lease storage: a snapshot taken, later restored (its
/// versions handed out again), then wiped (versions from one again), in
/// turn.
pub(crate) struct EmulatorRewind {
    pub(crate) emulator: Arc<Emulator>,
    pub(crate) restarts: Restarts,
    pub(crate) make: MakeClients,
    pub(crate) workers: usize,
    /// What the next turn does: 0 take a snapshot, 1 restore it, 2 wipe.
    pub(crate) step: u32,
    pub(crate) snapshot: Option<(Snapshot, Duration, Duration)>,
    /// When the clients in use took over (the last restart).
    pub(crate) since: Duration,
}

impl EmulatorRewind {
    pub(crate) async fn inject(&mut self, rec: &Recorder) -> Result<(), String> {
        let (copy_started, copy_ended, target) = match self.step % 3 {
            0 => {
                let from = rec.now();
                let snapshot = self.emulator.snapshot();
                self.snapshot = Some((snapshot, from, rec.now()));
                self.step += 1;
                return Ok(());
            }
            1 => {
                let Some((_, from, to)) = &self.snapshot else {
                    self.step = 0;
                    return Ok(());
                };
                (
                    *from,
                    *to,
                    "k8s-emulator (Lease storage restored from a snapshot)",
                )
            }
            // A wipe goes back to before anything was written.
            _ => (
                Duration::ZERO,
                Duration::ZERO,
                "k8s-emulator (Lease storage wiped)",
            ),
        };
        // Every worker's client must have seen versions the rewind takes
        // back: its own write of a grant, made after the copy.
        let granted = |op: &Op| matches!(op.outcome, Outcome::Granted { .. });
        let since = copy_ended.max(self.since);
        if !every_worker_saw(rec, since, self.workers, granted, |_| true).await {
            return Ok(());
        }
        let fault = rec.fault(FaultKind::Rewind, target);
        let started = rec.now();
        match self.snapshot.take() {
            Some((snapshot, _, _)) if self.step % 3 == 1 => self.emulator.restore(&snapshot),
            _ => self.emulator.wipe(),
        }
        let ended = rec.now();
        rec.heal(fault);
        let rewind = rec.rewind(Rewind {
            target: "k8s-emulator".into(),
            leases: true,
            store: false,
            copy_started,
            copy_ended,
            started,
            ended,
            accepted_by: None,
        });
        accept(rec, &self.restarts, &self.make, rewind, ended, self.workers).await?;
        self.since = rec.now();
        self.step += 1;
        Ok(())
    }
}

// ------------------------------------------------------ store directory

/// Every holder process stopped; the store directory backed up (one
/// turn) or put back from that backup (the next); every holder started
/// again, each opening the store itself. Put back, the store is refused
/// at open (`Rewound`) when its generation check is on, and then adopted
/// (`adopt_store_dir`): the rewind is accepted. With the check off, the
/// holders open the older copy as if nothing happened.
pub(crate) struct StoreSwap {
    pub(crate) holders: HolderSet,
    pub(crate) restarts: Restarts,
    pub(crate) store_dir: PathBuf,
    /// The lease directory, the generation check's witness.
    pub(crate) lease_dir: PathBuf,
    /// How the store is opened: a generation check witnessed in the lease
    /// directory, or none (a broken variant).
    pub(crate) generation: GenerationCheck,
    /// Where the backup goes.
    pub(crate) backup_dir: PathBuf,
    /// When the backup was taken, while one is kept.
    pub(crate) backup: Option<(Duration, Duration)>,
}

/// Copies the files and directories under `from` into `to` (created).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Removes everything under `dir`, keeping `dir` itself.
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

impl StoreSwap {
    /// The clients of a restart: a new holder process per worker, and the
    /// rig's own instance of the store.
    fn start(&self, store: Arc<dyn SessionStore>) -> Result<Clients, String> {
        let old = holders::current(&self.holders);
        let new = old
            .iter()
            .map(|h| Holder::start(h.name().to_owned(), h.config().clone()))
            .collect::<Result<Vec<_>, _>>()?;
        *lock(&self.holders) = new.clone();
        Ok(Clients {
            leases: new
                .iter()
                .map(|h| Arc::clone(h) as Arc<dyn SessionLease>)
                .collect(),
            store,
            writers: new
                .iter()
                .map(|h| Arc::clone(h) as Arc<dyn lease_history::Writer>)
                .collect(),
        })
    }

    /// Stops every holder process and waits until each is gone.
    async fn stop_all(&self) {
        for holder in holders::current(&self.holders) {
            lease_history::Writer::settle(&*holder).await;
        }
    }

    fn open(&self) -> Result<Arc<dyn SessionStore>, session_store::StoreError> {
        Ok(Arc::new(holders::open_store(
            &self.store_dir,
            &self.generation,
        )?))
    }

    pub(crate) async fn inject(&mut self, rec: &Recorder) -> Result<(), String> {
        let Some((copy_started, copy_ended)) = self.backup else {
            let fault = rec.fault(FaultKind::ServiceRestart, "every holder (store backed up)");
            self.stop_all().await;
            let from = rec.now();
            let _ = fs::remove_dir_all(&self.backup_dir);
            copy_tree(&self.store_dir, &self.backup_dir)
                .map_err(|e| format!("back up {}: {e}", self.store_dir.display()))?;
            self.backup = Some((from, rec.now()));
            let store = self
                .open()
                .map_err(|e| format!("open the store again: {e}"))?;
            let clients = self.start(store)?;
            self.restarts.restart(rec, clients, None).await?;
            rec.heal(fault);
            return Ok(());
        };
        // Something acknowledged since the backup, so that putting it back
        // loses something.
        let wrote = rec
            .ops_since(copy_ended)
            .iter()
            .any(|op| op.kind == OpKind::Write && op.invoked > copy_ended && op.succeeded());
        if !wrote {
            return Ok(());
        }
        self.backup = None;
        let fault = rec.fault(
            FaultKind::Rewind,
            "store directory (put back from a backup)",
        );
        let started = rec.now();
        self.stop_all().await;
        empty_dir(&self.store_dir)
            .and_then(|()| copy_tree(&self.backup_dir, &self.store_dir))
            .map_err(|e| format!("put {} back: {e}", self.store_dir.display()))?;
        let ended = rec.now();
        rec.heal(fault);
        let (store, accepted) = match self.open() {
            Ok(store) => (store, None),
            Err(e) if e.kind() == StoreErrorKind::Rewound => {
                let rewind = rec.rewind(Rewind {
                    target: "store directory".into(),
                    leases: false,
                    store: true,
                    copy_started,
                    copy_ended,
                    started,
                    ended,
                    accepted_by: None,
                });
                adopt_store_dir(&self.store_dir, Some(&self.lease_dir))
                    .map_err(|e| format!("adopt the store directory: {e}"))?;
                let store = self
                    .open()
                    .map_err(|e| format!("open the adopted store: {e}"))?;
                (store, Some(rewind))
            }
            Err(e) => return Err(format!("open the store put back: {e}")),
        };
        let clients = self.start(store)?;
        self.restarts.restart(rec, clients, accepted).await?;
        Ok(())
    }
}
