//! `GET /v1/sessions` pages: `limit` and an opaque `continue`, over a real
//! server on a JSONL store; bad cursors and limits are typed 400s.

use mecated::{Server, ServerConfig};
use serde_json::{Value, json};

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = client.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_a_page_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(ServerConfig::for_store(dir.path()))
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let client = reqwest::Client::new();
    let mut ids: Vec<String> = (0..25).map(|i| format!("s{i:02}")).collect();
    ids.push("needs escaping/é".into());
    for id in &ids {
        let r = client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({ "id": id }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    ids.sort();

    let mut seen = Vec::new();
    let mut url = format!("{base}/v1/sessions?limit=10");
    let mut pages = 0;
    loop {
        let (status, body) = get(&client, &url).await;
        assert_eq!(status, 200, "{body}");
        let page: Vec<String> = body["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect();
        assert!(page.len() <= 10);
        seen.extend(page);
        pages += 1;
        match body["continue"].as_str() {
            Some(token) => url = format!("{base}/v1/sessions?limit=10&continue={token}"),
            None => {
                assert!(body["continue"].is_null(), "{body}");
                break;
            }
        }
    }
    assert_eq!(seen, ids);
    assert_eq!(pages, 3);

    // No limit: a default page (100) holds them all, and says it is last.
    let (status, body) = get(&client, &format!("{base}/v1/sessions")).await;
    assert_eq!(status, 200);
    assert_eq!(body["sessions"].as_array().unwrap().len(), ids.len());
    assert!(body["continue"].is_null());

    // A cursor that is not one of ours, and limits out of bounds.
    for (query, code) in [
        ("continue=bogus", "invalid_continue"),
        ("continue=s1.zz", "invalid_continue"),
        ("continue=", "invalid_continue"),
        ("limit=0", "invalid"),
        ("limit=1001", "invalid"),
        ("limit=-1", "invalid"),
        ("limit=ten", "invalid"),
        ("page=2", "invalid"),
    ] {
        let (status, body) = get(&client, &format!("{base}/v1/sessions?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}: {body}");
    }
    assert!(server.shutdown().await);
}
