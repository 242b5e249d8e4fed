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
