//! The fencing rules: a token below the mark refused, an equal one from
//! another writer refused, a higher one accepted and binding the mark to
//! its writer; deletion fenced like an append; unfenced writes.

use std::fmt::Debug;

use std::sync::Arc;

use serde_json::json;
use session_store::{SessionStore, StoreError, StoreErrorKind, WriteFence};

use crate::StoreFactory;
use crate::support::{events, fence, must, must_fail, payloads, session, summary, writer};

/// Asserts `r` is `Fenced` and that the refusal names what was refused:
/// the token presented and by whom, the mark and the mark's writer.
#[track_caller]
fn must_be_fenced<T: Debug>(
    step: &str,
    r: Result<T, StoreError>,
    presented: (u64, &str),
    mark: (u64, &str),
) {
    match must_fail(step, r, StoreErrorKind::Fenced) {
        StoreError::Fenced {
            presented: token,
            presented_by,
            high_water,
            high_water_owner,
            ..
        } => {
            assert_eq!(
                (token.get(), high_water.get()),
                (presented.0, mark.0),
                "{step}: the refusal names token {token} against mark {high_water}, \
                 not {} against {}",
                presented.0,
                mark.0
            );
            assert_eq!(
                presented_by,
                writer(presented.1),
                "{step}: the refusal names the wrong presenting writer"
            );
            assert_eq!(
                high_water_owner,
                Some(writer(mark.1)),
                "{step}: the refusal names the wrong writer of the mark"
            );
        }
        other => panic!("{step}: a Fenced kind carried by {other:?}"),
    }
}

/// Rule 1: once a token wrote, every lower token is refused — from every
/// writer and client, and from a client made afterwards (the mark is in
/// the store's data) — and a refused write writes nothing.
pub async fn lower_token_refused<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("lower");
    must("create", one.create(&s).await);
    must(
        "a writes with token 5",
        one.append(&s, fence(5, "a"), &[json!("a1"), json!("a2")])
            .await,
    );
    let state = "after a wrote with token 5";
    for (token, by, store, via) in [
        (4, "a", &one, "the writer's client"),
        (4, "b", &two, "another client"),
        (1, "b", &two, "another client"),
        (0, "c", &one, "the writer's client"),
    ] {
        must_be_fenced(
            &format!("{state}: {by} appends with token {token} through {via}"),
            store.append(&s, fence(token, by), &[json!("late")]).await,
            (token, by),
            (5, "a"),
        );
    }
    let fresh = f.store().await;
    must_be_fenced(
        &format!("{state}: b appends with token 4 through a client made afterwards"),
        fresh.append(&s, fence(4, "b"), &[json!("late")]).await,
        (4, "b"),
        (5, "a"),
    );
    let read = events(&*two, state, &s).await;
    assert_eq!(
        payloads(&read),
        [json!("a1"), json!("a2")],
        "{state}: a refused lower token wrote"
    );
    assert_eq!(
        must("read the mark", two.high_water(&s).await).map(|t| t.get()),
        Some(5),
        "{state}: refused lower tokens moved the mark"
    );
    let r = must(
        "a writes on with token 5",
        two.append(&s, fence(5, "a"), &[json!("a3")]).await,
    );
    assert_eq!(
        r.first_seq, 3,
        "{state}: refused writes used up sequence numbers"
    );
}

/// Rule 1: the mark belongs to the writer that set it; the same token
/// from another writer (another lease authority's token 5, another
/// incarnation) is refused, for appends and deletions, from every client
/// and from a client made afterwards; the mark's own writer goes on.
pub async fn equal_token_from_another_writer_refused<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("twins");
    must("create", one.create(&s).await);
    must(
        "x writes with token 5",
        one.append(&s, fence(5, "x"), &[json!("x1")]).await,
    );
    let state = "after x wrote with token 5";
    for (store, via) in [(&two, "another client"), (&one, "x's client")] {
        must_be_fenced(
            &format!("{state}: y appends with token 5 through {via}"),
            store.append(&s, fence(5, "y"), &[json!("y1")]).await,
            (5, "y"),
            (5, "x"),
        );
    }
    must_be_fenced(
        &format!("{state}: y deletes with token 5"),
        two.delete(&s, fence(5, "y")).await,
        (5, "y"),
        (5, "x"),
    );
    must(
        &format!("{state}: x appends again with token 5 through another client"),
        two.append(&s, fence(5, "x"), &[json!("x2")]).await,
    );
    let fresh = f.store().await;
    must_be_fenced(
        &format!("{state}: y appends with token 5 through a client made afterwards"),
        fresh.append(&s, fence(5, "y"), &[json!("y2")]).await,
        (5, "y"),
        (5, "x"),
    );
    let read = events(&*fresh, state, &s).await;
    assert_eq!(
        payloads(&read),
        [json!("x1"), json!("x2")],
        "{state}: an equal token from another writer wrote"
    );
}

