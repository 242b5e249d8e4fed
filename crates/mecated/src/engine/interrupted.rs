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
//! claim is one append, as before.

use std::sync::Arc;

use lease_keeper::LeaseGuard;
use lease_port::{FencingToken, SessionId};
use serde_json::{Value, json};
use session_store::{AppendReceipt, StoreError, StoredEvent};
use tracing::{info, warn};

use super::follow::RUN_ENDED;
use super::{Engine, EngineError, tracked_append};

/// The `status` of the end the next owner records for a run that recorded
/// none.
pub const INTERRUPTED: &str = "interrupted";

/// The payload type of the event with which a new owner fences out the
/// owner of a run left without an end, before it judges that run.
pub const TAKEOVER: &str = "takeover";

/// Events read at a time while looking back for the start of a run.
const LOOK_BACK_PAGE: usize = 256;

/// A run whose start is in the log and whose end is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OpenRun {
    start_seq: u64,
    pub(super) token: Option<FencingToken>,
    owner: Option<String>,
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

impl Engine {
    /// Claims the session in the store before anything else: the first
    /// write raises the high-water mark to our token, so from here on no
    /// earlier owner can write, whether or not our agent ever emits. The
    /// claim's sequence number.
    ///
    /// The claim records the run's input: the user's side of the turn is
    /// part of the session, in the transcript of every later run, and
    /// another process can learn what an interrupted run was asked. The
    /// run before, if it recorded no end, is ended as `interrupted` first.
    pub(super) async fn write_claim(
        &self,
        session: &SessionId,
        guard: &LeaseGuard,
        input: &Value,
    ) -> Result<u64, EngineError> {
        let claim = json!({
            "type": "run_started",
            "owner": self.inner.keeper.owner().as_str(),
            "token": guard.token().map(|t| t.get()),
            "input": input,
        });
        let last = self.inner.store.last_seq(session).await?;
        if self.last_event_ends_a_run(session, last).await? {
            let receipt = self.append(session, guard, vec![claim]).await?;
            if receipt.first_seq != last + 1 {
                // Written meanwhile, below our token: an earlier owner's
                // write that was in flight. If it began a run, that run is
                // left open before our start (its followers end at it).
                warn!(
                    expected = last + 1,
                    claimed = receipt.first_seq,
                    "an earlier owner's writes landed just before this run's claim"
                );
            }
            return Ok(receipt.first_seq);
        }
        // Fenced, the earlier owner may still have writes on their way:
        // shut them out before reading how its run left the log. Unleased,
        // this process alone writes.
        let from = if guard.token().is_some() {
            let takeover = json!({
                "type": TAKEOVER,
                "owner": self.inner.keeper.owner().as_str(),
                "token": guard.token().map(|t| t.get()),
            });
            self.append(session, guard, vec![takeover]).await?.first_seq
        } else {
            last + 1
        };
        let mut batch = Vec::with_capacity(2);
        if let Some(open) = self.open_run_before(session, from).await? {
            info!(
                run_seq = open.start_seq,
                run_token = open.token.map(|t| t.get()),
                "the session's last run recorded no end; ending it as interrupted"
            );
            batch.push(self.interrupted_end(&open));
        }
        batch.push(claim);
        Ok(self.append(session, guard, batch).await?.last_seq)
    }

    /// Whether the log is empty or its event at `last` is a run's end.
    async fn last_event_ends_a_run(
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
        let mut below = before;
        while below > 1 {
            let from = below.saturating_sub(LOOK_BACK_PAGE as u64).max(1);
            let page = self
                .inner
                .store
                .read(session, from, (below - from) as usize)
                .await?;
            for e in page.events.iter().rev().filter(|e| e.seq < below) {
                match kind(e) {
                    Some(RUN_ENDED) => return Ok(None),
                    Some("run_started") => {
                        return Ok(Some(OpenRun {
                            start_seq: e.seq,
                            token: e.token,
                            owner: e
                                .payload
                                .get("owner")
                                .and_then(Value::as_str)
                                .map(str::to_owned),
                        }));
                    }
                    _ => {}
                }
            }
            below = from;
        }
        Ok(None)
    }

    fn interrupted_end(&self, open: &OpenRun) -> Value {
        let owner = open.owner.as_deref().unwrap_or("an unknown owner");
        json!({
            "type": RUN_ENDED,
            "status": INTERRUPTED,
            "run_seq": open.start_seq,
            "run_token": open.token.map(|t| t.get()),
            "error": format!(
                "the run stopped without recording an end: {owner}, which ran it, died, lost \
                 its lease or could not write; {} took the session over. Read the session's \
                 events to see how far it got before running its input again",
                self.inner.keeper.owner()
            ),
        })
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
