//! Starting a run that waits, for a bounded time, for another process to
//! release the session instead of being refused at once.

use std::time::{Duration, SystemTime};

use lease_keeper::KeeperErrorKind;
use lease_port::SessionId;
use serde_json::Value;
use tokio::time::Instant;

use super::{Engine, EngineError, StartedRun};
use crate::lease_view::HolderState;

/// The longest a client may ask a run to wait for its session.
pub const MAX_RUN_WAIT: Duration = Duration::from_secs(60);

/// How often a waiting run tries the lease again. A holder's release is
/// not announced by every backend, so a waiting run tries again this
/// often (one acquire attempt each); it starts within this long of the
/// release.
pub const RUN_WAIT_RETRY: Duration = Duration::from_millis(50);

impl Engine {
    /// [`start_run`](Engine::start_run), but while another run (in another
    /// process or this one) holds the session, tries again until it is released or `wait` (at most
    /// [`MAX_RUN_WAIT`]) has passed; then answers like `start_run`.
    pub async fn start_run_waiting(
        &self,
        session: SessionId,
        input: Value,
        wait: Duration,
    ) -> Result<StartedRun, EngineError> {
        let deadline = Instant::now() + wait.min(MAX_RUN_WAIT);
        loop {
            match self.start_run(session.clone(), input.clone()).await {
                Err(EngineError::Lease(e))
                    // Busy: the run holding the session is this process's
                    // own, which a load balancer makes as likely as any.
                    if matches!(
                        e.kind(),
                        KeeperErrorKind::LeasedElsewhere | KeeperErrorKind::Busy
                    ) && Instant::now() + RUN_WAIT_RETRY < deadline =>
                {
                    tokio::time::sleep(RUN_WAIT_RETRY).await;
                }
                other => return other,
            }
        }
    }

    /// How long a client refused because `session` is leased elsewhere
    /// should wait before trying again: until the holder's lease expires
    /// when the backend reports it, else one lease TTL. Whole seconds, at
    /// least 1.
    pub async fn retry_after(&self, session: &SessionId) -> u64 {
        let wait = match self.lease_holder(session).await {
            HolderState::Held(h) => h
                .expiry
                .duration_since(SystemTime::now())
                .unwrap_or_default(),
            HolderState::Free | HolderState::Unknown => self.inner.keeper.ttl(),
        };
        // Rounded up, and never 0: a client told to retry at once would
        // only be refused again.
        (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
    }
}
