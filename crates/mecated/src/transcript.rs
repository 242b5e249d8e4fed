//! What a run hands its agent — as much of the session's transcript as
//! its [`TranscriptScope`](crate::agent::TranscriptScope) asks for — and
//! the cache that spares a run from reading it again.
//!
//! A run's agent sees the events of its session up to and including the
//! run's claim: all of them, or those since the newest checkpoint. Read
//! from the store each time, that costs a run time in proportion to what
//! it is handed. The engine instead keeps, per session, the events it read
//! last time (a least-recently-used cache bounded in bytes,
//! `--transcript-cache-bytes`) and asks the store only for what follows
//! them.
//!
//! # Why a cached transcript can be trusted
//!
//! A store's sequence numbers are never reused: a deleted session created
//! again continues after the last number it ever gave (the JSONL store
//! keeps the counter in the session file, and in the graveyard once the
//! file is reclaimed; the Redis store keeps it in the session's record,
//! which outlives deletion; the PostgreSQL store in the session's row).
//! Events are immutable once accepted. So if the store still holds the
//! very event the cache ended with — same sequence number, token, time
//! and payload — the session has not been deleted since, and everything
//! before that event is what the cache holds. The engine's read starts
//! *at* that event, so one read both validates the cache and brings what
//! other processes appended since. A cache whose last event is gone is
//! dropped and the transcript is read afresh.
//!
//! The session's high-water token would not do as a check: an unleased
//! deployment deletes and creates sessions without any token, and a lease
//! re-acquired by its holder keeps its token.
//!
//! # What the budget counts
//!
//! The heap each entry takes as glibc's allocator hands it out: every
//! allocation at the size of its block, each JSON object at the size of
//! its tree's nodes, the list's slots by its capacity, and the cache's own
//! bookkeeping per entry. Other allocators round differently (within a
//! block size), and memory the allocator keeps after entries are dropped
//! (fragmentation, per-thread arenas) is not the cache's to count.

use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use lease_port::SessionId;
use serde::{Serialize, Serializer};
use serde_json::Value;
use session_store::StoredEvent;

/// The cache's byte budget when none is configured: 64 MiB.
pub const DEFAULT_TRANSCRIPT_CACHE_BYTES: usize = 64 << 20;

/// A session's events as a run's agent sees them, oldest first. Cheap to
/// clone: runs share it with the engine's cache instead of copying it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transcript(Arc<Vec<Value>>);

impl Transcript {
    /// The events.
    pub fn events(&self) -> &[Value] {
        &self.0
    }
}

impl Deref for Transcript {
    type Target = [Value];

    fn deref(&self) -> &[Value] {
        &self.0
    }
}

impl From<Vec<Value>> for Transcript {
    fn from(events: Vec<Value>) -> Self {
        Transcript(Arc::new(events))
    }
}

impl Serialize for Transcript {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// What the cache keeps of one session.
#[derive(Debug, Clone)]
pub(crate) struct CachedTranscript {
    /// The payloads, oldest first: the whole session, or from its newest
    /// checkpoint on when the agent reads no further back.
    events: Arc<Vec<Value>>,
    /// The newest event read, but for its payload (the last of
    /// `events`): the store must still hold it unchanged for the rest to
    /// be trusted.
    last: StoredEvent,
    /// The payloads' heap, counted against the budget (the list's own
    /// slots are counted apart, by its capacity).
    payload_bytes: usize,
    /// What the entry is counted as against the budget.
    bytes: usize,
}

impl CachedTranscript {
    /// A transcript read whole; `None` when it has no events (nothing to
    /// check the next read against).
    pub(crate) fn new(events: Vec<StoredEvent>) -> Option<Self> {
        let last = events.last()?;
        let last = StoredEvent {
            payload: Value::Null,
            ..last.clone()
        };
        let payload_bytes = events.iter().map(|e| resident::value(&e.payload)).sum();
        let mut events: Vec<Value> = events.into_iter().map(|e| e.payload).collect();
        // Collected in place, the list keeps the larger events' room.
        events.shrink_to_fit();
        let mut entry = Self {
            events: Arc::new(events),
            last,
            payload_bytes,
            bytes: 0,
        };
        entry.recount();
        Some(entry)
    }

