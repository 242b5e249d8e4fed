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

    /// What the store records of cancel requests for `session` before a
    /// run of it begins: the run stops only for requests counted after it.
    /// `Unknown` when the store could not say; the watch then starts from
    /// its own first reading.
    pub(super) async fn cancel_baseline(&self, session: &SessionId) -> CancelBaseline {
        match self.inner.store.cancel_request(session).await {
            Ok(request) => CancelBaseline::Known(request.map_or(0, |r| r.serial)),
            Err(e) if e.kind() == StoreErrorKind::Unsupported => CancelBaseline::Known(0),
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read cancel requests before the run");
                CancelBaseline::Unknown
            }
        }
    }

    /// Starts watching the store for cancel requests aimed at the run of
    /// `session` under `token`; the returned guard stops the watch. The
    /// run is cancelled through `cancel` once a request counted after
    /// `before` names its token or a later one.
    pub(super) fn watch_cancel_requests(
        &self,
        session: &SessionId,
        token: FencingToken,
        before: CancelBaseline,
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
                () = watch(&*store, &session, token, before, &cancel) => {}
            }
        });
        stop.drop_guard()
    }
}

/// The count of cancel requests a run's watch starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CancelBaseline {
    /// Requests counted up to this number came before the run.
    Known(u64),
    /// Not read: the watch's first reading stands in.
    Unknown,
}

async fn watch(
    store: &dyn SessionStore,
    session: &SessionId,
    token: FencingToken,
    mut before: CancelBaseline,
    cancel: &CancellationToken,
) {
    let mut interval = tokio::time::interval(CANCEL_POLL_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        match store.cancel_request(session).await {
            Ok(request) => {
                let serial = request.map_or(0, |r| r.serial);
                let CancelBaseline::Known(baseline) = before else {
                    before = CancelBaseline::Known(serial);
                    continue;
                };
                if let Some(request) = request
                    && request.run >= token
                    && request.serial > baseline
                {
                    info!(%token, "cancel requested through the store");
                    cancel.cancel();
                    return;
                }
            }
            Err(e) if e.kind() == StoreErrorKind::Unsupported => return,
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read cancel requests; retrying");
            }
        }
    }
}
