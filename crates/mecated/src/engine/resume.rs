//! Re-driving the input of a run that recorded no end (`--resume-interrupted`).
//!
//! A run whose process died stays open in its session's log until the next
//! owner of the session ends it as `interrupted`. With resumption on, that
//! owner does not wait for a client to ask again: it ends the run and, in
//! the same batch, starts a run of its recorded input that names what it
//! resumes. Something must notice the run first, and nothing here polls
//! sessions for it:
//!
//! - a follower of the run on this replica, once the run's holder is gone
//!   (the follow learns that anyway, to end), which is where a client whose
//!   stream broke with the dead process reconnects;
//! - a follower arriving at a session whose last run is open and not live;
//! - this process's start, which looks once through the store: a process
//!   restarted after a crash resumes what it, or a peer, left.
//!
//! Exactly once per interruption, however many replicas notice: each first
//! takes the session's lease, then fences the log with a `takeover` event,
//! and only then reads whether the run is still open. The first to get
//! there ends it and starts the resumption in one batch; every later one
//! reads an end and writes nothing more. A resumption that is itself
//! interrupted is resumed again, up to the configured number of attempts,
//! so an input that kills its process cannot take every replica down in
//! turn. The agent may so see an input twice (at least once): what it
//! does outside the log is fenced with the run's token and effect keys.

use std::sync::Arc;
use std::time::Duration;

use lease_keeper::KeeperErrorKind;
use lease_port::SessionId;
use session_store::{ListCursor, StoreErrorKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tracing::{Instrument, field, info, info_span, warn};

use super::interrupted::{ClaimFor, ClaimWritten, resumption_unguarded};
use super::{Engine, EngineError};
use crate::error::error_chain;

/// The default of `--resume-max-attempts`: how many times one input is run
/// again after interruptions before its session is left for a client.
pub const DEFAULT_RESUME_ATTEMPTS: u32 = 3;

/// Sessions read at a time by the start-up look for interrupted runs.
const SWEEP_PAGE: usize = 256;

/// How many times the start-up look comes back to a session whose lease
/// was held or that it could not judge, a TTL apart: a holder that died
/// just before this process started holds it until its lease runs out.
const SWEEP_AGAIN_ROUNDS: u32 = 3;

/// The most runs the start-up look keeps running at once.
pub const SWEEP_RUNS: usize = 64;

/// What [`Engine::resume_interrupted`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumption {
    /// The interrupted run was ended and a run of its input started.
    Resumed {
        /// The resuming run's `run_started` event.
        first_seq: u64,
        /// Its token; `None` when unleased.
        token: Option<u64>,
        /// How many times the input has now been run again (1 the first
        /// time).
        attempt: u32,
    },
    /// The interrupted run was ended and not run again: it recorded no
    /// input, or its input was already run again as often as allowed.
    Closed {
        /// The interrupted run's `run_started` event.
        run_seq: u64,
    },
    /// The session's last run has an end (or the log is empty): nothing to
    /// resume. Another process may have resumed it first.
    NothingOpen,
    /// The session's lease is held, here or elsewhere: its run is live, or
    /// its holder has not yet lost it.
    Held,
    /// Resumption is off on this server.
    Off,
}

/// What the start-up look did with one session.
enum Swept {
    Done,
    /// Looked at again after a while.
    Again(Again),
    /// The server drains: the look ends.
    Stop,
}

/// Why a session is looked at again.
enum Again {
    Held,
    Failed(String),
}

/// What one look through the store found (see
/// [`Engine::resume_interrupted_runs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Sessions looked at.
    pub sessions: u64,
    /// Interrupted runs run again.
    pub resumed: u64,
    /// Interrupted runs ended without running again.
    pub closed: u64,
    /// Sessions still held after the last round: live runs.
    pub held: u64,
    /// Sessions that could not be judged by the last round (the error is
    /// logged).
    pub failed: u64,
}

