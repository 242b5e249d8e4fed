//! Followers: waiters woken by `NOTIFY` over one `LISTEN` connection per
//! store, and the fallback to polling where notifications do not arrive
//! (PgBouncer in transaction mode, `listen(false)`, the server away).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_session_store::{PgStore, SAFETY_READ};
use serde_json::json;
use session_store::{SessionStore, StoreErrorKind};
use test_services::PgBouncer;

use crate::support::{builder, fence, scalar, server, session, store};

const FOREVER: Duration = Duration::from_secs(3600);

/// How soon after an append a waiter woken by its notification wakes, at
/// most: a waiter parked 300 ms after a read would be woken by its next
/// safety read (every [`SAFETY_READ`], 1 s) 700 ms after the append.
const NOTIFIED: Duration = Duration::from_millis(550);

/// Waits (reading the flag) until the store says notifications arrive, or
/// gives up after `within`.
async fn arriving(store: &PgStore, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if store.notifications_arrive() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.notifications_arrive()
}

/// Parks a waiter on `after`, appends one event 300 ms later through
/// `writer`, and answers how long after the append the waiter woke.
async fn wake_latency(
    reader: &PgStore,
    writer: &PgStore,
    s: &lease_port::SessionId,
    after: u64,
) -> Duration {
    let waiting = tokio::spawn({
        let (reader, s) = (reader.clone(), s.clone());
        async move { reader.wait_for_append(&s, after, FOREVER).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");
    writer
        .append(s, fence(1, "w"), &[json!(after)])
        .await
        .unwrap();
    let appended = Instant::now();
    let woke = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter did not wake")
        .unwrap()
        .unwrap();
    assert!(woke);
    appended.elapsed()
}

/// Directly connected, notifications arrive, and a waiter parked between
/// its reads wakes within a few milliseconds of the append — well before
/// its next safety read (1 s), every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_wake_waiters_at_once() {
    let server = server();
    let (reader, writer) = (store(&server.url()).await, store(&server.url()).await);
    let s = session("followed");
    writer.create(&s).await.unwrap();
    assert!(
        !reader.notifications_arrive(),
        "before any wait there is no listener"
    );
    assert!(!reader.wait_for_append(&s, 0, Duration::ZERO).await.unwrap());
    assert!(
        arriving(&reader, Duration::from_secs(10)).await,
        "notifications never arrived"
    );
    for after in 0..8 {
        let took = wake_latency(&reader, &writer, &s, after).await;
        assert!(
            took < NOTIFIED,
            "woken {took:?} after append {after}: not by the notification (safety read every \
             {SAFETY_READ:?})"
        );
    }
}

/// Two hundred waiters on twenty sessions share one `LISTEN` connection,
/// and each wakes on its own session's append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listen_connection_serves_every_waiter() {
    let server = server();
    let (reader, writer) = (store(&server.url()).await, store(&server.url()).await);
    let ids: Vec<_> = (0..20).map(|i| session(&format!("s{i}"))).collect();
    for s in &ids {
        writer.create(s).await.unwrap();
    }
    let mut waiters = Vec::new();
    for i in 0..200 {
        let (reader, s) = (reader.clone(), ids[i % 20].clone());
        waiters.push(tokio::spawn(async move {
            reader.wait_for_append(&s, 0, FOREVER).await
        }));
    }
    assert!(arriving(&reader, Duration::from_secs(10)).await);
    let listening = scalar(
        &server,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg-session-store listen'",
    );
    assert_eq!(
        listening.as_deref(),
        Some("1"),
        "one LISTEN connection for 200 waiters"
    );
    let all = scalar(
        &server,
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
         AND usename = 'mecatl'",
    )
    .and_then(|n| n.parse::<u32>().ok())
    .unwrap();
    assert!(
        all <= 2 * 4 + 1 + 2,
        "{all} connections for two stores and 200 waiters"
    );
    assert!(waiters.iter().all(|w| !w.is_finished()));
    let started = Instant::now();
    for s in &ids {
        writer.append(s, fence(1, "w"), &[json!(1)]).await.unwrap();
    }
    for w in waiters {
        assert!(w.await.unwrap().unwrap());
    }
    // How fast one wakes is `notifications_wake_waiters_at_once`'s to
    // judge; here, on a loaded machine, only that all do.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A deletion is notified too: a waiter learns at once that its session
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_wakes_its_waiters_at_once() {
    let server = server();
    let (reader, writer) = (store(&server.url()).await, store(&server.url()).await);
    let s = session("doomed");
    writer.create(&s).await.unwrap();
    assert!(!reader.wait_for_append(&s, 0, Duration::ZERO).await.unwrap());
    assert!(arriving(&reader, Duration::from_secs(10)).await);
    let waiting = tokio::spawn({
        let (reader, s) = (reader.clone(), s.clone());
        async move { reader.wait_for_append(&s, 0, FOREVER).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer.delete(&s, fence(1, "w")).await.unwrap();
    let deleted = Instant::now();
    let e = waiting.await.unwrap().unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::NotFound);
    assert!(deleted.elapsed() < NOTIFIED, "{:?}", deleted.elapsed());
}

/// Behind PgBouncer in transaction mode `LISTEN` is not carried: the
/// store finds its probes do not arrive and its waiters poll (still
/// woken, within the poll interval). Given a direct URL for
/// notifications, the same store behind the pooler is woken by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_waiters_poll_unless_given_a_direct_notify_url() {
    let server = server();
    let bouncer = PgBouncer::start(&server).expect("start PgBouncer");
    let writer = store(&bouncer.url()).await;
    let pooled = store(&bouncer.url()).await;
    let s = session("pooled");
    writer.create(&s).await.unwrap();
    assert!(!pooled.wait_for_append(&s, 0, Duration::ZERO).await.unwrap());
    assert!(
        !arriving(&pooled, Duration::from_secs(5)).await,
        "notifications arrived through a transaction pooler"
    );
    for after in 0..3 {
        let took = wake_latency(&pooled, &writer, &s, after).await;
        assert!(
            took < Duration::from_millis(1500),
            "polling woke it after {took:?}"
        );
    }

    let direct = builder(&bouncer.url())
        .notify_url(server.url())
        .connect()
        .await
        .unwrap();
    assert!(!direct.wait_for_append(&s, 3, Duration::ZERO).await.unwrap());
    assert!(
        arriving(&direct, Duration::from_secs(10)).await,
        "notifications on the direct URL never arrived"
    );
    for after in 3..6 {
        let took = wake_latency(&direct, &writer, &s, after).await;
        assert!(took < NOTIFIED, "woken after {took:?}");
    }
}

/// `listen(false)`: no listener, waiters poll at the poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listening_waiters_poll() {
    let server = server();
    let writer = store(&server.url()).await;
    let polling = builder(&server.url())
        .listen(false)
        .poll_interval(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let s = session("polled");
    writer.create(&s).await.unwrap();
    let took = wake_latency(&polling, &writer, &s, 0).await;
    assert!(took < Duration::from_millis(1000), "{took:?}");
    assert!(!polling.notifications_arrive());
    let listening = scalar(
        &server,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg-session-store listen'",
    );
    assert_eq!(listening.as_deref(), Some("0"));
}

/// The server restarts under a parked waiter: the wait goes on (reads
/// failing meanwhile are retried), the listener listens again, and the
/// waiter wakes on the next append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_comes_back_after_a_server_restart() {
    let mut server = server();
    let (reader, writer) = (
        Arc::new(store(&server.url()).await),
        store(&server.url()).await,
    );
    let s = session("restarted");
    writer.create(&s).await.unwrap();
    assert!(!reader.wait_for_append(&s, 0, Duration::ZERO).await.unwrap());
    assert!(arriving(&reader, Duration::from_secs(10)).await);
    let waiting = tokio::spawn({
        let (reader, s) = (Arc::clone(&reader), s.clone());
        async move { reader.wait_for_append(&s, 0, FOREVER).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| server.restart().expect("restart PostgreSQL"));
    assert!(
        arriving(&reader, Duration::from_secs(15)).await,
        "the listener did not listen again"
    );
    assert!(!waiting.is_finished());
    writer.append(&s, fence(1, "w"), &[json!(1)]).await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter did not wake after the restart")
        .unwrap()
        .unwrap();
    assert!(woke);
}
