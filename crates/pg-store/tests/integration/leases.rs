//! The lease check of a store whose leases live in the same database
//! (`leases_in_same_database`): every fenced write also requires the
//! session's live lease row in pglease's table to hold the write's token
//! and name its owner, so a holder whose lease was taken over is refused
//! before the new owner writes anything.

use std::sync::Arc;
use std::time::Duration;

use lease_keeper::LeaseKeeper;
use lease_port::SessionLease;
use pg_session_store::PgStore;
use pglease::PgLease;
use serde_json::json;
use session_store::{SessionStore, StoreError, StoreErrorKind, WriteFence};
use test_services::{PgBouncer, PostgresServer};

use crate::support::{builder, fence, owner, server, session};

const TTL: Duration = Duration::from_millis(800);

async fn leases(url: &str) -> PgLease {
    PgLease::builder(url)
        .ttl(TTL)
        .connect()
        .await
        .expect("connect the leases")
}

/// A store checking the leases of pglease's default prefix.
async fn checked(url: &str) -> PgStore {
    builder(url)
        .leases_in_same_database("mecatl")
        .connect()
        .await
        .expect("connect the store")
}

/// Asserts a refusal by the lease check: `Fenced`, naming the lease
/// row's token and its live holder.
#[track_caller]
fn lease_refused<T: std::fmt::Debug>(
    step: &str,
    r: Result<T, StoreError>,
    token: u64,
    holder: Option<&str>,
) {
    match r {
        Err(StoreError::Fenced {
            high_water,
            high_water_owner,
            ..
        }) => {
            assert_eq!(
                high_water.get(),
                token,
                "{step}: the refusal names another token"
            );
            assert_eq!(
                high_water_owner.as_ref().map(|o| o.as_str()),
                holder,
                "{step}: the refusal names another holder"
            );
        }
        other => panic!("{step}: expected Fenced by the lease check, got {other:?}"),
    }
}

/// A holds the session and writes; its lease lapses and B takes it over.
/// Before B writes anything (the mark is still A's token) A is refused,
/// for appends and deletions; B writes, and A stays refused.
async fn a_taken_over_holder_is_refused_before_the_new_owner_writes(url: &str) {
    let leases = leases(url).await;
    let store = checked(url).await;
    let s = session("chat");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("host-a")).await.unwrap();
    let r = store
        .append(&s, WriteFence::from(&a), &[json!("a1")])
        .await
        .unwrap();
    assert_eq!((r.first_seq, r.last_seq), (1, 1));

    tokio::time::sleep(TTL + Duration::from_millis(300)).await;
    let b = leases.acquire(&s, &owner("host-b")).await.unwrap();
    assert!(b.token() > a.token());
    assert_eq!(
        store.high_water(&s).await.unwrap(),
        Some(a.token()),
        "B has not written: the mark is still A's"
    );
    let late = store
        .append(&s, WriteFence::from(&a), &[json!("late")])
        .await;
    lease_refused(
        "A appends after B took over",
        late,
        b.token().get(),
        Some("host-b"),
    );
    let late = store.delete(&s, WriteFence::from(&a)).await;
    lease_refused(
        "A deletes after B took over",
        late,
        b.token().get(),
        Some("host-b"),
    );
    // Another client of the store, as another process of A would be.
    let other = checked(url).await;
    let late = other
        .append(&s, WriteFence::from(&a), &[json!("late")])
        .await;
    lease_refused(
        "A appends through another client",
        late,
        b.token().get(),
        Some("host-b"),
    );

    let r = store
        .append(&s, WriteFence::from(&b), &[json!("b1")])
        .await
        .unwrap();
    assert_eq!(r.first_seq, 2, "refused writes used up sequence numbers");
    let late = store
        .append(&s, WriteFence::from(&a), &[json!("late")])
        .await;
    assert_eq!(late.unwrap_err().kind(), StoreErrorKind::Fenced);
    let page = store.read(&s, 1, 10).await.unwrap();
    let payloads: Vec<_> = page.events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, [json!("a1"), json!("b1")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_holder_is_refused_before_the_new_owner_writes_directly() {
    let server = server();
    a_taken_over_holder_is_refused_before_the_new_owner_writes(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_holder_is_refused_before_the_new_owner_writes_through_pgbouncer() {
    let server = server();
    let bouncer = PgBouncer::start(&server).expect("start PgBouncer");
    a_taken_over_holder_is_refused_before_the_new_owner_writes(&bouncer.url()).await;
}

/// Without the lease check the same stale holder writes, until the new
/// owner's first write raises the mark: what the check adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_check_a_taken_over_holder_writes_until_the_new_owner_does() {
    let server = server();
    let leases = leases(&server.url()).await;
    let store = builder(&server.url()).connect().await.unwrap();
    let s = session("chat");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("host-a")).await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(300)).await;
    let b = leases.acquire(&s, &owner("host-b")).await.unwrap();
    store
        .append(&s, WriteFence::from(&a), &[json!("stale but accepted")])
        .await
        .unwrap();
    store
        .append(&s, WriteFence::from(&b), &[json!("b")])
        .await
        .unwrap();
    let late = store
        .append(&s, WriteFence::from(&a), &[json!("late")])
        .await;
    assert_eq!(late.unwrap_err().kind(), StoreErrorKind::Fenced);
}

