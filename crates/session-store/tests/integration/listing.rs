//! Paged listing of the JSONL store: pages in id order, cursors that
//! survive concurrent creation and deletion, deleted sessions left out,
//! bad input refused.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lease_port::{FencingToken, OwnerId, SessionId};
use session_store::{
    FsyncPolicy, JsonlOptions, JsonlStore, ListCursor, MAX_LIST_LIMIT, SessionStore,
    StoreErrorKind, WriteFence,
};

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn fence() -> WriteFence {
    WriteFence::new(FencingToken::new(1), OwnerId::new("lister").unwrap())
}

fn open(dir: &std::path::Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

/// Every page of the listing, `limit` sessions at a time.
async fn walk(store: &dyn SessionStore, limit: usize) -> Vec<Vec<SessionId>> {
    let mut pages = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let page = store.list_page(after.as_ref(), limit).await.unwrap();
        assert!(page.sessions.len() <= limit);
        let done = page.next.is_none();
        if let Some(next) = &page.next {
            assert_eq!(Some(next.last()), page.sessions.last());
            // The cursor travels as text.
            after = Some(ListCursor::decode(&next.encode()).unwrap());
        }
        pages.push(page.sessions);
        if done {
            return pages;
        }
    }
}

#[tokio::test]
async fn pages_hold_every_live_session_once_in_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // Plain names, names needing escapes, and ids long enough to be hashed
    // into their file names (so their ids come from the files' headers).
    let mut ids: Vec<SessionId> = (0..23).map(|i| sid(&format!("s-{i:02}"))).collect();
    ids.push(sid("Upper Case/é"));
    ids.push(sid(&format!("long-{}", "x".repeat(200))));
    ids.push(sid(&format!("a-long-{}", "y".repeat(200))));
    for id in &ids {
        store.create(id).await.unwrap();
    }
    // Deleted sessions keep their files but are not listed.
    for gone in ["s-03", "s-04", "s-05", "s-06", "s-07", "s-08", "s-09"] {
        store.delete(&sid(gone), fence()).await.unwrap();
        ids.retain(|i| i.as_str() != gone);
    }
    ids.sort();
    for limit in [1, 2, 3, 5, 19, ids.len(), ids.len() + 1, MAX_LIST_LIMIT] {
        let pages = walk(&store, limit).await;
        let flat: Vec<SessionId> = pages.concat();
        assert_eq!(flat, ids, "limit {limit}");
        // Full pages until the last; a listing that fits one page says so.
        for page in &pages[..pages.len() - 1] {
            assert_eq!(page.len(), limit);
        }
        assert!(!pages.last().unwrap().is_empty() || ids.is_empty());
    }
    assert_eq!(store.list().await.unwrap(), ids);
    // Another store instance (another process) agrees without any state.
    assert_eq!(walk(&open(dir.path()), 4).await.concat(), ids);
}

#[tokio::test]
async fn a_run_of_deleted_sessions_longer_than_a_page_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for i in 0..40 {
        store.create(&sid(&format!("d-{i:02}"))).await.unwrap();
    }
    for i in 0..37 {
        store
            .delete(&sid(&format!("d-{i:02}")), fence())
            .await
            .unwrap();
    }
    let first = store.list_page(None, 2).await.unwrap();
    assert_eq!(first.sessions, vec![sid("d-37"), sid("d-38")]);
    let rest = store.list_page(first.next.as_ref(), 2).await.unwrap();
    assert_eq!(rest.sessions, vec![sid("d-39")]);
    assert!(rest.next.is_none());
}

#[tokio::test]
async fn sessions_present_throughout_are_listed_once_while_others_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    // Stable sessions every third id; the churn takes the ids between, so
    // creations and deletions land before, inside and after every page.
    let stable: BTreeSet<SessionId> = (0..300)
        .step_by(3)
        .map(|i| sid(&format!("k-{i:03}")))
        .collect();
    for id in &stable {
        store.create(id).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        // Another store instance on the directory: another process.
        let other = open(dir.path());
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in (0u64..300).filter(|i| !i.is_multiple_of(3)) {
                    let id = sid(&format!("k-{i:03}"));
                    if (i + round).is_multiple_of(2) {
                        let _ = other.create(&id).await;
                    } else {
                        // Every delete raises its own mark: fences only rise.
                        let f = WriteFence::new(
                            FencingToken::new(round + 1),
                            OwnerId::new("churn").unwrap(),
                        );
                        let _ = other.delete(&id, f).await;
                    }
                }
                round += 1;
                tokio::task::yield_now().await;
            }
            round
        })
    };
    for limit in [1, 4, 7, 50] {
        for _ in 0..3 {
            let flat = walk(&*store, limit).await.concat();
            assert!(
                flat.windows(2).all(|w| w[0] < w[1]),
                "limit {limit}: out of order or repeated"
            );
            let seen: BTreeSet<SessionId> = flat.iter().cloned().collect();
            let missing: Vec<_> = stable.difference(&seen).collect();
            assert!(missing.is_empty(), "limit {limit}: {missing:?} missing");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.await.unwrap();
    assert!(rounds > 0, "the churn ran while the listings did");
}

#[tokio::test]
async fn limits_out_of_bounds_and_foreign_cursors_are_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create(&sid("a")).await.unwrap();
    for limit in [0, MAX_LIST_LIMIT + 1, usize::MAX] {
        let e = store.list_page(None, limit).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Invalid, "limit {limit}");
    }
    for text in ["", "a", "s1.zz", "s1.0a", "s9.61"] {
        let e = ListCursor::decode(text).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Invalid, "{text:?}");
    }
    // A cursor past every session: an empty last page.
    let page = store
        .list_page(Some(&ListCursor::after(sid("zzz"))), 10)
        .await
        .unwrap();
    assert!(page.sessions.is_empty() && page.next.is_none());
}
