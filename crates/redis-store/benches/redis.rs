//! The Redis store and lease against the bare commands they are built on,
//! over one real `redis-server` (no persistence, so the figures are the
//! scripts' cost, not the disk's) in the same run:
//!
//! - `acquire`: taking a free lease (one script: authority check, token
//!   record, grant with `PX`) against a bare `SET key value NX PX` on a new
//!   key.
//! - `renew`: renewing a held lease (compare-and-set script) against a bare
//!   `EVALSHA` of a script that does nothing.
//! - `append`: appending one small event (fence check, stream append,
//!   record update in one script) against a bare `XADD` of the same fields.
//! - `renew-1000`: renewing 1,000 held leases with `renew_many` (one
//!   script call) against 1,000 separate `renew` calls in flight at once on
//!   the same connection.
//!
//! Groups follow the `cargo xtask bench` convention: `ours` and `limit` in
//! one group, measured in the same run.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::future::join_all;
use lease_port::{Lease, OwnerId, SessionId, SessionLease};
use redis::aio::MultiplexedConnection;
use redis_session_store::RedisStore;
use serde_json::json;
use session_store::{SessionStore, WriteFence};
use test_services::RedisServer;

const TTL: Duration = Duration::from_secs(3600);

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start().expect("start redis-server");
    let store = rt.block_on(async {
        RedisStore::builder(redis.url())
            .leases(TTL)
            .request_timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect")
    });
    let leases = store.lease().expect("configured with leases").clone();
    let mut bare: MultiplexedConnection = rt.block_on(async {
        redis::Client::open(redis.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    });
    let owner = OwnerId::new("bench#1").expect("valid");
    let next = AtomicU64::new(0);
    let fresh = |what: &str| format!("{what}-{}", next.fetch_add(1, Ordering::Relaxed));

    let mut g = c.benchmark_group("redis-session-store/acquire");
    g.bench_function("ours", |b| {
        b.iter(|| {
            let s = SessionId::new(fresh("acquire")).expect("valid");
            rt.block_on(leases.acquire(&s, &owner)).expect("acquire")
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            let key = fresh("bare-set");
            rt.block_on(
                redis::cmd("SET")
                    .arg(&key)
                    .arg("1 bench#1")
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async::<redis::Value>(&mut bare),
            )
            .expect("SET")
        })
    });
    g.finish();

    let held = rt
        .block_on(leases.acquire(&SessionId::new("held").expect("valid"), &owner))
        .expect("acquire");
    let noop = redis::Script::new("return 1");
    rt.block_on(noop.prepare_invoke().load_async(&mut bare))
        .expect("SCRIPT LOAD");
    let mut g = c.benchmark_group("redis-session-store/renew");
    g.bench_function("ours", |b| {
        b.iter(|| rt.block_on(leases.renew(&held)).expect("renew"))
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            rt.block_on(
                redis::cmd("EVALSHA")
                    .arg(noop.get_hash())
                    .arg(0)
                    .query_async::<redis::Value>(&mut bare),
            )
            .expect("EVALSHA")
        })
    });
    g.finish();

    let session = SessionId::new("append").expect("valid");
    rt.block_on(store.create(&session)).expect("create");
    let fence = WriteFence::from(&held);
    let event = [json!({"text": "hello"})];
    let payload = event[0].to_string();
    let mut g = c.benchmark_group("redis-session-store/append");
    g.bench_function("ours", |b| {
        b.iter(|| {
            rt.block_on(store.append(&session, fence.clone(), &event))
                .expect("append")
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            rt.block_on(
                redis::cmd("XADD")
                    .arg("bare-stream")
                    .arg("*")
                    .arg("ts")
                    .arg("1700000000000")
                    .arg("k")
                    .arg("1")
                    .arg("w")
                    .arg("bench#1")
                    .arg("p")
                    .arg(&payload)
                    .query_async::<redis::Value>(&mut bare),
            )
            .expect("XADD")
        })
    });
    g.finish();

    let many: Vec<Lease> = (0..1000)
        .map(|i| {
            let s = SessionId::new(format!("many-{i}")).expect("valid");
            rt.block_on(leases.acquire(&s, &owner)).expect("acquire")
        })
        .collect();
    let mut g = c.benchmark_group("redis-session-store/renew-1000");
    g.sample_size(20);
    g.bench_function("ours", |b| {
        b.iter(|| {
            let answers = rt.block_on(leases.renew_many(&many));
            assert!(answers.iter().all(Result::is_ok));
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            let answers = rt.block_on(join_all(many.iter().map(|l| leases.renew(l))));
            assert!(answers.iter().all(Result::is_ok));
        })
    });
    g.finish();
    drop(redis);
}

criterion_group!(benches, bench);
criterion_main!(benches);
