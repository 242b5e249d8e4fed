//! The agent loop: what drives one run of a session, independent of leases.
//!
//! The server hands an [`Agent`] the session's transcript and the run's
//! input, and an [`EventSink`] that appends each event to the session's log
//! (fenced by the run's lease token) and streams it to the client. A run is
//! cancelled by dropping its future — on client cancel, on shutdown, or the
//! moment the lease is lost — so agents hold no state that must be cleaned
//! up by hand (the `exec` agent's child is killed when its future drops).

mod echo;
mod exec;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

pub use echo::EchoAgent;
pub use exec::ExecAgent;

pub use crate::transcript::Transcript;

/// Where a run's events go. Each `emit` returns once the event is durable
/// in the session's log; an error means the run must stop (for example its
/// lease token was fenced off).
#[async_trait]
pub trait EventSink: Send {
    /// Records one event of the run.
    async fn emit(&mut self, event: Value) -> Result<(), SinkError>;

    /// Asked before each side effect outside the session (a mail sent, a
    /// card charged, a ticket opened), which the store's fence does not
    /// cover: how long from now the run's lease is safely held, so the
    /// effect has that long to land. `Ok(None)` when the run is unleased.
    /// Refused once the lease is lost, the run is ending, or the time left
    /// is within the keeper's margin: the effect must not start, since
    /// another process may own the session by the time it lands.
    fn lease_check(&self) -> Result<Option<Duration>, SinkError>;
}

/// Why an event could not be recorded; the run stops.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SinkError(pub String);

/// One turn: what the agent is asked to do.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The session's id, as text.
    pub session_id: String,
    /// The session's events before this run, oldest first, and the run's
    /// own claim (`run_started`) last: all of them, or as many as the
    /// agent's [`TranscriptScope`] asks for. Shared, not copied, between
    /// runs: build one from a `Vec<Value>` with `into()`.
    pub transcript: Transcript,
    /// The run's input as the client sent it.
    pub input: Value,
    /// The run, and the lease it runs under.
    pub run: RunLease,
}

/// The run a [`Turn`] belongs to and the lease it runs under: what an agent
/// needs to fence the side effects that the session's store cannot.
///
/// The store refuses a stale owner's writes to the session; nothing refuses
/// its calls to other services. An agent that calls out checks
/// [`EventSink::lease_check`] before each effect and sends the run's
/// token and an [effect key](Turn::effect_key) with it, so the service can
/// refuse a token below the highest it has seen for the session and a key
/// it has already acted on (`lease_http::EffectFence` does both).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunLease {
    /// The run's id within its session: the sequence number of its claim
    /// (`run_started`) in the session's log.
    pub run_id: u64,
    /// The fencing token the run's writes carry; `None` when unleased.
    pub token: Option<u64>,
    /// How long the lease was safely held when the turn was handed over,
    /// on the monotonic clock: the time until the keeper would count it
    /// lost, less one renewal interval. `None` when unleased.
    pub safe_for: Option<Duration>,
}

impl Turn {
    /// The idempotency key of effect `step` of this run: the same for a
    /// retry of that effect within the run, different for every other
    /// session, token, run and step. `step` names the effect (`"mail-1"`,
    /// a tool call's id); the key is opaque to the service that receives
    /// it, which only compares keys for equality.
    pub fn effect_key(&self, step: &str) -> String {
        format!("{}{step}", effect_key_prefix(&self.session_id, &self.run))
    }
}

