//! End-to-end runs over HTTP. Each group measures two servers in the same
//! run, so the ratio `ours / limit` is what the one difference between them
//! costs a run:
//!
//! - `mecated/run`, `mecated/run-nofsync`, `mecated/run-8-concurrent`:
//!   `ours` leases every run from file leases (the default); `limit` is the
//!   same server leasing through [`InstantLease`], a backend that grants at
//!   once and never touches the disk. Same keeper, same tokens, same fenced
//!   store: the limit is a leased run with a free lease, a true lower bound
//!   of `ours`, and the ratio is what file leases cost.
//! - `mecated/run-nofsync-vs-unleased`: `limit` runs with leases disabled
//!   (no lease taken, unfenced writes under the single-process lock): what
//!   leasing costs against not leasing at all.
//! - `mecated/first-run-nofsync-vs-unleased`: the same pair, each run the
//!   first of a session created for it (untimed), so `ours` creates the
//!   session's lease file and takes its first reservation: what a new
//!   session's lease costs where the store promises no syncs.
//!
//! A run reads its session's whole transcript before the agent starts, so
//! it costs more the longer the session is (about a microsecond per stored
//! event here). Measured on ever-growing sessions, whichever function ran
//! second would pay for the runs of the first. Sessions are therefore
//! deleted and created again, untimed, every [`ROUNDS`] runs (and before
//! each sample of the concurrent group), so both functions of a group see
//! the same session lengths.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use lease_port::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use mecated::backend::{LeaseBackend, LeaseChoice, StoreChoice};
use mecated::{Server, ServerConfig};
use serde_json::{Value, json};

const SESSIONS: usize = 64;
/// Runs of a session before it is created afresh: a run finds 0 to
/// `2 × (ROUNDS − 1)` events in its session.
const ROUNDS: u32 = 16;
const TTL: Duration = Duration::from_secs(15);

/// Grants every acquire at once with the next token, renews and releases
/// without doing anything, and never touches the disk: the cheapest backend
/// a keeper can lease through.
#[derive(Default)]
struct InstantLease {
    last: AtomicU64,
}

#[async_trait]
impl SessionLease for InstantLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        let token = FencingToken::new(self.last.fetch_add(1, Ordering::Relaxed) + 1);
        Ok(Lease::new(
            session.clone(),
            owner.clone(),
            token,
            SystemTime::now() + TTL,
        ))
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        Ok(lease.with_expiry(SystemTime::now() + TTL))
    }
    async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
        Ok(())
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        AuthorityId::new("bench:instant")
    }
}

#[derive(Clone, Copy)]
enum Leases {
    /// File leases beside the store: the default.
    Files,
    /// [`InstantLease`].
    Instant,
    /// Leases disabled.
    Unleased,
}

struct Target {
    base: String,
    /// Runs of each session since it was last created.
    runs: Mutex<Vec<u32>>,
    /// Runs started, which picks the next session of a paired group.
    next: AtomicUsize,
    /// Sessions created for a first run.
    fresh: AtomicUsize,
    _server: Server,
    _dir: tempfile::TempDir,
}

fn session(i: usize) -> String {
    format!("bench-{}", i % SESSIONS)
}

async fn create(client: &reqwest::Client, base: &str, id: &str) {
    let r = client
        .post(format!("{base}/v1/sessions"))
        .json(&json!({ "id": id }))
        .send()
        .await
        .expect("create");
    assert!(r.status().is_success(), "create {id}: {}", r.status());
}

async fn start(leases: Leases, fsync: bool) -> Target {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::for_store(dir.path());
    config.lease_ttl = TTL;
    config.store = StoreChoice::Jsonl {
        dir: dir.path().to_path_buf(),
        fsync,
    };
    match leases {
        Leases::Files => {}
        Leases::Instant => {
            config.lease = LeaseChoice::Backend(LeaseBackend(Arc::new(InstantLease::default())));
        }
        Leases::Unleased => config.lease = LeaseChoice::Unleased,
    }
    let server = Server::start(config).await.expect("server");
    let base = format!("http://{}", server.local_addr());
    let client = reqwest::Client::new();
    for i in 0..SESSIONS {
        create(&client, &base, &session(i)).await;
    }
    Target {
        base,
        runs: Mutex::new(vec![0; SESSIONS]),
        next: AtomicUsize::new(0),
        fresh: AtomicUsize::new(0),
        _server: server,
        _dir: dir,
    }
}

impl Target {
    /// Deletes session `i` and creates it again: empty, its lease free.
    async fn recreate(&self, client: &reqwest::Client, i: usize) {
        let id = session(i);
        let r = client
            .delete(format!("{}/v1/sessions/{id}", self.base))
            .send()
            .await
            .expect("delete");
        assert!(r.status().is_success(), "delete {id}: {}", r.status());
        create(client, &self.base, &id).await;
        self.runs.lock().unwrap()[i % SESSIONS] = 0;
    }

    /// Counts a run of session `i`, first creating the session afresh when
    /// it has had [`ROUNDS`] runs. Untimed.
    async fn prepare(&self, client: &reqwest::Client, i: usize) {
        let full = self.runs.lock().unwrap()[i % SESSIONS] >= ROUNDS;
        if full {
            self.recreate(client, i).await;
        }
        self.runs.lock().unwrap()[i % SESSIONS] += 1;
    }

