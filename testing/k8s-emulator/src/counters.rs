//! Serves: both — k8slease tests and benches assert request counts; so does the kubectl test.
//!
//! Requests counted per (verb, resource), for benchmarks that report API
//! requests per operation; TCP connections accepted, for the bound a
//! client keeps on them.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
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

/// Counts the TCP connections the emulator accepted, whatever was said on
/// them (plain HTTP, TLS, or nothing), and how many are open. Clones share
/// the counts.
#[derive(Debug, Clone, Default)]
pub struct ConnectionCounters {
    inner: Arc<ConnectionCounts>,
}

#[derive(Debug, Default)]
struct ConnectionCounts {
    accepted: AtomicU64,
    open: AtomicU64,
    peak: AtomicU64,
}

/// One accepted connection, counted open until dropped.
#[derive(Debug)]
pub(crate) struct OpenConnection(Arc<ConnectionCounts>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnectionCounters {
    pub(crate) fn accepted_one(&self) -> OpenConnection {
        let counts = &self.inner;
        counts.accepted.fetch_add(1, Ordering::AcqRel);
        let open = counts.open.fetch_add(1, Ordering::AcqRel) + 1;
        counts.peak.fetch_max(open, Ordering::AcqRel);
        OpenConnection(Arc::clone(counts))
    }

    /// Connections accepted since the start or last reset.
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::Acquire)
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.inner.open.load(Ordering::Acquire)
    }

    /// The most connections open at once since the start or last reset.
    pub fn peak_open(&self) -> u64 {
        self.inner.peak.load(Ordering::Acquire)
    }

    /// Counts accepted connections from zero again, and the peak from the
    /// connections open now.
    pub fn reset(&self) {
        self.inner.accepted.store(0, Ordering::Release);
        self.inner
            .peak
            .store(self.inner.open.load(Ordering::Acquire), Ordering::Release);
    }
}
