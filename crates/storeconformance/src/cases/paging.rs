//! Reading a session page by page, and listing sessions page by page —
//! alone and while others write.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lease_port::SessionId;
use serde_json::json;
use session_store::{ListCursor, MAX_LIST_LIMIT, SessionStore, StoredEvent};

use crate::StoreFactory;
use crate::support::{events_paged, fence, must, payloads, promptly, session};

/// Pages of a session: at most `limit` events from `from_seq` on, in
/// order; `next_seq` right after the page while more follow, `None` at
/// the end; past the end an empty page. Walking the pages with any limit,
/// from any client, reads every event exactly once.
pub async fn read_paging<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("pages");
    must("create", one.create(&s).await);
    for i in 1..=10 {
        must("append", one.append(&s, fence(1, "a"), &[json!(i)]).await);
    }
    let state = "session of events 1..=10, one per append";
    let page = must(
        &format!("{state}: read 3 from seq 4"),
        two.read(&s, 4, 3).await,
    );
    let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
    assert!(
        !seqs.is_empty() && seqs.len() <= 3 && seqs.iter().copied().eq(4..4 + seqs.len() as u64),
        "{state}: reading 3 from seq 4 gave seqs {seqs:?}"
    );
    assert_eq!(
        page.next_seq,
        Some(4 + seqs.len() as u64),
        "{state}: reading 3 from seq 4 gave seqs {seqs:?} and next_seq {:?}",
        page.next_seq
    );
    let tail = events_paged(&*two, &format!("{state}: from seq 9"), &s, 9, 3).await;
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [9, 10],
        "{state}: walking pages of 3 from seq 9 read other events"
    );
    for from in [11, 12, 99, u64::MAX] {
        let page = must(
            &format!("{state}: read from seq {from}"),
            two.read(&s, from, 3).await,
        );
        assert!(
            page.events.is_empty() && page.next_seq.is_none(),
            "{state}: reading past the end from seq {from} gave {page:?}"
        );
    }
    let page = must(
        &format!("{state}: read 1 from seq 0"),
        two.read(&s, 0, 1).await,
    );
    assert_eq!(
        page.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1],
        "{state}: reading 1 from seq 0 must give the first event alone"
    );
    let expected: Vec<_> = (1..=10).map(|i| json!(i)).collect();
    for limit in [1, 2, 3, 7, 10, 11, 1000, usize::MAX] {
        for (who, store) in [("the writer", &one), ("another client", &two)] {
            let read = events_paged(&**store, &format!("{state}: {who}"), &s, 1, limit).await;
            assert_eq!(
                payloads(&read),
                expected,
                "{state}: {who} walking pages of {limit} read other events"
            );
        }
    }
}

/// Pages read while another client appends: reading on from where the
/// last read ended always ends on a batch boundary (batches are atomic
/// for readers too), and the events read form one gapless run from seq 1
/// in the order written, which a walk from seq 1 reads again unchanged.
pub async fn paging_under_concurrent_appends<F: StoreFactory>(f: &F) {
    const BATCHES: usize = 60;
    const PER_BATCH: usize = 4;
    let (reader, writer) = (f.store().await, f.store().await);
    let s = session("appended-while-read");
    must("create", writer.create(&s).await);
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let appending = tokio::spawn({
        let (s, stop) = (s.clone(), Arc::clone(&stop.0));
        async move {
            for b in 0..BATCHES {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let batch: Vec<_> = (0..PER_BATCH).map(|j| json!({"b": b, "j": j})).collect();
                must(
                    "append while a reader pages",
                    writer.append(&s, fence(1, "w"), &batch).await,
                );
                tokio::task::yield_now().await;
            }
        }
    });
    let written = |i: usize| json!({"b": i / PER_BATCH, "j": i % PER_BATCH});
    let check = |state: &str, read: &[StoredEvent]| {
        for (i, e) in read.iter().enumerate() {
            assert_eq!(
                e.seq,
                i as u64 + 1,
                "{state}: a gap or repeat before seq {}",
                e.seq
            );
            assert_eq!(
                e.payload,
                written(i),
                "{state}: seq {} is not the event written there",
                e.seq
            );
        }
    };
    let mut read: Vec<StoredEvent> = Vec::new();
    for reads in 0.. {
        let done = appending.is_finished();
        let from = read.len() as u64 + 1;
        let state =
            format!("read {reads}, from seq {from}, while batches of {PER_BATCH} are appended");
        read.extend(events_paged(&*reader, &state, &s, from, 3).await);
        assert_eq!(
            read.len() % PER_BATCH,
            0,
            "{state}: the read ended inside a batch, at seq {}",
            read.len()
        );
        check(&state, &read);
        if reads % 10 == 0 || done {
            let again =
                events_paged(&*reader, &format!("{state}, then from seq 1"), &s, 1, 3).await;
            assert!(
                again.len() >= read.len(),
                "{state}: reading from seq 1 again found fewer events"
            );
            check(&format!("{state}, then from seq 1"), &again);
        }
        if done {
            break;
        }
        // A store whose reads never wait would otherwise keep this worker
        // from the appending task.
        tokio::task::yield_now().await;
    }
    appending.await.expect("the appending task panicked");
    let all = events_paged(&*reader, "after every batch was appended", &s, 1, 3).await;
    assert_eq!(
        all.len(),
        BATCHES * PER_BATCH,
        "after every batch was appended, a walk read {} events",
        all.len()
    );
}

