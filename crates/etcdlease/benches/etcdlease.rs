//! Per-operation cost of `EtcdLease` beside the bare etcd operations it is
//! built on, and beside etcd's own lock API, all against one real etcd
//! member started for the run, measured in the same run.
//!
//! Groups (read by `cargo xtask bench`: `ours` against `limit`):
//! - `etcdlease/acquire`: acquire of a free session; limit = the bare
//!   transaction it sends (compare the creation of the key and its guard,
//!   put both, the key with an etcd lease, else read both).
//! - `etcdlease/renew`: renew of a live lease; limit = one KeepAlive round
//!   trip on an open stream.
//! - `etcdlease/renew-vs-keepalive-and-read`: the same renew; limit = a
//!   KeepAlive round trip, then a linearizable read of the key, which is
//!   all a renew is made of (the read after the keep-alive proves it).
//! - `etcdlease/release`: release of a live lease (one transaction that
//!   deletes the key and its guard if the guard is the lease's); limit = a
//!   bare delete of one key.
//! - `etcdlease/renew-1000-sessions`: `renew_many` of 1,000 held sessions;
//!   limit = 1,000 separate KeepAlive round trips (one per session, as one
//!   etcd lease per session would need). The target is a ratio of 0.1 or
//!   less.
//! - `etcdlease/acquire-release-vs-etcd-lock`: an acquire and release
//!   cycle; limit = etcd's own lock service (`v3lockpb.Lock`, what
//!   `etcd-client`'s lock calls): Lock then Unlock on a granted etcd lease.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use etcdlease::EtcdLease;
use etcdlease::wire::EtcdClient;
use etcdlease::wire::messages::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, Request, RequestOp, TargetUnion,
    TxnRequest, compare_result, compare_target,
};
use lease_port::{Lease, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

const TTL: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn unique(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{tag}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

struct Setup {
    rt: tokio::runtime::Runtime,
    leases: EtcdLease,
    raw: EtcdClient,
    owner: OwnerId,
    // Last: the server outlives the clients.
    _etcd: EtcdServer,
}

fn setup() -> Setup {
    let etcd = EtcdServer::start().expect("start etcd");
    let rt = runtime();
    let (leases, raw) = rt.block_on(async {
        let leases = EtcdLease::builder([etcd.endpoint()])
            .prefix("/bench/")
            .ttl(TTL)
            .build()
            .unwrap();
        let raw = EtcdClient::new(&[etcd.endpoint()], Duration::from_secs(2)).unwrap();
        (leases, raw)
    });
    Setup {
        rt,
        leases,
        raw,
        owner: OwnerId::new("bench").unwrap(),
        _etcd: etcd,
    }
}

/// The shape of an acquire's transaction: the session key and its guard.
fn take_if_free(key: Vec<u8>, lease: i64) -> TxnRequest {
    let guard = [key.as_slice(), b"/guard"].concat();
    let absent = |key: &[u8]| Compare {
        result: compare_result::EQUAL,
        target: compare_target::CREATE,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(0)),
    };
    let put = |key: &[u8], lease| RequestOp {
        request: Some(Request::Put(PutRequest {
            key: key.to_vec(),
            value: b"bench".to_vec(),
            lease,
        })),
    };
    let read = |key: &[u8]| RequestOp {
        request: Some(Request::Range(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })),
    };
    TxnRequest {
        compare: vec![absent(&key), absent(&guard)],
        success: vec![put(&key, lease), put(&guard, 0)],
        failure: vec![read(&key), read(&guard)],
    }
}

fn delete(key: Vec<u8>) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key,
        range_end: vec![],
    }
}

fn acquire(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("etcdlease/acquire");
    g.bench_function("ours", |b| {
        b.iter_custom(|iters| {
            s.rt.block_on(async {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let id = SessionId::new(unique("acquire")).unwrap();
                    let t = Instant::now();
                    let lease = s.leases.acquire(&id, &s.owner).await.unwrap();
                    spent += t.elapsed();
                    s.leases.release(&lease).await.unwrap();
                }
                spent
            })
        })
    });
    let lease =
        s.rt.block_on(s.raw.lease_grant(TTL.as_secs() as i64))
            .unwrap()
            .id;
    g.bench_function("limit", |b| {
        b.iter_custom(|iters| {
            s.rt.block_on(async {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let key = format!("/bench-raw/{}", unique("txn")).into_bytes();
                    let t = Instant::now();
                    let answer = s.raw.txn(take_if_free(key.clone(), lease)).await.unwrap();
                    spent += t.elapsed();
                    assert!(answer.succeeded);
                    s.raw.delete_range(delete(key)).await.unwrap();
                }
                spent
            })
        })
    });
    g.finish();
}

