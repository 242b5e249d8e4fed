//! `exec`: runs a user's command for every turn.
//!
//! Protocol: the command gets the turn as one JSON object on stdin
//! (`{"session_id", "transcript", "input", "run_id", "token",
//! "lease_safe_ms", "effect_key_prefix"}`, then EOF) and writes its events
//! as JSON objects, one per line, on stdout. A zero exit ends the run; a
//! non-zero exit, or a line that is not a JSON object, fails it with the
//! tail of stderr. The command runs in a process group of its own, and the
//! whole group is killed when the run is cancelled or loses its lease
//! while the command runs. A run whose lease is already lost starts no
//! command.
//!
//! For its side effects outside the session, the command is also given
//! the run in its environment: `MECATL_SESSION_ID`, `MECATL_RUN_ID`,
//! `MECATL_EFFECT_KEY_PREFIX` and, when leased, `MECATL_FENCING_TOKEN`,
//! `MECATL_LEASE_SAFE_MS` (how long the lease was safely held when the
//! command was started) and `MECATL_LEASE_SAFE_UNTIL_MONOTONIC_MS` (the
//! same as a deadline on `CLOCK_MONOTONIC`, in milliseconds: Python's
//! `time.monotonic()`, for one, reads that clock). A command starts no
//! effect past the deadline: the deadline, unlike a count of milliseconds,
//! holds even if the server paused before the command read it. Send the
//! token and the key prefix with a step name appended (see
//! `Turn::effect_key`) to the service the effect goes to, which can then
//! refuse a stale owner and a repeat (`lease_http::EffectFence`).
//!
//! The transcript is the whole session unless the agent is set to another
//! [`TranscriptScope`]: a command that writes `{"type": "checkpoint", …}`
//! events summing up the conversation so far can be handed only what
//! follows the newest one, so its runs cost the same however long the
//! session grows.

use std::path::PathBuf;
use std::process::Stdio;

use async_trait::async_trait;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::{Agent, AgentError, EventSink, TranscriptScope, Turn};

/// Longest stdout line accepted from the child, so a runaway command cannot
/// exhaust the server's memory.
const MAX_LINE: usize = 1 << 20;

/// Runs `program args…` per turn.
#[derive(Debug, Clone)]
pub struct ExecAgent {
    program: PathBuf,
    args: Vec<String>,
    scope: TranscriptScope,
}

impl ExecAgent {
    /// The command to run for every turn.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>) -> Self {
        Self {
            program: program.into(),
            args,
            scope: TranscriptScope::Full,
        }
    }

    /// Hands the command `scope` of the session's history instead of all
    /// of it.
    pub fn with_transcript_scope(mut self, scope: TranscriptScope) -> Self {
        self.scope = scope;
        self
    }

    /// The command for `turn`, its environment telling it the run and the
    /// lease, in a process group of its own: a cancelled or lease-lost run
    /// stops what the command started too, not the command alone.
    fn command(
        &self,
        turn: &Turn,
        key_prefix: &str,
        safe_ms: Option<u128>,
        safe_until: Option<u128>,
    ) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env("MECATL_SESSION_ID", &turn.session_id)
            .env("MECATL_RUN_ID", turn.run.run_id.to_string())
            .env("MECATL_EFFECT_KEY_PREFIX", key_prefix)
            .process_group(0);
        // Never inherited from the server's own environment: an unleased
        // run has no token and no bound.
        let optional = [
            ("MECATL_FENCING_TOKEN", turn.run.token.map(u128::from)),
            ("MECATL_LEASE_SAFE_MS", safe_ms),
            ("MECATL_LEASE_SAFE_UNTIL_MONOTONIC_MS", safe_until),
        ];
        for (name, value) in optional {
            match value {
                Some(v) => command.env(name, v.to_string()),
                None => command.env_remove(name),
            };
        }
        command
    }
}

/// What the command reads on stdin. Borrowed, so the transcript is
/// written out as it is cached, never copied first.
#[derive(serde::Serialize)]
struct Request<'a> {
    session_id: &'a str,
    transcript: &'a super::Transcript,
    input: &'a Value,
    run_id: u64,
    token: Option<u64>,
    lease_safe_ms: Option<u128>,
    effect_key_prefix: &'a str,
}

fn failed(msg: impl Into<String>) -> AgentError {
    AgentError::Failed(msg.into())
}

/// `now + left` on `CLOCK_MONOTONIC`, in milliseconds: what a command
/// compares with its own reading of that clock.
fn monotonic_deadline_ms(left: std::time::Duration) -> Option<u128> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    let now = std::time::Duration::new(
        u64::try_from(now.tv_sec()).ok()?,
        u32::try_from(now.tv_nsec()).ok()?,
    );
    Some((now + left).as_millis())
}

