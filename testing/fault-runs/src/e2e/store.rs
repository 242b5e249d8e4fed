//! What the store holds at the end: each session's events through the
//! API (what a user reads), and the writer the store recorded for each
//! (from the store itself: the API does not show it).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lease_history::server_log::StoredEvent;
use serde_json::Value;
use test_services::PostgresServer;

/// Every event of `session`, paged through the replica at `base`;
/// `origin_ms` is the wall clock at the history's start.
pub(crate) async fn read_log(
    http: &reqwest::Client,
    base: &str,
    session: &str,
    origin_ms: u64,
) -> Result<Vec<StoredEvent>, String> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let url = format!("{base}/v1/sessions/{session}/events?after={after}&limit=1000");
        let page = get_page(http, &url).await?;
        let events = page["events"]
            .as_array()
            .ok_or_else(|| format!("GET {url}: no events in {page}"))?;
        for e in events {
            let seq = e["seq"].as_u64().ok_or_else(|| format!("no seq in {e}"))?;
            all.push(StoredEvent {
                seq,
                token: e["token"].as_u64().filter(|t| *t != 0),
                writer: None,
                at: Duration::from_millis(
                    e["time_ms"].as_u64().unwrap_or(0).saturating_sub(origin_ms),
                ),
                payload: e["payload"].clone(),
            });
        }
        match page["next_after"].as_u64() {
            Some(n) => after = n,
            None => return Ok(all),
        }
    }
}

/// One page, asked again while the replica answers "retry" (503) or not at
/// all: its store connection may still be coming back from the last fault
/// (a Redis restarted under it). Any other error fails the read.
async fn get_page(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let mut last = String::new();
    for _ in 0..40 {
        match http.get(url).timeout(Duration::from_secs(30)).send().await {
            Ok(resp) if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                last = format!("GET {url}: {status} {body}");
            }
            Ok(resp) => {
                let status = resp.status();
                let body = resp.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
                if !status.is_success() {
                    return Err(format!(
                        "GET {url}: {status} {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
                return serde_json::from_slice(&body)
                    .map_err(|e| format!("GET {url}: {status}, not JSON: {e}"));
            }
            Err(e) => last = format!("GET {url}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

/// Sets each event's writer from `writers` (by sequence number).
pub(crate) fn attach_writers(log: &mut [StoredEvent], writers: &HashMap<u64, Arc<str>>) {
    for e in log {
        e.writer = writers.get(&e.seq).cloned();
    }
}

/// The writer of every event of `session` in a JSONL store directory, from
/// its record lines (`{"t":"e","seq":…,"owner":…}`). Only the writer is
/// taken from here; the events themselves are read through the API, whose
/// reader keeps only committed writes.
pub(crate) fn jsonl_writers(dir: &Path, session: &str) -> Result<HashMap<u64, Arc<str>>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if !path.is_file() {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut lines = text.lines();
        let header: Value = match lines.next().map(serde_json::from_str) {
            Some(Ok(v)) => v,
            _ => continue,
        };
        if header["t"] != "h" || header["id"] != session {
            continue;
        }
        let mut writers = HashMap::new();
        for line in lines {
            let Ok(record) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let (Some("e"), Some(seq), Some(owner)) = (
                record["t"].as_str(),
                record["seq"].as_u64(),
                record["owner"].as_str(),
            ) {
                writers.insert(seq, Arc::from(owner));
            }
        }
        return Ok(writers);
    }
    Err(format!("no file of session {session} in {}", dir.display()))
}

/// The writer of every event of `session` in the Redis store (the `w`
/// field of its events stream, `<prefix>{<id>}:events`).
pub(crate) async fn redis_writers(
    url: &str,
    prefix: &str,
    session: &str,
) -> Result<HashMap<u64, Arc<str>>, String> {
    use redis::AsyncCommands as _;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connect to {url}: {e}"))?;
    let key = format!("{prefix}{{{session}}}:events");
    let reply: redis::streams::StreamRangeReply = con
        .xrange_all(&key)
        .await
        .map_err(|e| format!("XRANGE {key}: {e}"))?;
    let mut writers = HashMap::new();
    for entry in reply.ids {
        let seq = entry
            .id
            .split('-')
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| format!("{key}: entry id {:?}", entry.id))?;
        if let Some(w) = entry.get::<String>("w") {
            writers.insert(seq, Arc::from(w.as_str()));
        }
    }
    Ok(writers)
}

/// The writer of every event of `session` in the PostgreSQL store (the
/// `writer` column of `<prefix>_events`), read on the server's own socket.
pub(crate) fn postgres_writers(
    pg: &PostgresServer,
    prefix: &str,
    session: &str,
) -> Result<HashMap<u64, Arc<str>>, String> {
    let sql = format!(
        "SELECT seq, writer FROM {prefix}_events WHERE session_id = '{}' AND writer IS NOT NULL",
        session.replace('\'', "''")
    );
    let rows = pg.query(&sql).map_err(|e| e.to_string())?;
    let mut writers = HashMap::new();
    for row in rows {
        match row.as_slice() {
            [Some(seq), Some(writer)] => {
                let seq = seq
                    .parse::<u64>()
                    .map_err(|e| format!("{prefix}_events: seq {seq:?}: {e}"))?;
                writers.insert(seq, Arc::from(writer.as_str()));
            }
            other => return Err(format!("{prefix}_events: a row {other:?}")),
        }
    }
    Ok(writers)
}
