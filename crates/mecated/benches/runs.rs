//! End-to-end runs over HTTP: the same server with file leases (`ours`)
//! and with leases disabled (`limit`), measured in one run, so the ratio is
//! what leasing adds to a run.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use mecated::backend::{LeaseChoice, StoreChoice};
use mecated::{Server, ServerConfig};
use serde_json::{Value, json};

const SESSIONS: usize = 64;

struct Target {
    base: String,
    _server: Server,
    _dir: tempfile::TempDir,
}

async fn start(leased: bool, fsync: bool) -> Target {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::for_store(dir.path());
    config.store = StoreChoice::Jsonl {
        dir: dir.path().to_path_buf(),
        fsync,
    };
    if !leased {
        config.lease = LeaseChoice::Unleased;
    }
    let server = Server::start(config).await.expect("server");
    let base = format!("http://{}", server.local_addr());
    let client = reqwest::Client::new();
    for i in 0..SESSIONS {
        let r = client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"id": format!("bench-{i}")}))
            .send()
            .await
            .expect("create");
        assert!(r.status().is_success());
    }
    Target {
        base,
        _server: server,
        _dir: dir,
    }
}

async fn one_run(client: &reqwest::Client, base: &str, i: usize) {
    let r: Value = client
        .post(format!("{base}/v1/sessions/bench-{}/runs", i % SESSIONS))
        .json(&json!({"input": "ping"}))
        .send()
        .await
        .expect("run")
        .json()
        .await
        .expect("json");
    assert_eq!(r["status"], "completed", "{r}");
}

fn runs(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (leased, unleased, leased_nosync, unleased_nosync) = rt.block_on(async {
        (
            start(true, true).await,
            start(false, true).await,
            start(true, false).await,
            start(false, false).await,
        )
    });
    let client = reqwest::Client::new();

    // The default configuration (appends synced), then without store syncs,
    // where the lease's own cost is a larger share of a run. Each measured
    // run is paired with an unmeasured run on the other server, so both
    // sides see the same mix of work and drift on this shared machine hits
    // them alike.
    for (group, leased, unleased) in [
        ("mecated/run", &leased, &unleased),
        ("mecated/run-nofsync", &leased_nosync, &unleased_nosync),
    ] {
        let mut g = c.benchmark_group(group);
        for (name, timed, other) in [("ours", leased, unleased), ("limit", unleased, leased)] {
            let (timed, other) = (Arc::new(timed.base.clone()), Arc::new(other.base.clone()));
            g.bench_function(name, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (client, timed, other) =
                        (client.clone(), Arc::clone(&timed), Arc::clone(&other));
                    async move {
                        let mut total = Duration::ZERO;
                        for i in 0..iters as usize {
                            one_run(&client, &other, i).await;
                            let start = Instant::now();
                            one_run(&client, &timed, i).await;
                            total += start.elapsed();
                        }
                        total
                    }
                })
            });
        }
        g.finish();
    }

    // Throughput: 8 clients at once on distinct sessions; time per run.
    let mut g = c.benchmark_group("mecated/run-8-concurrent");
    for (name, target) in [("ours", &leased), ("limit", &unleased)] {
        let base = Arc::new(target.base.clone());
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (client, base) = (client.clone(), Arc::clone(&base));
                async move {
                    let start = Instant::now();
                    let per_client = iters.div_ceil(8) as usize;
                    let tasks: Vec<_> = (0..8)
                        .map(|c| {
                            let (client, base) = (client.clone(), Arc::clone(&base));
                            tokio::spawn(async move {
                                for k in 0..per_client {
                                    // Client c only touches sessions ≡ c (mod 8).
                                    one_run(&client, &base, c + 8 * k).await;
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.expect("client task");
                    }
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_client * 8) as f64)
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    targets = runs
}
criterion_main!(benches);
