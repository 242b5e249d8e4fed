//! The agent the end-to-end replicas run for every turn (`--agent exec`,
//! this same executable started as `faults effect-agent …`): the echo
//! agent's shape — progress steps, then the input as its message — with a
//! side effect at each step, sent to the run's [destination] with the
//! run's session, token, run id and an idempotency key of the run's key
//! prefix and the step. The first step's effect is sent twice, as a
//! client retrying a request whose answer it lost would.
//!
//! It does what an agent that trusts its destination's fence does: it
//! never looks at its lease itself, so an agent that outlives its
//! replica's lease (the replica frozen, or killed under it) keeps sending
//! its effects, and only the destination stands between them and a
//! second, stale performance.
//!
//! [destination]: super::destination

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use lease_http::effect_fence::{IDEMPOTENCY_KEY_HEADER, SESSION_HEADER, TOKEN_HEADER};
use serde_json::{Value, json};

/// The first argument that starts this executable as the agent.
pub(crate) const AGENT_PROCESS: &str = "effect-agent";

/// The header the agent names its run in; the destination records it to
/// tie each effect to a stored run.
pub(crate) const RUN_ID_HEADER: &str = "mecatl-run-id";

/// The arguments the replicas' `--agent-arg` flags pass: the destination's
/// address, the steps, the run's length in milliseconds.
pub(crate) fn agent_args(destination: SocketAddr, steps: u32, run_ms: u64) -> Vec<String> {
    vec![
        AGENT_PROCESS.into(),
        destination.to_string(),
        steps.to_string(),
        run_ms.to_string(),
    ]
}

/// `faults effect-agent ADDR STEPS RUN_MS`: one turn on stdin, its events
/// on stdout.
pub(crate) fn agent_main(args: &[String]) -> ExitCode {
    match turn(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("effect-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the replica told the agent about its run, from the environment.
struct Run {
    session: String,
    /// `None` unleased: such a run has no token to fence an effect with,
    /// so it performs none.
    token: Option<String>,
    run_id: String,
    key_prefix: String,
}

impl Run {
    fn from_env() -> Result<Run, String> {
        let var = |name: &str| std::env::var(name).map_err(|e| format!("{name}: {e}"));
        Ok(Run {
            session: var("MECATL_SESSION_ID")?,
            token: std::env::var("MECATL_FENCING_TOKEN").ok(),
            run_id: var("MECATL_RUN_ID")?,
            key_prefix: var("MECATL_EFFECT_KEY_PREFIX")?,
        })
    }
}

fn turn(args: &[String]) -> Result<(), String> {
    let [addr, steps, run_ms] = args else {
        return Err(format!("usage: faults {AGENT_PROCESS} ADDR STEPS RUN_MS"));
    };
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let steps: u32 = steps.parse().map_err(|e| format!("{steps}: {e}"))?;
    let run_ms: u64 = run_ms.parse().map_err(|e| format!("{run_ms}: {e}"))?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    let request: Value = serde_json::from_str(&line).map_err(|e| format!("the turn: {e}"))?;
    let run = Run::from_env()?;
    let pause = Duration::from_millis(run_ms / u64::from(steps.max(1)));
    let mut out = std::io::stdout().lock();
    for step in 1..=steps {
        std::thread::sleep(pause);
        if let Some(token) = &run.token {
            let key = format!("{}step-{step}", run.key_prefix);
            let sends = if step == 1 { 2 } else { 1 };
            for _ in 0..sends {
                let status = send_effect(addr, &run, token, &key);
                emit(
                    &mut out,
                    &json!({"type": "effect", "step": step, "status": status}),
                )?;
            }
        }
        emit(
            &mut out,
            &json!({"type": "progress", "step": step, "of": steps}),
        )?;
    }
    emit(
        &mut out,
        &json!({"type": "message", "role": "assistant", "content": request["input"]}),
    )
}

/// One event line; a replica that is gone ends the agent.
fn emit(out: &mut impl Write, event: &Value) -> Result<(), String> {
    writeln!(out, "{event}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
}

/// POSTs one effect; its HTTP status, `None` when no answer came.
fn send_effect(addr: SocketAddr, run: &Run, token: &str, key: &str) -> Option<u16> {
    let timeout = Duration::from_secs(2);
    let mut conn = TcpStream::connect_timeout(&addr, timeout).ok()?;
    conn.set_read_timeout(Some(timeout)).ok()?;
    conn.set_write_timeout(Some(timeout)).ok()?;
    let request = format!(
        "POST /effect HTTP/1.1\r\nhost: {addr}\r\n{SESSION_HEADER}: {}\r\n\
         {TOKEN_HEADER}: {token}\r\n{IDEMPOTENCY_KEY_HEADER}: {key}\r\n\
         {RUN_ID_HEADER}: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        run.session, run.run_id
    );
    conn.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).ok()?;
    // "HTTP/1.1 200 OK"
    let status_line = answer.split(|b| *b == b'\r').next()?;
    std::str::from_utf8(status_line)
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}
