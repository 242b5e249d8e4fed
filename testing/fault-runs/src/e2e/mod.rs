//! The session server end to end under faults: three real replicas
//! (`mecated` on one JSONL store with file leases, `mecated-etcd` on one
//! JSONL store with leases on a three-member etcd cluster,
//! `mecated-postgres` with sessions and leases in one PostgreSQL, or
//! `mecak8s` on a real Redis with leases in the Kubernetes API emulator),
//! clients hammering a few sessions through all of them, replicas paused
//! past their lease, killed and restarted, the services behind them hurt
//! too; then what the store holds is checked against the lease rules and
//! against what the clients were told ([`lease_history::check_server`]).
//! The runs' agents ([`agent`]) send a side effect at each step to a
//! downstream service that fences them ([`destination`]), and what it
//! performed is checked too.
//!
//! The server binaries are found through `MECATL_MECATED_BIN` and
//! `MECATL_MECAK8S_BIN` (`cargo xtask faults` builds them and sets both),
//! else beside this example's own directory in the target directory.

pub(crate) mod agent;
mod chaos;
mod clients;
mod destination;
mod replicas;
mod setup;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::injectors::Chaos;
use lease_history::server_log::StoredEvent;
use lease_history::{
    Property, Recorder, ServerHistory, Verdict, check_server, server_timeline, write_svg,
};
use lease_port::SessionId;
use replicas::Replicas;
use session_store::{JsonlOptions, JsonlStore, SessionStore};
use setup::{Setup, setup};

/// The end-to-end runs, in the order `all` runs them.
pub(crate) const BACKENDS: &[&str] = &["mecated", "mecated-etcd", "mecated-postgres", "mecak8s"];

/// Sessions the clients share, and client tasks.
const SESSIONS: usize = 3;
const CLIENTS: u32 = 6;
const REPLICAS: usize = 3;
/// Lease TTL of the replicas: short, so pauses past it are short too.
const TTL: Duration = Duration::from_secs(1);
/// etcd grants no lease shorter than two seconds.
const ETCD_TTL: Duration = Duration::from_secs(2);
/// A run: four progress steps over 400 ms, each with its side effect,
/// then its message.
const RUN_STEPS: u32 = 4;
const RUN_MS: u64 = 400;
/// How long a replica stopped with SIGTERM lets its runs finish.
const DRAIN_TIMEOUT: &str = "5s";
const REDIS_PREFIX: &str = "mecatl:";

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn lock_read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// How one end-to-end run goes.
pub(crate) struct Plan {
    /// Requests the clients send in all.
    pub(crate) requests: u64,
    /// Stop sending at this age of the run even if requests are left.
    pub(crate) longest: Duration,
    pub(crate) seed: u64,
    /// The broken variant to run, if one.
    pub(crate) broken: Option<Breakage>,
}

/// A way to break the replicas that the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Breakage {
    /// Unleased replicas, each with a store directory of its own whose
    /// session files are hard links of one shared set, so the
    /// single-process lock that stops a second unleased server from
    /// writing does not see the others: two replicas run one session at
    /// once.
    UnleasedReplicas,
    /// Replicas whose resumption of interrupted runs does not check that
    /// the run is still open (`MECATED_BROKEN_RESUME_UNGUARDED`): a
    /// restarted replica runs inputs of ended runs again.
    ResumptionUnguarded,
    /// The effects' destination asks its fence with every token as 0: it
    /// still refuses a repeated key, but performs what an owner that lost
    /// its session sends after the next owner's effects.
    EffectFenceIgnoresTokens,
}

impl Breakage {
    /// Every variant, in the order they run.
    pub(crate) const ALL: [Breakage; 3] = [
        Breakage::UnleasedReplicas,
        Breakage::ResumptionUnguarded,
        Breakage::EffectFenceIgnoresTokens,
    ];

    /// The name in reports and directories.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Breakage::UnleasedReplicas => "unleased-replicas",
            Breakage::ResumptionUnguarded => "resumption-unguarded",
            Breakage::EffectFenceIgnoresTokens => "effect-fence-ignores-tokens",
        }
    }

    /// What the checker must find.
    pub(crate) fn must_break(self) -> &'static [Property] {
        match self {
            Breakage::UnleasedReplicas => &[Property::RunOrder],
            Breakage::ResumptionUnguarded => &[Property::LogIntegrity],
            Breakage::EffectFenceIgnoresTokens => &[Property::EffectFencing],
        }
    }
}

