//! A failover to an asynchronous standby that had not received the last
//! appends, with real PostgreSQL processes: the store instances that saw
//! those appends refuse (`Rewound`) instead of accepting a write the lost
//! mark had fenced.

use std::time::Duration;

use serde_json::{Value, json};
use session_store::{SessionStore, StoreError, StoreErrorKind};
use test_services::PostgresStandby;

use crate::support::{builder, fence, server, session};

async fn instance(url: &str) -> pg_session_store::PgStore {
    builder(url)
        .listen(false)
        .connections(1)
        .connect()
        .await
        .expect("connect the store")
}

/// Retries `call` while the database is away (the primary killed, the
/// standby not yet taking writes; a write on a connection that broke is
/// `Io`): the first answer of the new primary.
async fn first_answer<T, F, Fut>(mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    for _ in 0..200 {
        match call().await {
            Err(e) if matches!(e.kind(), StoreErrorKind::Unavailable | StoreErrorKind::Io) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
    panic!("the promoted standby never answered");
}

fn assert_rewound<T: std::fmt::Debug>(what: &str, r: Result<T, StoreError>) {
    let e = r.expect_err(what);
    assert_eq!(e.kind(), StoreErrorKind::Rewound, "{what}: {e}");
    assert!(
        e.to_string().contains("Restore the newer data"),
        "{what}: the message says what to do: {e}"
    );
}

/// Writer a appends under token 1 and the standby catches up; then it
/// stops receiving. On the primary b takes over with token 2 and appends
/// ten batches, and a's instance reads the session (it saw b's mark). The
/// primary dies, the standby is promoted, and both instances reach it
/// through the same URL. The promoted standby holds a's one event under
/// mark 1: a's stale token would pass it. Both instances refuse every
/// write and read of the session. A store started after the loss cannot
/// tell, and accepts a's stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_standby_that_lost_appends_is_refused() {
    let mut primary = server();
    let standby = tokio::task::block_in_place(|| PostgresStandby::start(&primary)).unwrap();
    let url = standby.failover_url(&primary);
    let a = instance(&url).await;
    let b = instance(&url).await;
    let s = session("chat");
    a.create(&s).await.unwrap();
    a.append(&s, fence(1, "a"), &[json!("a1")]).await.unwrap();
    tokio::task::block_in_place(|| standby.wait_for_replay(&primary)).unwrap();

    standby.pause_replication();
    for i in 0..10 {
        b.append(&s, fence(2, "b"), &[json!(i), json!(i)])
            .await
            .unwrap();
    }
    let page = a.read(&s, 1, 100).await.unwrap();
    assert_eq!(page.events.len(), 21);
    let stale = a
        .append(&s, fence(1, "a"), &[json!("stale")])
        .await
        .unwrap_err();
    assert_eq!(stale.kind(), StoreErrorKind::Fenced, "{stale}");

    tokio::task::block_in_place(|| {
        primary.kill();
        standby.promote()
    })
    .unwrap();
    let on_standby = standby
        .query("SELECT last_seq::text, mark::text FROM mecatl_sessions WHERE session_id = 'chat'")
        .unwrap();
    assert_eq!(
        on_standby,
        vec![vec![Some("1".to_owned()), Some("1".to_owned())]],
        "the standby lost b's appends"
    );

    let late = [json!("late")];
    assert_rewound(
        "a writes under its stale token",
        first_answer(|| a.append(&s, fence(1, "a"), &late)).await,
    );
    assert_rewound(
        "b writes under its token",
        first_answer(|| b.append(&s, fence(2, "b"), &late)).await,
    );
    assert_rewound(
        "b writes under a's stale token",
        b.append(&s, fence(1, "a"), &late).await,
    );
    assert_rewound("a reads", a.read(&s, 1, 100).await.map(drop));
    assert_rewound("b reads the mark", b.high_water(&s).await);
    assert_rewound("b deletes", b.delete(&s, fence(2, "b")).await);

    let fresh = instance(&standby.url()).await;
    fresh
        .append(&s, fence(1, "a"), &late)
        .await
        .expect("a store started after the loss knows no newer mark");
    let events: Vec<Value> = fresh
        .read(&s, 1, 100)
        .await
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(events, vec![json!("a1"), json!("late")]);
}
