//! `--store-fsync never` leaves file leases unsynced too. A machine crash can
//! then lose a session's lease file, or roll it back, while the store's
//! appends (and its high-water mark) survive: the next run's token comes
//! back at or below the mark, the store refuses the claim, and the server
//! acquires above the mark instead of failing the session.

use std::path::{Path, PathBuf};

use flocklease::Durability;
use mecated::backend::StoreChoice;
use mecated::{Server, ServerConfig};
use serde_json::{Value, json};

fn unsynced(dir: &Path) -> ServerConfig {
    let mut config = ServerConfig::for_store(dir);
    config.store = StoreChoice::Jsonl {
        dir: dir.to_path_buf(),
        fsync: false,
    };
    config.lease = config.store.default_leases();
    config
}

/// Runs session `id` once; its fencing token.
async fn run(client: &reqwest::Client, base: &str, id: &str) -> u64 {
    let r: Value = client
        .post(format!("{base}/v1/sessions/{id}/runs"))
        .json(&json!({"input": "ping"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["status"], "completed", "{r}");
    r["token"].as_u64().expect("a leased run has a token")
}

async fn high_water(client: &reqwest::Client, base: &str, id: &str) -> u64 {
    let r: Value = client
        .get(format!("{base}/v1/sessions/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["high_water_token"].as_u64().expect("a fenced session")
}

/// The session's one lease file.
fn lease_file(dir: &Path) -> PathBuf {
    let leases = dir.join(session_store::DEFAULT_LEASE_DIR_NAME);
    let mut files: Vec<_> = std::fs::read_dir(&leases)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "lease"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

#[test]
fn only_a_store_that_syncs_gets_synced_file_leases() {
    let dir = Path::new("/store");
    assert_eq!(unsynced(dir).store.lease_durability(), Durability::Unsynced);
    assert_eq!(
        ServerConfig::for_store(dir).store.lease_durability(),
        Durability::Synced
    );
}

/// A lease file lost (deleted) and one rolled back to an older record, each
/// between two server lifetimes, as a machine crash may leave them: the run
/// after each completes with a token above the store's mark, and the next
/// run needs no second try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_rolled_back_lease_file_resumes_above_the_stores_mark() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let id = "unsynced-1";

    let server = Server::start(unsynced(dir.path())).await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let r = client
        .post(format!("{base}/v1/sessions"))
        .json(&json!({ "id": id }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let first = run(&client, &base, id).await;
    let file = lease_file(dir.path());
    let early = std::fs::read(&file).unwrap();
    let mut last = first;
    for _ in 0..2 {
        let token = run(&client, &base, id).await;
        assert!(token > last, "{token} after {last}");
        last = token;
    }
    assert!(server.shutdown().await);

    for lose in [
        |file: &Path, _: &[u8]| std::fs::remove_file(file).unwrap(),
        |file: &Path, early: &[u8]| std::fs::write(file, early).unwrap(),
    ] {
        lose(&file, &early);
        let server = Server::start(unsynced(dir.path())).await.unwrap();
        let base = format!("http://{}", server.local_addr());
        let mark = high_water(&client, &base, id).await;
        assert_eq!(mark, last, "the store kept its mark");
        let token = run(&client, &base, id).await;
        assert!(
            token > mark,
            "token {token} not above the store's mark {mark}"
        );
        let next = run(&client, &base, id).await;
        assert!(next > token, "{next} after {token}");
        assert_eq!(high_water(&client, &base, id).await, next);
        last = next;
        assert!(server.shutdown().await);
    }
}
