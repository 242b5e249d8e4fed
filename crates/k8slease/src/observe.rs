//! What this process has seen of each Lease object, and when.
//!
//! Three uses: the version a renewal or release conditions its write on (so
//! the common case is one request), the moment each version was first
//! seen, which [`ExpiryJudgement::SkewSafe`](crate::ExpiryJudgement::SkewSafe)
//! measures expiry from, and the floors below which an answer shows that
//! the API server's storage went back (see the crate docs, "What it
//! requires of the cluster"). Forgetting an object is always safe: the next
//! operation reads it again, and a skew-safe client waits longer; its floor
//! outlives it (a deleted object's successor only has higher versions).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;

use crate::expiry::Seen;

/// How many objects one process remembers before forgetting some.
const CAPACITY: usize = 1 << 16;

#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub(crate) object: LeaseObject,
    pub(crate) version: u64,
    pub(crate) seen: Seen,
}

#[derive(Debug, Default)]
pub(crate) struct Observations {
    by_name: Mutex<HashMap<String, Observed>>,
    /// The highest version seen of each object, by name, kept when the
    /// object itself is forgotten: no later read of that name may answer
    /// below it.
    floors: Mutex<HashMap<String, u64>>,
    /// The highest version seen on any object: every later write must be
    /// answered above it.
    newest: AtomicU64,
}

impl Observations {
    pub(crate) fn get(&self, name: &str) -> Option<Observed> {
        self.lock().get(name).cloned()
    }

    /// The highest version seen so far on any object (0: none).
    pub(crate) fn newest(&self) -> u64 {
        self.newest.load(Ordering::Acquire)
    }

    /// The highest version seen so far of object `name` (0: none).
    pub(crate) fn floor(&self, name: &str) -> u64 {
        self.floors().get(name).copied().unwrap_or(0)
    }

    /// Counts `version`, seen on some object, towards [`newest`](Self::newest).
    pub(crate) fn saw_version(&self, version: u64) {
        self.newest.fetch_max(version, Ordering::AcqRel);
    }

    /// Notes `object` (at `version`), whose response arrived at `arrived`.
    /// A version seen before keeps its first sighting; a version older than
    /// one already noted (a slow reply overtaken by another task's) is
    /// returned as read but not stored. Either way the floors rise to it.
    pub(crate) fn note(
        &self,
        name: &str,
        object: LeaseObject,
        version: u64,
        arrived: Instant,
    ) -> Observed {
        self.saw_version(version);
        {
            let mut floors = self.floors();
            if floors.len() >= CAPACITY && !floors.contains_key(name) {
                // Forgetting floors only weakens the check, never fails it.
                let mut keep = false;
                floors.retain(|_, _| {
                    keep = !keep;
                    keep
                });
            }
            let floor = floors.entry(name.to_owned()).or_insert(0);
            *floor = (*floor).max(version);
        }
        let mut map = self.lock();
        let seen = match map.get(name) {
            Some(known) if known.version == version => known.seen,
            Some(known) if known.version > version => {
                return Observed {
                    object,
                    version,
                    seen: Seen { at: arrived },
                };
            }
            _ => Seen { at: arrived },
        };
        if map.len() >= CAPACITY && !map.contains_key(name) {
            // Forget every other entry: cheap, and forgetting is safe.
            let mut keep = false;
            map.retain(|_, _| {
                keep = !keep;
                keep
            });
        }
        let observed = Observed {
            object,
            version,
            seen,
        };
        map.insert(name.to_owned(), observed.clone());
        observed
    }

    /// The object no longer exists. Its floor stays.
    pub(crate) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Observed>> {
        self.by_name.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn floors(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.floors.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
