//! `echo`: replies with the input. With a delay it simulates a long run,
//! emitting progress events along the way so a lease lost mid-run is seen.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use super::{Agent, AgentError, EventSink, TranscriptScope, Turn};

/// The default agent: one `message` event echoing the input, preceded, when
/// a delay is set, by `steps` `progress` events spread over the delay.
#[derive(Debug, Clone)]
pub struct EchoAgent {
    delay: Duration,
    steps: u32,
}

impl EchoAgent {
    /// Replies after `delay`, in `steps` progress events (at least one when
    /// the delay is not zero).
    pub fn new(delay: Duration, steps: u32) -> Self {
        Self {
            delay,
            steps: if delay.is_zero() { 0 } else { steps.max(1) },
        }
    }
}

impl Default for EchoAgent {
    fn default() -> Self {
        Self::new(Duration::ZERO, 0)
    }
}

#[async_trait]
impl Agent for EchoAgent {
    /// The reply is the input: no history is read, so a run costs the
    /// same however long its session is.
    fn transcript_scope(&self) -> TranscriptScope {
        TranscriptScope::ClaimOnly
    }

    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        for step in 1..=self.steps {
            tokio::time::sleep(self.delay / self.steps).await;
            sink.emit(json!({"type": "progress", "step": step, "of": self.steps}))
                .await?;
        }
        sink.emit(json!({"type": "message", "role": "assistant", "content": turn.input}))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testing::VecSink;

    fn turn(input: serde_json::Value) -> Turn {
        Turn {
            session_id: "s".into(),
            transcript: Default::default(),
            input,
            run: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn echoes_after_progress_steps() {
        let mut sink = VecSink::default();
        EchoAgent::new(Duration::from_secs(3), 3)
            .run(turn(json!("hi")), &mut sink)
            .await
            .unwrap();
        assert_eq!(sink.events.len(), 4);
        assert_eq!(sink.events[0]["type"], "progress");
        assert_eq!(sink.events[3]["content"], "hi");
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_first_refused_event() {
        let mut sink = VecSink {
            fail_after: Some(1),
            ..VecSink::default()
        };
        let err = EchoAgent::new(Duration::from_secs(3), 3)
            .run(turn(json!("hi")), &mut sink)
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::Sink(_)));
        assert_eq!(sink.events.len(), 1);
    }
}
