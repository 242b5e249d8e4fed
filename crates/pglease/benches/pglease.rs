//! The PostgreSQL backend against the bare statements it is built on, on
//! one real server in the same run (`cargo xtask bench` convention: `ours`
//! and `limit` in one group):
//!
//! - `acquire`: taking a free session (the acquire statement: upsert under
//!   the row lock, the token rules and the clock floor, the log position)
//!   against a bare `INSERT … ON CONFLICT DO UPDATE … WHERE` of a row.
//! - `renew`: renewing a held lease against a bare conditional `UPDATE` of
//!   one row by key, owner and token.
//! - `renew-1000`: renewing 1,000 held sessions with `renew_many` (one
//!   statement) against 1,000 single renewals, four at a time (the client's
//!   connections); on a table of those 1,000 rows, 30 flat samples.
//!
//! Each bare statement is sent as the backend sends its own (unnamed,
//! typed parameters), over a connection of its own.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};
use lease_port::{Lease, OwnerId, SessionId, SessionLease};
use pglease::PgLease;
use test_services::PostgresServer;
use tokio_postgres::types::Type;

const TTL: Duration = Duration::from_secs(3600);

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = PostgresServer::start().expect("start PostgreSQL");
    let leases = rt.block_on(async {
        PgLease::builder(server.url())
            .ttl(TTL)
            .request_timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect")
    });
    let bare = rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        client
            .batch_execute(
                "CREATE TABLE bare (k text PRIMARY KEY, owner text, token bigint, expires_at timestamptz)",
            )
            .await
            .expect("create the bare table");
        client
    });
    let owner = OwnerId::new("bench#1").expect("valid");
    let next = AtomicU64::new(0);
    let fresh = |what: &str| format!("{what}-{}", next.fetch_add(1, Ordering::Relaxed));

    let mut g = c.benchmark_group("pglease/acquire");
    g.bench_function("ours", |b| {
        b.iter(|| {
            let s = SessionId::new(fresh("acquire")).expect("valid");
            rt.block_on(leases.acquire(&s, &owner)).expect("acquire")
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            let k = fresh("bare-acquire");
            rt.block_on(bare.query_typed(
                "INSERT INTO bare AS b (k, owner, token, expires_at)
                 VALUES ($1, $2, 1, now() + interval '1 hour')
                 ON CONFLICT (k) DO UPDATE SET owner = EXCLUDED.owner, token = b.token + 1
                 WHERE b.expires_at <= now()
                 RETURNING token",
                &[(&k, Type::TEXT), (&"bench#1", Type::TEXT)],
            ))
            .expect("bare upsert")
        })
    });
    g.finish();

    let held = rt.block_on(async {
        let s = SessionId::new("renewed").expect("valid");
        leases.acquire(&s, &owner).await.expect("acquire")
    });
    rt.block_on(bare.query_typed(
        "INSERT INTO bare VALUES ('renewed', 'bench#1', 1, now() + interval '1 hour')",
        &[],
    ))
    .expect("bare row");
    let mut g = c.benchmark_group("pglease/renew");
    g.bench_function("ours", |b| {
        b.iter(|| rt.block_on(leases.renew(&held)).expect("renew"))
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            rt.block_on(bare.query_typed(
                "UPDATE bare SET expires_at = now() + interval '1 hour'
                 WHERE k = $1 AND owner = $2 AND token = $3 RETURNING expires_at",
                &[
                    (&"renewed", Type::TEXT),
                    (&"bench#1", Type::TEXT),
                    (&1_i64, Type::INT8),
                ],
            ))
            .expect("bare update")
        })
    });
    g.finish();

    // A table of their own: the acquire group leaves as many fresh rows as
    // criterion ran iterations, a number that varies from run to run, and
    // the batch's plan (a scan of the table against an index probe per
    // lease) and cost follow the table's size.
    let batch = rt.block_on(async {
        PgLease::builder(server.url())
            .ttl(TTL)
            .request_timeout(Duration::from_secs(30))
            .table_prefix("many")
            .connect()
            .await
            .expect("connect")
    });
    let many: Vec<Lease> = rt.block_on(join_all((0..1000).map(|i| {
        let (batch, owner) = (batch.clone(), owner.clone());
        async move {
            let s = SessionId::new(format!("many-{i}")).expect("valid");
            batch.acquire(&s, &owner).await.expect("acquire")
        }
    })));
    // Analysed now, so autovacuum does not start (and the plan change)
    // halfway through the group.
    server
        .query("VACUUM ANALYZE many_leases")
        .expect("vacuum the leases");
    let mut g = c.benchmark_group("pglease/renew-1000");
    // Tens of milliseconds an iteration for the limit: flat sampling gives
    // every sample the same few iterations, and 30 samples after a warm-up
    // long enough to reach the steady state of both sides.
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(30)
        .warm_up_time(Duration::from_secs(3))
        .measurement_time(Duration::from_secs(10));
    g.bench_function("ours", |b| {
        b.iter(|| {
            let out = rt.block_on(batch.renew_many(&many));
            assert!(out.iter().all(Result::is_ok));
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            rt.block_on(
                stream::iter(&many)
                    .map(|l| batch.renew(l))
                    .buffer_unordered(4)
                    .for_each(|r| async move {
                        r.expect("renew");
                    }),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
