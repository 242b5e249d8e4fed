//! A run's agent sees exactly the transcript its store holds, although the
//! engine keeps what it read for the next run: another process appending
//! between two runs, the session deleted and created again (with or without
//! new events), and a cache too small to keep the session all give the
//! agent the store's events up to its claim, no more, no less.
//!
//! An agent that reads less than the whole session gets less, and its run
//! reads no more than that from the store however long the session is:
//! the claim alone, or what follows the newest checkpoint, found without
//! reading from the start, cached or not.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{KeeperErrorKind, LeaseKeeper};
use lease_port::FencingToken;
use lease_port::{OwnerId, SessionId, SessionLease};
use mecated::agent::{Agent, AgentError, CHECKPOINT_TYPE, EventSink, TranscriptScope, Turn};
use mecated::engine::{Engine, EngineError, Exclusivity, RUN_ENDED, RunStatus};
use mecated::metrics::Metrics;
use memlease::MemLease;
use serde_json::{Value, json};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

use crate::support::counting_store::CountingStore;

const TTL: Duration = Duration::from_secs(15);

/// Records the transcript of every run, then replies once; an input
/// starting with "checkpoint" is first written down as a checkpoint.
#[derive(Debug, Default)]
struct Recorder {
    scope: TranscriptScope,
    seen: Mutex<Vec<Vec<Value>>>,
}

#[async_trait]
impl Agent for Recorder {
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        self.seen.lock().unwrap().push(turn.transcript.to_vec());
        if turn
            .input
            .as_str()
            .is_some_and(|i| i.starts_with("checkpoint"))
        {
            sink.emit(json!({"type": CHECKPOINT_TYPE, "summary": turn.input}))
                .await?;
        }
        sink.emit(json!({"type": "message", "content": turn.input}))
            .await?;
        Ok(())
    }

    fn transcript_scope(&self) -> TranscriptScope {
        self.scope
    }
}

struct Process {
    engine: Engine,
    store: Arc<CountingStore>,
    agent: Arc<Recorder>,
}

/// One server process: its own store instance on `dir` (its own open files
/// and caches), the lease service shared by all.
fn process(dir: &std::path::Path, leases: &MemLease, owner: &str, cache_bytes: usize) -> Process {
    scoped_process(dir, leases, owner, cache_bytes, TranscriptScope::Full)
}

fn scoped_process(
    dir: &std::path::Path,
    leases: &MemLease,
    owner: &str,
    cache_bytes: usize,
    scope: TranscriptScope,
) -> Process {
    let store = Arc::new(CountingStore::new(
        JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap(),
    ));
    let backend: Arc<dyn SessionLease> = Arc::new(leases.clone());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new(owner).unwrap(), TTL)
        .allow_unleased(false)
        .build()
        .unwrap();
    let agent = Arc::new(Recorder {
        scope,
        ..Recorder::default()
    });
    let engine = Engine::new(
        Arc::clone(&store) as Arc<dyn SessionStore>,
        keeper,
        Arc::clone(&agent) as Arc<dyn Agent>,
        Arc::new(Metrics::default()),
        Exclusivity::Leased,
    )
    .with_transcript_cache_bytes(cache_bytes);
    Process {
        engine,
        store,
        agent,
    }
}

impl Process {
    /// Runs `session` to completion; the transcript its agent was given
    /// and the sequence number of its claim.
    async fn run(&self, session: &SessionId, input: &str) -> (Vec<Value>, u64) {
        // A deletion by another process releases its lease on a task of
        // its own: the session may still be leased there for a moment.
        let mut tries = 0;
        let run = loop {
            match self.engine.start_run(session.clone(), json!(input)).await {
                Ok(run) => break run,
                Err(EngineError::Lease(e))
                    if matches!(
                        e.kind(),
                        KeeperErrorKind::LeasedElsewhere | KeeperErrorKind::Busy
                    ) && tries < 500 =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("run {input:?}: {e}"),
            }
        };
        let claim = run.first_seq;
        let end = run.end.await.unwrap();
        assert_eq!(end.status, RunStatus::Completed);
        let seen = self.agent.seen.lock().unwrap().last().cloned().unwrap();
        (seen, claim)
    }

