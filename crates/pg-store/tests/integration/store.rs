//! What is this store's own: one transaction per append, the index behind
//! listing pages, deletion racing an append, payloads kept exactly, page
//! bytes, the schema and its versions, prefixes, bad configuration.

use std::sync::Arc;
use std::time::Duration;

use pg_session_store::{PgStore, PgStoreBuilder, SCHEMA_VERSION};
use pglease::PgLease;
use serde_json::json;
use session_store::{ListCursor, SessionStore, StoreErrorKind};
use test_services::PgBouncer;

use crate::support::{
    builder, fence, next_xid, scalar, server, session, store, until_waiting_on_locks,
};

/// A batch of fifty events is one transaction, directly and through
/// PgBouncer; so is a refused append (it takes the row lock, writes
/// nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_is_one_transaction() {
    let server = server();
    let bouncer = PgBouncer::start(&server).expect("start PgBouncer");
    for (i, url) in [server.url(), bouncer.url()].into_iter().enumerate() {
        let store = store(&url).await;
        let s = session(&format!("one-tx-{i}"));
        store.create(&s).await.unwrap();
        let batch: Vec<_> = (0..50).map(|i| json!({"i": i})).collect();
        let before = next_xid(&server);
        let r = store.append(&s, fence(3, "a"), &batch).await.unwrap();
        assert_eq!(
            next_xid(&server) - before,
            1,
            "{url}: the append took more transactions"
        );
        assert_eq!((r.first_seq, r.last_seq), (1, 50));
        let before = next_xid(&server);
        let refused = store.append(&s, fence(2, "a"), &batch).await;
        assert_eq!(refused.unwrap_err().kind(), StoreErrorKind::Fenced);
        assert!(next_xid(&server) - before <= 1);
        assert_eq!(store.read(&s, 1, 100).await.unwrap().events.len(), 50);
    }
}

/// A page of sessions walks the partial index of live ids and stops after
/// the page: among 20,000 deleted sessions and 5,000 live ones, the plan
/// of the listing statement is an index scan reading the page and one
/// more row, not the table. (The statement is `list_after` of `sql.rs`,
/// with the cursor and limit written in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_page_costs_the_page_not_the_table() {
    let server = server();
    let store = store(&server.url()).await;
    server
        .query(
            "INSERT INTO mecatl_sessions (session_id, live)
             SELECT format('s-%s', lpad(g::text, 6, '0')), g % 5 = 0
             FROM generate_series(1, 25000) g;
             ANALYZE mecatl_sessions",
        )
        .unwrap();
    let plan = scalar(
        &server,
        "EXPLAIN (ANALYZE, FORMAT JSON)
         SELECT session_id FROM mecatl_sessions WHERE live AND session_id > 's-012345'
         ORDER BY session_id LIMIT 11",
    )
    .unwrap();
    assert!(!plan.contains("Seq Scan"), "{plan}");
    assert!(
        plan.contains("mecatl_sessions_live"),
        "not the partial index: {plan}"
    );
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let scan = &plan[0]["Plan"]["Plans"][0];
    assert!(
        scan["Actual Rows"].as_u64().unwrap() <= 11,
        "the scan read more than the page: {scan}"
    );
    let page = store
        .list_page(Some(&ListCursor::after(session("s-012345"))), 10)
        .await
        .unwrap();
    let ids: Vec<_> = page
        .sessions
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    assert_eq!(ids.first().map(String::as_str), Some("s-012350"));
    assert_eq!(ids.len(), 10);
    assert_eq!(
        page.next.as_ref().map(|c| c.last().as_str()),
        Some("s-012395")
    );
}

