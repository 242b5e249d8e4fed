//! Run latency against session length: `mecated/run-long-session` times
//! runs (start → end, an agent handed the whole transcript, JSONL store
//! without syncs, in-memory leases) of a session holding 10,000 earlier
//! events (`ours`) and of one holding 10 (`limit`), interleaved in the same
//! run. Both stay in the transcript cache, so the ratio is what a long
//! transcript costs a run that finds it cached; the engine aims at no more
//! than 1.2×.
//!
//! The store does not sync, so a run costs little more than its reads and
//! appends and a transcript read shows in full; with `fdatasync` per
//! append the ratio would only shrink.
//!
//! The long session keeps growing by two events a run (its claim and its
//! reply), which only makes `ours` longer. The short one is replaced by a
//! fresh session of 10 events every [`SHORT_ROUNDS`] runs, untimed.
//!
//! The soak rows run round robin over [`SOAK_SESSIONS`] sessions, far
//! more than the default transcript cache holds once they are long, so
//! every run of a long session misses the cache: `ours` runs sessions of
//! [`SOAK_EVENTS`] events each, `limit` sessions of 10, each with the
//! default `--transcript-cache-bytes`:
//!
//! - `mecated/soak-echo-10k-vs-fresh`: the default agent, which reads no
//!   history;
//! - `mecated/soak-checkpointing-10k-vs-fresh`: an agent that reads its
//!   transcript since its newest checkpoint and writes one every
//!   [`CHECKPOINT_EVERY`] events;
//! - `mecated/soak-full-transcript-10k-vs-fresh`: an agent that reads the
//!   whole session: what a session that outgrew the cache costs it.
//!
//! Under `cargo test` (criterion's test mode) the long sessions hold
//! 1,000 events, so the fixture stays small.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use lease_keeper::LeaseKeeper;
use lease_port::{FencingToken, OwnerId, SessionId, SessionLease};
use mecated::agent::{
    Agent, AgentError, CHECKPOINT_TYPE, EchoAgent, EventSink, TranscriptScope, Turn,
};
use mecated::engine::{Engine, Exclusivity, RunStatus};
use mecated::metrics::Metrics;
use memlease::MemLease;
use serde_json::{Value, json};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

const TTL: Duration = Duration::from_secs(15);
const LONG_EVENTS: usize = 10_000;
const SHORT_EVENTS: usize = 10;
/// Runs of a short session before the next fresh one is used: it then
/// holds between 10 and 10 + 2 × (`SHORT_ROUNDS` − 1) events.
const SHORT_ROUNDS: u32 = 4;
/// Sessions run round robin in the soak rows.
const SOAK_SESSIONS: usize = 64;
/// Events of each long soak session (under `cargo bench`).
const SOAK_EVENTS: usize = 10_000;
/// How often the checkpointing agent sums up.
const CHECKPOINT_EVERY: usize = 100;

struct Bench {
    engine: Engine,
    store: Arc<JsonlStore>,
    long: SessionId,
    short: std::sync::Mutex<SessionId>,
    short_runs: AtomicU32,
    short_made: AtomicUsize,
    _dir: tempfile::TempDir,
}

/// What a conversation looks like: alternating claims and replies.
fn history(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                json!({"type": "run_started", "owner": "earlier", "token": 0})
            } else {
                json!({"type": "message", "role": "assistant", "content": format!("reply {i}: {}", "x".repeat(40))})
            }
        })
        .collect()
}

/// Creates `session` holding `n` events, written under token 0 (below
/// every token the engine's leases hand out).
async fn seed(store: &JsonlStore, session: &SessionId, n: usize) {
    seed_events(store, session, history(n)).await;
}

async fn seed_events(store: &JsonlStore, session: &SessionId, events: Vec<Value>) {
    store.create(session).await.expect("create");
    let fence = WriteFence::new(FencingToken::new(0), OwnerId::new("seed").unwrap());
    for chunk in events.chunks(1000) {
        store
            .append(session, fence.clone(), chunk)
            .await
            .expect("seed");
    }
}

impl Bench {
    async fn new() -> Bench {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(
            JsonlStore::open(
                dir.path(),
                JsonlOptions::default().fsync(FsyncPolicy::Never),
            )
            .expect("store"),
        );
        let leases: Arc<dyn SessionLease> = Arc::new(MemLease::new(TTL));
        let keeper = LeaseKeeper::builder(leases, OwnerId::new("bench").unwrap(), TTL)
            .allow_unleased(false)
            .build()
            .expect("keeper");
        let engine = Engine::new(
            Arc::clone(&store) as Arc<dyn SessionStore>,
            keeper,
            Arc::new(Reader(TranscriptScope::Full)),
            Arc::new(Metrics::default()),
            Exclusivity::Leased,
        );
        let long = SessionId::new("long").unwrap();
        seed(&store, &long, LONG_EVENTS).await;
        let short = SessionId::new("short-0").unwrap();
        seed(&store, &short, SHORT_EVENTS).await;
        Bench {
            engine,
            store,
            long,
            short: std::sync::Mutex::new(short),
            short_runs: AtomicU32::new(0),
            short_made: AtomicUsize::new(1),
            _dir: dir,
        }
    }

    /// The short session to run next, a fresh one every [`SHORT_ROUNDS`]
    /// runs. Untimed.
    async fn short(&self) -> SessionId {
        if self.short_runs.fetch_add(1, Ordering::Relaxed) >= SHORT_ROUNDS {
            self.short_runs.store(1, Ordering::Relaxed);
            let n = self.short_made.fetch_add(1, Ordering::Relaxed);
            let fresh = SessionId::new(format!("short-{n}")).unwrap();
            seed(&self.store, &fresh, SHORT_EVENTS).await;
            *self.short.lock().unwrap() = fresh;
        }
        self.short.lock().unwrap().clone()
    }

