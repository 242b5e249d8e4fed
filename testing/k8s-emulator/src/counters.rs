//! Serves: both — k8slease tests and benches assert request counts; so does the kubectl test.
//!
//! Requests counted per (verb, resource), for benchmarks that report API
//! requests per operation.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::verb::Verb;

/// Counts every request to a resource by verb and resource (`leases`,
/// `namespaces`, `events`), whatever its outcome, including requests
/// answered by an injected fault. Discovery and other non-resource paths
/// are counted apart, by [`RequestCounters::non_resource`]. Clones share
/// the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounters {
    inner: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    by_verb: BTreeMap<(Verb, String), u64>,
    non_resource: u64,
}

impl RequestCounters {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Counts stay meaningful even if a holder panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, verb: Verb, resource: &str) {
        *self
            .lock()
            .by_verb
            .entry((verb, resource.to_string()))
            .or_insert(0) += 1;
    }

    pub(crate) fn record_non_resource(&self) {
        self.lock().non_resource += 1;
    }

    /// Requests with `verb` on `resource` since the start or last reset.
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.lock()
            .by_verb
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests of any verb on `resource`.
    pub fn resource_total(&self, resource: &str) -> u64 {
        self.lock()
            .by_verb
            .iter()
            .filter(|((_, r), _)| r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests to paths that name no resource (discovery, `/version`,
    /// OpenAPI).
    pub fn non_resource(&self) -> u64 {
        self.lock().non_resource
    }

    /// Every non-zero count, keyed by (verb, resource).
    pub fn snapshot(&self) -> BTreeMap<(Verb, String), u64> {
        self.lock().by_verb.clone()
    }

    /// Sets every count to zero.
    pub fn reset(&self) {
        let mut counts = self.lock();
        counts.by_verb.clear();
        counts.non_resource = 0;
    }
}
