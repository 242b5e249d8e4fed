//! A write whose caller gave up — its future dropped while the statement
//! waited for the session's row lock — is cancelled on the server, never
//! committed later: left alone it would land when the lock frees, perhaps
//! after the session's next owner had begun.

use std::time::Duration;

use serde_json::json;
use session_store::SessionStore;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_append_is_cancelled_not_committed_later() {
    let server = server();
    let url = server.url();
    let store = builder(&url)
        .request_timeout(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let s = session("abandoned");
    store.create(&s).await.unwrap();
    store.append(&s, fence(1, "a"), &[json!(1)]).await.unwrap();

    // Another transaction holds the session's row, as a slow writer would.
    let (raw, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    raw.batch_execute(
        "BEGIN; SELECT 1 FROM mecatl_sessions WHERE session_id = 'abandoned' FOR UPDATE",
    )
    .await
    .unwrap();
    let events = [json!("late")];
    let mut late = Box::pin(store.append(&s, fence(1, "a"), &events));
    // Until the append waits for the lock, then its caller gives up.
    let patience = tokio::time::Instant::now() + Duration::from_secs(30);
    while waiting_on_locks(&server) == 0 {
        assert!(
            tokio::time::Instant::now() < patience,
            "the append never waited for the lock"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut late)
                .await
                .is_err(),
            "the append did not wait for the row"
        );
    }
    drop(late);
    // The cancel reaches the server: nothing waits for the lock any more.
    while waiting_on_locks(&server) > 0 {
        assert!(
            tokio::time::Instant::now() < patience,
            "the dropped append was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    raw.batch_execute("COMMIT").await.unwrap();
    store
        .append(&s, fence(2, "b"), &[json!("next owner")])
        .await
        .unwrap();

    let page = store.read(&s, 1, 10).await.unwrap();
    let payloads: Vec<_> = page.events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(
        payloads,
        [json!(1), json!("next owner")],
        "the abandoned append landed"
    );
}
