//! Paged listing of the JSONL store, where it promises more than the
//! trait: pages are full until the last, however many deleted sessions
//! (whose files stay) lie between the live ones, and ids hashed into their
//! file names are read from the files' headers. Pages in id order, cursors
//! surviving concurrent creation and deletion and bad limits are the
//! `storeconformance` suite's (`conformance`).

use lease_port::{FencingToken, OwnerId, SessionId};
use session_store::{
    FsyncPolicy, JsonlOptions, JsonlStore, ListCursor, MAX_LIST_LIMIT, SessionStore, WriteFence,
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
async fn pages_are_full_until_the_last_past_deleted_and_hashed_ids() {
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
