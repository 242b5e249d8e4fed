//! The claim of a run, and the end of the run before it when that run
//! recorded none: its process died, lost its lease, or could not write its
//! end. The next owner records it as `interrupted`, under its own greater
//! token, before its own `run_started`, so every run in a session's log
//! ends once and in order, and the interrupted run's followers end there.
//!
//! Judging the earlier run is only exact once its owner can no longer
//! write: a write it sent before its lease ran out may still land (a
//! process paused between its lease check and its write). So when the
//! log's last event is not an end, the new owner first writes a `takeover`
//! event, which raises the session's mark to its token and fences the
//! earlier owner out, and only then reads how the earlier run left the
//! log. When the last event is an end, as after every orderly run, the
//! claim is one append, written only onto the log as read
//! (`SessionStore::append_after`): an earlier owner's write still on its
//! way then (a new run's start, even) lands before the claim or never, and
//! if it landed the claim is judged again the long way. A store without
//! conditional appends always goes the long way.

use std::sync::Arc;

use lease_keeper::LeaseGuard;
use lease_port::{FencingToken, SessionId};
use serde_json::{Value, json};
use session_store::{AppendReceipt, StoreError, StoreErrorKind, StoredEvent};
use tracing::info;

use super::follow::{RUN_CUT_OFF, RUN_ENDED, RUN_STARTED};
use super::remote_cancel::CancelBaseline;
use super::{Engine, EngineError, tracked, tracked_append};

/// The `status` of the end the next owner records for a run that recorded
/// none.
pub const INTERRUPTED: &str = "interrupted";

/// The payload type of the event with which a new owner fences out the
/// owner of a run left without an end, before it judges that run.
pub const TAKEOVER: &str = "takeover";

/// How many more times than `--resume-max-attempts` an input may run
/// again when shutdowns, not crashes, cut it off.
pub const MAX_SHUTDOWN_RESUMPTIONS: u32 = 10;

/// Events read at a time while looking back for the start of a run.
const LOOK_BACK_PAGE: usize = 256;

/// A run whose start is in the log and whose end is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OpenRun {
    start_seq: u64,
    pub(super) token: Option<FencingToken>,
    owner: Option<String>,
    /// The input it was asked to run, when its start recorded one.
    input: Option<Value>,
    /// The start of the run whose input this one first ran: its own, or
    /// for a resumption, the one it resumes.
    origin_seq: u64,
    /// How many times the input was re-driven before this run: 0 for a
    /// client's run.
    attempt: u32,
    /// The store's count of cancel requests before the run; `None` when
    /// its start did not record it.
    cancel_serial: Option<u64>,
    /// Of `attempt`, how many followed a shutdown's cut rather than a
    /// crash.
    shutdowns: u32,
    /// For a resumption, the token of the run it resumes: cancel requests
    /// for that run are this one's too.
    resumes_token: Option<FencingToken>,
    /// Whether shutdown cut this run off (its last event says so).
    cut_off: bool,
}

impl OpenRun {
    /// The run `start`, a `run_started` event, begins.
    fn of(start: &StoredEvent) -> Self {
        let p = &start.payload;
        let resumes = p.get("resumes").filter(|r| !r.is_null());
        let field = |name| resumes.and_then(|r| r.get(name)).and_then(Value::as_u64);
        // A resumption whose attempt cannot be read counts as the last
        // allowed: better a session left for its client than an input
        // run again without bound.
        let attempt = match resumes {
            None => 0,
            Some(_) => field("attempt")
                .and_then(|a| u32::try_from(a).ok())
                .unwrap_or(u32::MAX),
        };
        Self {
            start_seq: start.seq,
            token: start.token,
            owner: p.get("owner").and_then(Value::as_str).map(str::to_owned),
            input: p.get("input").cloned(),
            origin_seq: field("run_seq").unwrap_or(start.seq),
            attempt,
            cancel_serial: p.get("cancel_serial").and_then(Value::as_u64),
            // Unreadable counts as none: every attempt a crash.
            shutdowns: field("shutdowns").map_or(0, |s| u32::try_from(s).unwrap_or(0)),
            resumes_token: field("run_token").map(FencingToken::new),
            cut_off: false,
        }
    }

    /// How many crashes have interrupted this input, this run's included
    /// when it was not cut off by shutdown: what `--resume-max-attempts`
    /// bounds.
    fn crashes(&self) -> u32 {
        self.attempt
            .saturating_sub(self.shutdowns)
            .saturating_add(u32::from(!self.cut_off))
    }

