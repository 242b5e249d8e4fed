//! The store contract's behaviour suite (`storeconformance`) on the JSONL
//! store. Every client is a store instance of its own on one directory —
//! its own caches, open file descriptions and locks, as another process
//! has — and the suite's unfenced client is one opened with
//! `allow_unfenced`.

use std::sync::Arc;

use async_trait::async_trait;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};
use storeconformance::StoreFactory;

/// Small, so the suite's oversized event is cheap.
const MAX_EVENT_BYTES: usize = 4096;

struct Jsonl(tempfile::TempDir);

impl Jsonl {
    fn open(&self, allow_unfenced: bool) -> Arc<dyn SessionStore> {
        let opts = JsonlOptions::default()
            .fsync(FsyncPolicy::Never)
            .max_event_bytes(MAX_EVENT_BYTES)
            .allow_unfenced(allow_unfenced);
        Arc::new(JsonlStore::open(self.0.path(), opts).expect("open the store directory"))
    }
}

#[async_trait]
impl StoreFactory for Jsonl {
    async fn store(&self) -> Arc<dyn SessionStore> {
        self.open(false)
    }

    async fn unfenced_store(&self) -> Option<Arc<dyn SessionStore>> {
        Some(self.open(true))
    }

    fn max_event_bytes(&self) -> Option<usize> {
        Some(MAX_EVENT_BYTES)
    }
    fn keeps_cancel_requests(&self) -> bool {
        true
    }
}

storeconformance::suite!(async { Jsonl(tempfile::tempdir().expect("a temporary directory")) });

/// The same contract with every write synced (`FsyncPolicy::Always`, the
/// default): calls then run on tokio's blocking pool rather than inline.
mod synced {
    use super::*;

    struct Synced(tempfile::TempDir);

    #[async_trait]
    impl StoreFactory for Synced {
        async fn store(&self) -> Arc<dyn SessionStore> {
            Arc::new(JsonlStore::open(self.0.path(), JsonlOptions::default()).expect("open"))
        }

        fn keeps_cancel_requests(&self) -> bool {
            true
        }
    }

    storeconformance::suite!(async { Synced(tempfile::tempdir().expect("a temporary directory")) });
}
