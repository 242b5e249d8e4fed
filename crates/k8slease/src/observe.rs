//! What this process has seen of each Lease object, and when.
//!
//! Two uses: the version a renewal or release conditions its write on (so
//! the common case is one request), and the moment each version was first
//! seen, which [`ExpiryJudgement::SkewSafe`](crate::ExpiryJudgement::SkewSafe)
//! measures expiry from. Forgetting an entry is always safe: the next
//! operation reads the object again, and a skew-safe client waits longer.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
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
    /// Objects this process created with their holder, by name: the uid of
    /// the object and the token the create granted (its own version, which
    /// the object itself cannot state).
    created: Mutex<HashMap<String, (String, u64)>>,
}

impl Observations {
    pub(crate) fn get(&self, name: &str) -> Option<Observed> {
        self.lock().get(name).cloned()
    }

    /// Notes `object` (at `version`), whose response arrived at `arrived`.
    /// A version seen before keeps its first sighting; a version older than
    /// one already noted (a slow reply overtaken by another task's) is
    /// returned as read but not stored.
    pub(crate) fn note(
        &self,
        name: &str,
        object: LeaseObject,
        version: u64,
        arrived: Instant,
    ) -> Observed {
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

    /// The object no longer exists.
    pub(crate) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    /// This process created `name` as the object with `uid`, granting `token`.
    pub(crate) fn note_creation(&self, name: &str, uid: &str, token: u64) {
        let mut created = self.created.lock().unwrap_or_else(PoisonError::into_inner);
        if created.len() >= CAPACITY && !created.contains_key(name) {
            created.clear();
        }
        created.insert(name.to_owned(), (uid.to_owned(), token));
    }

    /// The token this process's create of object `uid` granted, if it made it.
    pub(crate) fn creation(&self, name: &str, uid: &str) -> Option<u64> {
        let created = self.created.lock().unwrap_or_else(PoisonError::into_inner);
        created
            .get(name)
            .filter(|(known, _)| known == uid)
            .map(|(_, token)| *token)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Observed>> {
        self.by_name.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