/// A deletion whose snapshot was taken before an append committed (both
/// waited for the session's row lock, the append first) cannot see that
/// append's events to remove them; they stay hidden all the same, a
/// re-created session reads empty and numbers on after them, and the next
/// deletion removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_an_append_racing_a_deletion_stay_hidden() {
    let server = server();
    let store = Arc::new(store(&server.url()).await);
    let s = session("raced");
    store.create(&s).await.unwrap();
    store.append(&s, fence(1, "a"), &[json!(1)]).await.unwrap();
    let (locker, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    locker
        .batch_execute("BEGIN; SELECT * FROM mecatl_sessions WHERE session_id = 'raced' FOR UPDATE")
        .await
        .unwrap();
    let appending = tokio::spawn({
        let (store, s) = (Arc::clone(&store), s.clone());
        async move { store.append(&s, fence(1, "a"), &[json!(2), json!(3)]).await }
    });
    until_waiting_on_locks(&server, 1).await;
    let deleting = tokio::spawn({
        let (store, s) = (Arc::clone(&store), s.clone());
        async move { store.delete(&s, fence(1, "a")).await }
    });
    until_waiting_on_locks(&server, 2).await;
    locker.batch_execute("COMMIT").await.unwrap();
    let appended = appending.await.unwrap().unwrap();
    deleting.await.unwrap().unwrap();
    assert_eq!(appended.last_seq, 3);
    let left = scalar(
        &server,
        "SELECT count(*) FROM mecatl_events WHERE session_id = 'raced'",
    );
    assert_eq!(
        left.as_deref(),
        Some("2"),
        "the race did not happen as staged"
    );

    store.create(&s).await.unwrap();
    let page = store.read(&s, 0, 10).await.unwrap();
    assert!(
        page.events.is_empty(),
        "a re-created session shows {:?}",
        page.events
    );
    let r = store
        .append(&s, fence(1, "a"), &[json!("new")])
        .await
        .unwrap();
    assert_eq!(r.first_seq, 4);
    let page = store.read(&s, 0, 10).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [4]);
    store.delete(&s, fence(1, "a")).await.unwrap();
    let left = scalar(
        &server,
        "SELECT count(*) FROM mecatl_events WHERE session_id = 'raced'",
    );
    assert_eq!(left.as_deref(), Some("0"));
}

/// Payloads come back exactly as written: a NUL escape (which `jsonb`
/// would refuse), numbers beyond a double, deep nesting, any text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_round_trip_exactly() {
    let server = server();
    let store = store(&server.url()).await;
    let s = session("exact");
    store.create(&s).await.unwrap();
    let odd = vec![
        json!("nul \u{0} inside"),
        json!({"big": u64::MAX, "neg": i64::MIN, "half": 0.5, "tiny": 1e-300}),
        json!([[[[[[[[[[{"deep": true}]]]]]]]]]]),
        json!("é ☕ \"quoted\" \\ back\nslash 'single' $1 %s"),
        json!(null),
    ];
    store.append(&s, fence(1, "a"), &odd).await.unwrap();
    let page = store.read(&s, 1, 10).await.unwrap();
    let back: Vec<_> = page.events.into_iter().map(|e| e.payload).collect();
    assert_eq!(back, odd);
}

/// A page holds at most `max_page_bytes` of events, but always one; the
/// rest is the next page's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_bounded_in_bytes_but_hold_one_event() {
    let server = server();
    let store = builder(&server.url())
        .max_page_bytes(100)
        .connect()
        .await
        .unwrap();
    let s = session("bytes");
    store.create(&s).await.unwrap();
    let small = json!("x".repeat(38)); // 40 bytes serialised
    let big = json!("y".repeat(498)); // 500
    store
        .append(
            &s,
            fence(1, "a"),
            &[small.clone(), small.clone(), small.clone(), big, small],
        )
        .await
        .unwrap();
    let mut pages = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read(&s, from, 100).await.unwrap();
        pages.push(page.events.iter().map(|e| e.seq).collect::<Vec<_>>());
        match page.next_seq {
            Some(next) => from = next,
            None => break,
        }
    }
    assert_eq!(pages, [vec![1, 2], vec![3], vec![4], vec![5]]);
}

/// The tables are made by the first client (racing first clients take
/// turns), recorded in the schema table they share with pglease's, and a
/// version newer than this crate's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_versioned_and_shared_with_the_leases() {
    let server = server();
    let url = server.url();
    let mut connecting = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        connecting.push(tokio::spawn(async move { store(&url).await }));
    }
    for c in connecting {
        c.await.unwrap();
    }
    PgLease::builder(&url).connect().await.unwrap();
    let rows = server
        .query("SELECT component, version::text FROM mecatl_schema ORDER BY component")
        .unwrap();
    let version = SCHEMA_VERSION.to_string();
    assert_eq!(
        rows,
        [
            vec![Some("leases".to_owned()), Some("1".to_owned())],
            vec![Some("store".to_owned()), Some(version)],
        ]
    );
    let tables = server
        .query(
            "SELECT string_agg(tablename, ' ' ORDER BY tablename) FROM pg_tables \
             WHERE tablename LIKE 'mecatl%'",
        )
        .unwrap();
    assert_eq!(
        tables[0][0].as_deref(),
        Some(
            "mecatl_authority mecatl_cancel_requests mecatl_events mecatl_leases mecatl_schema \
             mecatl_sessions mecatl_store_authority"
        )
    );
    server
        .query("UPDATE mecatl_schema SET version = version + 1 WHERE component = 'store'")
        .unwrap();
    let err = builder(&url).connect().await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("newer"), "{err}");
}