    /// The number of the newest event held: a read must start at it and
    /// find it unchanged.
    pub(crate) fn last_seq(&self) -> u64 {
        self.last.seq
    }

    /// Whether `event` is the newest event held, unchanged.
    pub(crate) fn ends_with(&self, event: &StoredEvent) -> bool {
        event.seq == self.last.seq
            && event.token == self.last.token
            && event.at == self.last.at
            && self.events.last() == Some(&event.payload)
    }

    /// The newest event held, whole.
    pub(crate) fn last_event(&self) -> Option<StoredEvent> {
        Some(StoredEvent {
            payload: self.events.last()?.clone(),
            ..self.last.clone()
        })
    }

    /// Adds the events the store holds after the newest held, in order.
    /// In place unless a run still holds the previous transcript.
    ///
    /// With `from_checkpoint`, the entry then starts at the newest
    /// checkpoint it holds: what came before is never handed out again.
    pub(crate) fn extend(&mut self, newer: Vec<StoredEvent>, from_checkpoint: bool) {
        let Some(last) = newer.last() else {
            return;
        };
        self.last = StoredEvent {
            payload: Value::Null,
            ..last.clone()
        };
        let checkpoint = from_checkpoint
            .then(|| newer.iter().rposition(|e| is_checkpoint(&e.payload)))
            .flatten();
        if let Some(at) = checkpoint {
            // A fresh list: the old one may still be a run's.
            self.events = Arc::new(Vec::with_capacity(newer.len() - at));
            self.payload_bytes = 0;
        }
        let events = Arc::make_mut(&mut self.events);
        for e in newer.into_iter().skip(checkpoint.unwrap_or(0)) {
            self.payload_bytes += resident::value(&e.payload);
            events.push(e.payload);
        }
        self.recount();
    }

    /// The transcript as the agent gets it, sharing the cached events.
    pub(crate) fn transcript(&self) -> Transcript {
        Transcript(Arc::clone(&self.events))
    }

    fn recount(&mut self) {
        // The list's slots, and the `Arc` around it (two counts and the
        // list's own three words).
        let list = resident::block(self.events.capacity() * size_of::<Value>())
            + resident::block(2 * size_of::<usize>() + size_of::<Vec<Value>>());
        self.bytes = self.payload_bytes + list;
    }
}

/// Whether `payload` is a checkpoint: an object whose `type` is
/// [`CHECKPOINT_TYPE`](crate::agent::CHECKPOINT_TYPE).
pub(crate) fn is_checkpoint(payload: &Value) -> bool {
    payload.get("type").and_then(Value::as_str) == Some(crate::agent::CHECKPOINT_TYPE)
}

/// What parsed JSON occupies on the heap, as the allocator hands it out:
/// the budget is a bound on resident memory, so each allocation is
/// counted at the size of the block it takes, and a map at the size of
/// its tree's nodes, which hold up to eleven entries each however few it
/// has. Underestimating is what let a 64 MiB cache hold 240 MB.
mod resident {
    use serde_json::Value;

    /// The smallest block the allocator hands out, and its alignment,
    /// each block carrying one word of header (glibc's malloc on 64-bit
    /// targets; others are close).
    const MIN_BLOCK: usize = 32;
    const ALIGN: usize = 16;
    const HEADER: usize = size_of::<usize>();

    /// Entries per node of the standard library's B-tree (`2 * 6 - 1`).
    const NODE_CAPACITY: usize = 11;
    /// A leaf node: parent link, index and length, then eleven keys and
    /// eleven values. An internal node adds twelve child links.
    const LEAF: usize =
        2 * size_of::<usize>() + NODE_CAPACITY * (size_of::<String>() + size_of::<Value>());
    const INTERNAL: usize = LEAF + (NODE_CAPACITY + 1) * size_of::<usize>();

