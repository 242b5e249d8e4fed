//! Followers of one session in one process: the delay from an append to
//! its delivery, at 1,000 followers (`ours`) against 10 (`limit`), in the
//! same run. Each iteration appends one event and waits until every
//! follower has it; what is counted is the delay of the median follower
//! (`mecated/follow-p50-1000-vs-10`) or of the 99th percentile
//! (`mecated/follow-p99-1000-vs-10`), so the ratio says how much more a
//! follower waits when a thousand follow beside it. One reader per
//! session reads each append once and fans it out; without it, each
//! follower read the store itself, and the delay grew with their number.
//! Each follower is one task (as each SSE connection is), which the
//! append must wake: the bench also prints that floor, a bare broadcast
//! to 10 and to 1,000 tasks on the same runtime, with no store at all.
//!
//! The run followed is an unleased one that lasts for the whole bench
//! (its agent waits an hour); the bench appends the events itself, as
//! another writer of the unfenced session would.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use lease_keeper::LeaseKeeper;
use lease_port::{AuthorityId, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use mecated::agent::EchoAgent;
use mecated::engine::{Engine, Exclusivity, FollowItem};
use mecated::metrics::Metrics;
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};
use tokio::sync::mpsc;

/// The backend of an unleased deployment.
#[derive(Debug)]
struct NoLeases;

#[async_trait]
impl SessionLease for NoLeases {
    async fn acquire(&self, _: &SessionId, _: &OwnerId) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported("unleased"))
    }
    async fn renew(&self, _: &Lease) -> Result<Lease, LeaseError> {
        Err(LeaseError::unsupported("unleased"))
    }
    async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
        Ok(())
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        Err(LeaseError::unsupported("unleased"))
    }
}

/// A session with a live run and `followers` following it: appends made
/// through `writer` reach each follower, which reports when it got them.
struct Followed {
    writer: JsonlStore,
    session: SessionId,
    arrivals: mpsc::UnboundedReceiver<(u64, Instant)>,
    followers: usize,
    _engine: Engine,
    _dir: tempfile::TempDir,
}

impl Followed {
    async fn start(followers: usize) -> Followed {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let open = || {
            let opts = JsonlOptions::default()
                .fsync(FsyncPolicy::Never)
                .allow_unfenced(true);
            JsonlStore::open(dir.path(), opts).expect("open the store")
        };
        let metrics = Arc::new(Metrics::default());
        let keeper = LeaseKeeper::builder(
            Arc::new(NoLeases),
            OwnerId::new("bench").expect("valid"),
            Duration::from_secs(15),
        )
        .allow_unleased(true)
        .metrics(metrics.clone())
        .build()
        .expect("keeper");
        let agent = Arc::new(EchoAgent::new(Duration::from_secs(3600), 1));
        let engine = Engine::new(
            Arc::new(open()),
            keeper,
            agent,
            metrics,
            Exclusivity::ProvenSingleProcess,
        );
        let session = SessionId::new("followed").expect("valid");
        engine.create_session(&session).await.expect("create");
        let run = engine
            .start_run(session.clone(), json!("hold"))
            .await
            .expect("a run");
        std::mem::forget(run.events);
        let (tx, arrivals) = mpsc::unbounded_channel();
        for _ in 0..followers {
            let mut rx = engine.follow(session.clone(), 0).await.expect("follow");
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(item) = rx.recv().await {
                    if let FollowItem::Event(e) = item
                        && let Some(n) = e.payload.get("n").and_then(|n| n.as_u64())
                    {
                        let _ = tx.send((n, Instant::now()));
                    }
                }
            });
        }
        Followed {
            writer: open(),
            session,
            arrivals,
            followers,
            _engine: engine,
            _dir: dir,
        }
    }

    /// Appends event `n`; the followers' delays, sorted.
    async fn deliver(&mut self, n: u64) -> Vec<Duration> {
        let sent = Instant::now();
        self.writer
            .append(
                &self.session,
                session_store::WriteFence::Unfenced,
                &[json!({ "n": n })],
            )
            .await
            .expect("append");
        let mut delays = Vec::with_capacity(self.followers);
        while delays.len() < self.followers {
            let (got, at) = self.arrivals.recv().await.expect("followers follow");
            if got == n {
                delays.push(at - sent);
            }
        }
        delays.sort();
        delays
    }
}

/// The p50 and p99 delay of a bare broadcast of a shared value to
/// `tasks` tasks waiting for it: what waking that many costs the runtime.
async fn bare_wakeups(tasks: usize, rounds: usize) -> (Duration, Duration) {
    let (broadcast, _) = tokio::sync::broadcast::channel::<(u64, Arc<Instant>)>(16);
    let (tx, mut arrivals) = mpsc::unbounded_channel();
    for _ in 0..tasks {
        let (mut rx, tx) = (broadcast.subscribe(), tx.clone());
        tokio::spawn(async move {
            while let Ok((n, sent)) = rx.recv().await {
                let _ = tx.send((n, sent.elapsed()));
            }
        });
    }
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    for n in 0..rounds as u64 {
        broadcast
            .send((n, Arc::new(Instant::now())))
            .expect("receivers");
        let mut delays = Vec::with_capacity(tasks);
        while delays.len() < tasks {
            let (got, delay) = arrivals.recv().await.expect("tasks");
            if got == n {
                delays.push(delay);
            }
        }
        delays.sort();
        p50.push(delays[tasks / 2]);
        p99.push(delays[((tasks as f64 * 0.99) as usize).min(tasks - 1)]);
    }
    p50.sort();
    p99.sort();
    (p50[rounds / 2], p99[rounds / 2])
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for tasks in [10, 1000] {
        let (p50, p99) = rt.block_on(bare_wakeups(tasks, 200));
        println!("floor: a bare broadcast to {tasks} tasks, p50 {p50:?}, p99 {p99:?}");
    }
    let mut many = rt.block_on(Followed::start(1000));
    let mut few = rt.block_on(Followed::start(10));
    let mut n = 0;
    for (name, quantile) in [("p50", 0.5), ("p99", 0.99)] {
        let mut g = c.benchmark_group(format!("mecated/follow-{name}-1000-vs-10"));
        g.sample_size(20);
        for (function, followed) in [("ours", &mut many), ("limit", &mut few)] {
            g.bench_function(function, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        n += 1;
                        let delays = rt.block_on(followed.deliver(n));
                        let at = ((delays.len() as f64 * quantile) as usize).min(delays.len() - 1);
                        total += delays[at];
                    }
                    total
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
