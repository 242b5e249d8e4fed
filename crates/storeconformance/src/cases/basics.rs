//! Sessions and their events: creation, appending and reading back,
//! sessions kept apart, bad input.

use std::time::{Duration, SystemTime};

use serde_json::json;
use session_store::{MAX_LIST_LIMIT, StoreErrorKind};

use crate::StoreFactory;
use crate::support::{events, fence, must, must_fail, payloads, promptly, session, summary};

/// Sessions exist once created, and only then: `create` of an existing
/// session is `AlreadyExists` (from any client); reading, appending,
/// deleting and waiting on a missing one are `NotFound`, and none of them
/// creates it.
pub async fn create_and_exists<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let (s, missing) = (session("created"), session("missing"));
    let listed = must("list a fresh store", one.list().await);
    assert!(listed.is_empty(), "a fresh store lists {listed:?}");

    must("create a new session", one.create(&s).await);
    let page = must("read the new, empty session", one.read(&s, 1, 10).await);
    assert!(
        page.events.is_empty() && page.next_seq.is_none() && !page.unfinished_write,
        "a new session reads as {page:?}, not as an empty page"
    );
    for (who, store) in [("the creating client", &one), ("another client", &two)] {
        must_fail(
            &format!("{who} creates the session that exists"),
            store.create(&s).await,
            StoreErrorKind::AlreadyExists,
        );
    }

    let step = |what: &str| format!("{what} session {missing:?}, never created");
    must_fail(
        &step("read"),
        two.read(&missing, 1, 10).await,
        StoreErrorKind::NotFound,
    );
    must_fail(
        &step("append to"),
        two.append(&missing, fence(1, "a"), &[json!(1)]).await,
        StoreErrorKind::NotFound,
    );
    must_fail(
        &step("delete"),
        two.delete(&missing, fence(1, "a")).await,
        StoreErrorKind::NotFound,
    );
    must_fail(
        &step("wait on"),
        promptly(
            &step("wait on"),
            two.wait_for_append(&missing, 0, Duration::from_secs(1)),
        )
        .await,
        StoreErrorKind::NotFound,
    );
    match two.high_water(&missing).await {
        Ok(None) => {}
        Err(e) if e.kind() == StoreErrorKind::NotFound => {}
        other => panic!(
            "{}: expected no mark (or NotFound), got {other:?}",
            step("the mark of")
        ),
    }
    let listed = must("list after calls on a missing session", two.list().await);
    assert_eq!(
        listed,
        vec![s.clone()],
        "after creating {s:?} and calling on missing {missing:?}, the listing is wrong"
    );
    let fresh = f.store().await;
    must_fail(
        "a client made afterwards creates the session that exists",
        fresh.create(&s).await,
        StoreErrorKind::AlreadyExists,
    );
}

/// Rule 1 and 3: a batch is appended whole, under consecutive sequence
/// numbers from 1; the receipt names them; every client reads the events
/// back as written — payload, token and a timestamp from the store's
/// clock.
pub async fn append_and_read_back<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("appended");
    must("create", one.create(&s).await);
    let odd = json!({
        "list": [1, "two", null, true, {"n": -3}],
        "big": u64::MAX,
        "half": 0.5,
        "text": "é \"quoted\"\n☕",
    });
    let before = SystemTime::now();
    let r = must(
        "append a batch of three to a new session",
        one.append(&s, fence(5, "a"), &[json!(1), odd.clone(), json!("three")])
            .await,
    );
    assert_eq!(
        (r.first_seq, r.last_seq),
        (1, 3),
        "the first batch of a new session was numbered {r:?}"
    );
    let r = must(
        "append one more from another client",
        two.append(&s, fence(5, "a"), &[json!(4)]).await,
    );
    assert_eq!(
        (r.first_seq, r.last_seq),
        (4, 4),
        "after events 1..=3, the next was numbered {r:?}"
    );

    let expected = vec![
        (1, Some(5), json!(1)),
        (2, Some(5), odd),
        (3, Some(5), json!("three")),
        (4, Some(5), json!(4)),
    ];
    for (who, store) in [("the writer", &one), ("another client", &two)] {
        let read = events(&**store, &format!("{who} reads back"), &s).await;
        assert_eq!(
            summary(&read),
            expected,
            "{who} read back other events than were appended"
        );
        let day = Duration::from_secs(24 * 3600);
        for e in &read {
            assert!(
                e.at > before - day && e.at < SystemTime::now() + day,
                "event {} is stamped {:?}, a day away from the suite's clock",
                e.seq,
                e.at
            );
        }
    }
    let page = must("read from seq 0", two.read(&s, 0, 1).await);
    assert_eq!(
        page.events.first().map(|e| e.seq),
        Some(1),
        "reading from seq 0 must start at the first event"
    );
    assert_eq!(
        must("read the mark", one.high_water(&s).await).map(|t| t.get()),
        Some(5),
        "after token 5 wrote, the mark is not 5"
    );
}