    /// Whether this run's input may run again: not past `max_attempts`
    /// crashes, nor past [`MAX_SHUTDOWN_RESUMPTIONS`] more runs in all (an
    /// input longer than the time between restarts, or one that gets its
    /// process stopped, is not run again without end either).
    fn may_run_again(&self, max_attempts: u32) -> bool {
        self.crashes() <= max_attempts
            && self.attempt < max_attempts.saturating_add(MAX_SHUTDOWN_RESUMPTIONS)
    }

    /// The `resumes` of the run that runs this one's input again.
    fn resumed_by(&self, attempt: u32) -> Value {
        let mut resumes = json!({
            "run_seq": self.origin_seq,
            "attempt": attempt,
            "after_seq": self.start_seq,
            "run_token": self.token.map(|t| t.get()),
        });
        let shutdowns = self.shutdowns.saturating_add(u32::from(self.cut_off));
        if shutdowns > 0 {
            resumes["shutdowns"] = json!(shutdowns);
        }
        resumes
    }
}

/// The broken variant the fault runs must catch (built with the
/// `broken-variants` feature and asked for with
/// `MECATED_BROKEN_RESUME_UNGUARDED`): a resumption that does not check
/// that the run it resumes is still open.
pub(super) fn resumption_unguarded() -> bool {
    cfg!(feature = "broken-variants")
        && std::env::var_os("MECATED_BROKEN_RESUME_UNGUARDED").is_some()
}

fn kind(event: &StoredEvent) -> Option<&str> {
    event.payload.get("type").and_then(Value::as_str)
}

/// The token of the run a `run_ended` event ends: its writer's, or for an
/// `interrupted` end written by a later owner, the token it names.
pub(super) fn run_of_end(event: &StoredEvent) -> Option<FencingToken> {
    let p = &event.payload;
    if p.get("status").and_then(Value::as_str) == Some(INTERRUPTED) {
        return p
            .get("run_token")
            .and_then(Value::as_u64)
            .map(FencingToken::new);
    }
    event.token
}

/// What a claim is for.
#[derive(Debug, Clone)]
pub(super) enum ClaimFor {
    /// A client's run of this input.
    Client(Value),
    /// Re-driving the session's interrupted run, if its last run has no
    /// end, at most this many times per original input.
    Resumption { max_attempts: u32 },
}

/// A claim in the log: the run it starts.
#[derive(Debug, Clone)]
pub(super) struct Claimed {
    /// The sequence number of the run's `run_started`.
    pub(super) first_seq: u64,
    /// The input the run drives.
    pub(super) input: Value,
    /// For a resumption: the how-manieth re-drive of its input (1 for the
    /// first).
    pub(super) attempt: Option<u32>,
    /// For a resumption: the token of the run it resumes, whose cancel
    /// requests are the resumption's too.
    pub(super) resumes_token: Option<FencingToken>,
}

/// Whether an interrupted run's input runs again right after its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resumed {
    /// As this attempt (1 for the first).
    Yes(u32),
    /// No: it was cancelled.
    Cancelled,
    /// No: a client's run comes next, resumption is off, the input is
    /// missing or its attempts are used up.
    No,
}

impl Resumed {
    fn new(attempt: Option<u32>, cancelled: bool) -> Self {
        match attempt {
            Some(attempt) => Self::Yes(attempt),
            None if cancelled => Self::Cancelled,
            None => Self::No,
        }
    }
}

/// What [`Engine::write_claim`] wrote.
#[derive(Debug)]
pub(super) enum ClaimWritten {
    /// A run's start.
    Run(Claimed),
    /// For a resumption: the interrupted run was ended, and is not re-run
    /// (it recorded no input, or its attempts are used up).
    Closed { run_seq: u64 },
    /// For a resumption: the session's last run has an end, so there is
    /// nothing to resume (another process resumed or ended it first).
    NothingOpen,
}

