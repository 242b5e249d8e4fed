//! Two processes of the chat example over one directory, with a 2 s TTL:
//! while A holds a session in a slow request B is refused with 409
//! `session_leased_elsewhere` and `Retry-After`; A paused (`SIGSTOP`)
//! after acquiring and before writing, past its TTL, loses the session to
//! B, and when it resumes its late write is refused — the transcript holds
//! B's message, not A's.
//!
//! The example's executable is the one cargo builds beside this test
//! binary (`target/<profile>/examples/chat`): `cargo test` and `cargo
//! nextest run` build a package's examples with its tests. When it is
//! missing or older than the crate's sources (a run of this test target
//! alone, `--test integration`), the test builds it with `cargo build
//! --example chat`. `LEASE_HTTP_CHAT_EXE` names another executable.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use flocklease::FlockLease;
use lease_http::{ErrorBody, ErrorCode};
use lease_port::{Lease, SessionId, SessionLease};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

/// Short, so a paused holder's lease runs out soon.
const TTL: Duration = Duration::from_secs(2);

/// How long any awaited condition may take on a loaded machine; only a
/// bound on failure, never a measurement.
const PATIENCE: Duration = Duration::from_secs(120);

/// A's "model call": far longer than the test needs, so A is certainly
/// still between acquiring and writing when it is paused. The example
/// cuts it short once the lease is lost, so it never slows the test.
const THINK_MS: u64 = 120_000;