/// Sessions are independent, including ids that a naive key layout or
/// file naming would merge: separators and dots, braces and their
/// percent-encoding, case, long ids that must be hashed.
pub async fn session_isolation<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let max = lease_port::MAX_ID_LEN;
    let names: Vec<String> = vec![
        "a/../b{x}:events".into(),
        "a/../b%7Bx%7D:events".into(),
        "a/../b_7bx_7d_events".into(),
        "Chat".into(),
        "chat".into(),
        ".".into(),
        "..".into(),
        "a b".into(),
        "é".repeat(max / 2),
        "y".repeat(max),
        format!("{}z", "y".repeat(max - 1)),
    ];
    let ids: Vec<_> = names.iter().map(|n| session(n)).collect();
    for (i, id) in ids.iter().enumerate() {
        must(&format!("create {id:?}"), one.create(id).await);
        let store = if i % 2 == 0 { &one } else { &two };
        must(
            &format!("append to {id:?}"),
            store
                .append(id, fence(i as u64 + 1, "a"), &[json!(i)])
                .await,
        );
    }
    for (i, id) in ids.iter().enumerate() {
        let read = events(&*two, &format!("read {id:?} among similar ids"), id).await;
        assert_eq!(
            summary(&read),
            vec![(1, Some(i as u64 + 1), json!(i))],
            "session {id:?} holds another session's events"
        );
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(
        must("list the similar ids", one.list().await),
        sorted,
        "the listing merges, loses or misorders similar ids"
    );
    // Deleting one leaves the others.
    must("delete the first", one.delete(&ids[0], fence(1, "a")).await);
    for id in &ids[1..] {
        must(
            &format!("read {id:?} after deleting {:?}", ids[0]),
            two.read(id, 1, 1).await,
        );
    }
}

/// Rule 3: bad input is a typed `Invalid` and writes nothing — an empty
/// batch, a batch holding an event over the store's size limit (the
/// events before it are not written either), a page limit of 0, a listing
/// limit out of bounds — and no sequence number is used up.
pub async fn bad_input_is_invalid<F: StoreFactory>(f: &F) {
    let store = f.store().await;
    let s = session("bad-input");
    must("create", store.create(&s).await);
    must(
        "append one event",
        store.append(&s, fence(1, "a"), &[json!(1)]).await,
    );
    let state = "session holding one event";

    must_fail(
        &format!("{state}: append an empty batch"),
        store.append(&s, fence(1, "a"), &[]).await,
        StoreErrorKind::Invalid,
    );
    if let Some(max) = f.max_event_bytes() {
        let over = json!("x".repeat(max + 1));
        must_fail(
            &format!("{state}: append a small event, then one over the limit of {max} bytes"),
            store.append(&s, fence(1, "a"), &[json!(2), over]).await,
            StoreErrorKind::Invalid,
        );
    }
    must_fail(
        &format!("{state}: read with limit 0"),
        store.read(&s, 1, 0).await,
        StoreErrorKind::Invalid,
    );
    for limit in [0, MAX_LIST_LIMIT + 1, usize::MAX] {
        must_fail(
            &format!("list a page of {limit} sessions"),
            store.list_page(None, limit).await,
            StoreErrorKind::Invalid,
        );
    }
    let read = events(&*store, "after the refused input", &s).await;
    assert_eq!(
        payloads(&read),
        vec![json!(1)],
        "refused input wrote something (the session held one event before)"
    );
    let r = must(
        "append after the refused input",
        store.append(&s, fence(1, "a"), &[json!(2)]).await,
    );
    assert_eq!(r.first_seq, 2, "refused input used up sequence numbers");
}