/// What the caller reports.
pub(crate) struct Finished {
    pub(crate) requests: usize,
    pub(crate) elapsed: Duration,
    pub(crate) verdict: Verdict,
    pub(crate) history: ServerHistory,
}

/// Where a server binary is.
fn binary(name: &str, env: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    // target/<profile>/faults → target/<profile>/<name>
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(name)));
    match beside {
        Some(p) if p.is_file() => Ok(p),
        _ => Err(format!(
            "{name} not found: set {env}, or run `cargo xtask faults`, which builds it \
             (cargo build -p mecated --bins --features broken-variants)"
        )),
    }
}

pub(crate) async fn run(name: &str, plan: &Plan) -> Result<Finished, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let sessions: Vec<String> = (0..SESSIONS).map(|i| format!("s{i}")).collect();
    let rec = Recorder::new();
    // The stored events' times on the recorder's timeline.
    let origin_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let destination = destination::Destination::start(
        rec.clone(),
        plan.broken == Some(Breakage::EffectFenceIgnoresTokens),
    )
    .await?;
    let agent = agent::agent_args(destination.addr(), RUN_STEPS, RUN_MS);
    let Setup {
        ttl,
        launches,
        services,
        faults: service_faults,
    } = setup(name, plan, dir.path(), &sessions, &agent).await?;

    let replicas = Arc::new(tokio::task::block_in_place(|| Replicas::start(launches))?);
    let http = reqwest::Client::builder()
        // Every request on a connection of its own: a killed replica
        // leaves no pooled connection behind, and a paused one holds only
        // the requests sent to it.
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    if !plan.unleased() {
        let base = replicas.any_base().ok_or("no replica up")?;
        for s in &sessions {
            create(&http, &base, s).await?;
        }
    }

    let started = Instant::now();
    let shared = Arc::new(clients::Shared {
        rec: rec.clone(),
        bases: replicas.bases(),
        replica_names: (0..replicas.len()).map(|i| replicas.name(i)).collect(),
        sessions: sessions.clone(),
        next_id: AtomicU64::new(0),
        budget: plan.requests,
        deadline: started + plan.longest,
        requests: Mutex::new(Vec::new()),
        seen: Mutex::new(HashMap::new()),
        http: http.clone(),
        wait: Duration::from_secs(2),
        timeout: Duration::from_secs(10),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = chaos::ReplicaChaos {
        replicas: Arc::clone(&replicas),
        services: (!service_faults.is_empty()).then(|| Chaos::new(service_faults)),
        // The etcd and PostgreSQL runs exist for their lease services:
        // half their faults go there.
        services_share: if matches!(name, "mecated-etcd" | "mecated-postgres") {
            50
        } else {
            30
        },
        ttl,
        every: plan.fault_interval(),
        mix: plan.replica_mix(),
    };
    // The services' helpers give each process they start a parent-death
    // signal, which Linux ties to the starting *thread*: a Redis restarted
    // on a runtime worker is SIGKILLed when that worker retires. So faults
    // are injected from a thread of their own, which lives until the run
    // is over.
    let (faults_done, faults_result) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let (seed, faults_rec, faults_stop) = (plan.seed, rec.clone(), Arc::clone(&stop));
    let faults_thread = std::thread::spawn(move || {
        let result = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for the faults: {e}"))
            .and_then(|rt| rt.block_on(chaos.run(seed, faults_rec, faults_stop)));
        let _ = faults_done.send(result);
        // What this thread started must outlive the run.
        let _ = end_rx.recv();
    });
    let faults = async move {
        tokio::task::spawn_blocking(move || {
            faults_result
                .recv()
                .unwrap_or_else(|_| Err("the fault thread ended without a word".into()))
        })
        .await
    };
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        clients.push(tokio::spawn(clients::client(
            Arc::clone(&shared),
            c,
            plan.seed,
        )));
    }
    report_progress(name, plan, &shared, &rec, started, &clients).await;
    for c in clients {
        c.await.map_err(|e| format!("a client task failed: {e}"))?;
    }
    stop.store(true, Ordering::Relaxed);
    let injected = faults
        .await
        .map_err(|e| format!("the fault task failed: {e}"));
    let elapsed = started.elapsed();
    let healed = tokio::task::block_in_place(|| replicas.heal_all());
    // A fault that could not be healed explains a replica that cannot
    // start: report it first.
    injected?.map_err(|e| format!("injecting a fault: {e}"))?;
    healed?;
    // Runs still going (their clients gave up) end within a run's length
    // and a lease's; give them that before reading the logs.
    tokio::time::sleep(ttl * 3).await;

    // Taken before the logs are read: every effect in it is of a run whose
    // claim is stored, so the logs read next hold its run.
    let effects = destination.attempts();
    let logs = final_logs(&http, &replicas, &services, &sessions, origin_ms).await?;
    drop(replicas);
    drop(services);
    let _ = end_tx.send(());
    let _ = faults_thread.join();

    let history = ServerHistory {
        requests: std::mem::take(&mut *lock(&shared.requests)),
        faults: rec.history().faults,
        logs,
        effects,
    };
    let verdict = check_server(&history);
    Ok(Finished {
        requests: history.requests.len(),
        elapsed,
        verdict,
        history,
    })
}

