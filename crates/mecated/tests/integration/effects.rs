//! A run's side effects fenced at their destination, with real processes:
//! a downstream service keeps an `EffectFence`, and `exec` agents send it
//! the run's session, fencing token and effect key from their environment.
//! A holder paused past its lease, whose agent calls after the takeover,
//! is refused; the new owner's effect, sent twice with one key, lands once.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lease_http::{EffectClaim, EffectFence, EffectTicket, HttpError, Refusal};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::support::*;

/// The agent: reads its turn, then calls the downstream service for the
/// effect `charge` (twice, as a retry would, unless its input is `hold`:
/// then once, after the test lets it go) and records each answer as an
/// event. Plain bash (`/dev/tcp`), so the test needs no HTTP client.
const AGENT: &str = r#"
read -r req
port=$1; dir=$2
call() {
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf 'POST /effect HTTP/1.1\r\nHost: 127.0.0.1\r\nMecatl-Session: %s\r\nMecatl-Fencing-Token: %s\r\nIdempotency-Key: %s%s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' \
    "$MECATL_SESSION_ID" "$MECATL_FENCING_TOKEN" "$MECATL_EFFECT_KEY_PREFIX" "$1" >&3
  read -r _ code _ <&3
  exec 3<&-
  printf '{"type":"effect","step":"%s","status":%s}\n' "$1" "$code"
}
case "$req" in
  *'"input":"hold","run_id"'*)
    : > "$dir/ready"
    while [ ! -e "$dir/go" ]; do sleep 0.05; done
    call charge ;;
  *) printf '{"type":"lease","safe_ms":%s}\n' "${MECATL_LEASE_SAFE_MS:-null}"
     call charge; call charge ;;
esac
"#;

/// The downstream service: every request's claim and what the fence made
/// of it, and the effects performed.
#[derive(Default)]
struct Downstream {
    fence: EffectFence,
    seen: Mutex<Vec<(EffectClaim, Result<(), Refusal>)>>,
}

async fn effect(State(d): State<Arc<Downstream>>, claim: EffectClaim) -> Response {
    // The effect itself is instant here: admitted is performed.
    let outcome = d.fence.admit(&claim).map(EffectTicket::done);
    d.seen.lock().unwrap().push((claim, outcome));
    match outcome {
        Ok(()) => StatusCode::OK.into_response(),
        Err(refused) => HttpError::from(refused).into_response(),
    }
}

async fn downstream() -> (Arc<Downstream>, u16) {
    let d = Arc::new(Downstream::default());
    let app = axum::Router::new()
        .route("/effect", axum::routing::post(effect))
        .with_state(Arc::clone(&d));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (d, port)
}

fn replica(store: &Path, owner: &str, script: &Path, port: u16, dir: &Path) -> Mecated {
    let (script, port, dir) = (
        script.to_str().unwrap(),
        port.to_string(),
        dir.to_str().unwrap(),
    );
    let flags = [
        "--session-lease-ttl",
        "1s",
        "--agent",
        "exec",
        "--agent-command",
        "/bin/bash",
        "--agent-arg",
        script,
        "--agent-arg",
        &port,
        "--agent-arg",
        dir,
    ];
    Mecated::start(store, owner, &flags)
}

async fn until_exists(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < PATIENCE,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_effect_is_refused_and_the_new_owners_lands_once() {
    let root = tempfile::tempdir().unwrap();
    let (store, work) = (root.path().join("store"), root.path().join("work"));
    std::fs::create_dir_all(&work).unwrap();
    let script = root.path().join("agent.sh");
    std::fs::write(&script, AGENT).unwrap();
    let (down, port) = downstream().await;
    let a = replica(&store, "proc-a", &script, port, &work);
    let b = replica(&store, "proc-b", &script, port, &work);
    create(&a, "s").await;

    // A's agent is about to call when A stops: a pause past its lease.
    let _a_run = run_in_background(&a, "s", json!("hold"));
    until_exists(&work.join("ready")).await;
    let started = wait_for_event(&a, "s", is_run_started_by("proc-a")).await;
    let a_token = started["token"].as_u64().unwrap();
    a.signal(Signal::SIGSTOP);

    // B takes the session over and performs the effect, sending it twice.
    let b_run = run_when_free(&b, "s", json!("retry")).await;
    assert_eq!(b_run["status"], "completed", "{b_run}");
    let b_token = b_run["token"].as_u64().unwrap();
    assert!(b_token > a_token);
    let answers: Vec<Value> = b_run["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "effect")
        .map(|e| e["payload"]["status"].clone())
        .collect();
    assert_eq!(answers, [json!(200), json!(409)], "{b_run}");
    // Told how long its lease was safe: some of the TTL (1 s), less one
    // renewal interval (a third of it).
    let safe_ms = b_run["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["payload"]["type"] == "lease")
        .and_then(|e| e["payload"]["safe_ms"].as_u64())
        .expect("the agent was told its safe time");
    assert!(safe_ms > 0 && safe_ms <= 667, "{safe_ms} ms");

    // A's agent, which never learned of the takeover, calls now.
    std::fs::write(work.join("go"), "").unwrap();
    let start = Instant::now();
    while down.seen.lock().unwrap().len() < 3 {
        assert!(start.elapsed() < PATIENCE, "A's agent never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal(Signal::SIGCONT);

    let seen = down.seen.lock().unwrap().clone();
    let b_key = seen[0].0.key.clone().unwrap();
    let judged: Vec<_> = seen.iter().map(|(c, a)| (c.token, *a)).collect();
    assert_eq!(
        judged,
        [
            (b_token, Ok(())),
            (b_token, Err(Refusal::Repeat)),
            (a_token, Err(Refusal::Stale { highest: b_token })),
        ],
        "{seen:?}"
    );
    assert_eq!(seen[1].0.key.as_deref(), Some(b_key.as_str()));
    assert!(b_key.ends_with("charge"), "{b_key}");
    assert!(seen.iter().all(|(c, _)| c.session == "s"));
    assert_ne!(seen[2].0.key.as_deref(), Some(b_key.as_str()));
}
