//! Cancelling a run from any replica: the replica holding the run cancels
//! it at once; any other records a cancel request naming the run's token
//! in the store, which the holder watches.

use std::time::Duration;

use lease_port::{FencingToken, SessionId};
use session_store::{SessionStore, StoreErrorKind};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{info, warn};

use super::replicas::LiveRun;
use super::{Engine, EngineError};
use crate::error::error_chain;

/// How often a run's holder looks for cancel requests: the bound on how
/// late a cancel sent to another replica stops the run, and the cost (one
/// small read of the store per interval per run).
pub const CANCEL_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What a cancel found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelOutcome {
    /// Whether a run was live: `Some(true)` when one was (and is asked to
    /// stop), `Some(false)` when none was, `None` when the lease backend
    /// cannot tell (a request naming the session's latest run was recorded
    /// anyway).
    pub live: Option<bool>,
    /// The token of the run asked to stop.
    pub token: Option<u64>,
    /// Whether the run was in this process (cancelled directly) or
    /// elsewhere (asked through the store).
    pub here: bool,
}

impl Engine {
    /// Cancels the live run of `session`, wherever it runs. `NotFound`
    /// when the session does not exist.
    pub async fn cancel_anywhere(&self, session: &SessionId) -> Result<CancelOutcome, EngineError> {
        if let Some(token) = self.local_run(session)
            && self.cancel_run(session)
        {
            return Ok(CancelOutcome {
                live: Some(true),
                token: token.map(|t| t.get()),
                here: true,
            });
        }
        self.inner.store.read(session, 1, 1).await?;
        let (live, token) = match self.live_run(session).await {
            LiveRun::None | LiveRun::Run(None) => {
                return Ok(CancelOutcome {
                    live: Some(false),
                    token: None,
                    here: false,
                });
            }
            LiveRun::Run(Some(token)) => (Some(true), token),
            // The latest run is the one that last raised the mark.
            LiveRun::Unknown => match self.inner.store.high_water(session).await? {
                Some(token) => (None, token),
                None => {
                    return Ok(CancelOutcome {
                        live: Some(false),
                        token: None,
                        here: false,
                    });
                }
            },
        };
        self.inner.store.request_cancel(session, token).await?;
        Ok(CancelOutcome {
            live,
            token: Some(token.get()),
            here: false,
        })
    }

    /// Starts watching the store for cancel requests aimed at the run of
    /// `session` under `token`; the returned guard stops the watch. The
    /// run is cancelled through `cancel` once a request names its token or
    /// a later one.
    pub(super) fn watch_cancel_requests(
        &self,
        session: &SessionId,
        token: FencingToken,
        cancel: &CancellationToken,
    ) -> DropGuard {
        let stop = CancellationToken::new();
        let (store, session, cancel, stopped) = (
            self.inner.store.clone(),
            session.clone(),
            cancel.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                () = stopped.cancelled() => {}
                () = cancel.cancelled() => {}
                () = watch(&*store, &session, token, &cancel) => {}
            }
        });
        stop.drop_guard()
    }
}

async fn watch(
    store: &dyn SessionStore,
    session: &SessionId,
    token: FencingToken,
    cancel: &CancellationToken,
) {
    let mut interval = tokio::time::interval(CANCEL_POLL_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        match store.cancel_request(session).await {
            Ok(Some(requested)) if requested >= token => {
                info!(%token, "cancel requested through the store");
                cancel.cancel();
                return;
            }
            Ok(_) => {}
            Err(e) if e.kind() == StoreErrorKind::Unsupported => return,
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read cancel requests; retrying");
            }
        }
    }
}