impl Engine {
    /// Claims the session in the store before anything else: the first
    /// write raises the high-water mark to our token, so from here on no
    /// earlier owner can write, whether or not our agent ever emits.
    ///
    /// The claim records the run's input: the user's side of the turn is
    /// part of the session, in the transcript of every later run, and
    /// another process can learn what an interrupted run was asked. The
    /// run before, if it recorded no end, is ended as `interrupted` first;
    /// a resumption then runs that run's input again, and otherwise writes
    /// nothing.
    pub(super) async fn write_claim(
        &self,
        session: &SessionId,
        guard: &LeaseGuard,
        what: &ClaimFor,
        cancels_before: CancelBaseline,
    ) -> Result<ClaimWritten, EngineError> {
        let claim =
            |input: &Value, resumes| self.run_started(guard, input, resumes, cancels_before);
        let last = self.inner.store.last_seq(session).await?;
        if self.last_event_ends_a_run(session, last).await? {
            let ClaimFor::Client(input) = what else {
                if resumption_unguarded() {
                    return self
                        .resume_unguarded(session, guard, last, cancels_before)
                        .await;
                }
                return Ok(ClaimWritten::NothingOpen);
            };
            let start = claim(input, None);
            if let Some(claimed) = self.claim_after(session, guard, last, start).await? {
                return Ok(ClaimWritten::Run(Claimed {
                    first_seq: claimed.first_seq,
                    input: input.clone(),
                    attempt: None,
                    resumes_token: None,
                }));
            }
        }
        // Fenced, the earlier owner may still have writes on their way:
        // shut them out before reading how its run left the log. Unleased,
        // this process alone writes. A resumption is judged on what the
        // log holds after the takeover, never before: that is what makes
        // two replicas racing for one interrupted run resume it once.
        let from = if guard.token().is_some() {
            let takeover = json!({
                "type": TAKEOVER,
                "owner": self.inner.keeper.owner().as_str(),
                "token": guard.token().map(|t| t.get()),
            });
            self.append(session, guard, vec![takeover]).await?.first_seq
        } else {
            // Read again: a claim that found the log moved read it too early.
            self.inner.store.last_seq(session).await?.saturating_add(1)
        };
        let open = self.open_run_before(session, from).await?;
        let mut batch = Vec::with_capacity(2);
        let resumed = match (&open, what) {
            (None, ClaimFor::Resumption { .. }) => return Ok(ClaimWritten::NothingOpen),
            (None, ClaimFor::Client(input)) => Some((input.clone(), None)),
            (Some(open), ClaimFor::Client(input)) => {
                batch.push(self.interrupted_end(open, Resumed::No));
                Some((input.clone(), None))
            }
            (Some(open), ClaimFor::Resumption { max_attempts }) => {
                let cancelled = self.cancel_was_asked(session, open).await?;
                let again = open
                    .input
                    .clone()
                    .filter(|_| !cancelled && open.may_run_again(*max_attempts))
                    .map(|input| (input, Some(open.attempt.saturating_add(1))));
                let resumed = again.as_ref().and_then(|a| a.1);
                batch.push(self.interrupted_end(open, Resumed::new(resumed, cancelled)));
                again
            }
        };
        if let Some(open) = &open {
            info!(
                run_seq = open.start_seq,
                run_token = open.token.map(|t| t.get()),
                resumed = resumed.as_ref().is_some_and(|r| r.1.is_some()),
                "the session's last run recorded no end; ending it as interrupted"
            );
        }
        let Some((input, attempt)) = resumed else {
            let run_seq = open.map_or(0, |o| o.start_seq);
            self.append(session, guard, batch).await?;
            return Ok(ClaimWritten::Closed { run_seq });
        };
        let resumes = attempt
            .zip(open.as_ref())
            .map(|(attempt, open)| open.resumed_by(attempt));
        batch.push(claim(&input, resumes));
        let resumes_token = attempt.and(open.as_ref()).and_then(|o| o.token);
        Ok(ClaimWritten::Run(Claimed {
            first_seq: self.append(session, guard, batch).await?.last_seq,
            input,
            attempt,
            resumes_token,
        }))
    }

    /// The broken variant's resumption: the session's last run's input
    /// again, ended or not.
    async fn resume_unguarded(
        &self,
        session: &SessionId,
        guard: &LeaseGuard,
        last: u64,
        cancels_before: CancelBaseline,
    ) -> Result<ClaimWritten, EngineError> {
        let Some(open) = self.run_before(session, last + 1, true).await? else {
            return Ok(ClaimWritten::NothingOpen);
        };
        let Some(input) = open.input.clone() else {
            return Ok(ClaimWritten::NothingOpen);
        };
        let attempt = open.attempt.saturating_add(1);
        let resumes = open.resumed_by(attempt);
        let batch = vec![
            self.interrupted_end(&open, Resumed::Yes(attempt)),
            self.run_started(guard, &input, Some(resumes), cancels_before),
        ];
        Ok(ClaimWritten::Run(Claimed {
            first_seq: self.append(session, guard, batch).await?.last_seq,
            input,
            attempt: Some(attempt),
            resumes_token: open.token,
        }))
    }

