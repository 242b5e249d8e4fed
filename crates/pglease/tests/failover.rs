//! A failover to an asynchronous standby that had not received the last
//! commits, with real PostgreSQL processes: the clients that saw those
//! commits refuse (`Rewound`) instead of handing out again a token the
//! lost commits had superseded.

use std::time::Duration;

use lease_port::{LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use pglease::PgLease;
use test_services::{PostgresServer, PostgresStandby};

async fn client(url: &str) -> PgLease {
    PgLease::builder(url)
        .ttl(Duration::from_secs(120))
        .request_timeout(Duration::from_secs(5))
        .connections(1)
        .connect()
        .await
        .expect("connect")
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}
fn oid(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

/// Retries `call` while the database is away (the primary killed, the
/// standby not yet taking writes): the first answer of the new primary.
async fn first_answer<T, F, Fut>(mut call: F) -> Result<T, LeaseError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LeaseError>>,
{
    for _ in 0..200 {
        match call().await {
            Err(e) if e.kind() == LeaseErrorKind::Transient => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
    panic!("the promoted standby never answered");
}

fn assert_rewound<T: std::fmt::Debug>(what: &str, r: Result<T, LeaseError>) {
    let e = r.expect_err(what);
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{what}: {e}");
    assert!(
        e.message().to_lowercase().contains("stop every client"),
        "{what}: the message says what to do: {e}"
    );
}

/// a holds the session and renews it; the standby catches up and then
/// stops receiving. On the primary a's hold ends, b is granted a higher
/// token and renews, and a is told b holds the session — while the
/// primary keeps serving other traffic, so the standby falls behind by
/// more WAL than it writes after its promotion. The primary dies, the
/// standby is promoted, and the clients reach it through the same URL.
///
/// The promoted standby still shows a's grant, live. Without the log
/// position floor a would be granted its superseded token again and
/// renew it; b is caught by its token floor as well. A client started
/// after the loss sees a's grant and cannot tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_standby_that_lost_commits_is_refused() {
    let mut primary = PostgresServer::start().unwrap();
    let standby = tokio::task::block_in_place(|| PostgresStandby::start(&primary)).unwrap();
    let url = standby.failover_url(&primary);
    let a = client(&url).await;
    let b = client(&url).await;
    let s = sid("chat");
    let la = a.acquire(&s, &oid("a")).await.unwrap();
    let la = a.renew(&la).await.unwrap();
    tokio::task::block_in_place(|| standby.wait_for_replay(&primary)).unwrap();

    standby.pause_replication();
    a.release(&la).await.unwrap();
    let lb = b.acquire(&s, &oid("b")).await.unwrap();
    assert!(lb.token() > la.token());
    let lb = b.renew(&lb).await.unwrap();
    primary
        .query(
            "CREATE TABLE other_traffic AS
             SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 10000) g",
        )
        .unwrap();
    let held = a.acquire(&s, &oid("a")).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held, "{held}");

    tokio::task::block_in_place(|| {
        primary.kill();
        standby.promote()
    })
    .unwrap();
    let on_standby = standby
        .query("SELECT owner, token::text FROM mecatl_leases WHERE session_id = 'chat'")
        .unwrap();
    let shown = la.token().get().to_string();
    assert_eq!(
        on_standby,
        vec![vec![Some("a".to_owned()), Some(shown)]],
        "the standby lost b's grant"
    );

    let row = || {
        standby
            .query("SELECT owner, token::text, expires_at::text FROM mecatl_leases")
            .unwrap()
    };
    let before = row();
    assert_rewound(
        "a renews its old grant",
        first_answer(|| a.renew(&la)).await,
    );
    assert_rewound("a acquires again", a.acquire(&s, &oid("a")).await);
    assert_rewound("b renews", b.renew(&lb).await);
    assert_rewound("b acquires again", b.acquire(&s, &oid("b")).await);
    assert_rewound("a reads the holder", a.current(&s).await);
    // Refused in the statements themselves: nothing was written behind
    // what the clients saw (a renewal refused only after its commit would
    // have extended a's stale grant).
    assert_eq!(
        row(),
        before,
        "a refused statement wrote to the lease table"
    );

    let fresh = client(&standby.url()).await;
    let seen = fresh.current(&s).await.unwrap().expect("a's grant");
    assert_eq!(
        (seen.owner(), seen.token()),
        (&oid("a"), la.token()),
        "a client started after the loss sees the standby's state"
    );
}
