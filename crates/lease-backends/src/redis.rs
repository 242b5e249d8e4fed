//! The leases a Redis server provides.

#[cfg(feature = "redis")]
use std::time::Duration;

#[cfg(feature = "redis")]
use crate::error::{OpenError, OpenErrorKind};

/// Which Redis, and which keys in it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisLeases {
    /// `redis://` or `rediss://` URL, credentials included.
    pub url: String,
    /// Key prefix shared by the servers.
    pub prefix: String,
}

/// The URL is left out: it may carry a password.
impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisLeases {
    /// `Redis leases under PREFIX`, for messages (never the URL, which may
    /// carry a password).
    pub fn describe(&self) -> String {
        format!("Redis leases under {}", self.prefix)
    }

    /// The backend, granting `ttl`: connects, and checks the server's
    /// deployment requirements (see `redis_session_store`), before
    /// answering.
    #[cfg(feature = "redis")]
    pub async fn open(&self, ttl: Duration) -> Result<redis_session_store::RedisLease, OpenError> {
        redis_session_store::RedisLease::builder(self.url.clone())
            .prefix(self.prefix.clone())
            .ttl(ttl)
            .connect()
            .await
            .map_err(|e| OpenError::new(OpenErrorKind::Backend, self.describe(), e))
    }
}
