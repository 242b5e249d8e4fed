//! What a run hands its agent — the session's transcript — and the cache
//! that spares a run from reading the whole of it again.
//!
//! A run's agent sees every event of its session up to and including the
//! run's claim. Read from the store each time, that costs a run time in
//! proportion to the session's length. The engine instead keeps, per
//! session, the events it read last time (a least-recently-used cache
//! bounded in bytes, `--transcript-cache-bytes`) and asks
//! the store only for what follows them.
//!
//! # Why a cached transcript can be trusted
//!
//! A store's sequence numbers are never reused: a deleted session created
//! again continues after the last number it ever gave (the JSONL store
//! keeps the counter in the session file, and in the graveyard once the
//! file is reclaimed; the Redis store keeps it in the session's record,
//! which outlives deletion). Events are immutable once accepted. So if the
//! store still holds the very event the cache ended with — same sequence
//! number, token, time and payload — the session has not been deleted
//! since, and everything before that event is what the cache holds. The
//! engine's read starts *at* that event, so one read both validates the
//! cache and brings what other processes appended since. A cache whose last
//! event is gone is dropped and the transcript is read from the start.
//!
//! The session's high-water token would not do as a check: an unleased
//! deployment deletes and creates sessions without any token, and a lease
//! re-acquired by its holder keeps its token.

use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use lease_port::SessionId;
use serde::{Serialize, Serializer};
use serde_json::Value;
use session_store::StoredEvent;

/// The cache's byte budget when none is configured: 64 MiB.
pub const DEFAULT_TRANSCRIPT_CACHE_BYTES: usize = 64 << 20;

/// Bytes counted for each cached event beyond its payload's own: the
/// `Value` itself and its slot in the list.
const EVENT_OVERHEAD: usize = 48;

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
    /// The payloads, oldest first.
    events: Arc<Vec<Value>>,
    /// The newest event read, whole: the store must still hold it
    /// unchanged for the rest to be trusted.
    last: StoredEvent,
    /// What the entry is counted as against the budget.
    bytes: usize,
}

impl CachedTranscript {
    /// A transcript read whole; `None` when it has no events (nothing to
    /// check the next read against).
    pub(crate) fn new(events: Vec<StoredEvent>) -> Option<Self> {
        let last = events.last()?.clone();
        let bytes = events.iter().map(|e| event_bytes(&e.payload)).sum();
        let events = events.into_iter().map(|e| e.payload).collect();
        Some(Self {
            events: Arc::new(events),
            last,
            bytes,
        })
    }

    /// The event a read must start at and find unchanged.
    pub(crate) fn last(&self) -> &StoredEvent {
        &self.last
    }

    /// Adds the events the store holds after [`last`](Self::last), in
    /// order. In place unless a run still holds the previous transcript.
    pub(crate) fn extend(&mut self, newer: Vec<StoredEvent>) {
        let Some(last) = newer.last().cloned() else {
            return;
        };
        let events = Arc::make_mut(&mut self.events);
        for e in newer {
            self.bytes += event_bytes(&e.payload);
            events.push(e.payload);
        }
        self.last = last;
    }

    /// The transcript as the agent gets it, sharing the cached events.
    pub(crate) fn transcript(&self) -> Transcript {
        Transcript(Arc::clone(&self.events))
    }
}

/// An estimate of what `payload` occupies in memory, in bytes.
fn event_bytes(payload: &Value) -> usize {
    EVENT_OVERHEAD + value_bytes(payload)
}

fn value_bytes(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        Value::String(s) => s.len(),
        Value::Array(items) => items
            .iter()
            .map(|v| size_of::<Value>() + value_bytes(v))
            .sum(),
        // Each entry: its key's text and `String`, its value, and the
        // map's own bookkeeping (roughly another `Value`).
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| k.len() + size_of::<String>() + 2 * size_of::<Value>() + value_bytes(v))
            .sum(),
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
    entries: HashMap<SessionId, (u64, CachedTranscript)>,
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
        let (tick, entry) = lru.entries.remove(session)?;
        lru.by_use.remove(&tick);
        lru.used -= entry.bytes;
        Some(entry)
    }

    /// Keeps `entry` as the session's newest, unless it alone exceeds the
    /// budget; drops the least recently used entries until the rest fit.
    pub(crate) fn put(&self, session: &SessionId, entry: CachedTranscript) {
        let mut lru = self.lru();
        if let Some((tick, old)) = lru.entries.remove(session) {
            lru.by_use.remove(&tick);
            lru.used -= old.bytes;
        }
        if entry.bytes > lru.budget {
            return;
        }
        lru.clock += 1;
        let tick = lru.clock;
        lru.used += entry.bytes;
        lru.by_use.insert(tick, session.clone());
        lru.entries.insert(session.clone(), (tick, entry));
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

impl Lru {
    fn shrink_to_budget(&mut self) {
        while self.used > self.budget {
            let Some((_, session)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((_, entry)) = self.entries.remove(&session) {
                self.used -= entry.bytes;
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

    #[test]
    fn an_empty_transcript_is_not_cached() {
        assert!(CachedTranscript::new(Vec::new()).is_none());
    }

    #[test]
    fn extending_appends_and_moves_the_last_event_without_touching_a_shared_transcript() {
        let mut cached = entry(2);
        let before = cached.transcript();
        let bytes = cached.bytes;
        cached.extend(events(3..=4, "new"));
        assert_eq!(cached.last().seq, 4);
        assert_eq!(cached.transcript().len(), 4);
        assert_eq!(cached.transcript()[3], json!({"text": "new"}));
        assert!(cached.bytes > bytes);
        assert_eq!(before.len(), 2, "a run's transcript never changes under it");
    }

    #[test]
    fn least_recently_used_sessions_go_first_once_over_budget() {
        let one = entry(10).bytes;
        let cache = TranscriptCache::new(2 * one);
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
        let cache = TranscriptCache::new(entry(10).bytes);
        cache.put(&sid("small"), entry(10));
        cache.put(&sid("large"), entry(11));
        assert!(cache.take(&sid("large")).is_none());
        assert!(cache.take(&sid("small")).is_some());
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
        cache.set_budget(entry(3).bytes);
        assert_eq!(cache.usage(), (entry(3).bytes, 1));
        assert!(cache.take(&sid("b")).is_some(), "the newer one stays");
        cache.forget(&sid("b"));
        assert_eq!(cache.usage(), (0, 0));
    }
}
