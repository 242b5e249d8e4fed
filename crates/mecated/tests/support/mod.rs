//! Real `mecated` processes for the tests: started on a free port, driven
//! over HTTP, stopped with real signals.

#![allow(dead_code)]

pub(crate) mod counting_store;
pub(crate) mod proxy;
pub(crate) mod scenarios;
pub(crate) mod sse;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Upper bound on waiting for anything in these tests; reaching it fails
/// the test. Generous, because CI machines are shared and slow.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) struct Mecated {
    pub(crate) child: Child,
    pub(crate) base: String,
    pub(crate) owner: String,
}

impl Mecated {
    pub(crate) fn start(store: &Path, owner: &str, extra: &[&str]) -> Self {
        let child = server_command(store, owner, extra)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mecated");
        Self::listening(child, owner)
    }

    /// A server just started with its stdout piped, once it says where it
    /// listens.
    pub(crate) fn listening(mut child: Child, owner: &str) -> Self {
        let stdout = child.stdout.take().expect("stdout piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self {
            child,
            base,
            owner: owner.to_owned(),
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub(crate) fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).expect("signal mecated");
    }

    /// Waits for the process to exit; its exit status.
    pub(crate) fn wait_exit(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(start.elapsed() < PATIENCE, "mecated did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The server on `store` as `owner` on a free port, stdout piped (its
/// first line is the address it listens on).
pub(crate) fn server_command(store: &Path, owner: &str, extra: &[impl AsRef<OsStr>]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mecated"));
    cmd.args(["--listen", "127.0.0.1:0", "--owner", owner, "--store-dir"])
        .arg(store)
        .args(extra)
        .env("MECATED_LOG", "warn")
        .stdout(Stdio::piped());
    cmd
}

/// Starts mecated expecting it to refuse: its exit status and stderr. Fails
/// if it starts serving instead.
pub(crate) fn refused_start(store: &Path, owner: &str, extra: &[&OsStr]) -> String {
    let mut child = server_command(store, owner, extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mecated");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("read stdout");
    if !line.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("mecated started when it should have refused: {line:?}");
    }
    let out = child.wait_with_output().expect("wait for mecated");
    assert!(!out.status.success(), "refused, yet exited 0");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

impl Drop for Mecated {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

pub(crate) async fn create(m: &Mecated, id: &str) {
    let r = client()
        .post(m.url("/v1/sessions"))
        .json(&json!({ "id": id }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
}

pub(crate) async fn run(m: &Mecated, id: &str, input: Value) -> (StatusCode, Value) {
    let r = client()
        .post(m.url(&format!("/v1/sessions/{id}/runs")))
        .json(&json!({ "input": input }))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// `m`'s Prometheus text.
pub(crate) async fn metrics(m: &Mecated) -> String {
    let r = client().get(m.url("/metrics")).send().await.unwrap();
    r.text().await.unwrap()
}

pub(crate) async fn events(m: &Mecated, id: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page: Value = client()
            .get(m.url(&format!(
                "/v1/sessions/{id}/events?after={after}&limit=1000"
            )))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        all.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_u64() {
            Some(n) => after = n,
            None => return all,
        }
    }
}

/// Waits until `id`'s log holds an event matching `pred`.
pub(crate) async fn wait_for_event(m: &Mecated, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        if let Some(e) = events(m, id).await.into_iter().find(|e| pred(e)) {
            return e;
        }
        assert!(start.elapsed() < PATIENCE, "event never appeared in {id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `value` names `owner`: exactly, or as one incarnation of it
/// (`owner#suffix`, as servers leasing from a lease service name
/// themselves).
pub(crate) fn is_owner(value: &Value, owner: &str) -> bool {
    value.as_str().is_some_and(|v| {
        v == owner
            || v.strip_prefix(owner)
                .is_some_and(|rest| rest.starts_with('#'))
    })
}

pub(crate) fn is_run_started_by(owner: &str) -> impl Fn(&Value) -> bool + '_ {
    move |e| e["payload"]["type"] == "run_started" && is_owner(&e["payload"]["owner"], owner)
}

/// Starts a run on `m` without waiting for it: its JSON result, or the
/// transport error when the process dies first.
pub(crate) fn run_in_background(
    m: &Mecated,
    id: &str,
    input: Value,
) -> tokio::task::JoinHandle<Result<Value, reqwest::Error>> {
    let url = m.url(&format!("/v1/sessions/{id}/runs"));
    tokio::spawn(async move {
        let body = json!({ "input": input });
        client().post(url).json(&body).send().await?.json().await
    })
}

/// A run started in the background and the processes around it, as
/// [`mid_run`] returns them.
pub(crate) type MidRun = (
    Mecated,
    Mecated,
    tokio::task::JoinHandle<Result<Value, reqwest::Error>>,
    Value,
);

/// Two processes on `store` with a 1 s TTL and the `lease` flags; `proc-a` is part-way through a
/// run of `id` lasting `delay` (its `run_started` and a first progress event
/// are in the log). Returns both, A's pending run and its `run_started`.
pub(crate) async fn mid_run(
    store: &Path,
    lease: &[&str],
    id: &str,
    delay: &str,
    input: Value,
) -> MidRun {
    mid_run_with_ttl(store, "1s", lease, id, delay, input).await
}

/// [`mid_run`] with the lease TTL `ttl`, for backends that count whole
/// seconds and grant no less than their own minimum (etcd's is 2 s).
pub(crate) async fn mid_run_with_ttl(
    store: &Path,
    ttl: &str,
    lease: &[&str],
    id: &str,
    delay: &str,
    input: Value,
) -> MidRun {
    let ttl = [&["--session-lease-ttl", ttl][..], lease].concat();
    let slow = [&ttl[..], &["--echo-delay", delay, "--echo-steps", "30"]].concat();
    let a = Mecated::start(store, "proc-a", &slow);
    let b = Mecated::start(store, "proc-b", &ttl);
    create(&a, id).await;
    let pending = run_in_background(&a, id, input);
    let started = wait_for_event(&a, id, is_run_started_by("proc-a")).await;
    wait_for_event(&a, id, |e| e["payload"]["type"] == "progress").await;
    (a, b, pending, started)
}

/// The wall clock in milliseconds, as the store stamps events.
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// `mecated leases --json` for one session of `store`.
pub(crate) fn listed_lease(store: &Path, session: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_mecated"))
        .args(["leases", "--json", "--store-dir"])
        .arg(store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["session"] == session)
        .unwrap_or_else(|| panic!("no lease of {session} listed"))
}

/// Retries a run on `m` until it is no longer refused as leased elsewhere.
pub(crate) async fn run_when_free(m: &Mecated, id: &str, input: Value) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = run(m, id, input.clone()).await;
        if status == StatusCode::OK {
            return body;
        }
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["code"], "session_leased_elsewhere", "{body}");
        assert!(start.elapsed() < PATIENCE, "the session was never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails unless the sequence numbers of `log` follow each other without a
/// gap.
pub(crate) fn assert_gapless(log: &[Value]) {
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gaps in {seqs:?}"
    );
}

/// Fails if any event after `owner`'s last `run_started` in `log` carries
/// a token other than `token`: a write of an earlier holder landed after the
/// takeover.
pub(crate) fn assert_only_token_after_takeover(log: &[Value], owner: &str, token: u64) {
    let taken_at = log
        .iter()
        .rfind(|e| is_run_started_by(owner)(e))
        .unwrap_or_else(|| panic!("no run of {owner} in the log"))["seq"]
        .as_u64()
        .unwrap();
    for e in log.iter().filter(|e| e["seq"].as_u64().unwrap() > taken_at) {
        assert_eq!(
            e["token"].as_u64().unwrap(),
            token,
            "a stale write reached the log: {e}"
        );
    }
}
