//! The transcript cache's budget bounds memory as the allocator hands it
//! out, not an idealised size of the events: every byte the cache's
//! transcripts take from the heap is counted against it. A binary of its
//! own, since it measures the process's whole heap.

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::LeaseKeeper;
use lease_port::{FencingToken, OwnerId, SessionId, SessionLease};
use mecated::agent::{Agent, AgentError, EventSink, Turn};
use mecated::engine::{Engine, Exclusivity, RunStatus};
use mecated::metrics::Metrics;
use memlease::MemLease;
use serde_json::{Value, json};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static HEAP: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Reads its whole transcript (the default scope) and replies once.
#[derive(Debug)]
struct Reader;

#[async_trait]
impl Agent for Reader {
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        sink.emit(json!({"type": "message", "seen": turn.transcript.len()}))
            .await?;
        Ok(())
    }
}

/// Events of the shapes a conversation holds: small objects mostly, now
/// and then a large one with a list.
fn history(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| match i % 10 {
            9 => {
                let fields: serde_json::Map<String, Value> = (0..30)
                    .map(|k| (format!("field-{k}"), json!(format!("value {i} {k}"))))
                    .collect();
                json!({"type": "tool_result", "fields": fields, "ids": (0..10).collect::<Vec<_>>()})
            }
            _ => json!({"type": "message", "role": "user", "content": "x".repeat(20 + i % 180)}),
        })
        .collect()
}

async fn run(engine: &Engine, session: &SessionId) {
    let run = engine
        .start_run(session.clone(), json!("go"))
        .await
        .unwrap();
    drop(run.events);
    assert_eq!(run.end.await.unwrap().status, RunStatus::Completed);
}

/// Runs every session once with the cache off (so everything else is as
/// large as it will be: the store's index, the lease), then once with it
/// on; what the cache counts, what the heap grew by in the second pass,
/// and how many sessions it kept.
fn cache_against_heap(sessions: usize, events: usize) -> (i64, i64, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            JsonlStore::open(
                dir.path(),
                JsonlOptions::default().fsync(FsyncPolicy::Never),
            )
            .unwrap(),
        );
        let ttl = Duration::from_secs(30);
        let leases: Arc<dyn SessionLease> = Arc::new(MemLease::new(ttl));
        let keeper = LeaseKeeper::builder(leases, OwnerId::new("memory").unwrap(), ttl)
            .allow_unleased(false)
            .build()
            .unwrap();
        let engine = Engine::new(
            Arc::clone(&store) as Arc<dyn SessionStore>,
            keeper,
            Arc::new(Reader),
            Arc::new(Metrics::default()),
            Exclusivity::Leased,
        )
        .with_transcript_cache_bytes(0);
        let fence = WriteFence::new(FencingToken::new(0), OwnerId::new("seed").unwrap());
        let sessions: Vec<SessionId> = (0..sessions)
            .map(|i| SessionId::new(format!("session-{i}")).unwrap())
            .collect();
        for s in &sessions {
            engine.create_session(s).await.unwrap();
            store
                .append(s, fence.clone(), &history(events))
                .await
                .unwrap();
            run(&engine, s).await;
        }

        let engine = engine.with_transcript_cache_bytes(usize::MAX);
        let region = Region::new(HEAP);
        for s in &sessions {
            run(&engine, s).await;
        }
        let change = region.change();
        // Reallocations are already in both totals.
        let held = change.bytes_allocated as i64 - change.bytes_deallocated as i64;
        let (counted, kept) = engine.transcript_cache_usage();
        (counted as i64, held, kept)
    })
}

#[test]
fn the_cache_counts_at_least_the_heap_its_transcripts_take() {
    // Long transcripts, where the events' own heap is most of it, and
    // many short ones, where the cache's bookkeeping per entry is.
    for (sessions, events) in [(20, 1_000), (2_000, 3)] {
        let (counted, held, kept) = cache_against_heap(sessions, events);
        assert_eq!(kept, sessions);
        let case = format!("{sessions} sessions of {events} events");
        assert!(
            counted >= held,
            "{case}: the cache counts {counted} bytes for {held} bytes it holds on the heap"
        );
        // Not so cautious that the budget buys little.
        assert!(
            counted < 2 * held,
            "{case}: the cache counts {counted} bytes for {held} bytes it holds on the heap"
        );
    }
}
