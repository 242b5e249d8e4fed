//! Clients hammering a few sessions through every replica: runs (some
//! waiting for the session), follows, cancels and page reads, each request
//! recorded with its invocation, completion and what it received.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use lease_history::server_log::{Request, RequestKind, SeenEvent, SeenRun};
use lease_history::{Recorder, Rng};
use serde_json::{Value, json};

use super::{lock, lock_read};

/// What every client shares.
pub(crate) struct Shared {
    pub(crate) rec: Recorder,
    pub(crate) bases: Arc<RwLock<Vec<Option<String>>>>,
    pub(crate) replica_names: Vec<String>,
    pub(crate) sessions: Vec<String>,
    pub(crate) next_id: AtomicU64,
    /// Requests to send in all; clients stop once this many were sent.
    pub(crate) budget: u64,
    pub(crate) deadline: Instant,
    pub(crate) requests: Mutex<Vec<Request>>,
    /// The highest sequence number any client saw, per session: where
    /// follows resume from.
    pub(crate) seen: Mutex<HashMap<String, u64>>,
    pub(crate) http: reqwest::Client,
    /// How long a run request may wait for its session (`?wait=`).
    pub(crate) wait: Duration,
    /// The longest any request may take before it counts as unanswered.
    pub(crate) timeout: Duration,
}

impl Shared {
    pub(crate) fn done(&self) -> u64 {
        lock(&self.requests).len() as u64
    }

    fn take_id(&self) -> Option<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        (id < self.budget && Instant::now() < self.deadline).then_some(id)
    }
}

