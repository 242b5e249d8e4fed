//! Holds that lapsed without a release, and since when this client has
//! seen each one lapsed.
//!
//! etcd deletes a session key when its etcd lease ends, and no reader can
//! tell why it ended. Usually the holder stopped renewing and counted the
//! lease lost long before. But a leader that was frozen (a long pause, a
//! stalled disk) and has not yet learnt it was replaced revokes every
//! etcd lease that expired in its own stale view, and its revocation is
//! forwarded to the new leader and committed while the holders are still
//! renewing there (etcd issues #12528 and #15247; fixed only in part, in
//! etcd 3.4.28 and 3.5.11). A holder then counts on its lease for up to a
//! TTL after the key is gone.
//!
//! So a session whose key is gone while its guard remains is taken over
//! only after this client has seen it so for the TTL plus the grace, on its
//! own monotonic clock, with the guard unchanged: by then the holder's last
//! renewal, sent before the key was deleted, has run out too. A release
//! deletes the guard, so a released session is taken at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One lapsed hold: its guard's revision, and when it was first seen.
#[derive(Debug, Clone, Copy)]
struct Sighting {
    guard_revision: i64,
    first_seen: Instant,
}

/// The lapsed holds this client has seen, by guard key.
#[derive(Debug, Default)]
pub(crate) struct LapsedHolds {
    seen: Mutex<HashMap<Vec<u8>, Sighting>>,
}

impl LapsedHolds {
    /// How much longer the hold behind `guard` at `guard_revision` must be
    /// seen lapsed before it may be taken over, when it must be seen so for
    /// `wait`, counting from `now` if it was not seen so before. Zero when
    /// the wait is over.
    pub(crate) fn remaining(
        &self,
        guard: &[u8],
        guard_revision: i64,
        now: Instant,
        wait: Duration,
    ) -> Duration {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Sightings outlive their use only when a caller gave up waiting;
        // dropping the long-expired ones keeps the table bounded by the
        // sessions tried within a few waits.
        let stale = wait * 4;
        seen.retain(|_, s| now.saturating_duration_since(s.first_seen) < stale);
        let sighting = seen
            .entry(guard.to_vec())
            .and_modify(|s| {
                // Another hold lapsed since: its wait starts now.
                if s.guard_revision != guard_revision {
                    *s = Sighting {
                        guard_revision,
                        first_seen: now,
                    };
                }
            })
            .or_insert(Sighting {
                guard_revision,
                first_seen: now,
            });
        (sighting.first_seen + wait).saturating_duration_since(now)
    }

    /// The hold behind `guard` is over (taken over or released).
    pub(crate) fn forget(&self, guard: &[u8]) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(guard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn the_wait_counts_from_the_first_sighting_of_one_guard_revision() {
        let holds = LapsedHolds::default();
        let t0 = Instant::now();
        assert_eq!(holds.remaining(b"g", 7, t0, WAIT), WAIT);
        assert_eq!(
            holds.remaining(b"g", 7, t0 + Duration::from_secs(2), WAIT),
            Duration::from_secs(3)
        );
        assert_eq!(holds.remaining(b"g", 7, t0 + WAIT, WAIT), Duration::ZERO);
        // A new hold lapsed meanwhile: its wait starts over.
        let t1 = t0 + Duration::from_secs(6);
        assert_eq!(holds.remaining(b"g", 9, t1, WAIT), WAIT);
        // Other guards are independent.
        assert_eq!(holds.remaining(b"h", 7, t1, WAIT), WAIT);
        holds.forget(b"g");
        assert_eq!(
            holds.remaining(b"g", 9, t1 + Duration::from_secs(1), WAIT),
            WAIT
        );
    }

    #[test]
    fn old_sightings_are_dropped() {
        let holds = LapsedHolds::default();
        let t0 = Instant::now();
        holds.remaining(b"g", 7, t0, WAIT);
        holds.remaining(b"h", 7, t0 + WAIT * 5, WAIT);
        assert_eq!(holds.seen.lock().unwrap().len(), 1);
    }
}