/// What every effect key of a run begins with: the session's id with its
/// length (so no id's end is read as the next field), the token and the
/// run id. A step name appended makes the key.
pub fn effect_key_prefix(session_id: &str, run: &RunLease) -> String {
    let token = run
        .token
        .map_or_else(|| "unleased".to_owned(), |t| t.to_string());
    format!("{}:{session_id}/{token}/{}/", session_id.len(), run.run_id)
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The sink refused an event; nothing more may be written.
    #[error("event not recorded: {0}")]
    Sink(#[from] SinkError),
    /// The agent itself failed (a crashed child, malformed output).
    #[error("agent failed: {0}")]
    Failed(String),
}

/// The `type` of an event that sums up everything before it, for agents
/// that read their transcript [since the newest
/// checkpoint](TranscriptScope::SinceCheckpoint): a checkpoint is an event
/// whose payload is a JSON object with this string as its top-level
/// `type`.
pub const CHECKPOINT_TYPE: &str = "checkpoint";

/// How much of its session's history an agent is handed in
/// [`Turn::transcript`], and so what a run costs as the session grows.
///
/// With [`Full`](Self::Full), a run whose session no longer fits the
/// engine's transcript cache reads the session from its first event: its
/// cost grows with the session. The other two bound what a run reads of
/// the session: an agent that keeps its own summary in checkpoint events,
/// or reads no history at all, reads as much on its ten-thousandth run as
/// on its first. (What a store spends to find those events is the
/// store's: the JSONL store reads a session's file through once when a
/// process first opens it, and again when more sessions are in use at
/// once than it keeps open.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TranscriptScope {
    /// Every event of the session, oldest first, the run's claim last.
    #[default]
    Full,
    /// The events from the newest checkpoint (an event of type
    /// [`CHECKPOINT_TYPE`]) before the claim on, that checkpoint first and
    /// the claim last, or every event when the session has none. The
    /// agent promises that a checkpoint holds all it needs of what came
    /// before it, so the engine never reads past it.
    SinceCheckpoint,
    /// The run's claim alone: for agents that read no history.
    ClaimOnly,
}

/// Drives runs. Implementations must be cancel-safe: dropping the future of
/// [`run`](Agent::run) at any await point must leave nothing running.
#[async_trait]
pub trait Agent: Send + Sync + fmt::Debug {
    /// Runs one turn, emitting its events in order.
    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError>;

    /// How much history [`run`](Agent::run) is handed. The default is the
    /// whole session. Asked once, when the engine is built: an agent's
    /// scope does not change.
    fn transcript_scope(&self) -> TranscriptScope {
        TranscriptScope::Full
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Collects events in memory; fails after `fail_after` events when set.
    /// Answers `lease_check` with `safe`.
    #[derive(Default)]
    pub(crate) struct VecSink {
        pub(crate) events: Vec<Value>,
        pub(crate) fail_after: Option<usize>,
        pub(crate) safe: Option<Duration>,
    }

    #[async_trait]
    impl EventSink for VecSink {
        async fn emit(&mut self, event: Value) -> Result<(), SinkError> {
            if self.fail_after.is_some_and(|n| self.events.len() >= n) {
                return Err(SinkError("fenced".into()));
            }
            self.events.push(event);
            Ok(())
        }

        fn lease_check(&self) -> Result<Option<Duration>, SinkError> {
            Ok(self.safe)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(session: &str, token: Option<u64>, run_id: u64) -> Turn {
        Turn {
            session_id: session.into(),
            transcript: Default::default(),
            input: Value::Null,
            run: RunLease {
                run_id,
                token,
                safe_for: None,
            },
        }
    }

    #[test]
    fn effect_keys_differ_for_every_session_token_run_and_step() {
        let keys = [
            turn("a", Some(1), 1).effect_key("x"),
            turn("a", Some(1), 1).effect_key("y"),
            turn("a", Some(1), 2).effect_key("x"),
            turn("a", Some(2), 1).effect_key("x"),
            turn("a", None, 1).effect_key("x"),
            turn("b", Some(1), 1).effect_key("x"),
            // An id ending like another's fields is still another session.
            turn("a/1", Some(1), 1).effect_key("x"),
            turn("a", Some(1), 1).effect_key("1/1/x"),
        ];
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len(), "{keys:?}");
        assert_eq!(
            turn("a", Some(1), 1).effect_key("x"),
            turn("a", Some(1), 1).effect_key("x")
        );
    }
}
