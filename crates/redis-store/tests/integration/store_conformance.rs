//! The store contract's behaviour suite (`storeconformance`) on the Redis
//! store, against a real `redis-server` each case starts for itself. Every
//! client is a `RedisStore` of its own with its own connections, as
//! another process has; the suite's unfenced client is one built with
//! `allow_unfenced`.

use std::sync::Arc;

use async_trait::async_trait;
use redis_session_store::RedisStore;
use session_store::SessionStore;
use storeconformance::StoreFactory;
use test_services::RedisServer;

/// Small, so the suite's oversized event is cheap.
const MAX_EVENT_BYTES: usize = 4096;

struct Redis(RedisServer);

impl Redis {
    async fn connect(&self, allow_unfenced: bool) -> Arc<dyn SessionStore> {
        let store = RedisStore::builder(self.0.url())
            .prefix("conformance:")
            .max_event_bytes(MAX_EVENT_BYTES)
            .allow_unfenced(allow_unfenced)
            .connect()
            .await
            .expect("connect to redis-server");
        Arc::new(store)
    }
}

#[async_trait]
impl StoreFactory for Redis {
    async fn store(&self) -> Arc<dyn SessionStore> {
        self.connect(false).await
    }

    async fn unfenced_store(&self) -> Option<Arc<dyn SessionStore>> {
        Some(self.connect(true).await)
    }

    fn max_event_bytes(&self) -> Option<usize> {
        Some(MAX_EVENT_BYTES)
    }
    fn keeps_cancel_requests(&self) -> bool {
        true
    }
}

storeconformance::suite!(async { Redis(RedisServer::start().expect("start redis-server")) });