impl Engine {
    /// Turns resumption on: the input of a run that recorded no end is run
    /// again by the next owner, at most `max_attempts` times per input (0
    /// turns it off).
    pub fn with_resumption(self, max_attempts: u32) -> Self {
        self.inner
            .resume_attempts
            .store(max_attempts, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The most times one input is run again; 0 when resumption is off.
    pub fn resume_attempts(&self) -> u32 {
        self.inner
            .resume_attempts
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Resumes `session`'s interrupted run if its last run recorded no end
    /// and its lease is free: ends that run as `interrupted` and starts a
    /// run of its input, in one fenced batch after a `takeover`. Answers
    /// once the outcome is in the log; the resumed run then runs on the
    /// engine's tasks, like a client's whose client left.
    ///
    /// Dropping this future does not half-resume: the lease, the claim and
    /// the run are taken on a task of their own.
    pub async fn resume_interrupted(&self, session: SessionId) -> Result<Resumption, EngineError> {
        self.resume_with(session, None).await
    }

    /// [`resume_interrupted`](Self::resume_interrupted), holding `permit`
    /// for as long as the resumed run runs.
    async fn resume_with(
        &self,
        session: SessionId,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Resumption, EngineError> {
        let max_attempts = self.resume_attempts();
        if max_attempts == 0 {
            return Ok(Resumption::Off);
        }
        let starting = self.inner.tasks.token();
        self.may_start_runs()?;
        if self.local_run(&session).is_some() {
            return Ok(Resumption::Held);
        }
        // Judged without the lease first: the common answer, an ended run,
        // costs no lease call.
        let last = self.inner.store.last_seq(&session).await?;
        if !resumption_unguarded()
            && (self.last_event_ends_a_run(&session, last).await?
                || self.open_run_before(&session, last + 1).await?.is_none())
        {
            // Nothing to resume, and nothing written: a log whose last
            // event is not an end, with no open run behind it, must not
            // cost a takeover each time a follower looks.
            return Ok(Resumption::NothingOpen);
        }
        let (answer, answered) = oneshot::channel();
        let app = self.clone();
        let span = info_span!("resume", session = %session, token = field::Empty);
        self.inner.tasks.spawn(
            async move {
                app.resume_and_drive(session, max_attempts, answer).await;
                drop(permit);
            }
            .instrument(span),
        );
        drop(starting);
        answered.await.unwrap_or(Err(EngineError::ShuttingDown))
    }

    async fn resume_and_drive(
        &self,
        session: SessionId,
        max_attempts: u32,
        answer: oneshot::Sender<Result<Resumption, EngineError>>,
    ) {
        let cancels_before = self.cancel_baseline(&session).await;
        if self.is_draining() {
            let _ = answer.send(Err(EngineError::Draining));
            return;
        }
        let what = ClaimFor::Resumption { max_attempts };
        let (guard, written) = match self.claim(&session, &what, cancels_before, None).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => {
                let _ = answer.send(Ok(Resumption::NothingOpen));
                return;
            }
            Err(EngineError::Lease(e))
                if matches!(
                    e.kind(),
                    KeeperErrorKind::LeasedElsewhere | KeeperErrorKind::Busy
                ) =>
            {
                let _ = answer.send(Ok(Resumption::Held));
                return;
            }
            Err(e) => {
                let _ = answer.send(Err(e));
                return;
            }
        };
        let claimed = match written {
            ClaimWritten::Run(claimed) => claimed,
            ClaimWritten::Closed { run_seq } => {
                info!(run_seq, "ended an interrupted run without running it again");
                let _ = guard.finish().await;
                let _ = answer.send(Ok(Resumption::Closed { run_seq }));
                return;
            }
            ClaimWritten::NothingOpen => {
                let _ = guard.finish().await;
                let _ = answer.send(Ok(Resumption::NothingOpen));
                return;
            }
        };
        let attempt = claimed.attempt.unwrap_or(1);
        info!(
            first_seq = claimed.first_seq,
            attempt, "running an interrupted run's input again"
        );
        self.inner.metrics.run_resumed();
        let _ = answer.send(Ok(Resumption::Resumed {
            first_seq: claimed.first_seq,
            token: guard.token().map(|t| t.get()),
            attempt,
        }));
        self.run_claimed(session, guard, claimed, cancels_before, None)
            .await;
    }

    /// Looks once through every session of the store and resumes the
    /// interrupted runs whose leases are free; comes back to those held or
    /// that could not be judged, a TTL apart, a few times (a holder that
    /// died just before holds its lease until it runs out; a store may be
    /// briefly down). What a server does once at start-up with resumption
    /// on: its cost is one read of each session's last event. At most
    /// [`SWEEP_RUNS`] resumed runs run at once, so a store full of
    /// interrupted runs does not start them all together. Stops early when
    /// the server drains.
    pub async fn resume_interrupted_runs(&self) -> SweepReport {
        let mut report = SweepReport::default();
        let runs = Arc::new(Semaphore::new(SWEEP_RUNS));
        let mut again = Vec::new();
        let mut after: Option<ListCursor> = None;
        loop {
            let page = match self.inner.store.list_page(after.as_ref(), SWEEP_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    warn!(error = %error_chain(&e), "cannot list sessions to resume interrupted runs");
                    report.failed += 1;
                    return report;
                }
            };
            for session in page.sessions {
                report.sessions += 1;
                match self.sweep_one(&runs, &session, &mut report).await {
                    Swept::Done => {}
                    Swept::Again(why) => again.push((session, why)),
                    Swept::Stop => return report,
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for _ in 0..SWEEP_AGAIN_ROUNDS {
            if again.is_empty() {
                break;
            }
            let wait = self.inner.keeper.ttl() + Duration::from_millis(100);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.inner.draining.cancelled() => return report,
            }
            for (session, _) in std::mem::take(&mut again) {
                match self.sweep_one(&runs, &session, &mut report).await {
                    Swept::Done => {}
                    Swept::Again(why) => again.push((session, why)),
                    Swept::Stop => return report,
                }
            }
        }
        for (session, why) in again {
            match why {
                Again::Held => report.held += 1,
                Again::Failed(e) => {
                    report.failed += 1;
                    warn!(session = %session, error = %e, "cannot resume the session's interrupted run");
                }
            }
        }
        report
    }

    /// One session of the start-up look.
    async fn sweep_one(
        &self,
        runs: &Arc<Semaphore>,
        session: &SessionId,
        report: &mut SweepReport,
    ) -> Swept {
        let permit = tokio::select! {
            permit = Arc::clone(runs).acquire_owned() => permit.ok(),
            () = self.inner.draining.cancelled() => return Swept::Stop,
        };
        match self.resume_with(session.clone(), permit).await {
            Ok(Resumption::Resumed { .. }) => report.resumed += 1,
            Ok(Resumption::Closed { .. }) => report.closed += 1,
            Ok(Resumption::Held) => return Swept::Again(Again::Held),
            Ok(Resumption::NothingOpen | Resumption::Off) => {}
            Err(EngineError::Draining | EngineError::ShuttingDown) if self.is_draining() => {
                return Swept::Stop;
            }
            // Deleted meanwhile: nothing to resume.
            Err(EngineError::Store(e)) if e.kind() == StoreErrorKind::NotFound => {}
            Err(e) => return Swept::Again(Again::Failed(error_chain(&e))),
        }
        Swept::Done
    }
}