/// A lease that lapsed, or was released, fences its holder though nobody
/// took it; a renewal of the lapsed grant (nobody took it) or a new grant
/// lets the owner write again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_or_released_lease_fences_its_holder() {
    let server = server();
    let leases = leases(&server.url()).await;
    let store = checked(&server.url()).await;
    let s = session("chat");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("host-a")).await.unwrap();
    store
        .append(&s, WriteFence::from(&a), &[json!(1)])
        .await
        .unwrap();

    tokio::time::sleep(TTL + Duration::from_millis(300)).await;
    let lapsed = store.append(&s, WriteFence::from(&a), &[json!(2)]).await;
    lease_refused(
        "A writes after its lease lapsed",
        lapsed,
        a.token().get(),
        None,
    );
    let a = leases.renew(&a).await.expect("nobody took it: renewed");
    store
        .append(&s, WriteFence::from(&a), &[json!(3)])
        .await
        .unwrap();

    leases.release(&a).await.unwrap();
    let released = store.append(&s, WriteFence::from(&a), &[json!(4)]).await;
    lease_refused("A writes after releasing", released, a.token().get(), None);
    let again = leases.acquire(&s, &owner("host-a")).await.unwrap();
    assert!(again.token() > a.token());
    store
        .append(&s, WriteFence::from(&again), &[json!(5)])
        .await
        .unwrap();
    let page = store.read(&s, 1, 10).await.unwrap();
    let payloads: Vec<_> = page.events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, [json!(1), json!(3), json!(5)]);
}

/// The writer must be the lease's owner, or the owner followed by `#` and
/// an incarnation id; the token must be exactly the lease's. Refused
/// writes (a stranger, an owner whose id merely begins like the holder's,
/// a token above or below the lease's, a session never leased) write
/// nothing and do not move the mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_and_token_must_be_the_leases() {
    let server = server();
    let leases = leases(&server.url()).await;
    let store = checked(&server.url()).await;
    let s = session("chat");
    store.create(&s).await.unwrap();
    let held = leases.acquire(&s, &owner("host-a")).await.unwrap();
    let t = held.token().get();
    for (token, writer) in [
        (t, "host-b"),
        (t, "host-ab"),
        (t, "host"),
        (t, "host-a-#1"),
        (t + 1, "host-a"),
        (t - 1, "host-a"),
        (t + 1, "host-a#0123456789abcdef"),
    ] {
        let r = store.append(&s, fence(token, writer), &[json!("no")]).await;
        lease_refused(
            &format!("{writer} writes with token {token} under host-a's lease {t}"),
            r,
            t,
            Some("host-a"),
        );
    }
    assert_eq!(
        store.high_water(&s).await.unwrap(),
        None,
        "refusals moved the mark"
    );
    assert!(store.read(&s, 1, 10).await.unwrap().events.is_empty());

    for (i, writer) in ["host-a", "host-a#0123456789abcdef", "host-a#x"]
        .iter()
        .enumerate()
    {
        let s = session(&format!("ok-{i}"));
        store.create(&s).await.unwrap();
        let lease = leases.acquire(&s, &owner("host-a")).await.unwrap();
        store
            .append(&s, fence(lease.token().get(), writer), &[json!("yes")])
            .await
            .unwrap_or_else(|e| panic!("{writer} under host-a's lease: {e}"));
    }

    let never = session("never-leased");
    store.create(&never).await.unwrap();
    let r = store
        .append(&never, fence(5, "host-a"), &[json!("no")])
        .await;
    lease_refused("a write to a session never leased", r, 5, None);
    // Unfenced writes are refused as unfenced: not allowed.
    let r = store
        .append(&never, WriteFence::Unfenced, &[json!("no")])
        .await;
    assert_eq!(r.unwrap_err().kind(), StoreErrorKind::Unfenced);
}