/// Kills the command's process group when dropped before the command was
/// reaped: a run cancelled, or one whose lease was lost, mid-command.
/// Until then the group's id is the unreaped leader's pid, so it cannot
/// name anyone else's processes.
struct GroupKill(Option<i32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[async_trait]
impl Agent for ExecAgent {
    fn transcript_scope(&self) -> TranscriptScope {
        self.scope
    }

    async fn run(&self, turn: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        let key_prefix = super::effect_key_prefix(&turn.session_id, &turn.run);
        // Asked now, not when the turn was made: the command counts from
        // its own start. Its deadline goes with it on the monotonic clock
        // too, which a pause of this server before the command reads it
        // cannot stretch.
        let safe = sink.lease_check()?;
        let safe_ms = safe.map(|d| d.as_millis());
        let safe_until = safe.and_then(monotonic_deadline_ms);
        let mut command = self.command(&turn, &key_prefix, safe_ms, safe_until);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot start {}: {e}", self.program.display())))?;
        let mut group = GroupKill(child.id().and_then(|id| i32::try_from(id).ok()));
        let mut stdin = child.stdin.take().ok_or_else(|| failed("no stdin pipe"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| failed("no stdout pipe"))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| failed("no stderr pipe"))?;
        // Feed stdin concurrently: a child that writes before reading must
        // not deadlock against a full pipe.
        let request = Request {
            session_id: &turn.session_id,
            transcript: &turn.transcript,
            input: &turn.input,
            run_id: turn.run.run_id,
            token: turn.run.token,
            lease_safe_ms: safe_ms,
            effect_key_prefix: &key_prefix,
        };
        let body = serde_json::to_vec(&request).map_err(|e| failed(e.to_string()))?;
        let feed = tokio::spawn(async move {
            let _ = stdin.write_all(&body).await;
            // Dropping stdin closes it: the child sees EOF.
        });
        let drain = tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut buf).await;
            String::from_utf8_lossy(&buf).into_owned()
        });

        let mut lines = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut lines)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .await
                .map_err(|e| failed(format!("reading stdout: {e}")))?;
            if n == 0 {
                break;
            }
            if line.len() > MAX_LINE {
                return Err(failed(format!("output line longer than {MAX_LINE} bytes")));
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(text) {
                Ok(event @ Value::Object(_)) => sink.emit(event).await?,
                _ => {
                    return Err(failed(format!(
                        "output line is not a JSON object: {text:.200}"
                    )));
                }
            }
        }
        let status = child
            .wait()
            .await
            .map_err(|e| failed(format!("waiting for the command: {e}")))?;
        // Reaped: its group id may be reused from here on.
        group.0 = None;
        let _ = feed.await;
        let stderr = drain.await.unwrap_or_default();
        if status.success() {
            Ok(())
        } else {
            Err(failed(format!(
                "command exited with {status}: {}",
                tail(&stderr).trim()
            )))
        }
    }
}

