//! Per-operation cost of `FlockLease` beside the raw system calls it is
//! built on, measured in the same run.
//!
//! Groups (read by `cargo xtask bench`: `ours` against `limit`):
//! - `flocklease/renew`: renew of a live lease; limit = open + flock +
//!   pread + pwrite + unlock + close of one file, no fsync.
//! - `flocklease/acquire-new-token`: a takeover after expiry (a new token;
//!   with the default reservation of 1,024 tokens, one acquire in 1,024
//!   syncs); limit = the raw sequence above plus fdatasync, what every new
//!   token cost before reservations.
//! - `flocklease/acquire-new-token-nofsync`: the same takeover; limit = the
//!   raw sequence without fdatasync, the floor for a token written in place.
//! - `flocklease/renew-100k-files`: `ours` renews in a directory of 100,000
//!   lease files, `limit` in one of 1,000: the ratio shows whether the cost
//!   stays flat as the directory grows.
//! - `flocklease/renew-offloaded`: renew with every operation on the
//!   blocking pool (`inline_fast_path(false)`), against the raw sequence.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flocklease::FlockLease;
use lease_port::{Lease, ManualClock, OwnerId, SessionId, SessionLease};
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

const RECORD: usize = flocklease::RECORD_LEN;

/// A multi-thread runtime, as a server runs; the benchmark loop itself runs
/// in `block_on`.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The raw sequence one operation is built on.
fn raw_cycle(path: &Path, sync: bool) {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    let locked = Flock::lock(File::from(fd), FlockArg::LockExclusive).unwrap();
    let mut buf = [0u8; RECORD];
    let n = locked.read_at(&mut buf, 0).unwrap();
    buf[RECORD - 1] = buf[RECORD - 1].wrapping_add(black_box(n as u8));
    locked.write_all_at(&buf, 0).unwrap();
    if sync {
        locked.sync_data().unwrap();
    }
    drop(locked);
}

fn raw_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("raw.lease");
    std::fs::write(&path, [7u8; RECORD]).unwrap();
    path
}

fn live_lease(rt: &tokio::runtime::Runtime, leases: &FlockLease, name: &str) -> Lease {
    let s = SessionId::new(name).unwrap();
    let o = OwnerId::new("bench").unwrap();
    rt.block_on(leases.acquire(&s, &o)).unwrap()
}

fn renew(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path(), Duration::from_secs(3600)).unwrap();
    let lease = live_lease(&rt, &leases, "bench-renew");
    let raw = raw_file(dir.path());
    let mut g = c.benchmark_group("flocklease/renew");
    g.bench_function("ours", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(leases.renew(&lease).await.unwrap()) })
    });
    g.bench_function("limit", |b| b.iter(|| raw_cycle(&raw, false)));
    g.finish();

    let offloaded = FlockLease::builder(dir.path())
        .ttl(Duration::from_secs(3600))
        .inline_fast_path(false)
        .open()
        .unwrap();
    let mut g = c.benchmark_group("flocklease/renew-offloaded");
    g.bench_function("ours", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(offloaded.renew(&lease).await.unwrap()) })
    });
    g.bench_function("limit", |b| b.iter(|| raw_cycle(&raw, false)));
    g.finish();
}

fn acquire_new_token(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let ttl = Duration::from_secs(10);
    let leases = FlockLease::builder(dir.path())
        .ttl(ttl)
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    let s = SessionId::new("bench-acquire").unwrap();
    let o = OwnerId::new("bench").unwrap();
    let raw = raw_file(dir.path());
    for (group, limit_syncs) in [
        ("flocklease/acquire-new-token", true),
        ("flocklease/acquire-new-token-nofsync", false),
    ] {
        let mut g = c.benchmark_group(group);
        g.bench_function("ours", |b| {
            b.to_async(&rt).iter(|| async {
                // The previous grant has expired: every acquire is a
                // takeover with a new token.
                clock.advance(ttl * 2);
                black_box(leases.acquire(&s, &o).await.unwrap())
            })
        });
        g.bench_function("limit", |b| b.iter(|| raw_cycle(&raw, limit_syncs)));
        g.finish();
    }
}

/// A directory of `n` lease files (empty: created, never written) plus one
/// live lease to renew.
fn crowded(rt: &tokio::runtime::Runtime, root: &Path, n: usize) -> (FlockLease, Lease) {
    let dir = root.join(format!("dir-{n}"));
    let leases = FlockLease::open(&dir, Duration::from_secs(3600)).unwrap();
    for i in 0..n {
        File::create(dir.join(format!("filler-{i:06}.lease"))).unwrap();
    }
    let lease = live_lease(rt, &leases, &format!("bench-{n}"));
    (leases, lease)
}

fn flat_across_sizes(c: &mut Criterion) {
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    let (big, big_lease) = crowded(&rt, root.path(), 100_000);
    let (small, small_lease) = crowded(&rt, root.path(), 1_000);
    let mut g = c.benchmark_group("flocklease/renew-100k-files");
    g.bench_function("ours", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(big.renew(&big_lease).await.unwrap()) })
    });
    g.bench_function("limit", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(small.renew(&small_lease).await.unwrap()) })
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = renew, acquire_new_token, flat_across_sizes
}
criterion_main!(benches);
