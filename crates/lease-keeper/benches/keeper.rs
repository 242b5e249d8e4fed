//! Per-run overhead of the keeper: in-process lock + acquire + release
//! around an empty run, against the bare backend acquire + release, in the
//! same run and on the same runtime.
//!
//! Groups (read by `cargo xtask bench`: `ours` against `limit`):
//! - `lease-keeper/run-memlease`: memlease, whose own cost is tens of ns,
//!   so the ratio shows the keeper's cost;
//! - `lease-keeper/run-flocklease`: flocklease on a directory under the
//!   target dir (each acquisition after a release writes a new token and
//!   syncs it): the difference `ours − limit` is the keeper's overhead.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flocklease::FlockLease;
use lease_keeper::LeaseKeeper;
use lease_port::{OwnerId, SessionId, SessionLease};
use memlease::MemLease;

const TTL: Duration = Duration::from_secs(30);

/// A multi-thread runtime with one worker, as a server runs.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

fn sessions(n: usize) -> Vec<SessionId> {
    (0..n)
        .map(|i| SessionId::new(format!("bench-{i}")).expect("valid"))
        .collect()
}

fn compare(c: &mut Criterion, group: &str, backend: Arc<dyn SessionLease>) {
    let rt = runtime();
    let owner = OwnerId::new("bench-owner").expect("valid");
    let keeper = LeaseKeeper::new(Arc::clone(&backend), owner.clone(), TTL).expect("keeper");
    let ids = Arc::new(sessions(256));
    let mut g = c.benchmark_group(group);
    // Each sample's loop runs as a task on the worker, as request handlers do.
    g.bench_function("ours", |b| {
        b.iter_custom(|iters| {
            let (keeper, ids) = (keeper.clone(), Arc::clone(&ids));
            rt.block_on(rt.spawn(async move {
                let start = Instant::now();
                for i in 0..iters as usize {
                    let guard = keeper.acquire(&ids[i % ids.len()]).await.expect("acquire");
                    black_box(guard.token());
                    guard.finish().await.expect("release");
                }
                start.elapsed()
            }))
            .expect("bench task")
        })
    });
    g.bench_function("limit", |b| {
        b.iter_custom(|iters| {
            let (backend, owner, ids) = (Arc::clone(&backend), owner.clone(), Arc::clone(&ids));
            rt.block_on(rt.spawn(async move {
                let start = Instant::now();
                for i in 0..iters as usize {
                    let lease = backend
                        .acquire(&ids[i % ids.len()], &owner)
                        .await
                        .expect("acquire");
                    black_box(lease.token());
                    backend.release(&lease).await.expect("release");
                }
                start.elapsed()
            }))
            .expect("bench task")
        })
    });
    g.finish();
}

fn run_memlease(c: &mut Criterion) {
    compare(c, "lease-keeper/run-memlease", Arc::new(MemLease::new(TTL)));
}

fn run_flocklease(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let backend = FlockLease::open(dir.path().join("leases"), TTL).expect("flocklease");
    compare(c, "lease-keeper/run-flocklease", Arc::new(backend));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = run_memlease, run_flocklease
}
criterion_main!(benches);
