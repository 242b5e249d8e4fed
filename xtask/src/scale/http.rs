//! Just enough HTTP/1.1 to drive `mecated` from a plain thread: requests
//! on a kept-alive connection, and run starts that hang up once the run
//! has started (the run belongs to the server, not to the connection, so
//! ten thousand runs need no ten thousand open requests).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::Result;

/// Long enough for a run start that waits its longest (`?wait` is cut to
/// a minute) and for a server busy starting thousands of runs.
const READ_TIMEOUT: Duration = Duration::from_secs(90);

/// One kept-alive connection to a server.
pub(super) struct Conn {
    addr: String,
    stream: BufReader<TcpStream>,
}

/// An answer: status and body (JSON when it parses, else the text as a
/// JSON string).
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Value,
}

fn addr_of(base: &str) -> &str {
    base.trim_start_matches("http://").trim_end_matches('/')
}

fn connect(addr: &str) -> Result<TcpStream> {
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(READ_TIMEOUT))
        .and_then(|()| stream.set_nodelay(true))
        .map_err(|e| format!("{addr}: {e}"))?;
    Ok(stream)
}

fn request_text(addr: &str, method: &str, path: &str, body: Option<&Value>, extra: &str) -> String {
    let body = body.map(Value::to_string).unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

impl Conn {
    pub(super) fn open(base: &str) -> Result<Conn> {
        let addr = addr_of(base).to_owned();
        let stream = BufReader::new(connect(&addr)?);
        Ok(Conn { addr, stream })
    }

    /// `method path` with `body`; the connection stays open for the next.
    pub(super) fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer> {
        let text = request_text(&self.addr, method, path, body, "");
        self.stream
            .get_mut()
            .write_all(text.as_bytes())
            .map_err(|e| format!("{method} {path}: {e}"))?;
        read_answer(&mut self.stream, true).map_err(|e| format!("{method} {path}: {e}"))
    }
}

/// Starts a run of `session` on its own connection and hangs up as soon as
/// the server answered: 200 once the run has started (its event stream
/// would follow), or the refusal with its body. `wait` is the `?wait` of a
/// start that may wait for the session's lease.
pub(super) fn start_run(base: &str, session: &str, wait: Option<&str>) -> Result<Answer> {
    let addr = addr_of(base);
    let mut stream = connect(addr)?;
    let path = match wait {
        Some(w) => format!("/v1/sessions/{session}/runs?wait={w}"),
        None => format!("/v1/sessions/{session}/runs"),
    };
    let body = serde_json::json!({ "input": "hold" });
    let text = request_text(
        addr,
        "POST",
        &path,
        Some(&body),
        "accept: text/event-stream\r\nconnection: close\r\n",
    );
    stream
        .write_all(text.as_bytes())
        .map_err(|e| format!("start a run of {session}: {e}"))?;
    let mut reader = BufReader::new(stream);
    read_answer(&mut reader, false).map_err(|e| format!("start a run of {session}: {e}"))
}

/// An event stream whose headers were read: its body is what follows.
pub(super) struct FollowStream(BufReader<TcpStream>);

/// Server-Sent Events as read: each one's `event:` name and its `data:`
/// as JSON.
pub(super) type SseEvents = Vec<(String, Value)>;

/// Follows `session`'s events from the first, on a connection of its own
/// that the server closes once the stream ends.
pub(super) fn open_follow(base: &str, session: &str) -> Result<FollowStream> {
    let addr = addr_of(base);
    let mut stream = connect(addr)?;
    let path = format!("/v1/sessions/{session}/events");
    let text = request_text(
        addr,
        "GET",
        &path,
        None,
        "accept: text/event-stream\r\nconnection: close\r\n",
    );
    stream
        .write_all(text.as_bytes())
        .map_err(|e| format!("follow {session}: {e}"))?;
    let mut reader = BufReader::new(stream);
    let answer = read_answer(&mut reader, false).map_err(|e| format!("follow {session}: {e}"))?;
    match answer.status {
        200 => Ok(FollowStream(reader)),
        s => Err(format!("follow {session}: {s} {}", answer.body)),
    }
}

impl FollowStream {
    /// Every event of the stream, read to its end.
    pub(super) fn rest(mut self) -> Result<SseEvents> {
        let body = read_chunked(&mut self.0)?;
        let text = String::from_utf8(body).map_err(|e| format!("an event stream: {e}"))?;
        Ok(parse_sse(&text))
    }
}

/// The events of an SSE body; comments (keep-alives) and `id:` lines are
/// left out, and data that is not JSON is kept as a string.
fn parse_sse(text: &str) -> SseEvents {
    text.split("\n\n")
        .filter_map(|block| {
            let (mut name, mut data) = (None, String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            Some((name?, value))
        })
        .collect()
}

/// Reads one answer; a 200 event stream is not read past its headers when
/// `whole_stream` is false.
fn read_answer(r: &mut BufReader<TcpStream>, whole_stream: bool) -> Result<Answer> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP status line: {line:?}"))?;
    let (mut length, mut chunked, mut stream) = (None, false, false);
    loop {
        line.clear();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or((header, ""));
        let (name, value) = (name.to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "content-type" => stream = value.starts_with("text/event-stream"),
            _ => {}
        }
    }
    if stream && !whole_stream {
        return Ok(Answer {
            status,
            body: Value::Null,
        });
    }
    let bytes = match (length, chunked) {
        (Some(n), _) => {
            let mut buf = vec![0; n];
            r.read_exact(&mut buf).map_err(|e| e.to_string())?;
            buf
        }
        (None, true) => read_chunked(r)?,
        (None, false) => Vec::new(),
    };
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok(Answer { status, body })
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| format!("bad chunk size {line:?}"))?;
        let mut chunk = vec![0; size + 2];
        r.read_exact(&mut chunk).map_err(|e| e.to_string())?;
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&chunk[..size]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sse_events_are_read_with_their_names_and_json_data() {
        let text = ": keep-alive\n\nevent: event\ndata: {\"seq\":1}\nid: 1\n\n\
                    event: end\ndata: {\"reason\":\"run_ended\"}\n\n";
        assert_eq!(
            parse_sse(text),
            vec![
                ("event".to_string(), json!({ "seq": 1 })),
                ("end".to_string(), json!({ "reason": "run_ended" })),
            ]
        );
    }
}
