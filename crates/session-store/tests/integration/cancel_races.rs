//! The JSONL store's cancel requests made at once by several processes
//! (replicas answering cancels for one session): the token never goes
//! down and no request goes uncounted.

use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

fn open(dir: &std::path::Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

/// The contract of `request_cancel`: the recorded token only rises, and
/// every request for the recorded token or a later one is counted. Here
/// replicas record requests for a run (token 5) and for the run after it
/// (token 6) at the same time; afterwards the record must name run 6 and
/// count each of its requests, or run 6 is never stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_cancel_requests_never_lower_the_token_or_lose_a_count() {
    const ROUNDS: usize = 300;
    const EACH: u64 = 4;
    let dir = tempfile::tempdir().unwrap();
    let replicas: Vec<JsonlStore> = (0..4).map(|_| open(dir.path())).collect();
    let writer = WriteFence::new(FencingToken::new(1), OwnerId::new("writer").unwrap());
    let (mut lowered, mut uncounted) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let s = SessionId::new(format!("race-{round}")).unwrap();
        replicas[0].create(&s).await.unwrap();
        replicas[0]
            .append(&s, writer.clone(), &[json!("x")])
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..2 * EACH {
            let (store, s) = (replicas[i as usize % 4].clone(), s.clone());
            // Interleaved: the earlier run's requests and the later run's.
            let token = FencingToken::new(5 + i % 2);
            tasks.push(tokio::spawn(async move {
                store.request_cancel(&s, token).await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let recorded = replicas[0].cancel_request(&s).await.unwrap().unwrap();
        if recorded.run != FencingToken::new(6) {
            lowered.push((round, recorded));
        } else if recorded.serial < EACH {
            uncounted.push((round, recorded));
        }
    }
    assert!(
        lowered.is_empty() && uncounted.is_empty(),
        "of {ROUNDS} rounds, {} ended naming the earlier run (first: {:?}) and {} lost \
         requests for the later one (first: {:?})",
        lowered.len(),
        lowered.first(),
        uncounted.len(),
        uncounted.first()
    );
}
