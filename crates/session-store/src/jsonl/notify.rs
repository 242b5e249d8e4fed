//! Waiting for appends and cancel requests: woken through the store's
//! directory watch ([`hub`](super::hub)) when any process writes, reading
//! on an interval where no watch can be had.

use std::time::Duration;

use lease_port::SessionId;

use super::JsonlStore;
use super::hub::{Subscription, Topic};
use crate::port::{APPEND_POLL_INTERVAL, has_event_after, wait_notified};
use crate::{StoreError, poll_for_append};

/// How often a woken-by-watch waiter reads anyway, unless its caller
/// waits longer: the watch wakes on every change, so this only bounds the
/// harm of an event the kernel did not deliver (it never drops one
/// silently; it reports an overflow, which wakes everyone). A caller that
/// waits longer in one call (a run's cancel watch, whose own interval is
/// the safety read, one per run held) reads once and then on the watch
/// alone: ten thousand runs would otherwise read two thousand times a
/// second for nothing.
const SAFETY_READ: Duration = Duration::from_secs(5);

impl JsonlStore {
    /// [`SessionStore::wait_for_append`](crate::SessionStore::wait_for_append)
    /// for the JSONL store.
    pub(super) async fn wait_for_append_to_file(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let topic = Topic::Appends(session_filename::stem(session));
        let Some(watch) = self.core.hub.subscribe(topic) else {
            return poll_for_append(self, session, after_seq, timeout).await;
        };
        let found = wait_watched(&watch, timeout, APPEND_POLL_INTERVAL, || async {
            Ok(has_event_after(self, session, after_seq)
                .await?
                .then_some(()))
        })
        .await?;
        Ok(found.is_some())
    }

    /// [`SessionStore::wait_for_cancel_request`](crate::SessionStore::wait_for_cancel_request)
    /// for the JSONL store.
    #[cfg(feature = "cancel-requests")]
    pub(super) async fn wait_for_cancel_file(
        &self,
        session: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<crate::CancelRequest>, StoreError> {
        use crate::port::{CANCEL_POLL_INTERVAL, cancel_request_after};
        let check = || cancel_request_after(self, session, after_serial);
        let topic = Topic::Cancels(session_filename::stem(session));
        match self.core.hub.subscribe(topic) {
            Some(watch) => wait_watched(&watch, timeout, CANCEL_POLL_INTERVAL, check).await,
            None => wait_notified(None, timeout, CANCEL_POLL_INTERVAL, check).await,
        }
    }
}

/// [`wait_notified`] on `watch`, turning to reads every `poll` should the
/// watch end while it waits (the directory removed or replaced).
async fn wait_watched<T, F, Fut>(
    watch: &Subscription,
    timeout: Duration,
    poll: Duration,
    mut check: F,
) -> Result<Option<T>, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let watched = wait_notified(
        Some(watch.notify()),
        timeout,
        SAFETY_READ.max(timeout),
        || {
            let live = watch.live();
            let checked = check();
            async move {
                match checked.await? {
                    Some(found) => Ok(Some(Some(found))),
                    // Done with the watch: the rest of the wait polls.
                    None if !live => Ok(Some(None)),
                    None => Ok(None),
                }
            }
        },
    )
    .await?;
    match watched {
        Some(Some(found)) => Ok(Some(found)),
        None => Ok(None),
        Some(None) => {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            wait_notified(None, left, poll, check).await
        }
    }
}
