//! Cancelling a run from any replica: the replica holding the run cancels
//! it at once; any other records a cancel request naming the run's token
//! in the store, which the holder watches.

use std::time::Duration;

use lease_port::{FencingToken, SessionId};
use session_store::{CancelRequest, SessionStore, StoreErrorKind};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{info, warn};

use super::replicas::LiveRun;
use super::{Engine, EngineError};
use crate::error::error_chain;

/// The longest a run's holder waits on the store's notification of cancel
/// requests before it reads them anyway: the bound on how late a cancel
/// whose notification was lost stops the run. A store that is told of
/// requests (the JSONL store's directory watch, the Redis store's
/// subscription) wakes the holder at once; one that is not reads on its
/// own interval ([`session_store::CANCEL_POLL_INTERVAL`]).
pub const CANCEL_SAFETY_READ: Duration = Duration::from_secs(30);

/// How long the watch waits before trying again after the store failed.
const CANCEL_RETRY: Duration = Duration::from_millis(500);

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
        // The run itself, not whichever run of the session is here once
        // the record below is written: a new one may have started.
        let here = self
            .runs()
            .get(session)
            .cloned()
            .zip(self.local_run(session));
        if let Some((cancel, token)) = here {
            self.record_cancel_for_resumption(session, token).await;
            cancel.cancel();
            return Ok(CancelOutcome {
                live: Some(true),
                token: token.map(|t| t.get()),
                here: true,
            });
        }
        self.inner.store.read(session, 1, 1).await?;
        let (live, token) = match self.live_run(session).await {
            LiveRun::None if self.resume_attempts() > 0 => {
                return self.cancel_interrupted(session).await;
            }
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

    /// With resumption on, a cancel of a run of this process is recorded
    /// in the store too, before the run is stopped: were this process to
    /// die before the run's `cancelled` end is stored, the next owner
    /// must not run its input again. Unleased runs have no token: theirs
    /// is recorded under token 0, which only an unleased run can match.
    /// A store that cannot record it still has the run cancelled here.
    async fn record_cancel_for_resumption(&self, session: &SessionId, token: Option<FencingToken>) {
        if self.resume_attempts() == 0 {
            return;
        }
        let token = token.unwrap_or(FencingToken::new(0));
        match self.inner.store.request_cancel(session, token).await {
            Ok(()) => {}
            Err(e) if e.kind() == StoreErrorKind::Unsupported => {}
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot record the cancel; should this process die before the run's end is stored, the next owner may run its input again");
            }
        }
    }

    /// With resumption on, a cancel of a session whose run is open but not
    /// live: recorded against the open run's token, so that whoever ends
    /// that run as interrupted does not run its input again.
    async fn cancel_interrupted(&self, session: &SessionId) -> Result<CancelOutcome, EngineError> {
        let last = self.inner.store.last_seq(session).await?;
        let open = if self.last_event_ends_a_run(session, last).await? {
            None
        } else {
            self.open_run_before(session, last + 1).await?
        };
        let Some(open) = open else {
            return Ok(CancelOutcome {
                live: Some(false),
                token: None,
                here: false,
            });
        };
        // A replica that resumes the run meanwhile either reads this
        // request before its claim, or its resumed run's watch counts it (a
        // resumption takes requests for the run it resumes). Unleased, the
        // run has no token: 0 stands for it, as for a local cancel.
        let token = open.token;
        let named = token.unwrap_or(FencingToken::new(0));
        info!(token = %named, "cancel of an interrupted run recorded: it will not run again");
        self.inner.store.request_cancel(session, named).await?;
        Ok(CancelOutcome {
            live: Some(false),
            token: token.map(|t| t.get()),
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
    loop {
        let read = match before {
            CancelBaseline::Unknown => store
                .cancel_request(session)
                .await
                .map(|request| Some(request.unwrap_or(NO_REQUEST))),
            CancelBaseline::Known(baseline) => {
                store
                    .wait_for_cancel_request(session, baseline, CANCEL_SAFETY_READ)
                    .await
            }
        };
        match read {
            Ok(None) => {}
            Ok(Some(request)) => {
                if before != CancelBaseline::Unknown && request.run >= token {
                    info!(%token, "cancel requested through the store");
                    cancel.cancel();
                    return;
                }
                // The first reading, or requests for an earlier run (they
                // count once the recorded run is theirs): the next wait
                // starts past them.
                before = CancelBaseline::Known(request.serial);
            }
            Err(e) if e.kind() == StoreErrorKind::Unsupported => return,
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read cancel requests; retrying");
                tokio::time::sleep(CANCEL_RETRY).await;
            }
        }
    }
}

/// What "no request yet" reads as.
const NO_REQUEST: CancelRequest = CancelRequest {
    run: FencingToken::new(0),
    serial: 0,
};
