//! Paged listing of a JSONL store of 100,000 sessions.
//!
//! Groups (read by `cargo xtask bench`):
//! - `session-store/list-page-100k`: `ours` = one page of 100 sessions
//!   after a cursor somewhere in the store; `limit` = streaming the same
//!   directory's entries and nothing else (`readdir` to the end), which
//!   every page must do since the directory is not sorted. The ratio is
//!   what a page costs beyond the scan.
//!
//! Printed, timed once: `session-store/list-walk-100k`, every session in
//! pages of 1000 (the HTTP maximum), cursor to cursor: the total a client
//! pays to list the whole store (one directory scan per page).
//!
//! Memory: the bench prints how far the resident set rose while one page
//! was listed, and while `list` gathered every session, so the two can be
//! compared (coarse: the allocator keeps freed memory).

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use lease_port::SessionId;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, ListCursor, SessionStore};

const SESSIONS: usize = 100_000;
const PAGE: usize = 100;
const WALK_PAGE: usize = 1000;

/// The process's resident set now and at its peak, in KiB, from
/// `/proc/self/status`.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// How far the resident set rose above where it was while `f` ran, in
/// KiB. Writing 5 to `clear_refs` resets the peak (Linux 4.0 on).
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (before, _) = rss_kib();
    let r = f();
    let (_, peak) = rss_kib();
    (r, peak.saturating_sub(before))
}

fn id(i: usize) -> SessionId {
    SessionId::new(format!("session-{i:06}")).expect("id")
}

fn listing(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = || JsonlOptions::default().fsync(FsyncPolicy::Never);
    rt.block_on(async {
        let store = JsonlStore::open(dir.path(), opts()).expect("store");
        for i in 0..SESSIONS {
            store.create(&id(i)).await.expect("create");
        }
    });
    // A store instance that has not seen the sessions being created, as a
    // server started afterwards.
    let store = JsonlStore::open(dir.path(), opts()).expect("store");

    let (_, page_peak) = peak_during(|| {
        rt.block_on(store.list_page(Some(&ListCursor::after(id(SESSIONS / 2))), PAGE))
            .expect("page")
    });
    let (all, list_peak) = peak_during(|| rt.block_on(store.list()).expect("list"));
    assert_eq!(all.len(), SESSIONS);
    drop(all);
    println!(
        "session-store/list-100k memory: the resident set rose {page_peak} KiB listing one \
         page of {PAGE}, {list_peak} KiB listing all {SESSIONS} with list()"
    );

    let mut g = c.benchmark_group("session-store/list-page-100k");
    g.sample_size(20);
    let mut k = 0usize;
    g.bench_function("ours", |b| {
        b.iter(|| {
            // Cursors spread over the store, so pages open different files.
            k = (k + 7919) % SESSIONS;
            let after = ListCursor::after(id(k));
            let page = rt
                .block_on(store.list_page(Some(&after), PAGE))
                .expect("page");
            black_box(page)
        })
    });
    g.bench_function("limit", |b| {
        b.iter(|| {
            let entries = std::fs::read_dir(dir.path()).expect("read_dir");
            black_box(entries.filter(|e| e.is_ok()).count())
        })
    });
    g.finish();
    walk(&store, &rt);
}

/// Lists every session in pages of [`WALK_PAGE`], cursor to cursor: what a
/// client pays to list the whole store. Timed once and printed: with one
/// directory scan per page it takes seconds, too long for criterion's ten
/// samples at least.
fn walk(store: &JsonlStore, rt: &tokio::runtime::Runtime) {
    let start = std::time::Instant::now();
    let mut after: Option<ListCursor> = None;
    let (mut n, mut pages) = (0, 0);
    loop {
        let page = rt
            .block_on(store.list_page(after.as_ref(), WALK_PAGE))
            .expect("page");
        n += page.sessions.len();
        pages += 1;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(n, SESSIONS);
    println!(
        "session-store/list-walk-100k: all {SESSIONS} sessions in {pages} pages of {WALK_PAGE}: {:.2} s",
        start.elapsed().as_secs_f64()
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = listing
}
criterion_main!(benches);
