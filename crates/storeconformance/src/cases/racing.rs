//! Writers racing on one session from clients of their own: the fence
//! check and the numbering are atomic with the write.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use session_store::{AppendReceipt, StoreErrorKind, WriteFence};
use tokio::sync::Barrier;

use crate::StoreFactory;
use crate::support::{events, fence, must, session, summary};

/// What one racing writer had accepted: its receipts with the batch each
/// carried, and how many of its appends were fenced.
#[derive(Debug, Default)]
struct Outcome {
    accepted: Vec<(AppendReceipt, Vec<Value>)>,
    fenced: usize,
}

/// Runs one writer per entry of `fences`, each on a client of its own,
/// all starting together; writer `w` appends `batches` batches made by
/// `batch(w, i)` under `fences[w](i)`. Anything but success or `Fenced`
/// fails the case.
async fn race<F: StoreFactory>(
    f: &F,
    s: &lease_port::SessionId,
    fences: Vec<Arc<dyn Fn(usize) -> WriteFence + Send + Sync>>,
    batches: usize,
    batch: fn(usize, usize) -> Vec<Value>,
) -> Vec<Outcome> {
    let barrier = Arc::new(Barrier::new(fences.len()));
    let mut tasks = Vec::new();
    for (w, fence_of) in fences.into_iter().enumerate() {
        let (store, barrier, s) = (f.store().await, Arc::clone(&barrier), s.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut out = Outcome::default();
            for i in 0..batches {
                let (fence, events) = (fence_of(i), batch(w, i));
                match store.append(&s, fence.clone(), &events).await {
                    Ok(r) => out.accepted.push((r, events)),
                    Err(e) if e.kind() == StoreErrorKind::Fenced => out.fenced += 1,
                    Err(e) => panic!(
                        "racing writer {w}, append {i} with {fence:?}: expected success or \
                         Fenced, got {:?}: {e}",
                        e.kind()
                    ),
                }
                tokio::task::yield_now().await;
            }
            out
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("a racing writer panicked"));
    }
    outcomes
}

/// Rule 1, raced: two writers of different ids present the same token to
/// a new session at once, batch after batch, each from its own client.
/// Exactly one wins: every append of one is accepted, every append of the
/// other refused, and the session holds the winner's events alone.
pub async fn racing_equal_tokens_one_writer_wins<F: StoreFactory>(f: &F) {
    const APPENDS: usize = 30;
    for round in 0..4 {
        let s = session(&format!("twins-{round}"));
        must("create", f.store().await.create(&s).await);
        let twins: Vec<Arc<dyn Fn(usize) -> WriteFence + Send + Sync>> =
            vec![Arc::new(|_| fence(7, "x")), Arc::new(|_| fence(7, "y"))];
        let out = race(f, &s, twins, APPENDS, |w, i| vec![json!({"w": w, "i": i})]).await;
        let counts: Vec<usize> = out.iter().map(|o| o.accepted.len()).collect();
        let state = format!(
            "round {round}: writers x and y raced {APPENDS} appends each with token 7 on a new \
             session"
        );
        assert!(
            counts == [APPENDS, 0] || counts == [0, APPENDS],
            "{state}: x had {} accepted, y {}; exactly one must win every append",
            counts[0],
            counts[1]
        );
        let winner = usize::from(counts[0] == 0);
        let read = events(&*f.store().await, &state, &s).await;
        let expected: Vec<_> = (0..APPENDS)
            .map(|i| (i as u64 + 1, Some(7), json!({"w": winner, "i": i})))
            .collect();
        assert_eq!(
            summary(&read),
            expected,
            "{state}: the session is not the winner's appends"
        );
    }
}

/// Rule 1, raced: a writer with a lower token and one with a higher token
/// append at once, batch after batch, each from its own client. The
/// higher is never refused, the lower is refused from the higher's first
/// write on, and every accepted batch is stored whole, in order, once.
pub async fn racing_lower_and_higher_tokens<F: StoreFactory>(f: &F) {
    const BATCHES: usize = 60;
    const PER_BATCH: usize = 3;
    let s = session("overtaken");
    must("create", f.store().await.create(&s).await);
    let fences: Vec<Arc<dyn Fn(usize) -> WriteFence + Send + Sync>> =
        vec![Arc::new(|_| fence(1, "old")), Arc::new(|_| fence(2, "new"))];
    let out = race(f, &s, fences, BATCHES, |w, i| {
        (0..PER_BATCH)
            .map(|j| json!({"w": w, "b": i, "j": j}))
            .collect()
    })
    .await;
    let state = format!(
        "old (token 1) and new (token 2) raced {BATCHES} batches of {PER_BATCH} each, {} of \
         old's accepted",
        out[0].accepted.len()
    );
    assert_eq!(
        out[1].fenced, 0,
        "{state}: the higher token was refused {} times",
        out[1].fenced
    );
    let read = events(&*f.store().await, &state, &s).await;
    assert_eq!(
        read.len(),
        (out[0].accepted.len() + BATCHES) * PER_BATCH,
        "{state}: the session holds {} events",
        read.len()
    );
    let first_new = read
        .iter()
        .position(|e| e.payload["w"] == 1)
        .unwrap_or(read.len());
    for (i, e) in read.iter().enumerate() {
        let new = e.payload["w"] == 1;
        assert!(
            new || i < first_new,
            "{state}: seq {} of the lower token landed after the higher wrote",
            e.seq
        );
        assert_eq!(
            e.seq,
            i as u64 + 1,
            "{state}: a gap or repeat before seq {}",
            e.seq
        );
        assert_eq!(
            e.token.map(|t| t.get()),
            Some(if new { 2 } else { 1 }),
            "{state}: seq {} carries another token than its writer's",
            e.seq
        );
        assert_eq!(
            e.payload["j"],
            json!(i % PER_BATCH),
            "{state}: a batch was split at seq {}",
            e.seq
        );
    }
}