/// Tables of schema version 1 (before cancel requests) are upgraded in
/// place by the first client of this version: sessions, events and marks
/// kept, cancel requests working afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_tables_are_upgraded_in_place() {
    let server = server();
    let url = server.url();
    let old = store(&url).await;
    let s = session("from-version-1");
    old.create(&s).await.unwrap();
    old.append(&s, fence(3, "x"), &[json!("kept")])
        .await
        .unwrap();
    drop(old);
    // What version 1 left: no cancel requests' table, version 1 recorded.
    server
        .query(
            "DROP TABLE mecatl_cancel_requests; \
             UPDATE mecatl_schema SET version = 1 WHERE component = 'store'",
        )
        .unwrap();

    let upgraded = store(&url).await;
    let version = server
        .query("SELECT version::text FROM mecatl_schema WHERE component = 'store'")
        .unwrap();
    assert_eq!(
        version[0][0].as_deref(),
        Some(SCHEMA_VERSION.to_string().as_str())
    );
    let page = upgraded.read(&s, 1, 10).await.unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].payload, json!("kept"));
    let err = upgraded
        .append(&s, fence(2, "y"), &[json!("late")])
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        StoreErrorKind::Fenced,
        "the mark survived: {err}"
    );
    upgraded
        .request_cancel(&s, lease_port::FencingToken::new(3))
        .await
        .unwrap();
    let request = upgraded.cancel_request(&s).await.unwrap().unwrap();
    assert_eq!(request.serial, 1);
}

/// Prefixes keep deployments apart in one database; a foreign table under
/// one of the names is refused, not adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_are_independent_and_foreign_tables_refused() {
    let server = server();
    let (a, b) = (
        builder(&server.url())
            .table_prefix("one")
            .connect()
            .await
            .unwrap(),
        builder(&server.url())
            .table_prefix("two")
            .connect()
            .await
            .unwrap(),
    );
    let s = session("same-id");
    a.create(&s).await.unwrap();
    b.create(&s).await.unwrap();
    a.append(&s, fence(9, "x"), &[json!("in one")])
        .await
        .unwrap();
    b.append(&s, fence(1, "y"), &[json!("in two")])
        .await
        .unwrap();
    assert_eq!(
        b.read(&s, 1, 10).await.unwrap().events[0].payload,
        json!("in two")
    );

    server
        .query("CREATE TABLE foreign_sessions (x integer)")
        .unwrap();
    let err = builder(&server.url())
        .table_prefix("foreign")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("another application"), "{err}");
}

/// Bad configuration is `Invalid` before any connection; an unreachable
/// database is `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_invalid_and_no_database_unavailable() {
    type Configure = fn(PgStoreBuilder) -> PgStoreBuilder;
    let bad: [(&str, Configure); 6] = [
        ("a bad prefix", |b| b.table_prefix("Bad-Prefix")),
        ("a prefix too long", |b| b.table_prefix("x".repeat(41))),
        ("a bad lease prefix", |b| b.leases_in_same_database("a-b")),
        ("no event size", |b| b.max_event_bytes(0)),
        ("no page size", |b| b.max_page_bytes(0)),
        ("no timeout", |b| b.request_timeout(Duration::ZERO)),
    ];
    for (what, configure) in bad {
        let err = configure(PgStore::builder("postgres://u:p@127.0.0.1:1/x"))
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Invalid, "{what}: {err}");
    }
    let err = PgStore::builder("not a url ::")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    let err = PgStore::builder("postgres://u:secret@127.0.0.1:1/x")
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    assert!(
        !err.to_string().contains("secret"),
        "the password leaked: {err}"
    );
}
