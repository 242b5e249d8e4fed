//! Cancel requests on the JSONL store, made through another store
//! instance (its own files and locks, as another process has). Waiting
//! for appends is the `storeconformance` suite's (`conformance`).

use lease_port::{FencingToken, SessionId};
use session_store::{
    CancelRequest, FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, StoreErrorKind,
};

fn open(dir: &std::path::Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

#[tokio::test]
async fn cancel_requests_are_seen_by_other_instances_and_only_rise() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, other) = (open(dir.path()), open(dir.path()));
    let s = SessionId::new("cancelled").unwrap();
    holder.create(&s).await.unwrap();
    assert_eq!(holder.cancel_request(&s).await.unwrap(), None);

    let request = |run, serial| {
        Some(CancelRequest {
            run: FencingToken::new(run),
            serial,
        })
    };
    other
        .request_cancel(&s, FencingToken::new(7))
        .await
        .unwrap();
    assert_eq!(holder.cancel_request(&s).await.unwrap(), request(7, 1));
    // Asked again: counted, so a run that began after the first request
    // (a holder re-acquiring its own lease keeps the token) sees it.
    other
        .request_cancel(&s, FencingToken::new(7))
        .await
        .unwrap();
    assert_eq!(holder.cancel_request(&s).await.unwrap(), request(7, 2));

    // A late request for an earlier run neither lowers the token nor
    // counts; a later run's raises it.
    other
        .request_cancel(&s, FencingToken::new(3))
        .await
        .unwrap();
    assert_eq!(holder.cancel_request(&s).await.unwrap(), request(7, 2));
    other
        .request_cancel(&s, FencingToken::new(9))
        .await
        .unwrap();
    assert_eq!(holder.cancel_request(&s).await.unwrap(), request(9, 3));

    // Not a session: listings do not show the requests' directory.
    assert_eq!(holder.list().await.unwrap(), vec![s.clone()]);
    let missing = SessionId::new("missing").unwrap();
    let err = other
        .request_cancel(&missing, FencingToken::new(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::NotFound);
}