/// Every page of the listing, `limit` sessions at a time, with the page
/// rules checked: at most `limit` sessions, sorted, a cursor naming the
/// page's last session that survives its text form.
async fn walk(store: &dyn SessionStore, state: &str, limit: usize) -> Vec<SessionId> {
    let mut out: Vec<SessionId> = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let step = format!(
            "{state}: list a page of {limit} after {:?}",
            after.as_ref().map(ListCursor::last)
        );
        let page = must(
            &step,
            promptly(&step, store.list_page(after.as_ref(), limit)).await,
        );
        assert!(
            page.sessions.len() <= limit,
            "{step}: {} sessions",
            page.sessions.len()
        );
        out.extend(page.sessions.iter().cloned());
        match page.next {
            None => return out,
            Some(next) => {
                assert_eq!(
                    Some(next.last()),
                    page.sessions.last(),
                    "{step}: the cursor does not name the page's last session"
                );
                let text = next.encode();
                after = Some(must(&step, ListCursor::decode(&text)));
            }
        }
    }
}

/// Listing pages: every live session exactly once, in id order, for any
/// page size and from any client; deleted sessions left out, also a run
/// of them longer than a page; a cursor past every session ends the
/// listing.
pub async fn listing_pages<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let mut ids: Vec<SessionId> = (0..14).map(|i| session(&format!("s-{i:02}"))).collect();
    for name in [
        "Upper Case/é",
        "A",
        "a",
        "a b",
        "a{x}",
        "a%7B",
        &"l".repeat(200),
        &format!("k{}", "y".repeat(200)),
    ] {
        ids.push(session(name));
    }
    for id in &ids {
        must(&format!("create {id:?}"), one.create(id).await);
    }
    let gone: Vec<SessionId> = (3..9).map(|i| session(&format!("s-{i:02}"))).collect();
    for id in &gone {
        must(
            &format!("delete {id:?}"),
            two.delete(id, fence(1, "a")).await,
        );
    }
    ids.retain(|i| !gone.contains(i));
    ids.sort();
    let state = format!("{} sessions, six in a row deleted", ids.len());
    for limit in [1, 2, 3, 5, ids.len(), ids.len() + 1, MAX_LIST_LIMIT] {
        for (who, store) in [("the creating client", &one), ("another client", &two)] {
            assert_eq!(
                walk(&**store, &format!("{state}, {who}"), limit).await,
                ids,
                "{state}: {who} listing pages of {limit} lists other sessions"
            );
        }
    }
    assert_eq!(
        must("list", two.list().await),
        ids,
        "{state}: list() disagrees with the pages"
    );
    let fresh = f.store().await;
    assert_eq!(
        walk(&*fresh, &format!("{state}, a client made afterwards"), 4).await,
        ids,
        "{state}: a client made afterwards lists other sessions"
    );
    let beyond = ListCursor::after(session(&"\u{10ffff}".repeat(8)));
    let page = must(
        &format!("{state}: list after a cursor past every session"),
        one.list_page(Some(&beyond), 10).await,
    );
    assert!(
        page.sessions.is_empty() && page.next.is_none(),
        "{state}: a cursor past every session gave {page:?}"
    );
}

/// Stops a background task when the case ends, also by a panic.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A bound on the churn, should the listing never end.
const MAX_CHURN_ROUNDS: u64 = 100_000;

/// Listing pages while another client creates and deletes sessions among
/// them: every session that exists throughout is listed exactly once, in
/// order, whatever the page size.
pub async fn listing_under_concurrent_changes<F: StoreFactory>(f: &F) {
    const IDS: u64 = 90;
    let (lister, churner) = (f.store().await, f.store().await);
    let id = |i: u64| session(&format!("k-{i:03}"));
    // Stable sessions every third id; the churn takes the ids between, so
    // creations and deletions land before, inside and after every page.
    let stable: BTreeSet<SessionId> = (0..IDS).step_by(3).map(id).collect();
    for s in &stable {
        must(&format!("create {s:?}"), lister.create(s).await);
    }
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let churned = Arc::new(AtomicU64::new(0));
    let churn = tokio::spawn({
        let stop = Arc::clone(&stop.0);
        let churned = Arc::clone(&churned);
        async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) && round < MAX_CHURN_ROUNDS {
                for i in (0..IDS).filter(|i| i % 3 != 0) {
                    if (i + round).is_multiple_of(2) {
                        let _ = churner.create(&id(i)).await;
                    } else {
                        // Every deletion raises its own mark: fences only rise.
                        let _ = churner.delete(&id(i), fence(round + 1, "churn")).await;
                    }
                }
                round += 1;
                churned.store(round, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            round
        }
    });
    // Every page size twice, and on until a round of churn has run beside
    // the listings: a slow store (one that syncs each change) may take
    // longer over one round than the listings over their passes.
    let passes = [1, 4, 7, 50]
        .into_iter()
        .flat_map(|limit| [(limit, 0), (limit, 1)]);
    let more = (2..2_000).map(|pass| (7, pass));
    for (limit, pass) in passes.chain(more) {
        if pass >= 2 && churned.load(Ordering::Relaxed) > 0 {
            break;
        }
        {
            let state = format!(
                "pass {pass} with pages of {limit}, while sessions between are created and deleted"
            );
            tokio::task::yield_now().await;
            let listed = walk(&*lister, &state, limit).await;
            assert!(
                listed.windows(2).all(|w| w[0] < w[1]),
                "{state}: sessions out of order or listed twice: {listed:?}"
            );
            let seen: BTreeSet<SessionId> = listed.into_iter().collect();
            let missing: Vec<_> = stable.difference(&seen).collect();
            assert!(
                missing.is_empty(),
                "{state}: sessions present throughout were not listed: {missing:?}"
            );
        }
    }
    drop(stop);
    let rounds = churn.await.expect("the churning task panicked");
    assert!(rounds > 0, "the churn never ran while the listings did");
}