/// Rule 1: a higher token is accepted and binds the mark to its writer:
/// the former writer is then refused at the new token as at its own, the
/// new writer goes on from any client, and the next higher token moves
/// the mark again.
pub async fn higher_token_binds_its_writer<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("takeover");
    must("create", one.create(&s).await);
    must(
        "x writes with token 5",
        one.append(&s, fence(5, "x"), &[json!("x5")]).await,
    );
    must(
        "after x wrote with token 5: y writes with the higher token 6",
        two.append(&s, fence(6, "y"), &[json!("y6")]).await,
    );
    assert_eq!(
        must("read the mark", one.high_water(&s).await).map(|t| t.get()),
        Some(6),
        "after y wrote with token 6, the mark is not 6"
    );
    let state = "after x wrote with token 5, then y with token 6";
    must_be_fenced(
        &format!("{state}: x appends with token 6"),
        one.append(&s, fence(6, "x"), &[json!("x6")]).await,
        (6, "x"),
        (6, "y"),
    );
    must_be_fenced(
        &format!("{state}: x appends with its token 5"),
        one.append(&s, fence(5, "x"), &[json!("x5b")]).await,
        (5, "x"),
        (6, "y"),
    );
    must(
        &format!("{state}: y appends again with token 6 through x's client"),
        one.append(&s, fence(6, "y"), &[json!("y6b")]).await,
    );
    let fresh = f.store().await;
    must_be_fenced(
        &format!("{state}: x appends with token 6 through a client made afterwards"),
        fresh.append(&s, fence(6, "x"), &[json!("x6")]).await,
        (6, "x"),
        (6, "y"),
    );
    must(
        &format!("{state}: x appends with the higher token 7"),
        fresh.append(&s, fence(7, "x"), &[json!("x7")]).await,
    );
    must_be_fenced(
        "after x took the mark with token 7: y appends with token 7",
        two.append(&s, fence(7, "y"), &[json!("y7")]).await,
        (7, "y"),
        (7, "x"),
    );
    let read = events(&*two, state, &s).await;
    assert_eq!(
        payloads(&read),
        [json!("x5"), json!("y6"), json!("y6b"), json!("x7")],
        "{state}: the events are not the accepted writes"
    );
}

/// Rule 1: tokens compare exactly across the whole `u64` range — beyond
/// what a double holds (2^53 + 1 against 2^53), beyond `i64` — and are
/// stored exactly.
pub async fn tokens_compare_exactly<F: StoreFactory>(f: &F) {
    let store = f.store().await;
    let s = session("big-tokens");
    must("create", store.create(&s).await);
    let big = (1u64 << 53) + 1;
    let huge = 99_999_999_999_999_999u64;
    let top = (1u64 << 63) + 1;
    must(
        "write with token 9",
        store.append(&s, fence(9, "t9"), &[json!(0)]).await,
    );
    must(
        &format!("after token 9: write with token {big}"),
        store.append(&s, fence(big, "big"), &[json!(1)]).await,
    );
    for below in [big - 1, 1u64 << 53, 10] {
        must_be_fenced(
            &format!("mark {big}: write with token {below}"),
            store.append(&s, fence(below, "low"), &[json!("low")]).await,
            (below, "low"),
            (big, "big"),
        );
    }
    must(
        &format!("mark {big}: write with token {huge}"),
        store.append(&s, fence(huge, "huge"), &[json!(2)]).await,
    );
    must(
        &format!("mark {huge}: write with token {top}"),
        store.append(&s, fence(top, "top"), &[json!(3)]).await,
    );
    must_be_fenced(
        &format!("mark {top}: write with token {}", top - 1),
        store
            .append(&s, fence(top - 1, "low"), &[json!("low")])
            .await,
        (top - 1, "low"),
        (top, "top"),
    );
    must(
        &format!("mark {top}: write with token {}", u64::MAX),
        store.append(&s, fence(u64::MAX, "max"), &[json!(4)]).await,
    );
    let state = format!("mark {}", u64::MAX);
    must_be_fenced(
        &format!("{state}: write with token {}", u64::MAX - 1),
        store
            .append(&s, fence(u64::MAX - 1, "low"), &[json!("low")])
            .await,
        (u64::MAX - 1, "low"),
        (u64::MAX, "max"),
    );
    must_be_fenced(
        &format!("{state}: delete with token {}", u64::MAX - 1),
        store.delete(&s, fence(u64::MAX - 1, "low")).await,
        (u64::MAX - 1, "low"),
        (u64::MAX, "max"),
    );
    assert_eq!(
        must("read the mark", store.high_water(&s).await).map(|t| t.get()),
        Some(u64::MAX),
        "{state}: the mark reads otherwise"
    );
    let tokens: Vec<_> = summary(&events(&*store, &state, &s).await)
        .into_iter()
        .map(|e| e.1)
        .collect();
    assert_eq!(
        tokens,
        [Some(9), Some(big), Some(huge), Some(top), Some(u64::MAX)],
        "{state}: the stored tokens are not the accepted ones"
    );
}

