//! memlease against its limit: a bare `Mutex<HashMap>` doing the same
//! insert / update / remove as an acquire → renew → release cycle.
//!
//! Groups follow the `cargo xtask bench` convention: `ours` and `limit` in
//! one group, measured in the same run.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use lease_port::{OwnerId, SessionId, SessionLease};
use memlease::MemLease;

/// memlease never awaits anything, so one poll finishes every call; this
/// keeps executor overhead out of both sides of the comparison.
fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("memlease futures complete on first poll"),
    }
}

fn ids(prefix: &str, n: usize) -> Vec<SessionId> {
    (0..n)
        .map(|i| SessionId::new(format!("{prefix}-{i}")).expect("valid"))
        .collect()
}

fn ours_cycle(leases: &MemLease, owner: &OwnerId, session: &SessionId) {
    let lease = ready(leases.acquire(session, owner)).expect("free");
    let lease = ready(leases.renew(&lease)).expect("ours");
    ready(leases.release(&lease)).expect("release");
}

type Bare = Mutex<HashMap<SessionId, (OwnerId, u64, SystemTime)>>;

/// The same work with nothing but a mutex and a map: read-then-insert,
/// update in place, remove — what any lease table must at least do.
fn limit_cycle(map: &Bare, owner: &OwnerId, session: &SessionId, token: &mut u64) {
    let now = SystemTime::now();
    {
        let mut m = map.lock().expect("unpoisoned");
        *token += 1;
        if m.get(session).is_none() {
            m.insert(
                session.clone(),
                (owner.clone(), *token, now + Duration::from_secs(30)),
            );
        }
    }
    {
        let mut m = map.lock().expect("unpoisoned");
        if let Some(e) = m.get_mut(session) {
            e.2 = SystemTime::now() + Duration::from_secs(30);
        }
    }
    map.lock().expect("unpoisoned").remove(session);
}

fn single_thread(c: &mut Criterion) {
    let owner = OwnerId::new("bench-owner").expect("valid");
    let sessions = ids("s", 1024);
    let mut g = c.benchmark_group("memlease/cycle");
    let leases = MemLease::new(Duration::from_secs(30));
    let mut i = 0;
    g.bench_function("ours", |b| {
        b.iter(|| {
            i = (i + 1) % sessions.len();
            ours_cycle(&leases, &owner, black_box(&sessions[i]));
        })
    });
    let map = Bare::default();
    let mut token = 0;
    g.bench_function("limit", |b| {
        b.iter(|| {
            i = (i + 1) % sessions.len();
            limit_cycle(&map, &owner, black_box(&sessions[i]), &mut token);
        })
    });
    g.finish();
}

/// Time for `threads` threads to each run `per_thread` cycles on sessions
/// of their own.
fn parallel(leases: &MemLease, threads: usize, per_thread: u64) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (leases, barrier) = (leases.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let owner = OwnerId::new(format!("owner-{t}")).expect("valid");
                let sessions = ids(&format!("t{t}"), 256);
                barrier.wait();
                for i in 0..per_thread as usize {
                    ours_cycle(&leases, &owner, &sessions[i % sessions.len()]);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    start.elapsed()
}

/// Throughput scaling: `ours` runs the cycles on two threads (distinct
/// sessions), `limit` runs the same total on one. A ratio of 0.5 is perfect
/// scaling; the target is at most 0.625 (two threads ≥ 1.6× one).
fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("memlease/cycle-2-threads");
    let leases = MemLease::new(Duration::from_secs(30));
    g.bench_function("ours", |b| {
        b.iter_custom(|iters| parallel(&leases, 2, iters.div_ceil(2)))
    });
    g.bench_function("limit", |b| {
        b.iter_custom(|iters| parallel(&leases, 1, iters))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = single_thread, two_threads
}
criterion_main!(benches);
