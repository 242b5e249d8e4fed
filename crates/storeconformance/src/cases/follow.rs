//! Following a session: waiting for appends.

use std::time::{Duration, Instant};

use serde_json::json;
use session_store::StoreErrorKind;

use crate::StoreFactory;
use crate::support::{fence, must, must_fail, promptly, session};

/// Longer than any case lasts: a waiter given it ends only by an append.
const FOREVER: Duration = Duration::from_secs(3600);

/// How long a case lets a parked waiter sit before it checks that the
/// waiter is still parked.
const PARKED: Duration = Duration::from_millis(200);

/// A waiter wakes when another client appends: at once when the event is
/// already there, and promptly (well before its timeout) when it lands
/// while the waiter is parked, the new event then readable.
pub async fn wait_wakes_on_append<F: StoreFactory>(f: &F) {
    let (reader, writer) = (f.store().await, f.store().await);
    let s = session("followed");
    must("create", writer.create(&s).await);
    must(
        "append event 1",
        writer.append(&s, fence(1, "w"), &[json!("one")]).await,
    );
    let state = "session holding event 1";
    let step = format!("{state}: wait for an event after seq 0");
    assert!(
        must(
            &step,
            promptly(&step, reader.wait_for_append(&s, 0, FOREVER)).await
        ),
        "{step}: the wait reported no event"
    );

    let waiting = tokio::spawn({
        let (reader, s) = (reader.clone(), s.clone());
        async move { reader.wait_for_append(&s, 1, FOREVER).await }
    });
    tokio::time::sleep(PARKED).await;
    if waiting.is_finished() {
        let answer = waiting.await;
        panic!(
            "{state}: a wait for an event after seq 1 ended before anything was appended: {answer:?}"
        );
    }
    must(
        "append event 2 while a waiter is parked",
        writer.append(&s, fence(1, "w"), &[json!("two")]).await,
    );
    let step =
        format!("{state}: a waiter parked on seq 1 when event 2 was appended by another client");
    let woke = promptly(&step, waiting)
        .await
        .expect("the waiting task panicked");
    assert!(must(&step, woke), "{step}: the wait reported no event");
    let page = must(&step, reader.read(&s, 2, 10).await);
    assert_eq!(
        page.events
            .iter()
            .map(|e| (e.seq, e.payload.clone()))
            .collect::<Vec<_>>(),
        [(2, json!("two"))],
        "{step}: the woken waiter's client reads otherwise"
    );
    let step =
        "session holding events 1 and 2: a wait with no time at all for an event after seq 1";
    assert!(
        must(
            step,
            promptly(step, reader.wait_for_append(&s, 1, Duration::ZERO)).await
        ),
        "{step}: answered that there is none"
    );
}

/// A wait with nothing appended runs to its timeout — not less — and
/// answers `false`; with no time at all it answers from what is stored.
pub async fn wait_times_out<F: StoreFactory>(f: &F) {
    let store = f.store().await;
    let s = session("quiet");
    must("create", store.create(&s).await);
    must(
        "append event 1",
        store.append(&s, fence(1, "w"), &[json!(1)]).await,
    );
    let state = "session holding event 1, nothing appended after";
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let step = format!("{state}: wait {timeout:?} for an event after seq 1");
    let woke = must(
        &step,
        promptly(&step, store.wait_for_append(&s, 1, timeout)).await,
    );
    let took = started.elapsed();
    assert!(!woke, "{step}: reported an event");
    assert!(
        took >= timeout - Duration::from_millis(20),
        "{step}: gave up after {took:?}, before its timeout"
    );
    let step = format!("{state}: a wait with no time at all for an event after seq 1");
    assert!(
        !must(
            &step,
            promptly(&step, store.wait_for_append(&s, 1, Duration::ZERO)).await
        ),
        "{step}: reported an event"
    );
    let step = format!("{state}: a wait with no time at all for an event after seq 0");
    assert!(
        must(
            &step,
            promptly(&step, store.wait_for_append(&s, 0, Duration::ZERO)).await
        ),
        "{step}: reported none"
    );
}

/// Waiting on a session that does not exist is `NotFound`, and so is a
/// wait whose session is deleted while it waits.
pub async fn wait_on_missing_or_deleted_is_not_found<F: StoreFactory>(f: &F) {
    let (reader, writer) = (f.store().await, f.store().await);
    let missing = session("never-created");
    let step = "wait on a session never created";
    must_fail(
        step,
        promptly(step, reader.wait_for_append(&missing, 0, FOREVER)).await,
        StoreErrorKind::NotFound,
    );

    let s = session("deleted-while-waited-on");
    must("create", writer.create(&s).await);
    must(
        "append event 1",
        writer.append(&s, fence(1, "w"), &[json!(1)]).await,
    );
    let waiting = tokio::spawn({
        let (reader, s) = (reader.clone(), s.clone());
        async move { reader.wait_for_append(&s, 1, FOREVER).await }
    });
    tokio::time::sleep(PARKED).await;
    must(
        "delete the session while a waiter is parked on it",
        writer.delete(&s, fence(1, "w")).await,
    );
    let step = "a waiter parked on seq 1 when another client deleted the session";
    let result = promptly(step, waiting)
        .await
        .expect("the waiting task panicked");
    must_fail(step, result, StoreErrorKind::NotFound);
}