/// Every five seconds until the clients are done, how far they got.
async fn report_progress(
    name: &str,
    plan: &Plan,
    shared: &clients::Shared,
    rec: &Recorder,
    started: Instant,
    clients: &[tokio::task::JoinHandle<()>],
) {
    let mut last_print = Instant::now();
    while clients.iter().any(|c| !c.is_finished()) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            let done = shared.done();
            let elapsed = started.elapsed();
            let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
            let by_budget = (plan.requests.saturating_sub(done)) as f64 / rate.max(1e-9);
            let by_clock = plan.longest.saturating_sub(elapsed).as_secs_f64();
            println!(
                "  {name}: {done}/{} requests, {rate:.0} req/s, {} faults so far, ~{:.0}s left",
                plan.requests,
                rec.fault_count(),
                by_budget.min(by_clock)
            );
        }
    }
}

/// Each session's log as the store holds it at the end, read through a
/// replica, with each event's writer from the store itself; the replicas
/// stopped once read.
async fn final_logs(
    http: &reqwest::Client,
    replicas: &Replicas,
    services: &setup::Services,
    sessions: &[String],
    origin_ms: u64,
) -> Result<BTreeMap<Arc<str>, Vec<StoredEvent>>, String> {
    let base = replicas.any_base().ok_or("no replica up at the end")?;
    let mut logs: BTreeMap<Arc<str>, Vec<StoredEvent>> = BTreeMap::new();
    for s in sessions {
        logs.insert(
            s.as_str().into(),
            store::read_log(http, &base, s, origin_ms).await?,
        );
    }
    tokio::task::block_in_place(|| replicas.stop_all());
    for (s, log) in logs.iter_mut() {
        let writers = services.writers(s).await?;
        store::attach_writers(log, &writers);
    }
    Ok(logs)
}

/// Writes the verdict and the timeline of `finished` under `dir`.
pub(crate) fn write_report(finished: &Finished, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let text = dir.join("verdict.txt");
    let mut verdict = finished.verdict.to_string();
    verdict.push_str(&summary(&finished.history));
    std::fs::write(&text, &verdict).map_err(|e| format!("{}: {e}", text.display()))?;
    let svg = dir.join("timeline.svg");
    write_svg(&server_timeline(&finished.history), &finished.verdict, &svg)
        .map_err(|e| format!("{}: {e}", svg.display()))?;
    print!("{verdict}");
    println!(
        "  verdict:  {}\n  timeline: {}",
        text.display(),
        svg.display()
    );
    Ok(())
}

