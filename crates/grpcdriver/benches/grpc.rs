//! grpcdriver against its limit, both over one real tonic server on
//! loopback in the same run:
//!
//! - `acquire` and `renew`: one lease call through `GrpcLease` (client
//!   validation, ErrorInfo-ready status mapping, the backend, expiry
//!   arithmetic) against the bare round trip of a tonic unary call whose
//!   handler does nothing (the standard health service's `Check` on the
//!   same server and connection).
//! - `renew-1000`: renewing 1,000 held leases with `renew_many` (one
//!   KeepAlive batch) against 1,000 unary `renew` calls in flight at once
//!   on the same connection.
//!
//! Groups follow the `cargo xtask bench` convention: `ours` and `limit` in
//! one group, measured in the same run.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::future::join_all;
use grpcdriver::{GrpcLease, LeaseServer};
use lease_port::{Lease, OwnerId, SessionId, SessionLease};
use memlease::MemLease;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

struct Setup {
    rt: tokio::runtime::Runtime,
    leases: GrpcLease,
    health: HealthClient<tonic::transport::Channel>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (addr, stop) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let backend = Arc::new(MemLease::new(Duration::from_secs(3600)));
        tokio::spawn(
            LeaseServer::new(backend)
                .concurrency_per_connection(2048)
                .serve(listener, async {
                    let _ = stopped.await;
                }),
        );
        (addr, stop)
    });
    let leases = rt.block_on(async {
        GrpcLease::builder(addr.to_string())
            .call_timeout(Duration::from_secs(30))
            .build()
            .expect("client")
    });
    let health = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        HealthClient::new(channel)
    });
    Setup {
        rt,
        leases,
        health,
        _stop: stop,
    }
}

fn bare_unary(s: &Setup) {
    let mut health = s.health.clone();
    s.rt.block_on(async move {
        health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health answers")
    });
}

fn bench(c: &mut Criterion) {
    let s = setup();
    let owner = OwnerId::new("bench#1").expect("valid");
    let session = SessionId::new("bench-session").expect("valid");
    // Connect and warm both sides up before measuring.
    bare_unary(&s);
    let held =
        s.rt.block_on(s.leases.acquire(&session, &owner))
            .expect("acquire");

    let mut g = c.benchmark_group("grpcdriver/acquire");
    g.bench_function("ours", |b| {
        b.iter(|| {
            s.rt.block_on(s.leases.acquire(&session, &owner))
                .expect("acquire")
        })
    });
    g.bench_function("limit", |b| b.iter(|| bare_unary(&s)));
    g.finish();

    let mut g = c.benchmark_group("grpcdriver/renew");
    g.bench_function("ours", |b| {
        b.iter(|| s.rt.block_on(s.leases.renew(&held)).expect("renew"))
    });
    g.bench_function("limit", |b| b.iter(|| bare_unary(&s)));
    g.finish();

    let many: Vec<Lease> = (0..1000)
        .map(|i| {
            let id = SessionId::new(format!("many-{i}")).expect("valid");
            s.rt.block_on(s.leases.acquire(&id, &owner))
                .expect("acquire")
        })
        .collect();
    let mut g = c.benchmark_group("grpcdriver/renew-1000");
    g.sample_size(20);
    g.bench_function("ours", |b| {
        b.iter(|| {
            let answers = s.rt.block_on(s.leases.renew_many(&many));
            assert!(answers.iter().all(Result::is_ok));
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            let answers =
                s.rt.block_on(join_all(many.iter().map(|l| s.leases.renew(l))));
            assert!(answers.iter().all(Result::is_ok));
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