    /// Creates afresh every session that has been run. Untimed.
    async fn reset(&self, client: &reqwest::Client) {
        for i in 0..SESSIONS {
            let used = self.runs.lock().unwrap()[i] > 0;
            if used {
                self.recreate(client, i).await;
            }
        }
    }
}

async fn one_run(client: &reqwest::Client, base: &str, i: usize) {
    run_session(client, base, &session(i)).await;
}

async fn run_session(client: &reqwest::Client, base: &str, id: &str) {
    let r: Value = client
        .post(format!("{base}/v1/sessions/{id}/runs"))
        .json(&json!({"input": "ping"}))
        .send()
        .await
        .expect("run")
        .json()
        .await
        .expect("json");
    assert_eq!(r["status"], "completed", "{r}");
}

/// Runs the next session of `other` (untimed), then the next of `timed`
/// (timed): both functions of a group see the same mix of work, so drift on
/// this shared machine hits them alike.
async fn paired(client: &reqwest::Client, timed: &Target, other: &Target) -> Duration {
    let i = other.next.fetch_add(1, Ordering::Relaxed);
    other.prepare(client, i).await;
    one_run(client, &other.base, i).await;
    let i = timed.next.fetch_add(1, Ordering::Relaxed);
    timed.prepare(client, i).await;
    let start = Instant::now();
    one_run(client, &timed.base, i).await;
    start.elapsed()
}

/// A session never run before, created untimed: no lease file exists for
/// it yet.
async fn fresh_session(client: &reqwest::Client, target: &Target) -> String {
    let id = format!("first-{}", target.fresh.fetch_add(1, Ordering::Relaxed));
    create(client, &target.base, &id).await;
    id
}

/// [`paired`] for first runs: each of the two runs is on a new session.
async fn paired_first(client: &reqwest::Client, timed: &Target, other: &Target) -> Duration {
    let id = fresh_session(client, other).await;
    run_session(client, &other.base, &id).await;
    let id = fresh_session(client, timed).await;
    let start = Instant::now();
    run_session(client, &timed.base, &id).await;
    start.elapsed()
}

fn runs(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (files, instant, files_nosync, instant_nosync, unleased_nosync) = rt.block_on(async {
        (
            start(Leases::Files, true).await,
            start(Leases::Instant, true).await,
            start(Leases::Files, false).await,
            start(Leases::Instant, false).await,
            start(Leases::Unleased, false).await,
        )
    });
    let (files, instant) = (Arc::new(files), Arc::new(instant));
    let (files_nosync, instant_nosync, unleased_nosync) = (
        Arc::new(files_nosync),
        Arc::new(instant_nosync),
        Arc::new(unleased_nosync),
    );
    let client = reqwest::Client::new();

    // The default configuration (appends synced), then without store syncs,
    // where the lease's own cost is a larger share of a run; then against
    // no leases at all.
    for (group, ours, limit) in [
        ("mecated/run", &files, &instant),
        ("mecated/run-nofsync", &files_nosync, &instant_nosync),
        (
            "mecated/run-nofsync-vs-unleased",
            &files_nosync,
            &unleased_nosync,
        ),
    ] {
        let mut g = c.benchmark_group(group);
        for (name, timed, other) in [("ours", ours, limit), ("limit", limit, ours)] {
            g.bench_function(name, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (client, timed, other) =
                        (client.clone(), Arc::clone(timed), Arc::clone(other));
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            total += paired(&client, &timed, &other).await;
                        }
                        total
                    }
                })
            });
        }
        g.finish();
    }

    // A session's first run: the lease file is created by it.
    let mut g = c.benchmark_group("mecated/first-run-nofsync-vs-unleased");
    for (name, timed, other) in [
        ("ours", &files_nosync, &unleased_nosync),
        ("limit", &unleased_nosync, &files_nosync),
    ] {
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (client, timed, other) = (client.clone(), Arc::clone(timed), Arc::clone(other));
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += paired_first(&client, &timed, &other).await;
                    }
                    total
                }
            })
        });
    }
    g.finish();

    // Throughput: 8 clients at once on distinct sessions; time per run.
    // Every sample starts on empty sessions.
    let mut g = c.benchmark_group("mecated/run-8-concurrent");
    for (name, target) in [("ours", &files), ("limit", &instant)] {
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (client, target) = (client.clone(), Arc::clone(target));
                async move {
                    target.reset(&client).await;
                    let per_client = iters.div_ceil(8) as usize;
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..8)
                        .map(|c| {
                            let (client, target) = (client.clone(), Arc::clone(&target));
                            tokio::spawn(async move {
                                for k in 0..per_client {
                                    // Client c only touches sessions ≡ c (mod 8).
                                    one_run(&client, &target.base, c + 8 * k).await;
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.expect("client task");
                    }
                    let elapsed = start.elapsed();
                    let mut runs = target.runs.lock().unwrap();
                    for c in 0..8 {
                        for k in 0..per_client {
                            runs[(c + 8 * k) % SESSIONS] += 1;
                        }
                    }
                    elapsed.mul_f64(iters as f64 / (per_client * 8) as f64)
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    targets = runs
}
criterion_main!(benches);
