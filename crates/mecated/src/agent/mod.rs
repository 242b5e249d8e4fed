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
    #[derive(Default)]
    pub(crate) struct VecSink {
        pub(crate) events: Vec<Value>,
        pub(crate) fail_after: Option<usize>,
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
    }
}