/// One running chat process.
struct Chat {
    child: Child,
    addr: String,
    http: reqwest::Client,
    // Held open: the example's stdout stays writable.
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Chat {
    async fn start(exe: &Path, dir: &Path) -> Chat {
        let mut child = Command::new(exe)
            .arg(dir)
            .env("CHAT_TTL_MS", TTL.as_millis().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", exe.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("the example printed its address in time")
            .expect("read the example's stdout")
            .expect("the example printed its address before exiting");
        Chat {
            child,
            addr,
            http: reqwest::Client::new(),
            _stdout: lines,
        }
    }

    fn pid(&self) -> Pid {
        let id = self.child.id().expect("the example is running");
        Pid::from_raw(i32::try_from(id).expect("a pid"))
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("{signal}: {e}"));
    }

    fn url(&self, session: &str) -> String {
        format!("http://{}/{session}/messages", self.addr)
    }

    /// `POST /{session}/messages?think_ms=…`: status, `Retry-After`, body.
    async fn post(&self, session: &str, text: &str, think_ms: u64) -> Answer {
        let response = self
            .http
            .post(self.url(session))
            .query(&[("think_ms", think_ms)])
            .body(text.to_owned())
            .send()
            .await
            .expect("the example answered");
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .map(|v| v.to_str().expect("ASCII").parse().expect("whole seconds"));
        let body = response.text().await.expect("a body");
        Answer {
            status,
            retry_after,
            body,
        }
    }

    /// `GET /{session}/messages`: the texts stored, in order.
    async fn transcript(&self, session: &str) -> Vec<String> {
        let response = self.http.get(self.url(session)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let events: Vec<Value> = response.json().await.unwrap();
        events
            .iter()
            .map(|e| e["text"].as_str().expect("a text").to_owned())
            .collect()
    }
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    body: String,
}

impl Answer {
    fn error(&self) -> ErrorBody {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not an error body ({e}): {self:?}"))
    }
}

/// Polls `probe` until it gives a value, for at most [`PATIENCE`].
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The live lease of `session`, as any process on the directory sees it.
async fn holder(leases: &FlockLease, session: &str) -> Option<Lease> {
    let session = SessionId::new(session).unwrap();
    leases.current(&session).await.expect("read the lease file")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_loses_the_session_and_its_late_write_is_refused() {
    let exe = tokio::task::spawn_blocking(chat_exe).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = Chat::start(&exe, dir.path()).await;
    let b = Chat::start(&exe, dir.path()).await;
    let leases = FlockLease::open(dir.path().join(session_store::DEFAULT_LEASE_DIR_NAME), TTL)
        .expect("open the example's lease directory");

    // Both serve the directory: each reads what the other wrote.
    let hello = a.post("hello", "from A", 0).await;
    assert_eq!(hello.status, StatusCode::OK, "{hello:?}");
    let hello = b.post("hello", "from B", 0).await;
    assert_eq!(hello.status, StatusCode::OK, "{hello:?}");
    assert_eq!(b.transcript("hello").await, ["from A", "from B"]);
    assert_eq!(a.transcript("hello").await, ["from A", "from B"]);

    // (a) A holds the session in a slow request: B is refused, told by
    // whom and when to come back.
    let slow = {
        let url = a.url("chat");
        let http = a.http.clone();
        tokio::spawn(async move {
            let response = http
                .post(url)
                .query(&[("think_ms", THINK_MS)])
                .body("from A")
                .send()
                .await
                .expect("A answered");
            (response.status(), response.text().await.expect("a body"))
        })
    };
    let held = eventually("A holds the session", || holder(&leases, "chat")).await;
    let refused = b.post("chat", "from B", 0).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    let error = refused.error().error;
    assert_eq!(error.code, ErrorCode::SessionLeasedElsewhere, "{refused:?}");
    assert_eq!(error.holder.as_deref(), Some(held.owner().as_str()));
    assert!(!error.retryable, "{refused:?}");
    let retry_after = refused.retry_after.expect("Retry-After on a 409");
    // The holder's lease lives at most a TTL (2 s) from its last renewal.
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");

    // (b) A pauses between acquiring and writing, past its TTL.
    a.signal(Signal::SIGSTOP);
    eventually("B takes the session over", || async {
        let answer = b.post("chat", "from B", 0).await;
        if answer.status == StatusCode::OK {
            return Some(());
        }
        // Until A's lease runs out, B is refused and writes nothing.
        assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
        let code = answer.error().error.code;
        assert_eq!(code, ErrorCode::SessionLeasedElsewhere, "{answer:?}");
        None
    })
    .await;
    a.signal(Signal::SIGCONT);

    // A's late write is refused, by its keeper (the lease was lost) or by
    // the store (B's token is higher).
    let (status, body) = tokio::time::timeout(PATIENCE, slow)
        .await
        .expect("A answered after resuming")
        .unwrap();
    eprintln!("A's late write: {status} {body}");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let error: ErrorBody = serde_json::from_str(&body).expect("an error body");
    assert!(
        matches!(
            error.error.code,
            ErrorCode::LeaseLost | ErrorCode::WriteFenced
        ),
        "{body}"
    );
    assert_eq!(b.transcript("chat").await, ["from B"]);
    assert_eq!(a.transcript("chat").await, ["from B"]);
}

/// The chat example's executable: see the module docs.
fn chat_exe() -> PathBuf {
    if let Some(exe) = std::env::var_os("LEASE_HTTP_CHAT_EXE") {
        return exe.into();
    }
    // This binary is target/<profile>/deps/integration-<hash>.
    let own = std::env::current_exe().expect("own executable");
    let profile_dir = own
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let beside = profile_dir.join("examples").join("chat");
    let built = std::fs::metadata(&beside).and_then(|m| m.modified()).ok();
    if built.is_some_and(|built| built >= newest_source()) {
        return beside;
    }
    build_chat(profile_dir)
}

/// When the crate's sources last changed: an example older than that is
/// stale.
fn newest_source() -> SystemTime {
    fn newest(path: &Path) -> SystemTime {
        let Ok(meta) = std::fs::metadata(path) else {
            return SystemTime::UNIX_EPOCH;
        };
        let own = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if !meta.is_dir() {
            return own;
        }
        std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| newest(&entry.path()))
            .fold(own, SystemTime::max)
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["Cargo.toml", "src", "examples"]
        .iter()
        .map(|p| newest(&crate_dir.join(p)))
        .fold(SystemTime::UNIX_EPOCH, SystemTime::max)
}

/// Builds the example with cargo, in this test's target directory and
/// profile, and gives the executable cargo reports.
fn build_chat(profile_dir: &Path) -> PathBuf {
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "-p", "lease-http", "--example", "chat"])
        .args(["--profile", profile, "--message-format", "json"])
        .stderr(Stdio::inherit());
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    let out = cmd.output().expect("run cargo build --example chat");
    assert!(out.status.success(), "cargo build --example chat failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "chat")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reported the example's executable")
}