/// Writers racing on one session never share a sequence number: clients
/// of one writer appending at once get receipts that tile the session
/// without overlap or gap, each naming where its batch was stored; and
/// writers with rising tokens of their own leave tokens that never go
/// down along the session.
pub async fn racing_writers_never_repeat_a_sequence_number<F: StoreFactory>(f: &F) {
    const WRITERS: usize = 3;
    const BATCHES: usize = 30;
    const PER_BATCH: usize = 2;
    let s = session("numbered");
    must("create", f.store().await.create(&s).await);
    let same: Vec<Arc<dyn Fn(usize) -> WriteFence + Send + Sync>> = (0..WRITERS)
        .map(|_| Arc::new(|_| fence(1, "w")) as Arc<_>)
        .collect();
    let out = race(f, &s, same, BATCHES, |w, i| {
        (0..PER_BATCH)
            .map(|j| json!({"w": w, "b": i, "j": j}))
            .collect()
    })
    .await;
    let state = format!(
        "{WRITERS} clients of one writer appended {BATCHES} batches of {PER_BATCH} at once"
    );
    let mut by_first = BTreeMap::new();
    for (w, o) in out.iter().enumerate() {
        assert_eq!(
            o.fenced, 0,
            "{state}: client {w} had appends fenced under its own writer's token"
        );
        for (r, batch) in &o.accepted {
            assert_eq!(
                r.last_seq - r.first_seq + 1,
                PER_BATCH as u64,
                "{state}: a batch of {PER_BATCH} got the receipt {r:?}"
            );
            if let Some((other, _)) = by_first.insert(r.first_seq, (*r, batch.clone())) {
                panic!("{state}: two batches got receipts {other:?} and {r:?}");
            }
        }
    }
    let mut next = 1;
    for (first, (r, _)) in &by_first {
        assert_eq!(
            *first, next,
            "{state}: the receipts overlap or leave a gap at {r:?}"
        );
        next = r.last_seq + 1;
    }
    let read = events(&*f.store().await, &state, &s).await;
    assert_eq!(
        read.len(),
        WRITERS * BATCHES * PER_BATCH,
        "{state}: the session holds {} events",
        read.len()
    );
    for (first, (r, batch)) in &by_first {
        let stored: Vec<_> = read
            .iter()
            .filter(|e| e.seq >= *first && e.seq <= r.last_seq)
            .map(|e| &e.payload)
            .collect();
        assert_eq!(
            stored,
            batch.iter().collect::<Vec<_>>(),
            "{state}: the receipt {r:?} does not name where its batch is"
        );
    }
    rising_tokens_race(f).await;
}

/// Two writers with interleaved rising tokens (one even, one odd) race on
/// a session: each accepted write is stored once, in one gapless run, and
/// the tokens along it never go down.
async fn rising_tokens_race<F: StoreFactory>(f: &F) {
    const APPENDS: usize = 60;
    let s = session("rising");
    must("create", f.store().await.create(&s).await);
    let rising: Vec<Arc<dyn Fn(usize) -> WriteFence + Send + Sync>> = vec![
        Arc::new(|i| fence(i as u64 * 2, "even")),
        Arc::new(|i| fence(i as u64 * 2 + 1, "odd")),
    ];
    let out = race(f, &s, rising, APPENDS, |w, i| vec![json!({"w": w, "i": i})]).await;
    let accepted: usize = out.iter().map(|o| o.accepted.len()).sum();
    let state =
        format!("two writers raced {APPENDS} appends each with rising tokens, {accepted} accepted");
    let read = events(&*f.store().await, &state, &s).await;
    assert_eq!(
        read.len(),
        accepted,
        "{state}: the session holds {} events",
        read.len()
    );
    for (i, e) in read.iter().enumerate() {
        assert_eq!(
            e.seq,
            i as u64 + 1,
            "{state}: a gap or repeat before seq {}",
            e.seq
        );
    }
    let tokens: Vec<u64> = read
        .iter()
        .filter_map(|e| e.token.map(|t| t.get()))
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "{state}: a lower token was stored after a higher one: {tokens:?}"
    );
}