/// Rule 4: a deletion is fenced like an append — a lower token, or an
/// equal one from another writer, is refused and the session stays — and
/// the mark survives it. A deleted session is gone for every call and
/// client.
pub async fn delete_is_fenced<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("deleted");
    must("create", one.create(&s).await);
    must(
        "x writes with token 5",
        one.append(&s, fence(5, "x"), &[json!("x1")]).await,
    );
    let state = "session holding x's token-5 event";
    must_be_fenced(
        &format!("{state}: y deletes with token 4"),
        two.delete(&s, fence(4, "y")).await,
        (4, "y"),
        (5, "x"),
    );
    must_be_fenced(
        &format!("{state}: y deletes with token 5"),
        two.delete(&s, fence(5, "y")).await,
        (5, "y"),
        (5, "x"),
    );
    let read = events(&*two, &format!("{state}, after refused deletions"), &s).await;
    assert_eq!(
        payloads(&read),
        [json!("x1")],
        "{state}: a refused deletion changed the session"
    );
    assert_eq!(
        must("list", two.list().await),
        std::slice::from_ref(&s),
        "{state}: a refused deletion hid the session"
    );

    must(
        &format!("{state}: y deletes with token 6"),
        two.delete(&s, fence(6, "y")).await,
    );
    let state = "after y deleted the session with token 6";
    for (who, store) in [("the deleting client", &two), ("another client", &one)] {
        must_fail(
            &format!("{state}: {who} reads it"),
            store.read(&s, 1, 10).await,
            StoreErrorKind::NotFound,
        );
        must_fail(
            &format!("{state}: {who} appends with token 7"),
            store.append(&s, fence(7, "y"), &[json!("after")]).await,
            StoreErrorKind::NotFound,
        );
        must_fail(
            &format!("{state}: {who} deletes it again with token 7"),
            store.delete(&s, fence(7, "y")).await,
            StoreErrorKind::NotFound,
        );
        let listed = must("list", store.list().await);
        assert!(listed.is_empty(), "{state}: {who} still lists {listed:?}");
    }
    let fresh = f.store().await;
    assert_eq!(
        must("read the mark", fresh.high_water(&s).await).map(|t| t.get()),
        Some(6),
        "{state}: the mark did not survive the deletion (read by a client made afterwards)"
    );
}

/// Rule 4: a session created again after its deletion starts empty but
/// keeps its mark — the old owner stays refused — and never reuses a
/// sequence number.
pub async fn recreated_session_keeps_mark_and_numbers<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("reborn");
    must("create", one.create(&s).await);
    let r = must(
        "x writes three events with token 3",
        one.append(&s, fence(3, "x"), &[json!(1), json!(2), json!(3)])
            .await,
    );
    must(
        "y deletes with token 4",
        two.delete(&s, fence(4, "y")).await,
    );
    must("create the deleted session again", two.create(&s).await);
    let state = format!(
        "session created again after x wrote seqs 1..={} with token 3 and y deleted it with \
         token 4",
        r.last_seq
    );
    let read = events(&*one, &state, &s).await;
    assert!(read.is_empty(), "{state}: it holds {:?}", summary(&read));
    assert_eq!(
        must("read the mark", one.high_water(&s).await).map(|t| t.get()),
        Some(4),
        "{state}: the mark went back"
    );
    must_be_fenced(
        &format!("{state}: x appends with its token 3"),
        one.append(&s, fence(3, "x"), &[json!("late")]).await,
        (3, "x"),
        (4, "y"),
    );
    let new = must(
        &format!("{state}: y appends with token 4"),
        two.append(&s, fence(4, "y"), &[json!("new")]).await,
    );
    assert!(
        new.first_seq > r.last_seq,
        "{state}: the new event was numbered {}, reusing a sequence number",
        new.first_seq
    );
    let fresh = f.store().await;
    must_fail(
        &format!("{state}: a client made afterwards creates it"),
        fresh.create(&s).await,
        StoreErrorKind::AlreadyExists,
    );
    assert_eq!(
        summary(&events(&*fresh, &state, &s).await),
        [(new.first_seq, Some(4), json!("new"))],
        "{state}: a client made afterwards reads other events"
    );
}

