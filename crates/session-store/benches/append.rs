//! Fenced appends against a bare `write` (+ `fdatasync`) of the same bytes
//! to a file on the same file system, measured in the same run.
//!
//! Groups (read by `cargo xtask bench`: `ours` against `limit`):
//! - `session-store/append`: one-event fenced append, `FsyncPolicy::Never`,
//!   cross-process locking on (the default); limit = one `write` of the
//!   same line to an `O_APPEND` file;
//! - `session-store/append-fsync`: `FsyncPolicy::Always` (the call runs on
//!   tokio's blocking pool); limit = `write` + `fdatasync`;
//! - `session-store/append-single-process`: like `append` with
//!   cross-process locking off, to show what the two `flock` calls cost.
//! - `session-store/append-offload`: what moving the same append off the
//!   async worker would cost on a two-worker runtime, to choose how the
//!   store runs calls whose lock is free: `inline` (what it does: the
//!   non-blocking lock succeeds on the worker), `spawn_blocking`,
//!   `block_in_place`. No limit: the rows compare with each other.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::{Value, json};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

fn payload() -> Value {
    json!({"role": "user", "text": "hello there, a typical short chat message", "n": 42})
}

/// The line the store writes for one event, for the limit to write.
fn line() -> Vec<u8> {
    format!(
        "{{\"t\":\"e\",\"seq\":123456,\"token\":7,\"ts\":1767225600000,\"payload\":{}}}\n",
        serde_json::to_string(&payload()).expect("json")
    )
    .into_bytes()
}

/// Appends without fsync never await anything: one poll finishes them, which
/// keeps executor overhead out of the comparison with a bare write.
fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("appends without fsync complete on first poll"),
    }
}

fn bare_file(dir: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("bare.log"))
        .expect("bare file")
}

fn inline_group(c: &mut Criterion, group: &str, cross_process: bool) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let opts = JsonlOptions::default()
        .fsync(FsyncPolicy::Never)
        .cross_process(cross_process);
    let store = JsonlStore::open(dir.path().join("store"), opts).expect("store");
    let fence = WriteFence::new(FencingToken::new(7), OwnerId::new("bench").expect("owner"));
    let events = [payload()];
    let mut n = 0u64;
    let mut g = c.benchmark_group(group);
    g.bench_function("ours", |b| {
        // A fresh session per sample keeps files and indexes small.
        b.iter_custom(|iters| {
            n += 1;
            let s = SessionId::new(format!("bench-{n}")).expect("valid");
            ready(store.create(&s)).expect("create");
            let start = Instant::now();
            for _ in 0..iters {
                black_box(ready(store.append(&s, fence.clone(), &events)).expect("append"));
            }
            start.elapsed()
        })
    });
    let bytes = line();
    let mut file = bare_file(dir.path());
    g.bench_function("limit", |b| {
        b.iter(|| file.write_all(black_box(&bytes)).expect("write"))
    });
    g.finish();
}

fn append(c: &mut Criterion) {
    inline_group(c, "session-store/append", true);
}

fn append_single_process(c: &mut Criterion) {
    inline_group(c, "session-store/append-single-process", false);
}

fn append_fsync(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let store = JsonlStore::open(dir.path().join("store"), JsonlOptions::default()).expect("store");
    let fence = WriteFence::new(FencingToken::new(7), OwnerId::new("bench").expect("owner"));
    let events = [payload()];
    let mut n = 0u64;
    let mut g = c.benchmark_group("session-store/append-fsync");
    g.bench_function("ours", |b| {
        b.iter_custom(|iters| {
            n += 1;
            let s = SessionId::new(format!("bench-{n}")).expect("valid");
            rt.block_on(async {
                store.create(&s).await.expect("create");
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        store
                            .append(&s, fence.clone(), &events)
                            .await
                            .expect("append"),
                    );
                }
                start.elapsed()
            })
        })
    });
    let bytes = line();
    let mut file = bare_file(dir.path());
    g.bench_function("limit", |b| {
        b.iter(|| {
            file.write_all(black_box(&bytes)).expect("write");
            file.sync_data().expect("fdatasync");
        })
    });
    g.finish();
}

fn append_offload(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let opts = JsonlOptions::default().fsync(FsyncPolicy::Never);
    let store = JsonlStore::open(dir.path().join("store"), opts).expect("store");
    let fence = WriteFence::new(FencingToken::new(7), OwnerId::new("bench").expect("owner"));
    let mut n = 0u64;
    let mut g = c.benchmark_group("session-store/append-offload");
    for how in ["inline", "spawn_blocking", "block_in_place"] {
        g.bench_function(how, |b| {
            b.iter_custom(|iters| {
                n += 1;
                let s = SessionId::new(format!("offload-{n}")).expect("valid");
                let (store, fence) = (store.clone(), fence.clone());
                // Measured inside a task on a worker, as a server's call is.
                rt.block_on(rt.spawn(async move {
                    let events = [payload()];
                    store.create(&s).await.expect("create");
                    let start = Instant::now();
                    for _ in 0..iters {
                        match how {
                            "inline" => {
                                black_box(
                                    store
                                        .append(&s, fence.clone(), &events)
                                        .await
                                        .expect("append"),
                                );
                            }
                            "spawn_blocking" => {
                                let (store, s, events) = (store.clone(), s.clone(), events.clone());
                                let fence = fence.clone();
                                let r = tokio::task::spawn_blocking(move || {
                                    ready(store.append(&s, fence, &events))
                                });
                                black_box(r.await.expect("join").expect("append"));
                            }
                            _ => {
                                black_box(
                                    tokio::task::block_in_place(|| {
                                        ready(store.append(&s, fence.clone(), &events))
                                    })
                                    .expect("append"),
                                );
                            }
                        }
                    }
                    start.elapsed()
                }))
                .expect("task")
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = append, append_single_process, append_fsync, append_offload
}
criterion_main!(benches);