/// A lease keeper's run writes with its guard's fence (`owner#<hex>`),
/// which passes the check, for an owner id of any length (one too long
/// for the suffix is cut by the keeper); another keeper's stale run is
/// refused once it lost the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepers_fence_passes_and_its_stale_run_is_refused() {
    let server = server();
    // Long enough that no renewal is late on a loaded machine.
    let ttl = Duration::from_secs(5);
    let backend = Arc::new(
        PgLease::builder(server.url())
            .ttl(ttl)
            .connect()
            .await
            .unwrap(),
    );
    let store = Arc::new(checked(&server.url()).await);
    let long = "l".repeat(lease_port::MAX_ID_LEN - 2);
    for (i, name) in ["replica-a", long.as_str()].into_iter().enumerate() {
        let s = session(&format!("kept-{i}"));
        store.create(&s).await.unwrap();
        let keeper = LeaseKeeper::new(backend.clone(), owner(name), ttl).unwrap();
        assert_ne!(keeper.writer(), keeper.owner());
        let run = keeper.acquire(&s).await.unwrap();
        let (st, id) = (Arc::clone(&store), s.clone());
        run.spawn_write(move |fence| async move { st.append(&id, fence, &[json!("kept")]).await })
            .unwrap()
            .await
            .unwrap_or_else(|e| panic!("the keeper's fence for owner {name:.20}…: {e}"));
        let stale = run.fence();
        run.finish().await.unwrap();
        keeper.shutdown().await;
        // Released: the stale fence is refused though nobody wrote since.
        let r = store.append(&s, stale, &[json!("late")]).await;
        assert_eq!(r.unwrap_err().kind(), StoreErrorKind::Fenced);
    }
}

/// The lease table is checked when the store connects: a prefix whose
/// leases do not exist is `Invalid`, naming the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_lease_table_is_refused_at_connect() {
    let server = PostgresServer::start().expect("start PostgreSQL");
    let err = builder(&server.url())
        .leases_in_same_database("nowhere")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("nowhere_leases"), "{err}");
    let err = builder(&server.url())
        .leases_in_same_database("Bad-Prefix")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
}

/// An append of the old holder that waited for the session's row lock
/// (held here by another transaction) while its lease lapsed and B took
/// the session over is refused when it gets the lock: the lease is judged
/// when the write happens, on the lease row as the takeover left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_that_waited_past_a_takeover_is_refused() {
    let server = server();
    let leases = leases(&server.url()).await;
    let store = Arc::new(checked(&server.url()).await);
    let s = session("chat");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("host-a")).await.unwrap();
    store
        .append(&s, WriteFence::from(&a), &[json!(1)])
        .await
        .unwrap();

    let (locker, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    locker
        .batch_execute("BEGIN; SELECT * FROM mecatl_sessions WHERE session_id = 'chat' FOR UPDATE")
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let (store, s, a) = (Arc::clone(&store), s.clone(), a.clone());
        async move {
            store
                .append(&s, WriteFence::from(&a), &[json!("late")])
                .await
        }
    });
    tokio::time::sleep(TTL + Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the append did not wait for the row lock"
    );
    let b = leases.acquire(&s, &owner("host-b")).await.unwrap();
    locker.batch_execute("COMMIT").await.unwrap();
    let late = waiting.await.unwrap();
    lease_refused(
        "A's append that waited past B's takeover",
        late,
        b.token().get(),
        Some("host-b"),
    );
    store
        .append(&s, WriteFence::from(&b), &[json!(2)])
        .await
        .unwrap();
    let page = store.read(&s, 1, 10).await.unwrap();
    let payloads: Vec<_> = page.events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, [json!(1), json!(2)]);
}