    /// The block an allocation of `n` bytes takes; 0 for none.
    pub(super) fn block(n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (n + HEADER).next_multiple_of(ALIGN).max(MIN_BLOCK)
    }

    /// The heap `value` owns (not the `Value` itself, which lives in its
    /// parent's storage).
    pub(super) fn value(value: &Value) -> usize {
        match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
            Value::String(s) => block(s.capacity()),
            Value::Array(items) => {
                block(items.capacity() * size_of::<Value>())
                    + items.iter().map(self::value).sum::<usize>()
            }
            Value::Object(map) => {
                let n = map.len();
                // A full tree has at least six entries a node; count as if
                // every node were as empty as a valid tree allows.
                let nodes = if n <= NODE_CAPACITY { 1 } else { n.div_ceil(5) };
                let internal = if n <= NODE_CAPACITY { 0 } else { nodes / 6 + 1 };
                let tree = if n == 0 {
                    0
                } else {
                    (nodes - internal) * block(LEAF) + internal * block(INTERNAL)
                };
                tree + map
                    .iter()
                    .map(|(k, v)| block(k.capacity()) + self::value(v))
                    .sum::<usize>()
            }
        }
    }
}

/// Transcripts of recently run sessions, least recently used dropped first
/// once they hold more than the byte budget. A transcript larger than the
/// whole budget is not kept at all; a budget of 0 keeps nothing.
#[derive(Debug)]
pub(crate) struct TranscriptCache {
    lru: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    budget: usize,
    used: usize,
    /// Bumped on every use; an entry's tick orders it in `by_use`.
    clock: u64,
    /// Each entry with its tick and what it is counted as.
    entries: HashMap<SessionId, (u64, usize, CachedTranscript)>,
    by_use: BTreeMap<u64, SessionId>,
}

impl TranscriptCache {
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            lru: Mutex::new(Lru {
                budget,
                ..Lru::default()
            }),
        }
    }

    fn lru(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the budget, dropping entries until they fit it.
    pub(crate) fn set_budget(&self, budget: usize) {
        let mut lru = self.lru();
        lru.budget = budget;
        lru.shrink_to_budget();
    }

    /// The session's entry, taken out of the cache: the caller validates
    /// and extends it, then [`put`](Self::put)s it back. Runs of one
    /// session in one process never overlap, so nobody else misses it
    /// meanwhile.
    pub(crate) fn take(&self, session: &SessionId) -> Option<CachedTranscript> {
        let mut lru = self.lru();
        let (tick, cost, entry) = lru.entries.remove(session)?;
        lru.by_use.remove(&tick);
        lru.used -= cost;
        Some(entry)
    }

    /// Keeps `entry` as the session's newest, unless it alone exceeds the
    /// budget; drops the least recently used entries until the rest fit.
    pub(crate) fn put(&self, session: &SessionId, entry: CachedTranscript) {
        let mut lru = self.lru();
        if let Some((tick, cost, _)) = lru.entries.remove(session) {
            lru.by_use.remove(&tick);
            lru.used -= cost;
        }
        let cost = entry.bytes + bookkeeping(session);
        if cost > lru.budget {
            return;
        }
        lru.clock += 1;
        let tick = lru.clock;
        lru.used += cost;
        lru.by_use.insert(tick, session.clone());
        lru.entries.insert(session.clone(), (tick, cost, entry));
        lru.shrink_to_budget();
    }

    /// Forgets the session (deleted: its events are gone).
    pub(crate) fn forget(&self, session: &SessionId) {
        drop(self.take(session));
    }

    /// Bytes counted against the budget, and how many sessions they hold.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let lru = self.lru();
        (lru.used, lru.entries.len())
    }
}

/// What the cache's own structures take per entry: the map's slot (kept
/// at most seven eighths full, plus a control byte), the session's id
/// twice (the map's key and the use order's value), and a share of the
/// use order's tree (nodes of eleven ticks and ids, at least five used).
fn bookkeeping(session: &SessionId) -> usize {
    let slot = size_of::<(SessionId, (u64, usize, CachedTranscript))>() * 8 / 7 + 1;
    let ids = 2 * resident::block(session.as_str().len());
    let node = 2 * size_of::<usize>() + 11 * (size_of::<u64>() + size_of::<SessionId>());
    slot + ids + resident::block(node) / 5
}

