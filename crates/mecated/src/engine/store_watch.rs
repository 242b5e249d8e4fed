//! The session store as the engine sees it: every call forwarded, and a
//! store that answers `Rewound` (its state went back, or it is deployed so
//! that it can lose what it confirmed) remembered until it answers again,
//! so `/readyz` reports it while it lasts.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, SessionId, SessionLease};
use serde_json::Value;
use session_store::{
    AppendReceipt, CancelRequest, ListCursor, Page, SessionPage, SessionStore, StoreError,
    StoreErrorKind, WriteFence,
};

use crate::error::error_chain;

/// The last `Rewound` answer of the store, cleared by its next success.
#[derive(Debug, Default)]
pub(crate) struct StoreFault(Mutex<Option<String>>);

impl StoreFault {
    /// Why the store refuses, while it does.
    pub(crate) fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records `e` when it says the store went back.
    pub(crate) fn note(&self, e: &StoreError) {
        if e.kind() == StoreErrorKind::Rewound {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(error_chain(e));
        }
    }

    fn observe<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(_) => *slot = None,
            Err(e) if e.kind() == StoreErrorKind::Rewound => *slot = Some(error_chain(e)),
            // Other failures say nothing about whether the store went back.
            Err(_) => {}
        }
        result
    }
}

/// `inner`, its `Rewound` answers recorded in `fault`.
pub(crate) struct WatchedStore {
    pub(crate) inner: Arc<dyn SessionStore>,
    pub(crate) fault: Arc<StoreFault>,
}

#[async_trait]
impl SessionStore for WatchedStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        self.fault.observe(self.inner.create(session).await)
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        self.fault
            .observe(self.inner.append(session, fence, events).await)
    }

    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        self.fault
            .observe(self.inner.append_after(session, fence, after, events).await)
    }

    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.fault
            .observe(self.inner.read(session, from_seq, limit).await)
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.fault.observe(self.inner.list().await)
    }

    async fn list_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        self.fault.observe(self.inner.list_page(after, limit).await)
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        self.fault.observe(self.inner.delete(session, fence).await)
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        self.fault.observe(self.inner.high_water(session).await)
    }

    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        self.fault
            .observe(self.inner.bind_authority(authority).await)
    }

    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.fault.observe(self.inner.recorded_authority().await)
    }

    async fn last_seq(&self, session: &SessionId) -> Result<u64, StoreError> {
        self.fault.observe(self.inner.last_seq(session).await)
    }

    fn session_lease(&self) -> Option<Arc<dyn SessionLease>> {
        self.inner.session_lease()
    }

    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.fault.observe(
            self.inner
                .wait_for_append(session, after_seq, timeout)
                .await,
        )
    }

    async fn request_cancel(
        &self,
        session: &SessionId,
        run: FencingToken,
    ) -> Result<(), StoreError> {
        self.fault
            .observe(self.inner.request_cancel(session, run).await)
    }

    async fn cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<CancelRequest>, StoreError> {
        self.fault.observe(self.inner.cancel_request(session).await)
    }

    async fn wait_for_cancel_request(
        &self,
        session: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<CancelRequest>, StoreError> {
        self.fault.observe(
            self.inner
                .wait_for_cancel_request(session, after_serial, timeout)
                .await,
        )
    }
}