/// Asserts `r` is `Unfenced` naming `mark` as the session's mark.
#[track_caller]
fn must_be_unfenced<T: Debug>(step: &str, r: Result<T, StoreError>, mark: Option<u64>) {
    match must_fail(step, r, StoreErrorKind::Unfenced) {
        StoreError::Unfenced { high_water, .. } => assert_eq!(
            high_water.map(|t| t.get()),
            mark,
            "{step}: the refusal names the wrong mark"
        ),
        other => panic!("{step}: an Unfenced kind carried by {other:?}"),
    }
}

/// Rule 2: a client not configured to allow unfenced writes refuses them,
/// appends and deletions, whatever the session holds; a client that
/// allows them (when the store can) accepts one on a session that never
/// took a fenced write, stored without a token.
pub async fn unfenced_refused_unless_allowed<F: StoreFactory>(f: &F) {
    let strict = f.store().await;
    let s = session("unfenced");
    must("create", strict.create(&s).await);
    let state = "a new session, through a client not allowing unfenced writes";
    must_be_unfenced(
        &format!("{state}: unfenced append"),
        strict.append(&s, WriteFence::Unfenced, &[json!(1)]).await,
        None,
    );
    must_be_unfenced(
        &format!("{state}: unfenced delete"),
        strict.delete(&s, WriteFence::Unfenced).await,
        None,
    );
    let read = events(&*strict, state, &s).await;
    assert!(
        read.is_empty(),
        "{state}: refused unfenced writes wrote {:?}",
        summary(&read)
    );

    let Some(lax) = f.unfenced_store().await else {
        return;
    };
    must(
        "a new session, through a client allowing unfenced writes: unfenced append",
        lax.append(&s, WriteFence::Unfenced, &[json!("u1")]).await,
    );
    let state = "after an unfenced write, through a client not allowing them";
    must_be_unfenced(
        &format!("{state}: unfenced append"),
        strict
            .append(&s, WriteFence::Unfenced, &[json!("u2")])
            .await,
        None,
    );
    assert_eq!(
        summary(&events(&*strict, state, &s).await),
        [(1, None, json!("u1"))],
        "{state}: the session holds other events than the one unfenced write"
    );
}

/// Rule 2: once a session accepted a fenced write, unfenced writes are
/// refused, naming the mark — also by a client that allows them, and also
/// when the session began with unfenced writes.
pub async fn unfenced_refused_once_fenced<F: StoreFactory>(f: &F) {
    let strict = f.store().await;
    let s = session("fenced");
    must("create", strict.create(&s).await);
    must(
        "x writes with token 3",
        strict.append(&s, fence(3, "x"), &[json!("f1")]).await,
    );
    let state = "session holding x's token-3 event";
    must_be_unfenced(
        &format!("{state}: unfenced append through a client not allowing them"),
        strict.append(&s, WriteFence::Unfenced, &[json!("u")]).await,
        Some(3),
    );
    if let Some(lax) = f.unfenced_store().await {
        must_be_unfenced(
            &format!("{state}: unfenced append through a client allowing them"),
            lax.append(&s, WriteFence::Unfenced, &[json!("u")]).await,
            Some(3),
        );
        must_be_unfenced(
            &format!("{state}: unfenced delete through a client allowing them"),
            lax.delete(&s, WriteFence::Unfenced).await,
            Some(3),
        );
        let t = session("began-unfenced");
        must("create", lax.create(&t).await);
        must(
            "unfenced append to a new session",
            lax.append(&t, WriteFence::Unfenced, &[json!("u1")]).await,
        );
        must(
            "after an unfenced write, x writes with token 3",
            strict.append(&t, fence(3, "x"), &[json!("f1")]).await,
        );
        let state = "session holding an unfenced event, then x's token-3 event";
        must_be_unfenced(
            &format!("{state}: unfenced append through a client allowing them"),
            lax.append(&t, WriteFence::Unfenced, &[json!("u2")]).await,
            Some(3),
        );
        assert_eq!(
            summary(&events(&*lax, state, &t).await),
            [(1, None, json!("u1")), (2, Some(3), json!("f1"))],
            "{state}: the session holds other events than were accepted"
        );
    }
    assert_eq!(
        payloads(&events(&*strict, state, &s).await),
        [json!("f1")],
        "{state}: a refused unfenced write changed the session"
    );
}