    /// A run's start: who runs it under which token, on which input, for
    /// a resumption which interrupted input it runs again, and with
    /// resumption on how many cancel requests the store held before it (a
    /// later one is for it).
    fn run_started(
        &self,
        guard: &LeaseGuard,
        input: &Value,
        resumes: Option<Value>,
        cancels_before: CancelBaseline,
    ) -> Value {
        let mut claim = json!({
            "type": RUN_STARTED,
            "owner": self.inner.keeper.owner().as_str(),
            "token": guard.token().map(|t| t.get()),
            "input": input,
        });
        if let Some(resumes) = resumes {
            claim["resumes"] = resumes;
        }
        // Only resumption reads it: without, the log keeps its shape.
        if let CancelBaseline::Known(serial) = cancels_before
            && self.resume_attempts() > 0
        {
            claim["cancel_serial"] = json!(serial);
        }
        claim
    }

    /// Whether the log is empty or its event at `last` is a run's end.
    pub(super) async fn last_event_ends_a_run(
        &self,
        session: &SessionId,
        last: u64,
    ) -> Result<bool, StoreError> {
        if last == 0 {
            return Ok(true);
        }
        let page = self.inner.store.read(session, last, 1).await?;
        Ok(page
            .events
            .first()
            .is_none_or(|e| e.seq != last || kind(e) == Some(RUN_ENDED)))
    }

    /// The run the events before `before` leave open: the last
    /// `run_started` with no end after it. Reads back from `before`, a
    /// page at a time, as far as the open run's start (its length, not the
    /// log's).
    pub(super) async fn open_run_before(
        &self,
        session: &SessionId,
        before: u64,
    ) -> Result<Option<OpenRun>, StoreError> {
        self.run_before(session, before, false).await
    }

    /// The last run started before `before`; with `ended`, whether or
    /// not it ended.
    async fn run_before(
        &self,
        session: &SessionId,
        before: u64,
        ended: bool,
    ) -> Result<Option<OpenRun>, StoreError> {
        let mut below = before;
        // The token of a `run_cut_off` seen on the way back: the open run
        // was cut off by shutdown when it is that run's.
        let mut cut_off = None;
        while below > 1 {
            let from = below.saturating_sub(LOOK_BACK_PAGE as u64).max(1);
            let page = self
                .inner
                .store
                .read(session, from, (below - from) as usize)
                .await?;
            for e in page.events.iter().rev().filter(|e| e.seq < below) {
                match kind(e) {
                    Some(RUN_ENDED) if !ended => return Ok(None),
                    Some(RUN_CUT_OFF) => {
                        cut_off.get_or_insert(e.token);
                    }
                    Some(RUN_STARTED) => {
                        let mut open = OpenRun::of(e);
                        open.cut_off = cut_off == Some(e.token);
                        return Ok(Some(open));
                    }
                    _ => {}
                }
            }
            below = from;
        }
        Ok(None)
    }

    /// Whether a client asked to cancel the open run: the store holds a
    /// request naming its token or a later one (unleased: any), counted
    /// after the run's start. Such a run is ended and never run again.
    /// A start that did not record the count is judged on the token
    /// alone: a session left for its client is the safe side of a
    /// request that may have been for an earlier run of the same token.
    async fn cancel_was_asked(
        &self,
        session: &SessionId,
        open: &OpenRun,
    ) -> Result<bool, StoreError> {
        let request = match self.inner.store.cancel_request(session).await {
            Ok(request) => request,
            Err(e) if e.kind() == StoreErrorKind::Unsupported => return Ok(false),
            Err(e) => return Err(e),
        };
        // A resumption's watch took requests for the run it resumes; one
        // that landed as its process died is still its.
        let floor = open.resumes_token.or(open.token);
        Ok(request.is_some_and(|r| {
            floor.is_none_or(|token| r.run >= token)
                && open.cancel_serial.is_none_or(|before| r.serial > before)
        }))
    }