/// The last 2,000 characters of a command's stderr: where its error is.
fn tail(stderr: &str) -> String {
    let mut tail: Vec<char> = stderr.chars().rev().take(2000).collect();
    tail.reverse();
    tail.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testing::VecSink;
    use serde_json::json;

    fn sh(script: &str) -> ExecAgent {
        ExecAgent::new("/bin/sh", vec!["-c".into(), script.into()])
    }

    fn turn() -> Turn {
        Turn {
            session_id: "s-1".into(),
            transcript: vec![json!({"type": "message", "content": "earlier"})].into(),
            input: json!("hello"),
            run: crate::agent::RunLease {
                run_id: 7,
                token: Some(3),
                safe_for: Some(std::time::Duration::from_millis(4_500)),
            },
        }
    }

    #[tokio::test]
    async fn child_is_told_its_run_and_lease_on_stdin_and_in_its_environment() {
        let mut sink = VecSink {
            safe: Some(std::time::Duration::from_millis(4_500)),
            ..VecSink::default()
        };
        let before = monotonic_deadline_ms(std::time::Duration::ZERO).unwrap();
        sh(r#"read -r req
printf '{"req":%s,"env":["%s","%s","%s","%s","%s"],"until":%s}\n' "$req" \
  "$MECATL_SESSION_ID" "$MECATL_RUN_ID" "$MECATL_FENCING_TOKEN" \
  "$MECATL_LEASE_SAFE_MS" "$MECATL_EFFECT_KEY_PREFIX" \
  "$MECATL_LEASE_SAFE_UNTIL_MONOTONIC_MS""#)
        .run(turn(), &mut sink)
        .await
        .unwrap();
        let after = monotonic_deadline_ms(std::time::Duration::ZERO).unwrap();
        let got = &sink.events[0];
        let prefix = turn().effect_key("");
        assert_eq!(got["env"], json!(["s-1", "7", "3", "4500", prefix]));
        assert_eq!(got["req"]["run_id"], 7);
        assert_eq!(got["req"]["token"], 3);
        assert_eq!(got["req"]["lease_safe_ms"], 4500);
        assert_eq!(got["req"]["effect_key_prefix"], prefix);
        // The deadline on the monotonic clock: the safe time from when the
        // command was started.
        let until = u128::from(got["until"].as_u64().unwrap());
        assert!(until >= before + 4_500 && until <= after + 4_500, "{until}");
        assert_eq!(
            format!("{prefix}mail-1"),
            turn().effect_key("mail-1"),
            "a step appended to the prefix is the run's key"
        );
    }

    #[tokio::test]
    async fn a_run_whose_lease_is_lost_starts_no_command() {
        struct Lost;
        #[async_trait]
        impl EventSink for Lost {
            async fn emit(&mut self, _: Value) -> Result<(), crate::agent::SinkError> {
                unreachable!("nothing may be emitted")
            }
            fn lease_check(&self) -> Result<Option<std::time::Duration>, crate::agent::SinkError> {
                Err(crate::agent::SinkError("lost".into()))
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let err = sh(&format!("touch {}", marker.display()))
            .run(turn(), &mut Lost)
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::Sink(_)), "{err}");
        assert!(!marker.exists(), "the command ran");
    }

    #[tokio::test]
    async fn child_reads_the_turn_and_its_lines_become_events() {
        let mut sink = VecSink::default();
        // The child echoes its stdin back as one event, then a second one.
        sh(r#"read -r req; printf '{"type":"got","req":%s}\n{"type":"done"}\n' "$req""#)
            .run(turn(), &mut sink)
            .await
            .unwrap();
        assert_eq!(sink.events.len(), 2);
        assert_eq!(sink.events[0]["req"]["input"], "hello");
        assert_eq!(sink.events[0]["req"]["session_id"], "s-1");
        assert_eq!(sink.events[0]["req"]["transcript"][0]["content"], "earlier");
        assert_eq!(sink.events[1]["type"], "done");
    }

    #[tokio::test]
    async fn non_zero_exit_fails_with_stderr() {
        let mut sink = VecSink::default();
        let err = sh("echo boom >&2; exit 3")
            .run(turn(), &mut sink)
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("boom") && msg.contains('3'), "{msg}");
    }

    #[tokio::test]
    async fn malformed_output_fails_the_run() {
        let mut sink = VecSink::default();
        let err = sh("echo '{\"ok\":1}'; echo 'not json'")
            .run(turn(), &mut sink)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a JSON object"));
        assert_eq!(sink.events.len(), 1);
    }

    #[tokio::test]
    async fn missing_program_is_an_error_not_a_panic() {
        let mut sink = VecSink::default();
        let err = ExecAgent::new("/nonexistent/agent", vec![])
            .run(turn(), &mut sink)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cannot start"));
    }

    /// Whether `pid` is gone, or a zombie, within 10 s.
    async fn gone_soon(pid: i32) -> bool {
        for _ in 0..500 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let field = state
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next();
            if state.is_empty() || field == Some("Z") {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        false
    }

    /// Runs `script` (which writes a pid, then a newline, to the file named
    /// by its first argument) until that pid is written, then drops the run:
    /// the pid.
    async fn pid_of_a_dropped_run(script: &str) -> i32 {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let agent = ExecAgent::new(
            "/bin/sh",
            vec![
                "-c".into(),
                script.into(),
                "sh".into(),
                pidfile.display().to_string(),
            ],
        );
        let mut sink = VecSink::default();
        let run = agent.run(turn(), &mut sink);
        let started = async {
            while std::fs::read_to_string(&pidfile).map_or(true, |s| !s.ends_with('\n')) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        // Once it is running, cancel the run by dropping its future.
        tokio::select! {
            r = run => panic!("the run ended on its own: {r:?}"),
            () = started => {}
        }
        std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn dropping_the_run_kills_the_child() {
        let pid = pid_of_a_dropped_run(r#"echo $$ > "$1"; exec sleep 30"#).await;
        assert!(
            gone_soon(pid).await,
            "child {pid} survived the cancelled run"
        );
    }

    #[tokio::test]
    async fn dropping_the_run_kills_what_the_child_started() {
        let pid = pid_of_a_dropped_run(r#"sleep 30 & echo $! > "$1"; wait"#).await;
        assert!(
            gone_soon(pid).await,
            "the child's own child {pid} survived the cancelled run"
        );
    }
}
