//! Bearer tokens and roles on real `mecated` processes, over real HTTP:
//! who is refused (401, 403) and that a refused request changed nothing;
//! what stays open; the start-up refusal of an exposed address without
//! tokens; the token file read again without a restart; the audit trail.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::*;

/// The token of `name` in these tests.
fn secret(name: &str) -> String {
    format!("{name}-7f3a9c")
}

/// A token file line for `name` with `roles`.
fn line(name: &str, roles: &str) -> String {
    format!(
        "{name} {roles} {}\n",
        mecated::auth::hash_token(&secret(name))
    )
}

/// Replaces the file at `path` by rename, as an operator's tool (or a
/// Kubernetes Secret update) does: never half written.
fn replace(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// The usual token file: a reader, a runner (who may create sessions and
/// cancel runs, but not start them: that needs reading too), a driver who
/// starts runs, an admin (who may only delete), and an operator with every
/// role.
fn token_file(dir: &Path) -> PathBuf {
    let path = dir.join("tokens");
    let text = [
        "# the tokens of the tests\n".to_owned(),
        line("reader", "read"),
        line("runner", "run"),
        line("driver", "read,run"),
        line("janitor", "admin"),
        line("operator", "read,run,admin"),
    ]
    .concat();
    std::fs::write(&path, text).unwrap();
    path
}

/// `method path` on `m` as `who` (a token name, or no token).
async fn call(m: &Mecated, method: Method, path: &str, who: Option<&str>) -> (StatusCode, Value) {
    call_with(m, method, path, who.map(secret), json!(null)).await
}

async fn call_with(
    m: &Mecated,
    method: Method,
    path: &str,
    token: Option<String>,
    body: Value,
) -> (StatusCode, Value) {
    let mut req = client().request(method, m.url(path));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if !body.is_null() {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn start(dir: &Path, owner: &str, extra: &[&str]) -> Mecated {
    let tokens = token_file(dir);
    let store = dir.join("store");
    let args = [&["--token-file", tokens.to_str().unwrap()][..], extra].concat();
    Mecated::start(&store, owner, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_known_bearer_token_every_protected_route_is_401() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), "auth-401", &[]);
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        Some(secret("operator")),
        json!({"id": "s"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    for route in mecated::http::route_table() {
        if route.access == mecated::http::Access::Open {
            continue;
        }
        let url = m.url(&route.path.replace("{id}", "s"));
        let method = Method::from_bytes(route.method.as_str().as_bytes()).unwrap();
        let attempts: [(&str, Option<String>); 6] = [
            ("no header", None),
            ("an unknown token", Some("Bearer guessed".into())),
            (
                "a token's hash instead of the token",
                Some(format!(
                    "Bearer {}",
                    mecated::auth::hash_token(&secret("operator"))
                )),
            ),
            (
                "another scheme",
                Some(format!("Basic {}", secret("operator"))),
            ),
            ("an empty bearer", Some("Bearer ".into())),
            (
                "a known token with a suffix",
                Some(format!("Bearer {}x", secret("operator"))),
            ),
        ];
        for (what, header) in attempts {
            let mut req = client().request(method.clone(), &url);
            if let Some(h) = header {
                req = req.header("authorization", h);
            }
            let r = req.send().await.unwrap();
            assert_eq!(
                r.status(),
                StatusCode::UNAUTHORIZED,
                "{what}: {method} {url}"
            );
            assert_eq!(
                r.headers()["www-authenticate"],
                "Bearer realm=\"mecated\"",
                "{what}"
            );
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthenticated", "{what}: {body}");
        }
        // Two headers, one of them good: ambiguous, so refused.
        let r = client()
            .request(method.clone(), &url)
            .header("authorization", format!("Bearer {}", secret("operator")))
            .header("authorization", "Bearer guessed")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{method} {url}");
    }
    // HEAD reaches the GET handlers, and a token in the query is not one.
    for path in ["/v1/sessions", "/v1/sessions/s/events", "/metrics"] {
        let r = client().head(m.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "HEAD {path}");
        let r = client()
            .get(m.url(&format!("{path}?token={}", secret("operator"))))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "?token= on {path}");
    }
    // The scheme's case does not matter (RFC 9110).
    let r = client()
        .get(m.url("/v1/sessions"))
        .header("authorization", format!("bEaReR {}", secret("operator")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (status, body) = call(&m, Method::GET, "/v1/sessions/s/events", Some("operator")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["events"], json!([]), "a refused request ran: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_cannot_start_cancel_or_delete() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), "auth-read", &[]);
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        Some(secret("operator")),
        json!({"id": "kept"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let refused = [
        (Method::POST, "/v1/sessions", json!({"id": "new"}), "run"),
        (
            Method::POST,
            "/v1/sessions/kept/runs",
            json!({"input": "x"}),
            "run",
        ),
        (
            Method::DELETE,
            "/v1/sessions/kept/runs/current",
            json!(null),
            "run",
        ),
        (Method::DELETE, "/v1/sessions/kept", json!(null), "admin"),
    ];
    for (method, path, body, role) in refused {
        let (status, answer) =
            call_with(&m, method.clone(), path, Some(secret("reader")), body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        assert_eq!(answer["error"]["role"], role, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("\"reader\"") && message.contains(role),
            "{message}"
        );
    }
    // Nothing changed: one session, no events, and the reader reads.
    let (status, listed) = call(&m, Method::GET, "/v1/sessions", Some("reader")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["sessions"], json!([{"id": "kept"}]));
    let (status, page) = call(&m, Method::GET, "/v1/sessions/kept/events", Some("reader")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["events"], json!([]));
    let (status, _) = call(&m, Method::GET, "/v1/sessions/kept/lease", Some("reader")).await;
    assert_eq!(status, StatusCode::OK);
    // A runner does not read: roles grant only what they name.
    let (status, answer) = call(&m, Method::GET, "/v1/sessions", Some("runner")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(answer["error"]["role"], "read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_creates_and_cancels_read_and_run_start_runs_and_only_admin_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), "auth-run", &[]);
    let runner = Some(secret("runner"));
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        runner.clone(),
        json!({"id": "c"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, refused) = call_with(
        &m,
        Method::POST,
        "/v1/sessions/c/runs",
        runner.clone(),
        json!({"input": "hello"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["role"], "read", "{refused}");
    let (status, ran) = call_with(
        &m,
        Method::POST,
        "/v1/sessions/c/runs",
        Some(secret("driver")),
        json!({"input": "hello"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ran}");
    assert_eq!(ran["status"], "completed", "{ran}");
    let (status, _) = call(
        &m,
        Method::DELETE,
        "/v1/sessions/c/runs/current",
        Some("runner"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "nothing live to cancel");
    let (status, answer) = call(&m, Method::DELETE, "/v1/sessions/c", Some("runner")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(answer["error"]["role"], "admin");
    let (status, _) = call(&m, Method::GET, "/v1/sessions/c", Some("reader")).await;
    assert_eq!(status, StatusCode::OK, "the runner deleted it");
    let (status, _) = call(&m, Method::DELETE, "/v1/sessions/c", Some("janitor")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(&m, Method::GET, "/v1/sessions/c", Some("reader")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_the_document_stay_open_and_metrics_name_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), "auth-open", &[]);
    for path in ["/healthz", "/readyz", "/openapi.json", "/"] {
        let r = client().get(m.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let r = client().get(m.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let session = "metrics-canary-5d1e";
    let operator = Some(secret("operator"));
    call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        operator.clone(),
        json!({"id": session}),
    )
    .await;
    let path = format!("/v1/sessions/{session}/runs");
    let (status, _) = call_with(&m, Method::POST, &path, operator, json!({"input": "x"})).await;
    assert_eq!(status, StatusCode::OK);
    let r = client()
        .get(m.url("/metrics"))
        .bearer_auth(secret("reader"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("mecated_runs_total{outcome=\"completed\"} 1"),
        "{text}"
    );
    assert!(text.contains("mecated_auth_tokens 5"), "{text}");
    assert!(
        !text.contains(session),
        "the metrics name a session: {text}"
    );
    assert!(
        !text.contains("operator"),
        "the metrics name a token: {text}"
    );
}

/// `mecated` listening on `listen` with `extra`: its first stdout line,
/// and its stderr once it exited (when it refused).
fn listen_on(dir: &Path, listen: &str, extra: &[&str]) -> (Option<Mecated>, String) {
    listen_with(dir, listen, extra, &[])
}

/// [`listen_on`], with variables of the environment.
fn listen_with(
    dir: &Path,
    listen: &str,
    extra: &[&str],
    vars: &[(&str, &str)],
) -> (Option<Mecated>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mecated"))
        .envs(vars.iter().copied())
        .args(["--listen", listen, "--owner", "exposed", "--store-dir"])
        .arg(dir.join("store"))
        .args(extra)
        .env("MECATED_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    if first.is_empty() {
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success());
        return (None, String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let base = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let m = Mecated {
        child,
        base,
        owner: "exposed".into(),
    };
    (Some(m), String::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listen_without_tokens_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let (started, stderr) = listen_on(dir.path(), listen, &[]);
        assert!(started.is_none(), "{listen} served without authentication");
        assert!(
            stderr.contains("refusing to serve on")
                && stderr.contains("--token-file")
                && stderr.contains("--allow-unauthenticated"),
            "{stderr}"
        );
    }
    let tokens = token_file(dir.path());
    let (with_tokens, stderr) = listen_on(
        dir.path(),
        "0.0.0.0:0",
        &["--token-file", tokens.to_str().unwrap()],
    );
    let m = with_tokens.unwrap_or_else(|| panic!("refused with tokens: {stderr}"));
    let port = m.base.rsplit(':').next().unwrap().to_owned();
    let r = client()
        .get(format!("http://127.0.0.1:{port}/v1/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    drop(m);
    let (allowed, stderr) = listen_on(dir.path(), "0.0.0.0:0", &["--allow-unauthenticated"]);
    assert!(allowed.is_some(), "refused though allowed: {stderr}");
    drop(allowed);
    // Both at once contradict each other.
    let (both, stderr) = listen_on(
        dir.path(),
        "0.0.0.0:0",
        &[
            "--allow-unauthenticated",
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    );
    assert!(
        both.is_none() && stderr.contains("contradict each other"),
        "{stderr}"
    );
    // The variable spelled off allows nothing, so it contradicts nothing.
    let (spelled_off, stderr) = listen_with(
        dir.path(),
        "0.0.0.0:0",
        &["--token-file", tokens.to_str().unwrap()],
        &[("MECATED_ALLOW_UNAUTHENTICATED", "false")],
    );
    assert!(spelled_off.is_some(), "refused: {stderr}");
    let (spelled_off, stderr) = listen_with(
        dir.path(),
        "0.0.0.0:0",
        &[],
        &[("MECATED_ALLOW_UNAUTHENTICATED", "false")],
    );
    assert!(
        spelled_off.is_none() && stderr.contains("refusing to serve on"),
        "{stderr}"
    );
}

/// A server without authentication answers requests addressed to an IP
/// address, `localhost` or a name it was given, and no other: a web page
/// rebinding its own name to the server's address names itself in `Host`.
/// It takes no write whose `Origin` is another site either. Neither
/// refusal does anything.
#[tokio::test]
async fn without_authentication_only_local_names_and_same_origin_writes_are_answered() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (router, engine) = in_process(dir.path(), mecated::http::Auth::Off).await;
    let request = |method: &str, path: &str, host: &str, origin: Option<&str>| {
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", host)
            .header("content-type", "application/json");
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        let body = if method == "POST" {
            json!({"id": "planted"}).to_string()
        } else {
            String::new()
        };
        req.body(axum::body::Body::from(body)).unwrap()
    };
    let planted = lease_port::SessionId::new("planted").unwrap();
    let refused = [
        ("POST", "rebound.attacker.example:8080", None),
        ("POST", "localhost.attacker.example", None),
        ("GET", "rebound.attacker.example:8080", None),
        ("POST", "127.0.0.1:8080", Some("http://attacker.example")),
        ("POST", "127.0.0.1:8080", Some("null")),
        ("POST", "127.0.0.1:8080", Some("http://127.0.0.1:8081")),
    ];
    for (method, host, origin) in refused {
        let r = router
            .clone()
            .oneshot(request(method, "/v1/sessions", host, origin))
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::FORBIDDEN,
            "{method} {host} {origin:?}"
        );
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
        assert!(
            engine.describe(&planted).await.is_err(),
            "{method} {host} {origin:?} acted"
        );
    }
    let answered = [
        ("127.0.0.1:8080", None),
        ("localhost:8080", Some("http://localhost:8080")),
        ("[::1]:8080", None),
    ];
    for (host, origin) in answered {
        let r = router
            .clone()
            .oneshot(request("POST", "/v1/sessions", host, origin))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{host} {origin:?}");
        engine.delete_session(&planted).await.unwrap();
    }
    // A name it was given, such as a Service's.
    let named = mecated::http::router_configured(
        engine.clone(),
        mecated::http::Auth::Off,
        mecated::http::HttpOptions {
            allowed_hosts: mecated::http::AllowedHosts::new(["mecated.prod.svc"]),
            ..Default::default()
        },
    );
    let r = named
        .oneshot(request(
            "POST",
            "/v1/sessions",
            "mecated.prod.svc:8080",
            None,
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_token_file_is_refused_at_start_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(
        &path,
        format!(
            "{}# fine so far\nbot run my-plain-token\n",
            line("reader", "read")
        ),
    )
    .unwrap();
    let flags = ["--token-file", path.to_str().unwrap()].map(std::ffi::OsStr::new);
    let stderr = refused_start(&dir.path().join("store"), "bad-file", &flags);
    assert!(
        stderr.contains("line 3") && stderr.contains("sha256"),
        "{stderr}"
    );
    std::fs::write(&path, "# nothing\n").unwrap();
    let stderr = refused_start(&dir.path().join("store"), "bad-file", &flags);
    assert!(stderr.contains("holds no token"), "{stderr}");
}

/// Waits until `who`'s token gets `want` from `GET /v1/sessions`.
async fn until_answered(m: &Mecated, who: &str, want: StatusCode) {
    let start = Instant::now();
    loop {
        if call(m, Method::GET, "/v1/sessions", Some(who)).await.0 == want {
            return;
        }
        assert!(start.elapsed() < PATIENCE, "{who} never got {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The count of token file readings with `outcome` in `m`'s metrics.
async fn token_reads(m: &Mecated, outcome: &str) -> u64 {
    let text = client()
        .get(m.url("/metrics"))
        .bearer_auth(secret("reader"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("mecated_auth_token_file_reads_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix}in {text}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_token_file_is_read_again_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(
        dir.path(),
        "auth-poll",
        &["--token-file-check-interval", "100ms"],
    );
    until_answered(&m, "reader", StatusCode::OK).await;
    let path = dir.path().join("tokens");
    replace(
        &path,
        &[line("reader", "read"), line("newcomer", "read")].concat(),
    );
    until_answered(&m, "newcomer", StatusCode::OK).await;
    until_answered(&m, "operator", StatusCode::UNAUTHORIZED).await;
}

/// A follow opened with a token ends at its next event once the token is
/// removed from the file: revoking a token stops what it already reads,
/// not only what it asks for next. A follow of a token still in the file
/// goes on to the run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_ends_once_its_token_is_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let slow = ["--echo-delay", "8s", "--echo-steps", "16"];
    let args = [&["--token-file-check-interval", "0s"][..], &slow].concat();
    let m = start(dir.path(), "auth-revoked-follow", &args);
    let operator = Some(secret("operator"));
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        operator.clone(),
        json!({"id": "watched"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let run = client()
        .post(m.url("/v1/sessions/watched/runs"))
        .bearer_auth(secret("operator"))
        .header("accept", "text/event-stream")
        .json(&json!({"input": "long"}))
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), StatusCode::OK);
    let follow = |who: &str| {
        client()
            .get(m.url("/v1/sessions/watched/events"))
            .bearer_auth(secret(who))
            .header("accept", "text/event-stream")
            .send()
    };
    let (revoked, kept) = (
        follow("reader").await.unwrap(),
        follow("operator").await.unwrap(),
    );
    assert_eq!(revoked.status(), StatusCode::OK);
    assert_eq!(kept.status(), StatusCode::OK);
    let path = dir.path().join("tokens");
    replace(&path, &line("operator", "read,run,admin"));
    m.signal(Signal::SIGHUP);
    until_answered(&m, "reader", StatusCode::UNAUTHORIZED).await;
    let read_all = |r: reqwest::Response| async move {
        tokio::time::timeout(PATIENCE, r.text())
            .await
            .expect("the follow never ended")
            .unwrap()
    };
    let kept = read_all(kept).await;
    assert!(kept.contains("event: end"), "{kept}");
    let revoked = read_all(revoked).await;
    assert!(
        !revoked.contains("event: end") && !revoked.contains("run_ended"),
        "a revoked token followed the run to its end: {revoked}"
    );
    drop(run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_token_file_again_and_a_refused_one_keeps_the_tokens() {
    let dir = tempfile::tempdir().unwrap();
    // No polling: only the signal reads the file again.
    let m = start(
        dir.path(),
        "auth-hup",
        &["--token-file-check-interval", "0s"],
    );
    let path = dir.path().join("tokens");
    assert_eq!(token_reads(&m, "read").await, 1, "read once at start-up");

    replace(
        &path,
        &[line("reader", "read"), line("newcomer", "read")].concat(),
    );
    m.signal(Signal::SIGHUP);
    until_answered(&m, "newcomer", StatusCode::OK).await;
    assert_eq!(token_reads(&m, "read").await, 2);
    let (status, _) = call(&m, Method::GET, "/v1/sessions", Some("operator")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a removed token still works"
    );

    // A malformed file: refused, and the tokens in force stay.
    replace(
        &path,
        &[
            line("reader", "read"),
            "intruder admin plain-token\n".into(),
        ]
        .concat(),
    );
    m.signal(Signal::SIGHUP);
    let start = Instant::now();
    while token_reads(&m, "refused").await == 0 {
        assert!(
            start.elapsed() < PATIENCE,
            "the malformed file was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _) = call(&m, Method::GET, "/v1/sessions", Some("newcomer")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a refused reload dropped the tokens"
    );
    let (status, _) = call_with(
        &m,
        Method::GET,
        "/v1/sessions",
        Some("plain-token".into()),
        json!(null),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(token_reads(&m, "read").await, 2);
}

/// Every `audit` event's fields, as recorded by a subscriber of the test's
/// own (on this thread: the router runs on it).
#[derive(Default, Clone)]
struct AuditLog(Arc<Mutex<Vec<std::collections::BTreeMap<String, String>>>>);

struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.to_string());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

impl tracing::Subscriber for AuditLog {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == mecated::http::AUDIT_TARGET
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = std::collections::BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        fields.insert("level".into(), event.metadata().level().to_string());
        self.0.lock().unwrap().push(fields);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// An in-process server on `dir`, its callers known by `auth`.
async fn in_process(
    dir: &Path,
    auth: mecated::http::Auth,
) -> (axum::Router, mecated::engine::Engine) {
    use mecated::engine::{Engine, Exclusivity};
    let ttl = Duration::from_secs(15);
    let store = session_store::JsonlStore::open(dir.join("store"), Default::default()).unwrap();
    let leases = flocklease::FlockLease::open(dir.join("leases"), ttl).unwrap();
    let metrics = Arc::new(mecated::metrics::Metrics::default());
    let keeper = lease_keeper::LeaseKeeper::builder(
        Arc::new(leases),
        lease_port::OwnerId::new("audited").unwrap(),
        ttl,
    )
    .metrics(metrics.clone())
    .build()
    .unwrap();
    let engine = Engine::new(
        Arc::new(store),
        keeper,
        Arc::new(mecated::agent::EchoAgent::default()),
        metrics,
        Exclusivity::Leased,
    );
    let router = mecated::http::router_with(engine.clone(), 1 << 20, auth);
    (router, engine)
}

async fn send(router: &axum::Router, method: &str, path: &str, token: Option<&str>) -> u16 {
    use tower::ServiceExt;
    let mut req = axum::http::Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {}", secret(t)));
    }
    if method == "POST" {
        req = req.header("content-type", "application/json");
    }
    let body = if path == "/v1/sessions" {
        json!({"id": "gone"}).to_string()
    } else {
        String::new()
    };
    let req = req.body(axum::body::Body::from(body)).unwrap();
    router.clone().oneshot(req).await.unwrap().status().as_u16()
}

/// A flood of refused deletes writes a bounded number of audit lines, and
/// says how many it left out; a delete that was let through is written
/// all the same.
#[tokio::test]
async fn a_flood_of_refusals_is_audited_within_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let file = mecated::auth::TokenFile::open(tokens).unwrap();
    let auth = mecated::http::Auth::Tokens(Arc::new(file));
    let (router, _engine) = in_process(dir.path(), auth).await;
    let log = AuditLog::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    let started = Instant::now();
    for _ in 0..500 {
        assert_eq!(send(&router, "DELETE", "/v1/sessions/x", None).await, 401);
    }
    let seconds = u32::try_from(started.elapsed().as_secs()).unwrap() + 1;
    assert_eq!(
        send(&router, "POST", "/v1/sessions", Some("operator")).await,
        201
    );
    assert_eq!(
        send(&router, "DELETE", "/v1/sessions/gone", Some("janitor")).await,
        204
    );
    let lines = log.0.lock().unwrap().clone();
    let refused = lines
        .iter()
        .filter(|l| l.get("status").map(String::as_str) == Some("401"));
    let bound = mecated::http::REFUSAL_AUDIT_LINES_PER_SECOND * seconds;
    assert!(
        refused.count() <= usize::try_from(bound).unwrap(),
        "{} lines for 500 refusals in {seconds} s",
        lines.len()
    );
    let last = lines.last().unwrap();
    assert_eq!(
        (last["who"].as_str(), last["status"].as_str()),
        ("janitor", "204"),
        "the delete let through was not written: {lines:?}"
    );
}

/// One line per delete and cancel, refused or not: who, what, which
/// session, the outcome; nothing for reads and runs.
#[tokio::test]
async fn deletes_and_cancels_leave_one_audit_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let file = mecated::auth::TokenFile::open(tokens).unwrap();
    let auth = mecated::http::Auth::Tokens(Arc::new(file));
    let (router, _engine) = in_process(dir.path(), auth).await;
    let log = AuditLog::default();
    let _guard = tracing::subscriber::set_default(log.clone());

    assert_eq!(
        send(&router, "POST", "/v1/sessions", Some("operator")).await,
        201
    );
    assert_eq!(
        send(&router, "GET", "/v1/sessions/gone", Some("reader")).await,
        200
    );
    assert!(
        log.0.lock().unwrap().is_empty(),
        "reads and creates are not audited"
    );
    let steps = [
        ("DELETE", "/v1/sessions/gone", Some("reader"), 403),
        ("DELETE", "/v1/sessions/gone/runs/current", None, 401),
        (
            "DELETE",
            "/v1/sessions/gone/runs/current",
            Some("runner"),
            200,
        ),
        ("DELETE", "/v1/sessions/gone", Some("janitor"), 204),
        ("DELETE", "/v1/sessions/gone", Some("janitor"), 404),
    ];
    for (method, path, who, status) in steps {
        assert_eq!(send(&router, method, path, who).await, status, "{path}");
    }
    let lines = log.0.lock().unwrap().clone();
    let seen: Vec<Vec<&str>> = lines
        .iter()
        .map(|l| {
            ["who", "what", "session", "status", "code", "level"]
                .map(|k| l.get(k).map_or("<missing>", String::as_str))
                .to_vec()
        })
        .collect();
    assert_eq!(
        seen,
        [
            [
                "reader",
                "deleteSession",
                "gone",
                "403",
                "forbidden",
                "INFO"
            ],
            [
                "unauthenticated",
                "cancelRun",
                "gone",
                "401",
                "unauthenticated",
                "INFO"
            ],
            ["runner", "cancelRun", "gone", "200", "", "INFO"],
            ["janitor", "deleteSession", "gone", "204", "", "INFO"],
            [
                "janitor",
                "deleteSession",
                "gone",
                "404",
                "not_found",
                "INFO"
            ],
        ]
    );
}

#[tokio::test]
async fn without_authentication_the_audit_line_names_the_caller_anonymous() {
    let dir = tempfile::tempdir().unwrap();
    let (router, _engine) = in_process(dir.path(), mecated::http::Auth::Off).await;
    let log = AuditLog::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    assert_eq!(send(&router, "POST", "/v1/sessions", None).await, 201);
    assert_eq!(
        send(&router, "DELETE", "/v1/sessions/gone", None).await,
        204
    );
    let lines = log.0.lock().unwrap().clone();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["who"], "anonymous");
    assert_eq!(lines[0]["what"], "deleteSession");
    assert_eq!(lines[0]["status"], "204");
}

/// `--metrics-listen` serves `/metrics` open on its own address, and
/// nothing else there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_their_own_listener_are_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = mecated::ServerConfig::for_store(dir.path().join("store"));
    config.token_file = Some(token_file(dir.path()));
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = mecated::Server::start(config).await.unwrap();
    let metrics = server.metrics_addr().unwrap();
    let r = client()
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("mecated_runs_total"));
    let r = client()
        .get(format!("http://{metrics}/v1/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "the API on the metrics listener"
    );
    let main = server.local_addr();
    let r = client()
        .get(format!("http://{main}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(server.shutdown().await);
}

/// The limits stated in docs/server.md, over the wire: a body over
/// `--max-body-bytes` is 413 `invalid` (or, from a caller without a
/// token, 401 before any of it is read); a request head past the HTTP
/// server's bound is refused with 431.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_and_heads_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), "auth-limits", &["--max-body-bytes", "1024"]);
    let operator = Some(secret("operator"));
    call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        operator.clone(),
        json!({"id": "l"}),
    )
    .await;
    let big = json!({"input": "x".repeat(4096)});
    let (status, body) = call_with(
        &m,
        Method::POST,
        "/v1/sessions/l/runs",
        operator,
        big.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "invalid", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too large"),
        "{body}"
    );
    let (status, _) = call_with(&m, Method::POST, "/v1/sessions/l/runs", None, big).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, page) = call(&m, Method::GET, "/v1/sessions/l/events", Some("reader")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["events"], json!([]), "an oversized run ran");

    let r = client()
        .get(m.url("/healthz"))
        .header("x-padding", "p".repeat(512 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

/// One token holds at most `--max-follows-per-client` follows open: one
/// more is 429 `too_many_follows`, another token follows all the same, and
/// a follow whose client went away frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_holds_at_most_its_follows() {
    let dir = tempfile::tempdir().unwrap();
    let slow = ["--echo-delay", "120s", "--echo-steps", "1"];
    let args = [&["--max-follows-per-client", "2"][..], &slow].concat();
    let m = start(dir.path(), "auth-follows", &args);
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        Some(secret("operator")),
        json!({"id": "f"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // A follow lasts while a run is live.
    let run = client()
        .post(m.url("/v1/sessions/f/runs"))
        .bearer_auth(secret("operator"))
        .header("accept", "text/event-stream")
        .json(&json!({"input": "a long one"}))
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), StatusCode::OK);
    let follow = |who: &str| {
        client()
            .get(m.url("/v1/sessions/f/events"))
            .bearer_auth(secret(who))
            .header("accept", "text/event-stream")
            .send()
    };
    let first = follow("reader").await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = follow("reader").await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let refused = follow("reader").await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_follows", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    let other = follow("operator").await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "another token is held up");
    // A page is no follow: it is not bounded.
    let (status, _) = call(&m, Method::GET, "/v1/sessions/f/events", Some("reader")).await;
    assert_eq!(status, StatusCode::OK);
    drop(first);
    // The server learns of the closed connection when it next reads or
    // writes it; until then the place stays taken.
    let patience = Instant::now() + Duration::from_secs(60);
    loop {
        let again = follow("reader").await.unwrap();
        if again.status() == StatusCode::OK {
            break;
        }
        assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < patience, "a closed follow kept its place");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop((second, run));
}

/// `mecated hash-token` reads the token from standard input (never the
/// command line) and prints the hash, or the whole line it checked.
#[test]
fn hash_token_prints_what_the_token_file_holds() {
    use std::io::Write;
    let hash = |stdin: &str, args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mecated"))
            .arg("hash-token")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let expected = mecated::auth::hash_token("s3cret");
    assert_eq!(
        hash("s3cret\n", &[]),
        (true, expected.clone(), String::new())
    );
    let (ok, line, _) = hash("s3cret", &["--name", "ops", "--roles", "read,run"]);
    assert!(ok);
    assert_eq!(line, format!("ops read,run {expected}"));
    let (ok, _, err) = hash("s3cret", &["--name", "ops", "--roles", "read,write"]);
    assert!(!ok && err.contains("unknown role \"write\""), "{err}");
    let (ok, _, err) = hash("\n", &[]);
    assert!(!ok && err.contains("empty"), "{err}");
    let (ok, _, err) = hash("two words", &[]);
    assert!(!ok && err.contains("blank"), "{err}");
}

/// A run-only token could start a run on any session, and the agent is
/// handed that session's whole transcript (the exec agent's default `full`
/// scope): whatever the agent said about it came back to the caller.
/// Starting a run needs `read` too, and the refused start writes nothing
/// into the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_token_cannot_read_another_sessions_transcript_through_its_agent() {
    let dir = tempfile::tempdir().unwrap();
    // An agent that answers from the conversation so far.
    let agent = dir.path().join("agent.sh");
    std::fs::write(
        &agent,
        "printf '{\"type\":\"reply\",\"seen\":%s}\\n' \"$(cat)\"\n",
    )
    .unwrap();
    let agent_arg = format!("--agent-arg={}", agent.display());
    let m = start(
        dir.path(),
        "auth-run-reads",
        &["--agent", "exec", "--agent-command", "/bin/sh", &agent_arg],
    );
    let operator = Some(secret("operator"));
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        operator.clone(),
        json!({"id": "alice"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, ran) = call_with(
        &m,
        Method::POST,
        "/v1/sessions/alice/runs",
        operator,
        json!({"input": "my card is 4111-1111"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ran}");
    let (_, before) = call(&m, Method::GET, "/v1/sessions/alice/events", Some("reader")).await;
    assert!(before.to_string().contains("4111-1111"), "{before}");
    let (status, answer) = call_with(
        &m,
        Method::POST,
        "/v1/sessions/alice/runs",
        Some(secret("runner")),
        json!({"input": "what did we say?"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(answer["error"]["role"], "read", "{answer}");
    assert!(!answer.to_string().contains("4111-1111"), "{answer}");
    let (_, after) = call(&m, Method::GET, "/v1/sessions/alice/events", Some("reader")).await;
    assert_eq!(before, after, "the refused start wrote into the session");
}

// ---------------------------------------------------------------------
// Attacks on the edge's authentication and authorization, each a
// regression test of a hole once open.
// ---------------------------------------------------------------------

/// A follow on a run that emits nothing for a while (`--echo-steps 1`:
/// one event, at the run's end), opened by `who`, its first stored
/// events already sent.
async fn quiet_follow(m: &Mecated, who: &str, token: &str) -> reqwest::Response {
    let r = client()
        .get(m.url("/v1/sessions/quiet/events"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{who}'s follow");
    r
}

/// `quiet`, with a run of it live that is silent for `--echo-delay`.
async fn quiet_run(m: &Mecated) -> reqwest::Response {
    let (status, _) = call_with(
        m,
        Method::POST,
        "/v1/sessions",
        Some(secret("operator")),
        json!({"id": "quiet"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let run = client()
        .post(m.url("/v1/sessions/quiet/runs"))
        .bearer_auth(secret("operator"))
        .header("accept", "text/event-stream")
        .json(&json!({"input": "think for a while"}))
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), StatusCode::OK);
    run
}

/// Regression: the docs say a removed token "stops reading at once", but a
/// follow is asked again only when an event arrives. A follow of a run
/// that is quiet (an agent thinking for minutes) goes on after its token
/// was revoked, holding its connection and its follow slot, until the
/// run's next event, however far off. Two keep-alive intervals (20 s) are
/// given for it to end: the keep-alive tick already wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_follow_of_a_quiet_run_ends_without_waiting_for_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--token-file-check-interval",
        "0s",
        "--echo-delay",
        "90s",
        "--echo-steps",
        "1",
    ];
    let m = start(dir.path(), "edge-quiet", &args);
    let run = quiet_run(&m).await;
    let follow = quiet_follow(&m, "reader", &secret("reader")).await;
    // Its stored events (the run's start) are sent before the revocation.
    tokio::time::sleep(Duration::from_millis(500)).await;
    replace(
        &dir.path().join("tokens"),
        &line("operator", "read,run,admin"),
    );
    m.signal(Signal::SIGHUP);
    until_answered(&m, "reader", StatusCode::UNAUTHORIZED).await;
    let revoked_at = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(25), follow.text()).await;
    assert!(
        ended.is_ok(),
        "a follow of a revoked token was still open {:?} after the revocation: it ends only at \
         the run's next event",
        revoked_at.elapsed()
    );
    drop(run);
}

/// Regression: follow slots are counted by token *name*, and a revoked
/// token's follows keep theirs until their next event. Rotating a leaked
/// token under the same name (the usual rotation) leaves the new token
/// refused 429 `too_many_follows` for as long as the old token's follows
/// of quiet runs last: whoever holds the leaked token keeps the rightful
/// client from following.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_is_not_refused_follows_for_its_revoked_predecessors() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--token-file-check-interval",
        "0s",
        "--max-follows-per-client",
        "1",
        "--echo-delay",
        "90s",
        "--echo-steps",
        "1",
    ];
    let m = start(dir.path(), "edge-rotate", &args);
    let run = quiet_run(&m).await;
    let leaked = quiet_follow(&m, "reader (leaked)", &secret("reader")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rotated = "reader-rotated-1b2c";
    replace(
        &dir.path().join("tokens"),
        &[
            format!("reader read {}\n", mecated::auth::hash_token(rotated)),
            line("operator", "read,run,admin"),
        ]
        .concat(),
    );
    m.signal(Signal::SIGHUP);
    until_answered(&m, "reader", StatusCode::UNAUTHORIZED).await;
    let give_up = Instant::now() + Duration::from_secs(25);
    loop {
        let r = client()
            .get(m.url("/v1/sessions/quiet/events"))
            .bearer_auth(rotated)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            Instant::now() < give_up,
            "the rotated token is still refused its follow: the revoked token's follow holds \
             the name's slot"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop((leaked, run));
}

/// Regression: `?wait` checks the token when the request arrives and starts
/// the run up to 60 s later. A token revoked while its run waits for the
/// session still starts the run (writing its input into the session,
/// handing the agent the transcript) and gets the agent's answer back:
/// revocation does not stop what it "already reads".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_does_not_start_once_its_token_is_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--token-file-check-interval",
        "0s",
        "--echo-delay",
        "4s",
        "--echo-steps",
        "1",
    ];
    let m = start(dir.path(), "edge-wait", &args);
    let (status, _) = call_with(
        &m,
        Method::POST,
        "/v1/sessions",
        Some(secret("operator")),
        json!({"id": "busy"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let first = client()
        .post(m.url("/v1/sessions/busy/runs"))
        .bearer_auth(secret("operator"))
        .header("accept", "text/event-stream")
        .json(&json!({"input": "first"}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let waiting = tokio::spawn(
        client()
            .post(m.url("/v1/sessions/busy/runs?wait=30s"))
            .bearer_auth(secret("driver"))
            .json(&json!({"input": "sent before the revocation"}))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    replace(
        &dir.path().join("tokens"),
        &line("operator", "read,run,admin"),
    );
    m.signal(Signal::SIGHUP);
    until_answered(&m, "driver", StatusCode::UNAUTHORIZED).await;
    let answer = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiting run never answered")
        .unwrap()
        .unwrap();
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    let (_, log) = call(
        &m,
        Method::GET,
        "/v1/sessions/busy/events",
        Some("operator"),
    )
    .await;
    assert!(
        status != StatusCode::OK && !log.to_string().contains("sent before the revocation"),
        "a revoked token's run started after its revocation: {status} {body}"
    );
    drop(first);
}

/// Regression: refusal lines share one budget of 20 a second, whoever is
/// refused. A holder of a real but under-privileged token probes the
/// destructive routes unseen by sending them amid a burst of anonymous
/// 401s, which cost nothing: its 403 (the line that names a token) is one
/// of the lines left out, and the count left out says nothing of who.
#[tokio::test]
async fn a_known_tokens_refusal_is_audited_amid_a_flood_of_anonymous_ones() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let file = mecated::auth::TokenFile::open(tokens).unwrap();
    let auth = mecated::http::Auth::Tokens(Arc::new(file));
    let (router, _engine) = in_process(dir.path(), auth).await;
    let log = AuditLog::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    for _ in 0..100 {
        assert_eq!(send(&router, "DELETE", "/v1/sessions/x", None).await, 401);
    }
    assert_eq!(
        send(&router, "DELETE", "/v1/sessions/victim", Some("reader")).await,
        403
    );
    let lines = log.0.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.get("who").map(String::as_str) == Some("reader")),
        "the reader's refused delete left no audit line ({} lines)",
        lines.len()
    );
}

/// Regression: the count of refusal lines left out is written only on the
/// next refusal line. A burst that is followed by no refusal (the attacker
/// stops, or the server is stopped) is never counted: the trail shows 20
/// refusals where there were 500, and nothing else.
#[tokio::test]
async fn refusals_left_out_are_counted_even_when_no_refusal_follows() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let file = mecated::auth::TokenFile::open(tokens).unwrap();
    let auth = mecated::http::Auth::Tokens(Arc::new(file));
    let (router, _engine) = in_process(dir.path(), auth).await;
    let log = AuditLog::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    for _ in 0..500 {
        assert_eq!(send(&router, "DELETE", "/v1/sessions/x", None).await, 401);
    }
    // Well past the second of the burst; then only let-through requests.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        send(&router, "POST", "/v1/sessions", Some("operator")).await,
        201
    );
    assert_eq!(
        send(&router, "DELETE", "/v1/sessions/gone", Some("janitor")).await,
        204
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lines = log.0.lock().unwrap().clone();
    let written = lines
        .iter()
        .filter(|l| l.get("status").map(String::as_str) == Some("401"))
        .count();
    let counted: u64 = lines
        .iter()
        .filter_map(|l| l.get("left_out"))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        written as u64 + counted,
        500,
        "500 refusals: {written} written, {counted} counted as left out"
    );
}

/// Regression: a server without authentication refuses a rebinding page's
/// delete (403) before the guard, so the attempt leaves no audit line and
/// no log at all, though the audit trail promises one line per delete and
/// cancel, refused or not. The one sign that a web page tried to drive
/// the server is dropped.
#[tokio::test]
async fn a_delete_refused_for_its_host_or_origin_leaves_an_audit_line() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (router, _engine) = in_process(dir.path(), mecated::http::Auth::Off).await;
    let log = AuditLog::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    for (host, origin) in [
        ("rebound.attacker.example:8080", None),
        ("127.0.0.1:8080", Some("http://attacker.example")),
    ] {
        let mut req = axum::http::Request::builder()
            .method("DELETE")
            .uri("/v1/sessions/victim")
            .header("host", host);
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        let r = router
            .clone()
            .oneshot(req.body(axum::body::Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
    let lines = log.0.lock().unwrap().clone();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.get("status").map(String::as_str) == Some("403"))
            .count(),
        2,
        "refused deletes left no audit line: {lines:?}"
    );
}

/// Regression: behind a reverse proxy that sets `Host` to the upstream's
/// address (nginx's default, `proxy_set_header Host $proxy_host`), every
/// write a browser sends from the proxy's own origin is refused, even when
/// that origin's name is given with `--allowed-host`: the `Origin` is
/// compared with the rewritten `Host` only. Nothing in the docs says so,
/// and no flag lets it work but changing the proxy.
#[tokio::test]
async fn a_write_from_an_allowed_hosts_origin_is_taken_behind_a_host_rewriting_proxy() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (_, engine) = in_process(dir.path(), mecated::http::Auth::Off).await;
    let router = mecated::http::router_configured(
        engine,
        mecated::http::Auth::Off,
        mecated::http::HttpOptions {
            allowed_hosts: mecated::http::AllowedHosts::new(["ops.example.com"]),
            ..Default::default()
        },
    );
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/v1/sessions")
        .header("host", "127.0.0.1:8080")
        .header("origin", "https://ops.example.com")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"id":"from-the-ui"}"#))
        .unwrap();
    let r = router.oneshot(req).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "a same-origin write through the proxy was refused"
    );
}

/// Attacks on the trail and the token file: each fails without its fix.
mod trail {
    use super::*;
    use tower::ServiceExt;

    fn request(
        method: &str,
        path: &str,
        token: Option<&str>,
    ) -> axum::http::Request<axum::body::Body> {
        let mut req = axum::http::Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {}", secret(t)));
        }
        req.body(axum::body::Body::empty()).unwrap()
    }

    async fn tokens_router(dir: &Path) -> (axum::Router, mecated::engine::Engine) {
        let file = mecated::auth::TokenFile::open(token_file(dir)).unwrap();
        in_process(dir, mecated::http::Auth::Tokens(Arc::new(file))).await
    }

    /// A DELETE whose request future is dropped (the client went away)
    /// once the store's delete has begun still deletes the session (the
    /// delete is detached so that it completes): its audit line must be
    /// written all the same.
    #[tokio::test]
    async fn a_delete_abandoned_by_its_client_still_leaves_an_audit_line() {
        let dir = tempfile::tempdir().unwrap();
        let (router, engine) = tokens_router(dir.path()).await;
        let log = AuditLog::default();
        let _guard = tracing::subscriber::set_default(log.clone());
        let mut unaudited = Vec::new();
        for i in 0..40u64 {
            let id = lease_port::SessionId::new(format!("victim-{i}")).unwrap();
            engine.create_session(&id).await.unwrap();
            let before = log.0.lock().unwrap().len();
            let req = request("DELETE", &format!("/v1/sessions/{id}"), Some("janitor"));
            // The connection closes after i/4 ms: hyper drops the future.
            let cut = Duration::from_micros(250 * i);
            let answered = tokio::time::timeout(cut, router.clone().oneshot(req))
                .await
                .ok()
                .map(|r| r.unwrap().status().as_u16());
            tokio::time::sleep(Duration::from_millis(300)).await;
            let deleted = engine
                .describe(&id)
                .await
                .is_err_and(|e| e.to_string().contains("not found"));
            let lines = log.0.lock().unwrap().len() - before;
            if deleted && lines == 0 {
                unaudited.push((i, answered));
            }
        }
        assert!(
            unaudited.is_empty(),
            "sessions deleted without an audit line (attempt, answered): {unaudited:?}"
        );
    }

    /// A same-length rewrite in place whose modification time is kept
    /// (`cp -p` or `rsync -t --inplace` onto the file, `touch -r`, a
    /// restore) is read again: a revoked token must not stay in force
    /// until a SIGHUP.
    #[test]
    fn a_same_length_rewrite_keeping_the_mtime_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, line("reader", "read")).unwrap();
        let file = mecated::auth::TokenFile::open(&path).unwrap();
        assert!(file.current().authenticate(&secret("reader")).is_some());
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        // Revoke "reader": the same line for another token, same length.
        let revoked = line("reader", "read").replace(
            &mecated::auth::hash_token(&secret("reader")),
            &mecated::auth::hash_token("a-new-secret"),
        );
        std::fs::write(&path, &revoked).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let _ = file.reload_if_changed();
        assert!(
            file.current().authenticate(&secret("reader")).is_none(),
            "the revoked token is still accepted: the watcher saw no change"
        );
    }

    /// The audit trail's own caller words, `anonymous` (a server without
    /// authentication) and `unauthenticated` (no known token), are no token
    /// names: an audit line's `who` is never ambiguous.
    #[test]
    fn the_audit_trails_own_names_are_not_token_names() {
        for name in ["anonymous", "unauthenticated"] {
            let text = line(name, "admin");
            assert!(
                mecated::auth::TokenSet::parse(&text, Path::new("tokens")).is_err(),
                "{name:?} accepted as a token name"
            );
        }
    }
}

/// A route asked with a method it does not take is answered 405 with the
/// error body every error has, and its `Allow`.
#[tokio::test]
async fn a_method_a_route_does_not_take_is_405_with_an_error_body() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (router, _engine) = in_process(dir.path(), mecated::http::Auth::Off).await;
    for (method, path, allow) in [
        ("PUT", "/", "GET,HEAD"),
        ("PATCH", "/v1/sessions", "GET,HEAD,POST"),
    ] {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let r = router.clone().oneshot(req).await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        let allowed = r.headers()["allow"].to_str().unwrap().to_owned();
        let mut allowed: Vec<&str> = allowed.split(',').map(str::trim).collect();
        allowed.sort_unstable();
        assert_eq!(allowed.join(","), allow, "{method} {path}");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "invalid", "{body}");
    }
}
