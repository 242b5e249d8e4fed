//! `mecak8s` as a deployment runs it: replicas configured from the pod's
//! environment (`POD_NAMESPACE`, `POD_NAME`, `REDIS_URL`), sessions in a real
//! Redis, leases as Lease objects in the Kubernetes API emulator.

use std::process::{Command, Stdio};

use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

fn replica(redis: &str, kubeconfig: &str, pod: &str) -> Mecated {
    let child = Command::new(env!("CARGO_BIN_EXE_mecak8s"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--session-lease-ttl",
            "1s",
            "--echo-delay",
            "2s",
            "--session-lease-k8s-kubeconfig",
            kubeconfig,
        ])
        .env("POD_NAMESPACE", "default")
        .env("POD_NAME", pod)
        .env("REDIS_URL", redis)
        .env("MECATED_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mecak8s");
    Mecated::listening(child, pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_sessions_in_redis_and_lease_them_as_lease_objects() {
    let redis = test_services::RedisServer::start().expect("redis-server is installed");
    let emulator = k8s_emulator::Emulator::start(k8s_emulator::EmulatorConfig::default())
        .await
        .expect("the emulator starts");
    let kubeconfig = emulator.kubeconfig_path().to_str().unwrap().to_owned();
    let a = replica(&redis.url(), &kubeconfig, "mecak8s-0");
    let b = replica(&redis.url(), &kubeconfig, "mecak8s-1");

    // Created through one replica, visible through the other: one store.
    create(&a, "chat").await;
    let (status, first) = run(&b, "chat", json!("hello")).await;
    assert_eq!(status, StatusCode::OK, "{first}");

    let _slow = run_in_background(&a, "chat", json!("slow"));
    let started = wait_for_event(&a, "chat", is_run_started_by("mecak8s-0")).await;
    let (status, body) = run(&b, "chat", json!("me too")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(is_owner(&body["error"]["holder"], "mecak8s-0"), "{body}");

    // The holder killed mid-run: the other replica takes the session over,
    // once the Lease object's hold lapses, with a higher token.
    a.signal(Signal::SIGKILL);
    let taken = run_when_free(&b, "chat", json!("after the crash")).await;
    assert_eq!(taken["status"], "completed", "{taken}");
    assert!(
        taken["token"].as_u64().unwrap() > started["token"].as_u64().unwrap(),
        "{taken} after {started}"
    );
    let log = events(&b, "chat").await;
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gaps in {seqs:?}"
    );
    assert_eq!(log.last().unwrap()["payload"]["type"], "run_ended");
    assert_eq!(log[log.len() - 2]["payload"]["content"], "after the crash");

    // The sessions were leased as Lease objects, with exactly the verbs the
    // deployment's Role grants (deploy/kubernetes/role.yaml): no more (the
    // replicas would be refused), no fewer (the Role would grant too much).
    // `watch` is sent only by a replica holding k8slease's
    // DEFAULT_WATCH_FROM sessions (100), which these few runs do not reach;
    // k8slease's scale tests send it.
    let used: std::collections::BTreeSet<String> = emulator
        .requests()
        .snapshot()
        .into_iter()
        .filter(|((_, resource), n)| resource == "leases" && *n > 0)
        .map(|((verb, _), _)| format!("{verb:?}").to_lowercase())
        .collect();
    let mut granted = role_verbs();
    assert!(granted.remove("watch"), "the Role grants watch");
    assert_eq!(used, granted, "verbs used against the API vs the Role");
}

/// The verbs `deploy/kubernetes/role.yaml` grants on leases.
fn role_verbs() -> std::collections::BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/role.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the Role manifest");
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("verbs:"))
        .expect("the Role lists verbs");
    serde_json::from_str::<Vec<String>>(line.trim())
        .expect("verbs as a flow sequence")
        .into_iter()
        .collect()
}

#[test]
fn a_replica_without_its_environment_says_which_variable_is_missing() {
    let out = Command::new(env!("CARGO_BIN_EXE_mecak8s"))
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("POD_NAMESPACE"), "{stderr}");
}

/// GET of a session: its status, `Retry-After` and JSON body.
async fn get_session(
    m: &Mecated,
    id: &str,
) -> (
    StatusCode,
    Option<reqwest::header::HeaderValue>,
    serde_json::Value,
) {
    let answer = client()
        .get(m.url(&format!("/v1/sessions/{id}")))
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let retry_after = answer.headers().get("retry-after").cloned();
    (status, retry_after, answer.json().await.unwrap())
}

/// Redis down is a retryable 503 (`store_unavailable`, with `Retry-After`),
/// not a 500: a client told "retry" comes back once the replica's
/// connection is re-made, and gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_redis_is_down_answers_retry_and_serves_again_once_it_is_back() {
    let mut redis =
        test_services::RedisServer::start_persistent().expect("redis-server is installed");
    let emulator = k8s_emulator::Emulator::start(k8s_emulator::EmulatorConfig::default())
        .await
        .expect("the emulator starts");
    let kubeconfig = emulator.kubeconfig_path().to_str().unwrap().to_owned();
    let a = replica(&redis.url(), &kubeconfig, "mecak8s-0");
    create(&a, "chat").await;

    redis.kill();
    let (status, retry_after, body) = get_session(&a, "chat").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    assert!(retry_after.is_some(), "a retryable 503 says when to retry");

    redis.restart().expect("redis restarts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, _, body) = get_session(&a, "chat").await;
        if status == StatusCode::OK {
            assert_eq!(body["id"], "chat", "{body}");
            break;
        }
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "still {status} {body} 30 s after Redis came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A run that ended but whose events could not be read back (Redis
/// stopped as the run finished) is answered `internal`, never "retry": the
/// run is done, and a client that retried would run its input twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_whose_events_cannot_be_read_back_is_not_answered_retry() {
    use test_services::Controls;
    let redis = test_services::RedisServer::start().expect("redis-server is installed");
    let pid = redis.pid().expect("redis runs");
    let dir = tempfile::tempdir().unwrap();
    // One event; once it is stored (run_started and it), Redis stops as
    // the turn ends, until the test resumes it.
    let port = redis.addr().port();
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\necho '{{\"type\":\"message\",\"content\":\"turn\"}}'\n\
             until [ \"$(redis-cli -p {port} XLEN 'mecatl:{{chat}}:events')\" = 2 ]; do sleep 0.05; done\n\
             kill -STOP {pid}\n"
        ),
    )
    .unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&script, mode).unwrap();
    let url = redis.url();
    let a = Mecated::start(
        &dir.path().join("store"),
        "a",
        &[
            "--store-redis",
            &url,
            "--agent",
            "exec",
            "--agent-command",
            script.to_str().unwrap(),
        ],
    );
    create(&a, "chat").await;
    let (status, body) = run(&a, "chat", json!("book one ticket")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    assert_eq!(body["error"]["retryable"], false, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("do not run the input again"), "{message}");
    let _ = redis.resume();
}