    /// The store's transcript up to and including event `through`, read
    /// whole.
    async fn stored(&self, session: &SessionId, through: u64) -> Vec<Value> {
        let mut out = Vec::new();
        let mut from = 1;
        loop {
            let page = self.store.read(session, from, 3).await.unwrap();
            out.extend(
                page.events
                    .into_iter()
                    .filter(|e| e.seq <= through)
                    .map(|e| e.payload),
            );
            match page.next_seq {
                Some(n) => from = n,
                None => return out,
            }
        }
    }

    /// Runs `session` and checks its agent saw exactly the store's events
    /// through its claim; returns how many that was.
    async fn run_and_check(&self, session: &SessionId, input: &str) -> usize {
        let (seen, claim) = self.run(session, input).await;
        let stored = self.stored(session, claim).await;
        assert_eq!(
            seen, stored,
            "run {input:?}: the agent's transcript is not the store's"
        );
        assert_eq!(seen.last().unwrap()["type"], "run_started");
        seen.len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_appending_between_runs_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let a = process(dir.path(), &leases, "a", 1 << 20);
    let b = process(dir.path(), &leases, "b", 1 << 20);
    let s = SessionId::new("chat").unwrap();
    a.engine.create_session(&s).await.unwrap();

    assert_eq!(a.run_and_check(&s, "a1").await, 1);
    // Every run leaves its claim, its reply and its end.
    assert_eq!(a.run_and_check(&s, "a2").await, 4);
    assert!(
        a.engine.transcript_cache_usage().1 == 1,
        "a keeps the session"
    );
    // b runs twice in between: a's next run must see both.
    assert_eq!(b.run_and_check(&s, "b1").await, 7);
    assert_eq!(b.run_and_check(&s, "b2").await, 10);
    assert_eq!(a.run_and_check(&s, "a3").await, 13);
    // Nothing in between: a's cache alone plus its own reply.
    assert_eq!(a.run_and_check(&s, "a4").await, 16);
    let inputs: Vec<Value> = a
        .stored(&s, u64::MAX)
        .await
        .iter()
        .filter(|e| e["type"] == "message")
        .map(|e| e["content"].clone())
        .collect();
    assert_eq!(inputs, ["a1", "a2", "b1", "b2", "a3", "a4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_and_created_again_is_read_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let a = process(dir.path(), &leases, "a", 1 << 20);
    let b = process(dir.path(), &leases, "b", 1 << 20);
    let s = SessionId::new("chat").unwrap();
    a.engine.create_session(&s).await.unwrap();
    a.run_and_check(&s, "old 1").await;
    a.run_and_check(&s, "old 2").await;

    // Deleted and created again elsewhere, nothing written since: the new
    // session holds only a's next claim, numbered after the old events.
    b.engine.delete_session(&s).await.unwrap();
    b.engine.create_session(&s).await.unwrap();
    let (seen, claim) = a.run(&s, "new 1").await;
    assert_eq!(seen, a.stored(&s, claim).await);
    assert_eq!(seen.len(), 1, "only the claim: {seen:?}");
    assert!(claim > 4, "sequence numbers are not reused");

    // Deleted and created again, then run elsewhere (as many events as
    // before): still the new session only.
    b.engine.delete_session(&s).await.unwrap();
    b.engine.create_session(&s).await.unwrap();
    b.run_and_check(&s, "other 1").await;
    assert_eq!(a.run_and_check(&s, "new 2").await, 4);
    let seen = a.agent.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(seen[1]["content"], "other 1");

    // Deleted and created again by the same process: read afresh too.
    a.engine.delete_session(&s).await.unwrap();
    a.engine.create_session(&s).await.unwrap();
    assert_eq!(a.run_and_check(&s, "own").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_too_small_for_the_session_keeps_nothing_and_runs_stay_right() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    for budget in [0, 600] {
        let p = process(dir.path(), &leases, &format!("p{budget}"), budget);
        let s = SessionId::new(format!("chat-{budget}")).unwrap();
        p.engine.create_session(&s).await.unwrap();
        for (i, expected) in [1, 4, 7, 10, 13].into_iter().enumerate() {
            assert_eq!(p.run_and_check(&s, &format!("r{i}")).await, expected);
            let (bytes, _) = p.engine.transcript_cache_usage();
            assert!(
                bytes <= budget,
                "{bytes} bytes kept under a budget of {budget}"
            );
        }
        // Past the budget the session is no longer kept at all.
        assert_eq!(p.engine.transcript_cache_usage(), (0, 0), "budget {budget}");
    }
}

/// Writes `n` events to `session` under token 0 (below every token the
/// leases hand out), a checkpoint at each position of `checkpoints`
/// (1-based), then an end, as an earlier run's; the sequence numbers of
/// those checkpoints.
async fn seed(p: &Process, session: &SessionId, n: usize, checkpoints: &[usize]) -> Vec<u64> {
    p.engine.create_session(session).await.unwrap();
    let events: Vec<Value> = (1..=n)
        .map(|i| {
            if checkpoints.contains(&i) {
                json!({"type": CHECKPOINT_TYPE, "summary": format!("up to {i}")})
            } else {
                json!({"type": "message", "content": format!("earlier {i}")})
            }
        })
        .chain([json!({"type": RUN_ENDED, "status": "completed"})])
        .collect();
    let fence = WriteFence::new(FencingToken::new(0), OwnerId::new("seed").unwrap());
    let mut seqs = Vec::new();
    for chunk in events.chunks(500) {
        let receipt = p.store.append(session, fence.clone(), chunk).await.unwrap();
        seqs.extend(receipt.first_seq..receipt.first_seq + chunk.len() as u64);
    }
    checkpoints.iter().map(|&i| seqs[i - 1]).collect()
}

/// The events of `session` numbered `from..=through`, read whole.
async fn stored_from(p: &Process, session: &SessionId, from: u64, through: u64) -> Vec<Value> {
    let mut out = Vec::new();
    let mut next = Some(from);
    while let Some(at) = next {
        let page = p.store.inner.read(session, at, 1000).await.unwrap();
        out.extend(
            page.events
                .into_iter()
                .filter(|e| e.seq <= through)
                .map(|e| e.payload),
        );
        next = page.next_seq.filter(|&n| n <= through);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_reads_no_history_is_handed_and_reads_only_its_claim() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let p = scoped_process(dir.path(), &leases, "p", 0, TranscriptScope::ClaimOnly);
    let s = SessionId::new("long").unwrap();
    seed(&p, &s, 3_000, &[]).await;
    for input in ["first", "second"] {
        let before = p.store.events_read();
        let (seen, claim) = p.run(&s, input).await;
        let read = p.store.events_read() - before;
        assert_eq!(seen, stored_from(&p, &s, claim, claim).await);
        assert_eq!(seen[0]["type"], "run_started");
        // The session's existence check and the claim: one event each.
        assert!(read <= 4, "{read} events read for a run on 3,000");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reading_since_its_checkpoint_reads_no_further_back_uncached() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let p = scoped_process(
        dir.path(),
        &leases,
        "p",
        0,
        TranscriptScope::SinceCheckpoint,
    );
    let s = SessionId::new("long").unwrap();
    let checkpoints = seed(&p, &s, 3_000, &[700, 2_400]).await;
    let newest = checkpoints[1];
    let before = p.store.events_read();
    let (seen, claim) = p.run(&s, "after").await;
    let read = p.store.events_read() - before;
    assert_eq!(seen, stored_from(&p, &s, newest, claim).await);
    assert_eq!(seen[0]["summary"], "up to 2400");
    let handed = claim - newest + 1;
    // Reading backwards from the claim, in windows that double from 256,
    // overshoots by less than the last window.
    assert!(
        read < 2 * handed + 256 + 4,
        "{read} events read to hand {handed} of 3,000"
    );

    // No checkpoint: everything. Deleted and created again: the old
    // life's checkpoints are not the new one's.
    let plain = SessionId::new("plain").unwrap();
    seed(&p, &plain, 600, &[]).await;
    let (seen, claim) = p.run(&plain, "x").await;
    assert_eq!(seen, stored_from(&p, &plain, 1, claim).await);
    assert_eq!(seen.len(), 602, "600 seeded, their end and the claim");
    p.engine.delete_session(&s).await.unwrap();
    p.engine.create_session(&s).await.unwrap();
    let (seen, _) = p.run(&s, "reborn").await;
    assert_eq!(seen.len(), 1, "only the claim: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_a_run_writes_is_where_later_runs_start_cached_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let scope = TranscriptScope::SinceCheckpoint;
    let cached = scoped_process(dir.path(), &leases, "cached", 1 << 20, scope);
    let uncached = scoped_process(dir.path(), &leases, "uncached", 0, scope);
    let s = SessionId::new("chat").unwrap();
    cached.engine.create_session(&s).await.unwrap();
    assert_eq!(cached.run_and_check(&s, "r1").await, 1);
    assert_eq!(cached.run_and_check(&s, "r2").await, 4);
    cached.run(&s, "checkpoint one").await;
    assert_eq!(cached.engine.transcript_cache_usage().1, 1);
    // The checkpoint is the 8th event: claims of later runs see it first.
    for (p, input) in [(&cached, "r4"), (&uncached, "r5"), (&cached, "r6")] {
        let (seen, claim) = p.run(&s, input).await;
        assert_eq!(seen, stored_from(p, &s, 8, claim).await, "run {input}");
        assert_eq!(seen[0]["summary"], "checkpoint one", "run {input}");
    }
}

/// A holder paused past its lease between its claim and the transcript
/// read finds a later owner's events after its claim: its agent is never
/// handed them, nor their token, whatever the scope and the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_after_the_claim_are_never_handed_to_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    for scope in [TranscriptScope::Full, TranscriptScope::SinceCheckpoint] {
        for budget in [0, 1 << 20] {
            let name = format!("{scope:?}-{budget}");
            let p = scoped_process(dir.path(), &leases, &name, budget, scope);
            let s = SessionId::new(format!("chat-{name}")).unwrap();
            p.engine.create_session(&s).await.unwrap();
            p.run_and_check(&s, "r1").await;
            let mark = p.store.high_water(&s).await.unwrap().unwrap().get();
            let thief =
                WriteFence::new(FencingToken::new(mark + 10), OwnerId::new("thief").unwrap());
            p.store.append_before_next_read(
                thief,
                vec![
                    json!({"type": "run_started", "owner": "thief", "token": mark + 10}),
                    json!({"type": CHECKPOINT_TYPE, "summary": "the thief's"}),
                    json!({"type": "message", "content": "the thief's"}),
                ],
            );
            let run = p.engine.start_run(s.clone(), json!("r2")).await.unwrap();
            let claim = run.first_seq;
            drop(run.events);
            // Its writes are fenced off now; how the run ends is not the
            // point.
            let _ = run.end.await.unwrap();
            let seen = p.agent.seen.lock().unwrap().last().cloned().unwrap();
            // No checkpoint before the claim: both scopes hand everything.
            assert_eq!(seen, stored_from(&p, &s, 1, claim).await, "{name}");
            assert_eq!(seen.last().unwrap()["owner"], name.as_str(), "{name}");
        }
    }
}

/// A session cached here long ago and summed up since by another owner's
/// checkpoint: the next run here reads back to that checkpoint, not
/// forward from the old cache entry through everything since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_cache_entry_is_not_read_forward_past_a_newer_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let p = scoped_process(
        dir.path(),
        &leases,
        "p",
        1 << 20,
        TranscriptScope::SinceCheckpoint,
    );
    let s = SessionId::new("chat").unwrap();
    p.engine.create_session(&s).await.unwrap();
    p.run_and_check(&s, "r1").await;
    assert_eq!(p.engine.transcript_cache_usage().1, 1);
    // Another owner writes 3,000 events, summed up near their end.
    let mark = p.store.high_water(&s).await.unwrap().unwrap().get();
    let other = WriteFence::new(FencingToken::new(mark + 1), OwnerId::new("other").unwrap());
    // Their run ended, as runs do: its end is what the next claim reads.
    let events: Vec<Value> = (0..3_000)
        .map(|i| match i {
            2_990 => json!({"type": CHECKPOINT_TYPE, "summary": "theirs"}),
            2_999 => json!({"type": RUN_ENDED, "status": "completed"}),
            _ => json!({"type": "message", "content": format!("theirs {i}")}),
        })
        .collect();
    for chunk in events.chunks(500) {
        p.store
            .inner
            .append(&s, other.clone(), chunk)
            .await
            .unwrap();
    }
    let before = p.store.events_read();
    let (seen, claim) = p.run(&s, "r2").await;
    let read = p.store.events_read() - before;
    assert_eq!(seen[0]["summary"], "theirs");
    let checkpoint = claim + 1 - seen.len() as u64;
    assert_eq!(seen, stored_from(&p, &s, checkpoint, claim).await);
    assert!(
        read < 300,
        "{read} events read to hand {} of 3,000",
        seen.len()
    );
}

/// Each stored event's type and, for an end, its status.
fn types_and_statuses(log: &[Value]) -> Vec<(&str, Option<&str>)> {
    log.iter()
        .map(|e| (e["type"].as_str().unwrap(), e["status"].as_str()))
        .collect()
}

/// The earlier owner started another run, and its `run_started` was on
/// its way when the next owner read a log that ended with that owner's
/// orderly end: it lands just before the next owner's claim. The claim is
/// written only onto the log as read, so it is not written after the
/// unseen start; the next owner fences the earlier one out, ends its run
/// as interrupted, and only then starts its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_owners_start_landing_late_is_ended_before_the_next_claim() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let p = process(dir.path(), &leases, "p", 0);
    let s = SessionId::new("late-start").unwrap();
    p.engine.create_session(&s).await.unwrap();
    let old = WriteFence::new(FencingToken::new(0), OwnerId::new("old").unwrap());
    let ended = [
        json!({"type": "run_started", "owner": "old", "token": 0, "input": "x"}),
        json!({"type": "message", "role": "assistant", "content": "x"}),
        json!({"type": RUN_ENDED, "status": "completed"}),
    ];
    p.store.inner.append(&s, old.clone(), &ended).await.unwrap();
    p.store.append_before_next_append(
        old,
        vec![json!({"type": "run_started", "owner": "old", "token": 0, "input": "y"})],
    );
    p.run(&s, "next").await;

    let log = p.stored(&s, u64::MAX).await;
    let kinds = types_and_statuses(&log);
    assert_eq!(
        kinds,
        [
            ("run_started", None),
            ("message", None),
            ("run_ended", Some("completed")),
            ("run_started", None),
            ("takeover", None),
            ("run_ended", Some("interrupted")),
            ("run_started", None),
            ("message", None),
            ("run_ended", Some("completed")),
        ],
        "{log:#?}"
    );
    assert_eq!(log[5]["run_seq"], 4, "{log:#?}");
    assert_eq!(log[6]["input"], "next", "{log:#?}");
}

/// The earlier owner's end was on its way when the next owner read the
/// log (a holder paused between its lease check and its write): it lands
/// before the next owner's first write. That first write is a `takeover`
/// that fences the earlier owner out, and only then is the earlier run
/// judged: it ended, so it is not ended a second time as interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_owners_end_landing_late_is_not_followed_by_a_second_end() {
    let dir = tempfile::tempdir().unwrap();
    let leases = MemLease::new(TTL);
    let p = process(dir.path(), &leases, "p", 0);
    let s = SessionId::new("late").unwrap();
    p.engine.create_session(&s).await.unwrap();
    let old = WriteFence::new(FencingToken::new(0), OwnerId::new("old").unwrap());
    let opened = [
        json!({"type": "run_started", "owner": "old", "token": 0, "input": "x"}),
        json!({"type": "progress", "step": 1, "of": 2}),
    ];
    p.store
        .inner
        .append(&s, old.clone(), &opened)
        .await
        .unwrap();
    p.store
        .append_before_next_append(old, vec![json!({"type": RUN_ENDED, "status": "completed"})]);
    p.run(&s, "next").await;

    let log = p.stored(&s, u64::MAX).await;
    let kinds = types_and_statuses(&log);
    assert_eq!(
        kinds,
        [
            ("run_started", None),
            ("progress", None),
            ("run_ended", Some("completed")),
            ("takeover", None),
            ("run_started", None),
            ("message", None),
            ("run_ended", Some("completed")),
        ],
        "{log:#?}"
    );
}
