//! A Server-Sent Events reader for the tests: the `id`, `event` and
//! `data` of each message, comments (keep-alives) skipped.

use futures_util::StreamExt;
use serde_json::Value;

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
