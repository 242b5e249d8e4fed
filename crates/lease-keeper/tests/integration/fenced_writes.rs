//! What an adopter builds on: the fence a guard hands out, writes that
//! outlive a dropped caller, and a configuration checked against what the
//! backend grants. Against memlease and a real `JsonlStore`.

use std::sync::Arc;
use std::time::Duration;

use lease_keeper::{KeeperErrorKind, LeaseKeeper};
use lease_port::{OwnerId, SessionId, WriteFence};
use memlease::MemLease;
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, StoreErrorKind};
use tokio::sync::oneshot;

const TTL: Duration = Duration::from_secs(30);

fn store() -> (tempfile::TempDir, Arc<JsonlStore>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = JsonlOptions::default().fsync(FsyncPolicy::Never);
    let store = Arc::new(JsonlStore::open(dir.path(), opts).unwrap());
    (dir, store)
}

fn id(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

#[tokio::test]
async fn the_fence_names_the_token_and_a_writer_unique_to_the_keeper() {
    let backend = Arc::new(MemLease::new(TTL));
    let owner = OwnerId::new("pod-7").unwrap();
    let a = LeaseKeeper::new(backend.clone(), owner.clone(), TTL).unwrap();
    // The same owner id restarted: another writer.
    let again = LeaseKeeper::new(backend, owner.clone(), TTL).unwrap();
    assert_ne!(a.writer(), again.writer());
    assert!(a.writer().as_str().starts_with("pod-7#"), "{}", a.writer());

    let run = a.acquire(&id("s")).await.unwrap();
    match run.fence() {
        WriteFence::Fenced(f) => {
            assert_eq!(Some(f.token()), run.token());
            assert_eq!(f.owner(), a.writer());
        }
        WriteFence::Unfenced => panic!("a leased run handed out no fence"),
    }
    run.finish().await.unwrap();
}

#[tokio::test]
async fn a_spawned_write_outlives_its_dropped_caller_and_the_release_waits_for_it() {
    let (_dir, store) = store();
    let session = id("chat");
    store.create(&session).await.unwrap();
    let backend = MemLease::new(TTL);
    let keeper =
        LeaseKeeper::new(Arc::new(backend.clone()), OwnerId::new("a").unwrap(), TTL).unwrap();
    let run = keeper.acquire(&session).await.unwrap();

    let (go, wait) = oneshot::channel::<()>();
    let (s, sid) = (Arc::clone(&store), session.clone());
    let write = run
        .spawn_write(move |fence| async move {
            let _ = wait.await;
            s.append(&sid, fence, &[json!({"n": 1})]).await
        })
        .unwrap();
    drop(write); // the caller went away: the write goes on

    let finish = tokio::spawn(run.finish());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !finish.is_finished(),
        "released while a write was in flight"
    );
    let other = OwnerId::new("b").unwrap();
    let err = lease_port::SessionLease::acquire(&backend, &session, &other)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), lease_port::LeaseErrorKind::Held);

    go.send(()).unwrap();
    finish.await.unwrap().unwrap();
    let page = store.read(&session, 1, 10).await.unwrap();
    assert_eq!(page.events.len(), 1, "the dropped caller's write was lost");
}

#[tokio::test]
async fn a_write_is_not_started_once_the_run_has_begun_to_end() {
    let keeper = LeaseKeeper::new(
        Arc::new(MemLease::new(TTL)),
        OwnerId::new("a").unwrap(),
        TTL,
    )
    .unwrap();
    let run = keeper.acquire(&id("s")).await.unwrap();
    let gate = run.write_gate();
    run.finish().await.unwrap();
    assert_eq!(gate.begin().unwrap_err().kind(), KeeperErrorKind::RunEnded);
}

#[tokio::test]
async fn a_late_write_of_a_taken_over_run_is_fenced_by_the_store() {
    let (_dir, store) = store();
    let session = id("chat");
    store.create(&session).await.unwrap();
    let backend = MemLease::new(TTL);
    let a = LeaseKeeper::new(Arc::new(backend.clone()), OwnerId::new("a").unwrap(), TTL).unwrap();
    let b = LeaseKeeper::new(Arc::new(backend), OwnerId::new("b").unwrap(), TTL).unwrap();
    let run = a.acquire(&session).await.unwrap();
    let late = run.fence();
    run.finish().await.unwrap();
    let taken = b.acquire(&session).await.unwrap();
    store
        .append(&session, taken.fence(), &[json!({"from": "b"})])
        .await
        .unwrap();
    let err = store
        .append(&session, late, &[json!({"from": "a"})])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Fenced);
    taken.finish().await.unwrap();
}

#[test]
fn a_keeper_counting_on_longer_leases_than_the_backend_grants_is_refused() {
    let backend = Arc::new(MemLease::new(Duration::from_secs(10)));
    let err = LeaseKeeper::new(backend.clone(), OwnerId::new("a").unwrap(), TTL).unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Invalid);
    assert!(err.to_string().contains("10s"), "{err}");
    // Equal or shorter is what the keeper may count on.
    LeaseKeeper::new(
        backend.clone(),
        OwnerId::new("a").unwrap(),
        Duration::from_secs(10),
    )
    .unwrap();
    LeaseKeeper::new(backend, OwnerId::new("a").unwrap(), Duration::from_secs(5)).unwrap();
}

#[tokio::test]
async fn an_error_says_its_cause_and_when_to_retry() {
    let backend = Arc::new(MemLease::new(TTL));
    let a = LeaseKeeper::new(backend.clone(), OwnerId::new("a").unwrap(), TTL).unwrap();
    let b = LeaseKeeper::new(backend, OwnerId::new("b").unwrap(), TTL).unwrap();
    let run = a.acquire(&id("s")).await.unwrap();
    let err = b.acquire(&id("s")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::LeasedElsewhere);
    let text = err.to_string();
    assert!(text.contains("held by a"), "the cause is missing: {text}");
    let after = err
        .retry_after()
        .expect("a refused acquire says when to retry");
    assert!(
        after <= TTL && after > TTL - Duration::from_secs(5),
        "{after:?}"
    );
    run.finish().await.unwrap();
}
