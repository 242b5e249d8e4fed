//! Waiting for appends and cancel requests on the JSONL store, with the
//! writer on another store instance (its own files and locks, as another
//! process has).

use std::time::Duration;

use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::json;
use session_store::{
    CancelRequest, FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, StoreErrorKind, WriteFence,
};

fn open(dir: &std::path::Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

fn fence(token: u64) -> WriteFence {
    WriteFence::new(FencingToken::new(token), OwnerId::new("writer").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_when_another_instance_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = (open(dir.path()), open(dir.path()));
    let s = SessionId::new("watched").unwrap();
    writer.create(&s).await.unwrap();
    writer.append(&s, fence(1), &[json!(1)]).await.unwrap();

    // Already there: answered at once.
    assert!(
        reader
            .wait_for_append(&s, 0, Duration::from_secs(30))
            .await
            .unwrap()
    );

    // Not yet there: the waiter is parked until the other instance writes.
    // The timeout is far beyond the test's patience, so only the watch can
    // end the wait.
    let waiting = tokio::spawn({
        let (reader, s) = (reader.clone(), s.clone());
        async move {
            reader
                .wait_for_append(&s, 1, Duration::from_secs(3600))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "woke before anything was appended");
    writer.append(&s, fence(1), &[json!(2)]).await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the append never woke the waiter")
        .unwrap()
        .unwrap();
    assert!(woke);
}

#[tokio::test]
async fn a_wait_with_nothing_appended_times_out_false() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = SessionId::new("quiet").unwrap();
    store.create(&s).await.unwrap();
    assert!(
        !store
            .wait_for_append(&s, 0, Duration::from_millis(50))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn waiting_on_a_missing_session_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = SessionId::new("absent").unwrap();
    let err = store
        .wait_for_append(&s, 0, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::NotFound);
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
