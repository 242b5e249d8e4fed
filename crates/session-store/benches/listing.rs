//! Paged listing of a JSONL store at two sizes: 10,000 sessions and
//! 1,000,000 under `cargo bench`; 1,000 and 10,000 in criterion's test
//! mode (`cargo test --bench listing`, which runs each bench once), so a
//! CI run stays short. `SESSION_STORE_BENCH_LARGE` overrides the larger
//! size.
//!
//! Groups (read by `cargo xtask bench`):
//! - `session-store/list-page-1m-vs-10k`: one page of 1000 sessions (the
//!   HTTP maximum) after a cursor somewhere in the store; `ours` in the
//!   large store, `limit` the same page in the small one, so the ratio is
//!   what the store's size adds to a page (the goal: at most 1.2×).
//!
//! Printed, timed once: `session-store/list-walk`, every session in pages
//! of 1000, cursor to cursor, at both sizes, with the time per session of
//! each (linear growth keeps it level): the first walk after the index
//! was built from the directory (it checks each session's file once and
//! records what it found), then one that reads only the index; and how
//! long a store instance's first page took, building the index or
//! reading it, with the resident set it added.
//!
//! The session files are written directly (header and commit line, as
//! the store writes them): a million creates through the store would
//! take minutes and measure creation, not listing. They go to a temporary
//! directory, removed at the end.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::hint::black_box;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lease_port::SessionId;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, ListCursor, SessionStore};

const PAGE: usize = 1000;

/// The two store sizes: small and large. Criterion measures only when
/// `--bench` is among the arguments (`cargo bench`); otherwise it runs
/// each bench once as a test.
fn sizes() -> (usize, usize) {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (small, large) = if measuring {
        (10_000, 1_000_000)
    } else {
        (1_000, 10_000)
    };
    let large = std::env::var("SESSION_STORE_BENCH_LARGE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(large);
    (small, large)
}

/// The process's resident set now, in KiB, from `/proc/self/status`.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn id(i: usize) -> SessionId {
    SessionId::new(format!("session-{i:07}")).expect("id")
}

/// Writes `n` valid session files into `dir`, as `create` leaves them.
fn fill(dir: &Path, n: usize) {
    for i in 0..n {
        let session = id(i);
        let header = format!(
            "{{\"t\":\"h\",\"v\":2,\"id\":{},\"ts\":1}}\n",
            serde_json::to_string(session.as_str()).expect("json")
        );
        let crc = crc32fast::hash(header.as_bytes());
        let commit = format!(
            "{{\"t\":\"c\",\"n\":1,\"len\":{},\"crc\":{crc}}}\n",
            header.len()
        );
        let name = format!("{}.jsonl", session_filename::stem(&session));
        let mut f = std::fs::File::create(dir.join(name)).expect("session file");
        f.write_all(format!("{header}{commit}").as_bytes())
            .expect("write");
    }
}

/// An instance's first page: printed, with the memory it took.
fn first_page(store: &JsonlStore, n: usize, what: &str, rt: &tokio::runtime::Runtime) {
    let before = rss_kib();
    let start = Instant::now();
    rt.block_on(store.list_page(None, PAGE)).expect("page");
    println!(
        "session-store/list-first-page-{n}: {what}: {:.3} s, resident set +{} KiB",
        start.elapsed().as_secs_f64(),
        rss_kib().saturating_sub(before)
    );
}

/// A store of `n` sessions whose index was built (by an instance that
/// then walked it once, checking every file) and which is opened by an
/// instance that has not seen them, as a server started afterwards.
fn store_of(n: usize, rt: &tokio::runtime::Runtime) -> (tempfile::TempDir, JsonlStore, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let start = Instant::now();
    fill(dir.path(), n);
    println!(
        "session-store/list: wrote {n} session files in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let opts = JsonlOptions::default().fsync(FsyncPolicy::Never);
    let builder = JsonlStore::open(dir.path(), opts.clone()).expect("store");
    first_page(&builder, n, "building the index", rt);
    let checking = walk(&builder, n, "checking each file", rt);
    drop(builder);
    let store = JsonlStore::open(dir.path(), opts).expect("store");
    first_page(&store, n, "reading the index", rt);
    (dir, store, checking)
}

fn listing(c: &mut Criterion) {
    let (small_n, large_n) = sizes();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (_small_dir, small, small_check) = store_of(small_n, &rt);
    let (large_dir, large, large_check) = store_of(large_n, &rt);

    let mut g = c.benchmark_group("session-store/list-page-1m-vs-10k");
    g.sample_size(20);
    for (name, store, n) in [("ours", &large, large_n), ("limit", &small, small_n)] {
        let mut k = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                // Cursors spread over the store.
                k = (k + 7919) % n;
                let after = ListCursor::after(id(k));
                let page = rt
                    .block_on(store.list_page(Some(&after), PAGE))
                    .expect("page");
                black_box(page)
            })
        });
    }
    g.finish();
    let per = |secs: f64, n: usize| secs * 1e6 / n as f64;
    let small_walk = walk(&small, small_n, "reading the index", &rt);
    let large_walk = walk(&large, large_n, "reading the index", &rt);
    for (what, s, l) in [
        ("checking each file", small_check, large_check),
        ("reading the index", small_walk, large_walk),
    ] {
        println!(
            "session-store/list-walk ({what}): per session {:.2} µs at {small_n}, {:.2} µs at {large_n}: {:.2}×",
            per(s, small_n),
            per(l, large_n),
            per(l, large_n) / per(s, small_n)
        );
    }
    drop(large);
    let start = Instant::now();
    drop(large_dir);
    println!(
        "session-store/list: removed the large store in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

/// Lists every session in pages of [`PAGE`], cursor to cursor: what a
/// client pays to list the whole store. Timed once and printed, in
/// seconds.
fn walk(store: &JsonlStore, sessions: usize, what: &str, rt: &tokio::runtime::Runtime) -> f64 {
    let start = Instant::now();
    let mut after: Option<ListCursor> = None;
    let (mut n, mut pages) = (0, 0);
    loop {
        let page = rt
            .block_on(store.list_page(after.as_ref(), PAGE))
            .expect("page");
        n += page.sessions.len();
        pages += 1;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(n, sessions);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "session-store/list-walk-{sessions} ({what}): all {sessions} sessions in {pages} pages of {PAGE}: {secs:.2} s"
    );
    secs
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = listing
}
criterion_main!(benches);
