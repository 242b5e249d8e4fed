//! Per-operation cost of `K8sLease` against the Kubernetes API emulator,
//! beside a bare conditional PUT of a Lease through the same kube client,
//! measured in the same run. Before measuring it prints the API requests
//! each operation costs, as the emulator counts them.
//!
//! Groups (read by `cargo xtask bench`: `ours` against `limit`):
//! - `k8slease/renew`: renew of one live lease (a GET of its object and a
//!   PUT of the owner lease; `renew_many`, which the lease keeper uses,
//!   costs one PUT and one list per third of a TTL for all of a process's
//!   sessions); limit = one PUT of a Lease conditional on its
//!   resourceVersion.
//! - `k8slease/acquire-release`: acquire of a free session this client
//!   released last, then its release; limit = two bare PUTs.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_emulator::{Emulator, EmulatorConfig, Verb};
use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8slease::K8sLease;
use kube::api::{Api, PostParams};
use lease_port::{OwnerId, SessionId, SessionLease};

const TTL: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

struct Setup {
    emulator: Emulator,
    client: kube::Client,
    leases: K8sLease,
}

async fn setup() -> Setup {
    let emulator = Emulator::start(EmulatorConfig::default())
        .await
        .expect("emulator");
    let client = k8slease::client_from_kubeconfig(emulator.kubeconfig_path())
        .await
        .expect("client");
    let leases = K8sLease::builder(client.clone(), "default")
        .ttl(TTL)
        .build()
        .expect("leases");
    Setup {
        emulator,
        client,
        leases,
    }
}

/// The requests one call of `op` costs, by verb.
async fn count<F: std::future::Future<Output = ()>>(e: &Emulator, op: F) -> String {
    e.requests().reset();
    op.await;
    let r = e.requests();
    format!(
        "get {} create {} update {}",
        r.get(Verb::Get, "leases"),
        r.get(Verb::Create, "leases"),
        r.get(Verb::Update, "leases")
    )
}

fn report_requests(rt: &tokio::runtime::Runtime) {
    rt.block_on(async {
        let s = setup().await;
        let (a, b) = (OwnerId::new("a").unwrap(), OwnerId::new("b").unwrap());
        let session = SessionId::new("counted").unwrap();
        let other = s.leases.clone();
        let fresh = K8sLease::builder(s.client.clone(), "default")
            .ttl(TTL)
            .build()
            .unwrap();
        let e = &s.emulator;
        let mut lease = None;
        let acquire_new = count(e, async {
            lease = Some(s.leases.acquire(&session, &a).await.unwrap());
        })
        .await;
        let renew = count(e, async {
            lease = Some(s.leases.renew(lease.as_ref().unwrap()).await.unwrap());
        })
        .await;
        let release = count(e, async {
            other.release(lease.as_ref().unwrap()).await.unwrap();
        })
        .await;
        let acquire_free = count(e, async {
            lease = Some(fresh.acquire(&session, &b).await.unwrap());
        })
        .await;
        let held = count(e, async {
            let _ = s.leases.acquire(&session, &a).await;
        })
        .await;
        println!("k8slease API requests per operation (emulator counts):");
        println!("  acquire, new session:               {acquire_new}");
        println!("  renew:                              {renew}");
        println!("  release:                            {release}");
        println!("  acquire, free session never seen:   {acquire_free}");
        println!("  acquire, held (memory said free):   {held}");
    });
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    report_requests(&rt);
    let s = rt.block_on(setup());
    let owner = OwnerId::new("bench").unwrap();

    // The bare write: one conditional PUT, resourceVersion carried forward.
    let api: Api<LeaseObject> = Api::namespaced(s.client.clone(), "default");
    let seed = rt
        .block_on(api.create(
            &PostParams::default(),
            &LeaseObject {
                metadata: ObjectMeta {
                    name: Some("bare".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("bench".into()),
                    ..LeaseSpec::default()
                }),
            },
        ))
        .expect("create the bare object");
    let bare = Bare {
        api,
        last: Mutex::new(seed),
    };

    let session = SessionId::new("bench-renew").unwrap();
    let held = rt.block_on(s.leases.acquire(&session, &owner)).unwrap();
    let mut g = c.benchmark_group("k8slease/renew");
    g.bench_function("ours", |b| {
        b.to_async(&rt)
            .iter(|| async { s.leases.renew(&held).await.unwrap() })
    });
    g.bench_function("limit", |b| {
        b.to_async(&rt).iter(|| bare.put());
    });
    g.finish();

    let cycle = SessionId::new("bench-cycle").unwrap();
    let mut g = c.benchmark_group("k8slease/acquire-release");
    g.bench_function("ours", |b| {
        b.to_async(&rt).iter(|| async {
            let l = s.leases.acquire(&cycle, &owner).await.unwrap();
            s.leases.release(&l).await.unwrap();
        })
    });
    g.bench_function("limit", |b| {
        b.to_async(&rt).iter(|| async {
            bare.put().await;
            bare.put().await;
        });
    });
    g.finish();
}

/// A Lease written by bare conditional PUTs, each carrying the version the
/// previous one produced.
struct Bare {
    api: Api<LeaseObject>,
    last: Mutex<LeaseObject>,
}

impl Bare {
    async fn put(&self) {
        let mut next = self.last.lock().unwrap().clone();
        // A changed field, or the server would skip the write.
        next.spec.as_mut().unwrap().renew_time = Some(MicroTime(
            jiff::Timestamp::try_from(SystemTime::now()).unwrap(),
        ));
        let written = self
            .api
            .replace("bare", &PostParams::default(), &next)
            .await
            .expect("bare PUT");
        *self.last.lock().unwrap() = written;
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