/// Requests by kind and answer, runs stored: what the run exercised.
fn summary(h: &ServerHistory) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for r in &h.requests {
        let answer = match (r.status, &r.run) {
            (_, Some(run)) => run.status.clone(),
            (Some(s), None) => s.to_string(),
            // Transport errors name the URL: count them by their kind.
            (None, None) => r.outcome.split(':').next().unwrap_or("").to_owned(),
        };
        *by.entry(format!("{} {answer}", r.kind.name())).or_default() += 1;
    }
    let count = |f: &dyn Fn(&StoredEvent) -> bool| -> usize {
        h.logs.values().flatten().filter(|e| f(e)).count()
    };
    let runs = count(&|e| e.payload["type"] == "run_started");
    let interrupted = count(&|e| e.payload["status"] == "interrupted");
    let resumed = count(&|e| e.payload["type"] == "run_started" && !e.payload["resumes"].is_null());
    let events: usize = h.logs.values().map(Vec::len).sum();
    let attributed = h
        .logs
        .values()
        .flatten()
        .filter(|e| e.writer.is_some())
        .count();
    let mut s = format!(
        "stored: {events} events ({attributed} with their writer recorded), {runs} runs \
         ({interrupted} ended as interrupted by the next owner, {resumed} resuming one)\n\
         effects by answer:"
    );
    let mut effects: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &h.effects {
        *effects.entry(&a.outcome).or_default() += 1;
    }
    for (k, n) in effects {
        s.push_str(&format!("  {k}={n}"));
    }
    s.push_str("\nrequests by answer:");
    for (k, n) in by {
        s.push_str(&format!("  {k}={n}"));
    }
    // By what they hit: the replicas, or the services behind them.
    let mut on: BTreeMap<String, usize> = BTreeMap::new();
    for f in &h.faults {
        let target = f.target.split(' ').next().unwrap_or_default();
        *on.entry(target.to_owned()).or_default() += 1;
    }
    s.push_str("\nfaults by target:");
    for (k, n) in on {
        s.push_str(&format!("  {k}={n}"));
    }
    s.push('\n');
    s
}

async fn create(http: &reqwest::Client, base: &str, id: &str) -> Result<(), String> {
    let resp = http
        .post(format!("{base}/v1/sessions"))
        .header("content-type", "application/json")
        .body(serde_json::json!({ "id": id }).to_string())
        .send()
        .await
        .map_err(|e| format!("create {id}: {e}"))?;
    if resp.status().as_u16() != 201 {
        return Err(format!("create {id}: {}", resp.status()));
    }
    Ok(())
}

/// Creates the sessions in the first directory and hard-links their files
/// into the others: one file, one inode, seen from every directory.
async fn share_session_files(dirs: &[PathBuf], sessions: &[String]) -> Result<(), String> {
    let store = JsonlStore::open(&dirs[0], JsonlOptions::default()).map_err(|e| e.to_string())?;
    for s in sessions {
        let id = SessionId::new(s.as_str()).map_err(|e| e.to_string())?;
        store.create(&id).await.map_err(|e| e.to_string())?;
    }
    drop(store);
    let entries = std::fs::read_dir(&dirs[0]).map_err(|e| e.to_string())?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') || !entry.path().is_file() {
            continue;
        }
        for other in &dirs[1..] {
            std::fs::hard_link(entry.path(), other.join(&name))
                .map_err(|e| format!("link {}: {e}", name.to_string_lossy()))?;
        }
    }
    Ok(())
}

impl Plan {
    /// The profile's size: the short one bounded to about a minute.
    pub(crate) fn new(
        long: bool,
        requests: Option<u64>,
        seed: u64,
        broken: Option<Breakage>,
    ) -> Plan {
        let (default, longest) = match (long, broken.is_some()) {
            (false, false) => (600, Duration::from_secs(75)),
            (false, true) => (300, Duration::from_secs(40)),
            (true, false) => (100_000, Duration::from_secs(4 * 3600)),
            (true, true) => (5_000, Duration::from_secs(600)),
        };
        Plan {
            requests: requests.unwrap_or(default),
            longest,
            seed,
            broken,
        }
    }

    /// Mean time between faults. The effect-fence variant's one telling
    /// fault is a freeze: often, so a short run meets a few mid-run.
    fn fault_interval(&self) -> Duration {
        match self.broken {
            Some(Breakage::EffectFenceIgnoresTokens) => Duration::from_millis(500),
            _ => Duration::from_millis(1500),
        }
    }

    /// How the faults on the replicas are shared out.
    fn replica_mix(&self) -> chaos::ReplicaMix {
        match self.broken {
            Some(Breakage::EffectFenceIgnoresTokens) => chaos::ReplicaMix::FREEZES,
            _ => chaos::ReplicaMix::USUAL,
        }
    }

    /// Whether the replicas run unleased, each on its own directory.
    pub(crate) fn unleased(&self) -> bool {
        self.broken == Some(Breakage::UnleasedReplicas)
    }
}