    /// The `interrupted` end of `open`, and whether the next run resumes
    /// it.
    fn interrupted_end(&self, open: &OpenRun, resumed: Resumed) -> Value {
        let owner = open.owner.as_deref().unwrap_or("an unknown owner");
        let what = if open.cut_off {
            format!("{owner}, which ran it, shut down before it finished")
        } else {
            format!("{owner}, which ran it, died, lost its lease or could not write")
        };
        let next = match resumed {
            Resumed::Yes(_) => "its input runs again in the next run, which resumes it",
            Resumed::Cancelled => "a cancel was asked for it, so its input does not run again",
            Resumed::No => {
                "read the session's events to see how far it got before running its input again"
            }
        };
        let mut end = json!({
            "type": RUN_ENDED,
            "status": INTERRUPTED,
            "run_seq": open.start_seq,
            "run_token": open.token.map(|t| t.get()),
            "error": format!(
                "the run stopped without recording an end: {what}; {} took the session over: \
                 {next}",
                self.inner.keeper.owner()
            ),
        });
        if let Resumed::Yes(attempt) = resumed {
            end["resumed"] = json!({ "attempt": attempt });
        }
        end
    }

    /// The claim `start` written onto the log as judged at `last`: an
    /// earlier owner's write still on its way when it was read (a new
    /// run's start, even) lands first or not at all. `None` when one
    /// landed, or the store cannot append conditionally: the claim is then
    /// judged again behind a `takeover`.
    async fn claim_after(
        &self,
        session: &SessionId,
        guard: &LeaseGuard,
        last: u64,
        start: Value,
    ) -> Result<Option<AppendReceipt>, EngineError> {
        match self.append_after(session, guard, last, vec![start]).await {
            Ok(Some(receipt)) => Ok(Some(receipt)),
            Ok(None) => {
                info!(
                    %session,
                    after = last,
                    "an earlier owner's write landed as this run was claimed: judging it"
                );
                Ok(None)
            }
            Err(EngineError::Store(e)) if e.kind() == StoreErrorKind::Unsupported => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`append`](Self::append) only onto a log whose last seq is `after`:
    /// `None` when it moved on.
    async fn append_after(
        &self,
        session: &SessionId,
        guard: &LeaseGuard,
        after: u64,
        events: Vec<Value>,
    ) -> Result<Option<AppendReceipt>, EngineError> {
        let (store, session, fence) = (
            Arc::clone(&self.inner.store),
            session.clone(),
            self.fence(guard),
        );
        let write = tracked(&guard.write_gate(), async move {
            store.append_after(&session, fence, after, &events).await
        })?;
        Ok(write.await?)
    }

    /// One fenced append of the claim's writes, under a write permit of
    /// the run.
    async fn append(
        &self,
        session: &SessionId,
        guard: &LeaseGuard,
        events: Vec<Value>,
    ) -> Result<AppendReceipt, EngineError> {
        let write = tracked_append(
            &guard.write_gate(),
            Arc::clone(&self.inner.store),
            session.clone(),
            self.fence(guard),
            events,
        )?;
        Ok(write.await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(resumes: Value) -> StoredEvent {
        StoredEvent {
            seq: 5,
            token: Some(FencingToken::new(9)),
            at: std::time::UNIX_EPOCH,
            payload: json!({"type": RUN_STARTED, "input": "x", "resumes": resumes}),
        }
    }

    #[test]
    fn an_unreadable_attempt_counts_as_used_up_without_overflow() {
        for attempt in [json!("many"), json!(-1), json!(u64::MAX), json!(null)] {
            let open = OpenRun::of(&start(json!({"run_seq": 1, "attempt": attempt})));
            assert_eq!(open.attempt, u32::MAX);
            assert!(!open.may_run_again(u32::MAX), "{attempt}");
            open.resumed_by(u32::MAX);
        }
    }

    #[test]
    fn shutdowns_do_not_count_as_crashes_but_are_bounded_in_all() {
        let mut open = OpenRun::of(&start(json!({"run_seq": 1, "attempt": 4, "shutdowns": 4})));
        open.cut_off = true;
        assert_eq!(open.crashes(), 0);
        assert!(open.may_run_again(1));
        assert_eq!(open.resumed_by(5)["shutdowns"], 5);
        open.attempt = 1 + MAX_SHUTDOWN_RESUMPTIONS;
        open.shutdowns = open.attempt;
        assert!(!open.may_run_again(1), "past the bound in all");
        open.shutdowns = u32::MAX;
        assert_eq!(open.resumed_by(1)["shutdowns"], u32::MAX);
        // A crash after the cuts counts once.
        let mut open = OpenRun::of(&start(json!({"run_seq": 1, "attempt": 3, "shutdowns": 3})));
        open.cut_off = false;
        assert_eq!(open.crashes(), 1);
        assert!(open.may_run_again(1));
        assert!(!open.may_run_again(0));
    }
}