    async fn run(&self, session: SessionId) -> Duration {
        let start = Instant::now();
        let run = self
            .engine
            .start_run(session, json!("ping"))
            .await
            .expect("run");
        drop(run.events);
        let end = run.end.await.expect("end");
        let elapsed = start.elapsed();
        assert_eq!(end.status, RunStatus::Completed);
        elapsed
    }

    /// Runs the other session untimed, then the timed one: both functions
    /// see the same mix of work.
    async fn paired(&self, long_timed: bool) -> Duration {
        let short = self.short().await;
        if long_timed {
            self.run(short).await;
            self.run(self.long.clone()).await
        } else {
            self.run(self.long.clone()).await;
            self.run(short).await
        }
    }
}

fn long_sessions(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let bench = Arc::new(rt.block_on(Bench::new()));
    let mut g = c.benchmark_group("mecated/run-long-session");
    for (name, long_timed) in [("ours", true), ("limit", false)] {
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let bench = Arc::clone(&bench);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += bench.paired(long_timed).await;
                    }
                    total
                }
            })
        });
    }
    g.finish();
}

/// Reads its transcript (all of it, or since its newest checkpoint) and
/// replies with how much it read; with checkpoints, sums up once the
/// transcript holds [`CHECKPOINT_EVERY`] events.
#[derive(Debug)]
struct Reader(TranscriptScope);

#[async_trait]
impl Agent for Reader {
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        let bytes: usize = turn.transcript.iter().map(|e| e.to_string().len()).sum();
        if self.0 == TranscriptScope::SinceCheckpoint && turn.transcript.len() >= CHECKPOINT_EVERY {
            sink.emit(json!({"type": CHECKPOINT_TYPE, "summary": bytes}))
                .await?;
        }
        sink.emit(json!({"type": "message", "read": bytes})).await?;
        Ok(())
    }

    fn transcript_scope(&self) -> TranscriptScope {
        self.0
    }
}

/// A conversation with a checkpoint every [`CHECKPOINT_EVERY`] events.
fn checkpointed_history(n: usize) -> Vec<Value> {
    let mut events = history(n);
    for (i, e) in events.iter_mut().enumerate() {
        if i % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 {
            *e = json!({"type": CHECKPOINT_TYPE, "summary": format!("up to {i}")});
        }
    }
    events
}

/// Sessions of one length for the soak, run round robin.
struct SoakSet {
    sessions: Vec<SessionId>,
    next: AtomicUsize,
}

impl SoakSet {
    async fn seeded(store: &JsonlStore, name: &str, events: usize) -> SoakSet {
        let mut sessions = Vec::new();
        for i in 0..SOAK_SESSIONS {
            let s = SessionId::new(format!("{name}-{i}")).unwrap();
            seed_events(store, &s, checkpointed_history(events)).await;
            sessions.push(s);
        }
        SoakSet {
            sessions,
            next: AtomicUsize::new(0),
        }
    }

    fn next(&self) -> SessionId {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.sessions[i % self.sessions.len()].clone()
    }
}

async fn timed_run(engine: &Engine, session: SessionId) -> Duration {
    let start = Instant::now();
    let run = engine.start_run(session, json!("ping")).await.expect("run");
    drop(run.events);
    let end = run.end.await.expect("end");
    let elapsed = start.elapsed();
    assert_eq!(end.status, RunStatus::Completed);
    elapsed
}

fn soak(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // `cargo bench` passes `--bench`; criterion's test mode does not.
    let long_events = if std::env::args().any(|a| a == "--bench") {
        SOAK_EVENTS
    } else {
        SOAK_EVENTS / 10
    };
    let agents: [(&str, Arc<dyn Agent>); 3] = [
        ("echo", Arc::new(EchoAgent::default())),
        (
            "checkpointing",
            Arc::new(Reader(TranscriptScope::SinceCheckpoint)),
        ),
        ("full-transcript", Arc::new(Reader(TranscriptScope::Full))),
    ];
    for (name, agent) in agents {
        // Sessions of its own for each row: the short ones must not have
        // grown in another row's runs.
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, long, short) = rt.block_on(async {
            let store = Arc::new(
                JsonlStore::open(
                    dir.path(),
                    JsonlOptions::default().fsync(FsyncPolicy::Never),
                )
                .expect("store"),
            );
            let long = SoakSet::seeded(&store, "long", long_events).await;
            let short = SoakSet::seeded(&store, "short", SHORT_EVENTS).await;
            (store, long, short)
        });
        let engine = rt.block_on(async {
            let leases: Arc<dyn SessionLease> = Arc::new(MemLease::new(TTL));
            let keeper = LeaseKeeper::builder(leases, OwnerId::new(name).unwrap(), TTL)
                .allow_unleased(false)
                .build()
                .expect("keeper");
            Engine::new(
                Arc::clone(&store) as Arc<dyn SessionStore>,
                keeper,
                agent,
                Arc::new(Metrics::default()),
                Exclusivity::Leased,
            )
        });
        let mut g = c.benchmark_group(format!("mecated/soak-{name}-10k-vs-fresh"));
        for (function, set) in [("ours", &long), ("limit", &short)] {
            g.bench_function(function, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let engine = engine.clone();
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            total += timed_run(&engine, set.next()).await;
                        }
                        total
                    }
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    targets = long_sessions, soak
}
criterion_main!(benches);
