//! The operator page (`GET /`) in a real headless Chromium: it loads,
//! lists a session created over the API with its lease, and shows the
//! events a run appended, read through the follow endpoint; against a
//! server with a token file, it sends the token it was given and says when
//! it has none, an unknown one, or one lacking the `read` role.

use std::process::Command;

use serde_json::json;

use crate::support::*;

/// The page as Chromium renders it once its scripts ran: `--dump-dom`
/// prints the DOM after the page settled (within a virtual time budget,
/// which lets its requests and timers run).
fn rendered(url: &str) -> String {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect(
            "headless Chromium is needed for this test: `cargo xtask ci` installs it as root \
             (apt-get install chromium)",
        );
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium)
        .args([
            "--headless",
            // Root in a container has no user namespace for the sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            // No internet here: nothing may wait on Google's services.
            "--disable-background-networking",
            "--no-first-run",
            // Virtual time keeps pace with real time while a follow is
            // streaming in: on a loaded machine the page may take seconds
            // to open, and a run must still reach its end inside the budget.
            "--virtual-time-budget=20000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_sessions_and_shows_a_runs_events() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(dir.path(), "page-owner", &[]);
    create(&m, "page-chat").await;
    let (status, _) = run(&m, "page-chat", json!("shown on the page")).await;
    assert_eq!(status, reqwest::StatusCode::OK);

    let dom = rendered(&m.url("/#session=page-chat"));
    assert!(
        dom.contains(
            r#"<tr class="session chosen" data-session="page-chat"><td>page-chat</td><td>free</td>"#
        ),
        "the session is not listed, free: {dom}"
    );
    assert!(
        dom.contains("shown on the page") && dom.contains(r#"data-seq="1""#),
        "the run's events are not shown: {dom}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_who_holds_a_running_session() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(
        dir.path(),
        "page-holder",
        &["--echo-delay", "60s", "--echo-steps", "60"],
    );
    create(&m, "busy").await;
    create(&m, "idle").await;
    let pending = run_in_background(&m, "busy", json!("long"));
    wait_for_event(&m, "busy", is_run_started_by("page-holder")).await;

    // Showing the idle session, the page does not wait for the busy
    // one's run to end before it is dumped.
    let dom = rendered(&m.url("/#session=idle"));
    assert!(
        dom.contains(r#"<td>busy</td><td class="held">held</td><td>page-holder</td><td>1</td>"#),
        "the holder and token are not shown: {dom}"
    );
    assert!(
        dom.contains(r#"<td>idle</td><td>free</td>"#),
        "the idle session is not free: {dom}"
    );
    pending.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_opened_mid_run_shows_its_events_and_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(
        dir.path(),
        "page-live",
        &["--echo-delay", "3s", "--echo-steps", "3"],
    );
    create(&m, "live").await;
    let pending = run_in_background(&m, "live", json!("appended later"));
    wait_for_event(&m, "live", is_run_started_by("page-live")).await;
    // Chromium's virtual time does not wait for a response still
    // streaming, so the dump comes about a second after the page opened,
    // mid-run: it shows the run's events so far and a follow the server
    // accepted ("following" is shown only on its 200). That a follow
    // delivers what is appended later is the follow endpoint's own tests'.
    let url = m.url("/#session=live");
    let dom = tokio::task::spawn_blocking(move || rendered(&url))
        .await
        .unwrap();
    // (A browser whose virtual time waits for the stream dumps after the
    // run's end, which then came through the follow.)
    let followed =
        dom.contains(r#"<p id="status">following</p>"#) || dom.contains(r#""type":"run_ended""#);
    assert!(
        dom.contains("appended later") && followed,
        "the run in progress is not shown and followed: {dom}"
    );
    let done = pending.await.unwrap().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
}

/// A token file of a reader, a runner (who may not read) and a driver (who
/// may read and run, as starting a run needs): each token is its name
/// followed by `-page-secret`.
fn page_tokens(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    let line = |name: &str, roles: &str| {
        let hash = mecated::auth::hash_token(&format!("{name}-page-secret"));
        format!("{name} {roles} {hash}\n")
    };
    let lines = [
        line("viewer", "read"),
        line("starter", "run"),
        line("driver", "read,run"),
    ];
    std::fs::write(&path, lines.concat()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_page_shows_sessions_and_events_and_says_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = page_tokens(dir.path());
    let m = Mecated::start(
        &dir.path().join("store"),
        "page-auth",
        &["--token-file", tokens.to_str().unwrap()],
    );
    for (name, body) in [
        ("starter", json!({"id": "guarded"})),
        ("driver", json!(null)),
    ] {
        let path = if body.is_null() {
            "/v1/sessions/guarded/runs"
        } else {
            "/v1/sessions"
        };
        let body = if body.is_null() {
            json!({"input": "behind a token"})
        } else {
            body
        };
        let r = client()
            .post(m.url(path))
            .bearer_auth(format!("{name}-page-secret"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }

    // The token comes in the fragment (never sent to the server) and
    // goes to sessionStorage; requests carry it as a header.
    let dom = rendered(&m.url("/#session=guarded&token=viewer-page-secret"));
    assert!(
        dom.contains(r#"<td>guarded</td><td>free</td>"#),
        "the session is not listed: {dom}"
    );
    assert!(
        dom.contains("behind a token") && dom.contains(r#"data-seq="1""#),
        "the run's events are not shown: {dom}"
    );
    assert!(
        !dom.contains("viewer-page-secret"),
        "the token is in the page: {dom}"
    );

    let dom = rendered(&m.url("/#session=guarded"));
    assert!(
        dom.contains("this server needs a token") && !dom.contains("<td>guarded</td>"),
        "without a token the page does not say it needs one: {dom}"
    );
    let dom = rendered(&m.url("/#session=guarded&token=starter-page-secret"));
    assert!(
        dom.contains("the token lacks the read role") && !dom.contains("behind a token"),
        "a token without read: {dom}"
    );
    let dom = rendered(&m.url("/#token=guessed"));
    assert!(dom.contains("the token is not accepted"), "{dom}");
}

/// No other site may frame the page (to overlay it and steer clicks), and
/// its requests name no page they came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_may_not_be_framed_by_another_site() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mecated::start(&dir.path().join("store"), "page-frames", &[]);
    let r = client().get(m.url("/")).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let policy = header("content-security-policy");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(policy.contains("default-src 'none'"), "{policy}");
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("referrer-policy"), "no-referrer");
}
