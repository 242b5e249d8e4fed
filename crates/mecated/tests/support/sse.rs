//! A Server-Sent Events reader for the tests: the `id`, `event` and
//! `data` of each message, comments (keep-alives) skipped.

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;

use super::{Mecated, PATIENCE, client};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SseMessage {
    pub(crate) id: Option<String>,
    pub(crate) event: String,
    pub(crate) data: Value,
}

pub(crate) struct SseReader {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buffer: String,
}

impl SseReader {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        assert!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream")),
            "not an event stream: {:?}",
            response.headers()
        );
        Self {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
        }
    }

    /// The next message; `None` when the stream ended (or broke).
    pub(crate) async fn next(&mut self) -> Option<SseMessage> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(message) = parse(&block) {
                    return Some(message);
                }
                continue;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                Some(Err(_)) | None => return None,
            }
        }
    }
}

fn parse(block: &str) -> Option<SseMessage> {
    let (mut id, mut event, mut data) = (None, String::from("message"), String::new());
    let mut any = false;
    for line in block.lines() {
        if line.starts_with(':') || line.is_empty() {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        any = true;
        match field {
            "id" => id = Some(value.to_owned()),
            "event" => event = value.to_owned(),
            "data" => data.push_str(value),
            _ => {}
        }
    }
    any.then(|| SseMessage {
        id,
        event,
        data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
    })
}

/// Follows `id` on `m` (from `last_event_id`, as `Last-Event-ID`, when
/// given): the stream, once the server said 200.
pub(crate) async fn follow_from(m: &Mecated, id: &str, last_event_id: Option<u64>) -> SseReader {
    let url = m.url(&format!("/v1/sessions/{id}/events"));
    follow_url(&client(), url, last_event_id).await
}

/// Follows the session event stream at `url` with `client`.
pub(crate) async fn follow_url(
    client: &reqwest::Client,
    url: String,
    last_event_id: Option<u64>,
) -> SseReader {
    let mut req = client.get(url).header("accept", "text/event-stream");
    if let Some(last) = last_event_id {
        req = req.header("last-event-id", last.to_string());
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    SseReader::new(r)
}

/// Reads a follow to its end: the payloads of its events and the end's data.
pub(crate) async fn payloads_to_end(stream: &mut SseReader) -> (Vec<Value>, Value) {
    let mut payloads = Vec::new();
    loop {
        let m = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("the follow never ended")
            .expect("the stream broke before its end");
        if m.event == "end" {
            return (payloads, m.data);
        }
        payloads.push(m.data["payload"].clone());
    }
}