/// Cancel requests, for a store that keeps them: recorded through one
/// client, read and waited for through another (the holder, in another
/// process). A wait from a count returns at once when a later request is
/// there, parks until one lands, and is woken by it; a request for an
/// earlier run never lowers the token or counts. A store that keeps none
/// answers `Unsupported` to all three calls.
pub async fn cancel_requests_wake_the_holder<F: StoreFactory>(f: &F) {
    let (holder, asker) = (f.store().await, f.store().await);
    let s = session("cancelled");
    must("create", asker.create(&s).await);
    let token = lease_port::FencingToken::new;
    if !f.keeps_cancel_requests() {
        let step = "a store keeping no cancel requests";
        must_fail(
            step,
            asker.request_cancel(&s, token(1)).await,
            StoreErrorKind::Unsupported,
        );
        must_fail(
            step,
            holder.cancel_request(&s).await,
            StoreErrorKind::Unsupported,
        );
        must_fail(
            step,
            holder.wait_for_cancel_request(&s, 0, Duration::ZERO).await,
            StoreErrorKind::Unsupported,
        );
        return;
    }
    let state = "session without cancel requests";
    assert_eq!(
        must(state, holder.cancel_request(&s).await),
        None,
        "{state}: a request is recorded"
    );
    let parked = tokio::spawn({
        let (holder, s) = (holder.clone(), s.clone());
        async move { holder.wait_for_cancel_request(&s, 0, FOREVER).await }
    });
    tokio::time::sleep(PARKED).await;
    if parked.is_finished() {
        panic!(
            "{state}: a wait for a request ended before any was made: {:?}",
            parked.await
        );
    }
    must(
        "request a cancel of run 5",
        asker.request_cancel(&s, token(5)).await,
    );
    let step =
        format!("{state}: a holder parked from count 0 when another client asked to cancel run 5");
    let request = must(
        &step,
        promptly(&step, parked)
            .await
            .expect("the waiting task panicked"),
    );
    let request = request.unwrap_or_else(|| panic!("{step}: woken with no request"));
    assert_eq!(
        (request.run, request.serial),
        (token(5), 1),
        "{step}: reads otherwise"
    );

    let state = "after one request for run 5";
    let step = format!("{state}: a wait from count 1 with no time");
    let none = must(
        &step,
        holder.wait_for_cancel_request(&s, 1, Duration::ZERO).await,
    );
    assert_eq!(none, None, "{step}: a later request was reported");
    must(
        "request a cancel of run 3",
        asker.request_cancel(&s, token(3)).await,
    );
    let read = must(state, holder.cancel_request(&s).await).map(|r| (r.run, r.serial));
    assert_eq!(
        read,
        Some((token(5), 1)),
        "{state}: a request for run 3 changed the record"
    );
    must(
        "request a cancel of run 9",
        asker.request_cancel(&s, token(9)).await,
    );
    let step = "after requests for runs 5 and 9: a wait from count 1";
    let request = must(
        step,
        promptly(step, holder.wait_for_cancel_request(&s, 1, FOREVER)).await,
    )
    .unwrap_or_else(|| panic!("{step}: no request"));
    assert_eq!(
        (request.run, request.serial),
        (token(9), 2),
        "{step}: reads otherwise"
    );
}

/// The last number follows the appends of every client, is where a wait
/// for what comes next starts, and carries on over a deletion; a session
/// that does not exist is `NotFound`.
pub async fn last_seq_follows_appends<F: StoreFactory>(f: &F) {
    let (reader, writer) = (f.store().await, f.store().await);
    let s = session("numbered");
    must_fail(
        "the last number of a session never created",
        reader.last_seq(&s).await,
        StoreErrorKind::NotFound,
    );
    must("create", writer.create(&s).await);
    assert_eq!(
        must("new session", reader.last_seq(&s).await),
        0,
        "a new session's last number"
    );
    let batch = [json!(1), json!(2), json!(3)];
    must(
        "append 3 events",
        writer.append(&s, fence(1, "w"), &batch).await,
    );
    let state = "after another client appended events 1 to 3";
    assert_eq!(
        must(state, reader.last_seq(&s).await),
        3,
        "{state}: the last number"
    );

    let waiting = tokio::spawn({
        let (reader, s) = (reader.clone(), s.clone());
        async move { reader.wait_for_append(&s, 3, FOREVER).await }
    });
    tokio::time::sleep(PARKED).await;
    if waiting.is_finished() {
        panic!(
            "{state}: a wait after the last number ended at once: {:?}",
            waiting.await
        );
    }
    must(
        "append event 4",
        writer.append(&s, fence(1, "w"), &[json!(4)]).await,
    );
    let step = format!("{state}: a wait after the last number when event 4 landed");
    assert!(
        must(
            &step,
            promptly(&step, waiting)
                .await
                .expect("the waiting task panicked")
        ),
        "{step}: the wait reported no event"
    );

    must("delete", writer.delete(&s, fence(1, "w")).await);
    must_fail(
        "the last number of a deleted session",
        reader.last_seq(&s).await,
        StoreErrorKind::NotFound,
    );
    must("create again", writer.create(&s).await);
    let state = "session created again after events 1 to 4";
    let last = must(state, reader.last_seq(&s).await);
    let receipt = must(state, writer.append(&s, fence(1, "w"), &[json!(5)]).await);
    assert!(
        receipt.first_seq > last,
        "{state}: last number {last}, yet the next append was numbered {}",
        receipt.first_seq
    );
}
