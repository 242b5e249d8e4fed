//! Failures the integration tests cannot cause: a failing `fdatasync`.

use std::sync::atomic::Ordering;

use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::json;

use super::{FsyncPolicy, JsonlOptions, JsonlStore};
use crate::{SessionStore, StoreErrorKind, WriteFence};

/// Token `t` of its one holder (each token here has exactly one).
fn tok(t: u64) -> WriteFence {
    WriteFence::new(
        FencingToken::new(t),
        OwnerId::new(format!("holder-of-{t}")).unwrap(),
    )
}

async fn seqs(store: &JsonlStore, s: &SessionId) -> Vec<(u64, serde_json::Value)> {
    let page = store.read(s, 1, 100).await.unwrap();
    page.events
        .into_iter()
        .map(|e| (e.seq, e.payload))
        .collect()
}

/// A failed sync after a complete write: the write is reported failed,
/// so it must not appear, and the next one must take its place — with
/// and without cross-process refreshes of the index.
#[tokio::test]
async fn a_write_whose_sync_failed_is_cut_back_and_never_appears() {
    for cross_process in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let opts = JsonlOptions::default()
            .fsync(FsyncPolicy::Always)
            .cross_process(cross_process);
        let store = JsonlStore::open(dir.path(), opts).unwrap();
        let s = SessionId::new("s").unwrap();
        store.create(&s).await.unwrap();
        store.append(&s, tok(1), &[json!(1)]).await.unwrap();
        let fail_next_sync = || store.core.fail_syncs.store(1, Ordering::Relaxed);

        // Append.
        fail_next_sync();
        let err = store
            .append(&s, tok(2), &[json!("lost"), json!("lost too")])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Io);
        let r = store.append(&s, tok(1), &[json!(2)]).await.unwrap();
        assert_eq!((r.first_seq, r.last_seq), (2, 2));
        // The failed write's token did not raise the high-water token.
        assert_eq!(
            store.high_water(&s).await.unwrap(),
            Some(FencingToken::new(1))
        );

        // Delete.
        fail_next_sync();
        let err = store.delete(&s, tok(1)).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Io);
        store.append(&s, tok(1), &[json!(3)]).await.unwrap();
        let want = vec![(1, json!(1)), (2, json!(2)), (3, json!(3))];
        assert_eq!(seqs(&store, &s).await, want);

        // Re-creating a deleted session.
        store.delete(&s, tok(1)).await.unwrap();
        fail_next_sync();
        let err = store.create(&s).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Io);
        assert_eq!(
            store.read(&s, 1, 1).await.unwrap_err().kind(),
            StoreErrorKind::NotFound
        );
        store.create(&s).await.unwrap();
        let r = store.append(&s, tok(1), &[json!(4)]).await.unwrap();
        assert_eq!(r.first_seq, 4);

        // Another store reading the file sees exactly what succeeded.
        let fresh = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
        assert_eq!(seqs(&fresh, &s).await, vec![(4, json!(4))]);
        let text = std::fs::read_to_string(store.path_of(&s)).unwrap();
        assert!(!text.contains("lost"), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.contains("\"t\":\"h\"")).count(),
            2
        );
        assert_eq!(
            text.lines().filter(|l| l.contains("\"t\":\"d\"")).count(),
            1
        );
    }
}

/// What one append showed under `policy`, on a current-thread runtime
/// (whose only worker is the calling thread): whether every `fdatasync`
/// ran on another thread (the blocking pool), and whether the event was
/// durable when the append returned — the durable image the crash model
/// builds from the logged operations holds it, and a fresh store reading
/// the file finds it.
fn observe(policy: FsyncPolicy) -> (bool, bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let worker = std::thread::current().id();
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::open(dir.path(), JsonlOptions::default().fsync(policy)).unwrap();
    let s = SessionId::new("durable").unwrap();
    rt.block_on(store.create(&s)).unwrap();
    rt.block_on(store.append(&s, tok(4), &[json!("kept")]))
        .unwrap();
    let ops = super::crash_sim::tests::ops(&store.path_of(&s));
    let syncs: Vec<_> = ops
        .iter()
        .filter_map(|op| match op {
            super::crash_sim::Op::Sync(thread) => Some(*thread),
            _ => None,
        })
        .collect();
    let off_worker = !syncs.is_empty() && syncs.iter().all(|t| *t != worker);
    let states = super::crash_sim::tests::states_since_sync(&ops);
    let durable = String::from_utf8_lossy(&states[0]).into_owned();
    let fresh = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    let page = rt.block_on(fresh.read(&s, 1, 10)).unwrap();
    let read_back = page.events.len() == 1 && page.events[0].payload == json!("kept");
    (off_worker, read_back && durable.contains("\"kept\""))
}

/// `Always`: the sync runs on the blocking pool, never on the async
/// worker, and the write is durable before the call returns. The same
/// observation tells the broken variants apart: `Interval` syncs inline on
/// the worker, `Never` leaves the write in the page cache only.
#[test]
fn fsync_always_runs_off_the_executor_and_persists() {
    assert_eq!(observe(FsyncPolicy::Always), (true, true));
    assert_eq!(
        observe(FsyncPolicy::Interval(std::time::Duration::ZERO)),
        (false, true)
    );
    assert!(!observe(FsyncPolicy::Never).1);
}

/// A run's cancel watch (one per run a process holds) reads the session's
/// cancel requests once, then waits on the directory's watch: ten waiters
/// idle for six seconds read ten times, not once more each per safety
/// read. A request still wakes its waiter at once.
#[cfg(feature = "cancel-requests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_cancel_waiters_read_once_and_wake_on_a_request() {
    use std::time::Duration;
    const WAITERS: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::open(dir.path(), JsonlOptions::default()).unwrap();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let s = SessionId::new(format!("held-{i}")).unwrap();
        store.create(&s).await.unwrap();
        let store = store.clone();
        waiters.push(tokio::spawn(async move {
            store
                .wait_for_cancel_request(&s, 0, Duration::from_secs(60))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let reads = store.core.cancel_reads.load(Ordering::Relaxed);
    // Reading again at each 5 s safety read would be 20.
    assert!(
        reads < 2 * WAITERS,
        "{reads} reads by {WAITERS} idle waiters"
    );
    let first = SessionId::new("held-0").unwrap();
    store
        .request_cancel(&first, FencingToken::new(3))
        .await
        .unwrap();
    let found = tokio::time::timeout(Duration::from_secs(60), waiters.remove(0))
        .await
        .expect("woken by the request")
        .unwrap()
        .unwrap();
    assert_eq!(found.map(|r| r.run), Some(FencingToken::new(3)));
    for w in waiters {
        w.abort();
    }
}
