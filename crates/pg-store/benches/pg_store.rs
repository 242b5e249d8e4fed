//! The PostgreSQL store against the bare statement it is built on, on one
//! real server in the same run (`cargo xtask bench` convention: `ours` and
//! `limit` in one group):
//!
//! - `append`: a fenced append of one event (the one statement that locks
//!   the session row, checks the floors, the authority marker and the
//!   fence, raises `last_seq` and the mark, inserts the event and notifies)
//!   against a bare `INSERT` of the same event row into a table of the same
//!   shape, committed on its own (a single statement is its transaction),
//!   sent as the store sends its own (unnamed, typed parameters) over a
//!   connection of its own.
//!
//! Both sides append to one session, so the event tables grow alike.
//!
//! Twice: `append` on a server that does not sync its log (`fsync = off`,
//! as the tests run: the statements' own cost, side by side), and
//! `append-durable` on one that does (`fsync = on`, as a deployment that
//! keeps its commits runs: what an append costs there, the commit's flush
//! included, which both sides pay once).

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use lease_port::{FencingToken, OwnerId, SessionId};
use pg_session_store::PgStore;
use serde_json::json;
use session_store::{SessionStore, WriteFence};
use test_services::PostgresServer;
use tokio_postgres::types::Type;

fn bench(c: &mut Criterion) {
    let fast = PostgresServer::start().expect("start PostgreSQL");
    append(c, "pg-session-store/append", &fast);
    drop(fast);
    let durable = PostgresServer::start_durable().expect("start PostgreSQL, syncing");
    append(c, "pg-session-store/append-durable", &durable);
}

/// The fenced append against the bare insert, in group `name`, on `server`.
fn append(c: &mut Criterion, name: &str, server: &PostgresServer) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store = rt.block_on(async {
        PgStore::builder(server.url())
            .request_timeout(Duration::from_secs(30))
            .listen(false)
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
                "CREATE TABLE bare_events (
                     session_id text COLLATE \"C\" NOT NULL,
                     seq bigint NOT NULL,
                     token numeric(20, 0),
                     writer text,
                     at timestamptz NOT NULL,
                     bytes integer NOT NULL,
                     payload json NOT NULL,
                     PRIMARY KEY (session_id, seq)
                 )",
            )
            .await
            .expect("create the bare table");
        client
    });
    let s = SessionId::new("bench").expect("valid");
    rt.block_on(store.create(&s)).expect("create");
    let fence = WriteFence::new(
        FencingToken::new(1),
        OwnerId::new("bench#1").expect("valid"),
    );
    let event = [json!({"type": "message", "text": "hello"})];
    let payload = event[0].to_string();
    let bytes = i32::try_from(payload.len()).expect("small");

    let mut g = c.benchmark_group(name);
    g.bench_function("ours", |b| {
        b.iter(|| {
            rt.block_on(store.append(&s, fence.clone(), &event))
                .expect("append")
        })
    });
    let mut seq = 0_i64;
    g.bench_function("limit", |b| {
        b.iter(|| {
            seq += 1;
            rt.block_on(bare.query_typed(
                "INSERT INTO bare_events (session_id, seq, token, writer, at, bytes, payload)
                 VALUES ($1, $2, $3::numeric, $4, now(), $5, $6::json)",
                &[
                    (&"bench", Type::TEXT),
                    (&seq, Type::INT8),
                    (&"1", Type::TEXT),
                    (&"bench#1", Type::TEXT),
                    (&bytes, Type::INT4),
                    (&payload, Type::TEXT),
                ],
            ))
            .expect("bare insert")
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