/// A conditional append ([`append_after`](session_store::SessionStore::append_after))
/// writes only onto the log it names, judged atomically with the fence:
/// onto a log that moved on it writes nothing and leaves the mark where it
/// was; the fence is still checked first; and of two clients racing onto
/// one position, exactly one writes.
pub async fn append_after_writes_only_onto_the_log_it_names<F: StoreFactory>(f: &F) {
    let (a, b) = (f.store().await, f.store().await);
    let s = session("conditional");
    must_fail(
        "an append after 0 to a session never created",
        a.append_after(&s, fence(1, "x"), 0, &[json!("no")]).await,
        StoreErrorKind::NotFound,
    );
    must("create", a.create(&s).await);
    let first = must(
        "x appends after 0 to an empty session",
        a.append_after(&s, fence(1, "x"), 0, &[json!(1), json!(2)])
            .await,
    );
    assert_eq!(
        first.map(|r| (r.first_seq, r.last_seq)),
        Some((1, 2)),
        "an append after 0 onto an empty session writes seqs 1 and 2"
    );

    let state = "after x appended events 1 and 2 with token 1";
    for after in [0, 1, 3] {
        let moved = must(
            state,
            b.append_after(&s, fence(5, "y"), after, &[json!("late")])
                .await,
        );
        assert!(
            moved.is_none(),
            "{state}: y appends after {after} through another client: expected nothing \
             written (the log ends at 2), but it wrote {moved:?}"
        );
    }
    // The refused writes carried token 5: had they raised the mark, x's
    // token 2 would be fenced now.
    must(
        &format!(
            "{state} and y's appends after other positions wrote nothing: x appends with token 2"
        ),
        a.append(&s, fence(2, "x"), &[json!(3)]).await,
    );
    must_be_fenced(
        "after x wrote with token 2: x appends with token 1 after 3, the log's end",
        b.append_after(&s, fence(1, "x"), 3, &[json!("stale")])
            .await,
        (1, "x"),
        (2, "x"),
    );
    assert_eq!(
        payloads(&events(a.as_ref(), "reading the log back", &s).await),
        [json!(1), json!(2), json!(3)],
        "after x's events 1 to 3 and refused conditional appends: the log"
    );

    unfenced_append_after_holds_its_position(f).await;

    // Two clients onto one position: one writes, the other is told the
    // log moved.
    let race = |store: Arc<dyn SessionStore>, name: &'static str| {
        let s = s.clone();
        tokio::spawn(async move {
            store
                .append_after(&s, fence(7, name), 3, &[json!(name)])
                .await
        })
    };
    let (ra, rb) = (race(a.clone(), "p"), race(b.clone(), "q"));
    let (ra, rb) = (ra.await.expect("no panic"), rb.await.expect("no panic"));
    let written: Vec<_> = [ra, rb]
        .into_iter()
        .filter_map(|r| match r {
            Ok(Some(receipt)) => Some(Ok(receipt.first_seq)),
            Ok(None) => None,
            // The loser may find the winner's equal token first: fenced.
            Err(e) if e.kind() == StoreErrorKind::Fenced => None,
            Err(e) => Some(Err(e.kind())),
        })
        .collect();
    assert_eq!(
        written,
        [Ok(4)],
        "p and q, with token 7 each, append after 3 at once: exactly one must write, at 4"
    );
}

/// Unfenced, where the store allows it, a conditional append keeps its
/// position all the same.
async fn unfenced_append_after_holds_its_position<F: StoreFactory>(f: &F) {
    if let Some(lax) = f.unfenced_store().await {
        let u = session("conditional-unfenced");
        must("create", lax.create(&u).await);
        let state = "on a session without a fenced write";
        let first = must(
            state,
            lax.append_after(&u, WriteFence::Unfenced, 0, &[json!(1)])
                .await,
        );
        assert_eq!(
            first.map(|r| r.first_seq),
            Some(1),
            "{state}: an unfenced append after 0"
        );
        let moved = must(
            state,
            lax.append_after(&u, WriteFence::Unfenced, 0, &[json!("late")])
                .await,
        );
        assert!(
            moved.is_none(),
            "{state}: an unfenced append after 0 onto a log ending at 1: expected nothing \
             written, but it wrote {moved:?}"
        );
    }
}