/// A client task: requests chosen from its own seed until the budget or
/// the deadline is reached.
pub(crate) async fn client(shared: Arc<Shared>, client: u32, seed: u64) {
    let mut rng = Rng::new(seed ^ (u64::from(client) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    while let Some(id) = shared.take_id() {
        let session = shared.sessions[rng.below(shared.sessions.len() as u64) as usize].clone();
        let replica = rng.below(shared.replica_names.len() as u64) as usize;
        let roll = rng.below(100);
        let kind = match roll {
            0..=44 => RequestKind::Run,
            45..=69 => RequestKind::Follow,
            70..=89 => RequestKind::Cancel,
            _ => RequestKind::Read,
        };
        let wait = kind == RequestKind::Run && rng.below(2) == 0;
        let back = rng.below(6);
        let invoked = shared.rec.now();
        let base = lock_read(&shared.bases)[replica].clone();
        let mut request = Request {
            id,
            client,
            replica: shared.replica_names[replica].as_str().into(),
            session: session.as_str().into(),
            kind,
            invoked,
            completed: invoked,
            status: None,
            outcome: String::new(),
            events: Vec::new(),
            run: None,
        };
        match base {
            None => request.outcome = "replica down".into(),
            Some(base) => {
                let url = |path: &str| format!("{base}/v1/sessions/{session}{path}");
                let sent = match kind {
                    RequestKind::Run => {
                        let query = if wait {
                            format!("?wait={}ms", shared.wait.as_millis())
                        } else {
                            String::new()
                        };
                        let input = format!("c{client}-r{id}");
                        run(
                            &shared,
                            &url(&format!("/runs{query}")),
                            &input,
                            &mut request,
                        )
                        .await
                    }
                    RequestKind::Follow => {
                        let from = lock(&shared.seen)
                            .get(&session)
                            .copied()
                            .unwrap_or(0)
                            .saturating_sub(back);
                        follow(&shared, &url("/events"), from, &mut request).await
                    }
                    RequestKind::Cancel => {
                        cancel(&shared, &url("/runs/current"), &mut request).await
                    }
                    RequestKind::Read | RequestKind::Create => {
                        read(&shared, &url("/events?limit=1000"), &mut request).await
                    }
                };
                if let Err(e) = sent {
                    request.outcome = e;
                }
            }
        }
        request.completed = shared.rec.now();
        let highest = request
            .events
            .iter()
            .chain(request.run.iter().flat_map(|r| &r.events))
            .map(|e| e.seq)
            .max();
        if let Some(h) = highest {
            let mut seen = lock(&shared.seen);
            let e = seen.entry(session.clone()).or_default();
            *e = (*e).max(h);
        }
        lock(&shared.requests).push(request);
        // A replica that is down would spin the client through its budget.
        if request_was_refused_at_once(&shared, invoked) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn request_was_refused_at_once(shared: &Shared, invoked: Duration) -> bool {
    shared.rec.now().saturating_sub(invoked) < Duration::from_millis(2)
}

fn transport(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection refused".into()
    } else {
        format!("transport error: {e}")
    }
}

fn seen_event(v: &Value) -> Option<SeenEvent> {
    Some(SeenEvent {
        seq: v["seq"].as_u64()?,
        token: v["token"].as_u64().filter(|t| *t != 0),
        payload: v["payload"].clone(),
    })
}

fn error_code(body: &Value) -> String {
    body["error"]["code"].as_str().unwrap_or("?").to_owned()
}

async fn run(shared: &Shared, url: &str, input: &str, r: &mut Request) -> Result<(), String> {
    let resp = shared
        .http
        .post(url)
        .header("content-type", "application/json")
        .body(json!({ "input": input }).to_string())
        .timeout(shared.timeout)
        .send()
        .await
        .map_err(|e| transport(&e))?;
    r.status = Some(resp.status().as_u16());
    let body = resp.bytes().await.map_err(|e| transport(&e))?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if r.status != Some(200) {
        r.outcome = error_code(&body);
        return Ok(());
    }
    let status = body["status"].as_str().unwrap_or("?").to_owned();
    let events: Vec<SeenEvent> = body["events"]
        .as_array()
        .map(|a| a.iter().filter_map(seen_event).collect())
        .unwrap_or_default();
    r.outcome = status.clone();
    r.run = Some(SeenRun {
        token: body["token"].as_u64(),
        status,
        events,
    });
    Ok(())
}

/// Sends `request`, records its status in `r`, and returns its body as
/// JSON (`null` when it is not).
async fn answer(request: reqwest::RequestBuilder, r: &mut Request) -> Result<Value, String> {
    let resp = request.send().await.map_err(|e| transport(&e))?;
    r.status = Some(resp.status().as_u16());
    let body = resp.bytes().await.map_err(|e| transport(&e))?;
    Ok(serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn cancel(shared: &Shared, url: &str, r: &mut Request) -> Result<(), String> {
    let body = answer(shared.http.delete(url).timeout(shared.timeout), r).await?;
    r.outcome = if r.status.is_some_and(|s| s < 300) {
        format!("live={} token={}", body["live"], body["token"])
    } else {
        error_code(&body)
    };
    Ok(())
}

async fn read(shared: &Shared, url: &str, r: &mut Request) -> Result<(), String> {
    let body = answer(shared.http.get(url).timeout(shared.timeout), r).await?;
    r.events = body["events"]
        .as_array()
        .map(|a| a.iter().filter_map(seen_event).collect())
        .unwrap_or_default();
    r.outcome = format!("{} events", r.events.len());
    Ok(())
}

/// Follows from `after` to the end of the live run (or the timeout). When
/// it ends at a run's end, the run it saw end is recorded as seen whole.
async fn follow(shared: &Shared, url: &str, after: u64, r: &mut Request) -> Result<(), String> {
    let mut resp = shared
        .http
        .get(url)
        .header("accept", "text/event-stream")
        .header("last-event-id", after.to_string())
        .timeout(shared.timeout)
        .send()
        .await
        .map_err(|e| transport(&e))?;
    r.status = Some(resp.status().as_u16());
    if r.status != Some(200) {
        let body = resp.bytes().await.map_err(|e| transport(&e))?;
        r.outcome = error_code(&serde_json::from_slice(&body).unwrap_or(Value::Null));
        return Ok(());
    }
    let mut buffer = String::new();
    let mut end: Option<Value> = None;
    let mut events = Vec::new();
    'read: loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                r.outcome = format!("stream broke: {}", transport(&e));
                break;
            }
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(at) = buffer.find("\n\n") {
            let message: String = buffer.drain(..at + 2).collect();
            let mut name = "message";
            let mut data = String::new();
            for line in message.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = if v.trim() == "end" { "end" } else { "event" };
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            if name == "end" {
                end = Some(data);
                break 'read;
            }
            if let Some(e) = seen_event(&data) {
                events.push(e);
            }
        }
    }
    match &end {
        Some(end) => {
            r.outcome = format!("end {}", end["reason"].as_str().unwrap_or("?"));
            if end["reason"] == "run_ended" {
                split_seen_run(&mut events, r);
            }
        }
        None if r.outcome.is_empty() => r.outcome = "stream ended without its end".into(),
        None => {}
    }
    r.events.extend(events);
    Ok(())
}

/// A follow that ended at a run's end received that run from its
/// `run_started` (when it started after the follow's position) to its
/// `run_ended`: recorded as a run the client saw end.
fn split_seen_run(events: &mut Vec<SeenEvent>, r: &mut Request) {
    let Some(last) = events.last() else {
        return;
    };
    if last.payload["type"] != "run_ended" {
        return;
    }
    let Some(start) = events
        .iter()
        .rposition(|e| e.payload["type"] == "run_started")
    else {
        return;
    };
    let run_events = events.split_off(start);
    r.run = Some(SeenRun {
        token: run_events[0].payload["token"].as_u64(),
        status: run_events
            .last()
            .and_then(|e| e.payload["status"].as_str())
            .unwrap_or("?")
            .to_owned(),
        events: run_events,
    });
}