fn held(s: &Setup, tag: &str) -> Lease {
    let id = SessionId::new(unique(tag)).unwrap();
    s.rt.block_on(s.leases.acquire(&id, &s.owner)).unwrap()
}

fn renew(c: &mut Criterion) {
    let s = setup();
    let lease = held(&s, "renew");
    let raw_lease =
        s.rt.block_on(s.raw.lease_grant(TTL.as_secs() as i64))
            .unwrap()
            .id;
    let mut stream = s.raw.keep_alive_stream();
    let raw_key = b"/bench-raw/renew".to_vec();
    s.rt.block_on(s.raw.txn(take_if_free(raw_key.clone(), raw_lease)))
        .unwrap();

    let mut g = c.benchmark_group("etcdlease/renew");
    g.bench_function("ours", |b| {
        b.iter(|| s.rt.block_on(s.leases.renew(&lease)).unwrap())
    });
    g.bench_function("limit", |b| {
        b.iter(|| s.rt.block_on(stream.keep_alive(raw_lease)).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("etcdlease/renew-vs-keepalive-and-read");
    g.bench_function("ours", |b| {
        b.iter(|| s.rt.block_on(s.leases.renew(&lease)).unwrap())
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            s.rt.block_on(async {
                let k = stream.keep_alive(raw_lease).await.unwrap();
                let read = s.raw.range(RangeRequest {
                    key: raw_key.clone(),
                    ..Default::default()
                });
                (k, read.await.unwrap())
            })
        })
    });
    g.finish();
}

fn release(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("etcdlease/release");
    g.bench_function("ours", |b| {
        b.iter_custom(|iters| {
            s.rt.block_on(async {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let id = SessionId::new(unique("release")).unwrap();
                    let lease = s.leases.acquire(&id, &s.owner).await.unwrap();
                    let t = Instant::now();
                    s.leases.release(&lease).await.unwrap();
                    spent += t.elapsed();
                }
                spent
            })
        })
    });
    let lease =
        s.rt.block_on(s.raw.lease_grant(TTL.as_secs() as i64))
            .unwrap()
            .id;
    g.bench_function("limit", |b| {
        b.iter_custom(|iters| {
            s.rt.block_on(async {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let key = format!("/bench-raw/{}", unique("del")).into_bytes();
                    s.raw.txn(take_if_free(key.clone(), lease)).await.unwrap();
                    let t = Instant::now();
                    let answer = s.raw.delete_range(delete(key)).await.unwrap();
                    spent += t.elapsed();
                    assert_eq!(answer.deleted, 1);
                }
                spent
            })
        })
    });
    g.finish();
}

fn renew_many(c: &mut Criterion) {
    const SESSIONS: usize = 1000;
    let s = setup();
    let leases: Vec<Lease> = (0..SESSIONS).map(|_| held(&s, "many")).collect();
    let raw_leases: Vec<i64> = s.rt.block_on(async {
        let mut ids = Vec::with_capacity(SESSIONS);
        for _ in 0..SESSIONS {
            ids.push(s.raw.lease_grant(TTL.as_secs() as i64).await.unwrap().id);
        }
        ids
    });
    let mut stream = s.raw.keep_alive_stream();
    let mut g = c.benchmark_group("etcdlease/renew-1000-sessions");
    g.sample_size(10);
    g.bench_function("ours", |b| {
        b.iter(|| {
            let answers = s.rt.block_on(s.leases.renew_many(&leases));
            assert!(answers.iter().all(Result::is_ok));
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            s.rt.block_on(async {
                for &id in &raw_leases {
                    stream.keep_alive(id).await.unwrap();
                }
            })
        })
    });
    g.finish();
}

fn versus_etcd_lock(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("etcdlease/acquire-release-vs-etcd-lock");
    g.bench_function("ours", |b| {
        b.iter(|| {
            s.rt.block_on(async {
                let id = SessionId::new(unique("cycle")).unwrap();
                let lease = s.leases.acquire(&id, &s.owner).await.unwrap();
                s.leases.release(&lease).await.unwrap();
            })
        })
    });
    let lease =
        s.rt.block_on(s.raw.lease_grant(TTL.as_secs() as i64))
            .unwrap()
            .id;
    g.bench_function("limit", |b| {
        b.iter(|| {
            s.rt.block_on(async {
                let name = format!("/bench-lock/{}", unique("lock")).into_bytes();
                let locked = s.raw.lock(name, lease).await.unwrap();
                s.raw.unlock(locked.key).await.unwrap();
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    targets = acquire, renew, release, renew_many, versus_etcd_lock
}
criterion_main!(benches);