impl Lru {
    fn shrink_to_budget(&mut self) {
        while self.used > self.budget {
            let Some((_, session)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((_, cost, _)) = self.entries.remove(&session) {
                self.used -= cost;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::json;

    use super::*;

    fn sid(s: &str) -> SessionId {
        SessionId::new(s).unwrap()
    }

    fn events(seqs: std::ops::RangeInclusive<u64>, text: &str) -> Vec<StoredEvent> {
        seqs.map(|seq| StoredEvent {
            seq,
            token: None,
            at: UNIX_EPOCH + Duration::from_millis(seq),
            payload: json!({"text": text}),
        })
        .collect()
    }

    fn entry(n: u64) -> CachedTranscript {
        CachedTranscript::new(events(1..=n, "0123456789")).unwrap()
    }

    /// What an entry of `n` events under a one-letter id is counted as.
    fn cost(n: u64) -> usize {
        entry(n).bytes + bookkeeping(&sid("a"))
    }

    #[test]
    fn an_empty_transcript_is_not_cached() {
        assert!(CachedTranscript::new(Vec::new()).is_none());
    }

    #[test]
    fn extending_appends_and_moves_the_last_event_without_touching_a_shared_transcript() {
        let mut cached = entry(2);
        let before = cached.transcript();
        let bytes = cached.bytes;
        cached.extend(events(3..=4, "new"), false);
        assert_eq!(cached.last_seq(), 4);
        assert_eq!(cached.last_event().unwrap().payload, json!({"text": "new"}));
        assert!(cached.ends_with(&events(4..=4, "new")[0]));
        assert!(!cached.ends_with(&events(4..=4, "changed")[0]));
        assert_eq!(cached.transcript().len(), 4);
        assert_eq!(cached.transcript()[3], json!({"text": "new"}));
        assert!(cached.bytes > bytes);
        assert_eq!(before.len(), 2, "a run's transcript never changes under it");
    }

    #[test]
    fn least_recently_used_sessions_go_first_once_over_budget() {
        let cache = TranscriptCache::new(2 * cost(10));
        cache.put(&sid("a"), entry(10));
        cache.put(&sid("b"), entry(10));
        // `a` used again (taken and put back): `b` is now the oldest.
        let a = cache.take(&sid("a")).unwrap();
        cache.put(&sid("a"), a);
        cache.put(&sid("c"), entry(10));
        assert!(cache.take(&sid("b")).is_none());
        assert!(cache.take(&sid("a")).is_some());
        assert!(cache.take(&sid("c")).is_some());
        assert_eq!(cache.usage(), (0, 0));
    }

    #[test]
    fn a_transcript_larger_than_the_budget_is_not_kept_and_evicts_nothing() {
        let cache = TranscriptCache::new(cost(10));
        cache.put(&sid("s"), entry(10));
        cache.put(&sid("l"), entry(11));
        assert!(cache.take(&sid("l")).is_none());
        assert!(cache.take(&sid("s")).is_some());
    }

    #[test]
    fn a_budget_of_zero_keeps_nothing_and_shrinking_evicts() {
        let cache = TranscriptCache::new(0);
        cache.put(&sid("a"), entry(1));
        assert_eq!(cache.usage(), (0, 0));
        cache.set_budget(usize::MAX);
        cache.put(&sid("a"), entry(3));
        cache.put(&sid("b"), entry(3));
        assert_eq!(cache.usage().1, 2);
        cache.set_budget(cost(3));
        assert_eq!(cache.usage(), (cost(3), 1));
        assert!(cache.take(&sid("b")).is_some(), "the newer one stays");
        cache.forget(&sid("b"));
        assert_eq!(cache.usage(), (0, 0));
    }
}
