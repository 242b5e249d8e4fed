//! The on-disk format of a session file: what each JSON line says and how
//! it is written and parsed. Kept in one place so the format can be read
//! (and versioned) without the locking and caching around it.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use lease_port::SessionId;
use serde::Deserialize;
use serde_json::Value;

use super::index::Mark;
use super::open_flags;
use crate::StoreError;

/// The `v` of every header this store writes; it reads this one and 1
/// (unframed: every line commits on its own).
pub(super) const FORMAT_VERSION: u64 = 2;

/// The framing line: written before the first framed write to a file
/// whose lines are not framed yet (one written by format 1). From it on,
/// lines commit only with a commit line.
pub(super) const FRAMING_LINE: &str = "{\"t\":\"f\"}\n";

/// The fields of any record line (header, event or deletion) that the
/// index needs; the payload is left unparsed.
#[derive(Deserialize)]
pub(super) struct Record {
    pub(super) t: String,
    #[serde(default)]
    pub(super) v: Option<u64>,
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) seq: Option<u64>,
    #[serde(default)]
    pub(super) token: Option<u64>,
    #[serde(default)]
    pub(super) owner: Option<String>,
    #[serde(default)]
    pub(super) n: Option<u64>,
    #[serde(default)]
    pub(super) len: Option<u64>,
    #[serde(default)]
    pub(super) crc: Option<u64>,
    #[serde(default)]
    pub(super) ts: Option<u64>,
}

impl Record {
    /// A framing line or a version-2 header: lines from it on are framed.
    pub(super) fn starts_frame(&self) -> bool {
        self.t == "f" || (self.t == "h" && self.v.is_some_and(|v| v >= 2))
    }

    /// A record type this store writes.
    pub(super) fn is_known(&self) -> bool {
        matches!(self.t.as_str(), "h" | "e" | "d" | "f" | "c")
    }
}

/// Ends the write in `buf[from..]` (whole lines) with its commit line:
/// `{"t":"c","n":…,"len":…,"crc":…}`, the number of lines, their length in
/// bytes and their CRC-32. Readers take the lines only with it.
pub(super) fn push_commit(buf: &mut String, from: usize) {
    let lines = &buf.as_bytes()[from..];
    let n = lines.iter().filter(|&&b| b == b'\n').count();
    let len = lines.len();
    let crc = crc32fast::hash(lines);
    let _ = writeln!(buf, "{{\"t\":\"c\",\"n\":{n},\"len\":{len},\"crc\":{crc}}}");
}

/// An event line in full, parsed when a page is read.
#[derive(Deserialize)]
pub(super) struct EventLine {
    pub(super) seq: u64,
    pub(super) token: Option<u64>,
    pub(super) ts: u64,
    pub(super) payload: Value,
}

/// Milliseconds since the Unix epoch, the `ts` of every line.
pub(super) fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn json_str(s: &str) -> String {
    // Serialising a str cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// The header line that opens every incarnation of a session:
/// `{"t":"h","v":2,"id":…,"ts":…}`, and when the session's previous file
/// was reclaimed, what the graveyard kept of it:
/// `…,"token":…,"owner":…,"seq":<next sequence number>}`.
pub(super) fn header_line(session: &SessionId, ts: u64, grave: Option<&Grave>) -> String {
    let mut line = format!(
        "{{\"t\":\"h\",\"v\":{FORMAT_VERSION},\"id\":{},\"ts\":{ts}",
        json_str(session.as_str())
    );
    if let Some(grave) = grave {
        if let Some(mark) = &grave.mark {
            let _ = write!(line, ",\"token\":{}", mark.token);
            if let Some(owner) = &mark.owner {
                let _ = write!(line, ",\"owner\":{}", json_str(owner));
            }
        }
        let _ = write!(line, ",\"seq\":{}", grave.next_seq);
    }
    line.push_str("}\n");
    line
}

/// What the graveyard keeps of a reclaimed session file: what fencing and
/// sequence numbers need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Grave {
    /// The session's high-water mark and its writer.
    pub(super) mark: Option<Mark>,
    /// The next sequence number the session would have used.
    pub(super) next_seq: u64,
}

/// A graveyard line: `{"t":"g","id":…,"token":…,"owner":…,"seq":…,"ts":…}`.
pub(super) fn grave_line(session: &SessionId, grave: &Grave, ts: u64) -> String {
    let mut line = format!("{{\"t\":\"g\",\"id\":{}", json_str(session.as_str()));
    match &grave.mark {
        Some(mark) => {
            let _ = write!(line, ",\"token\":{}", mark.token);
            if let Some(owner) = &mark.owner {
                let _ = write!(line, ",\"owner\":{}", json_str(owner));
            }
        }
        None => line.push_str(",\"token\":null"),
    }
    let _ = writeln!(line, ",\"seq\":{},\"ts\":{ts}}}", grave.next_seq);
    line
}

/// A write's fence as a line holds it: `"token":…,"owner":"…"`, or
/// `"token":null` for an unfenced write.
pub(super) fn fence_json(fence: Option<(u64, &str)>) -> String {
    match fence {
        Some((token, owner)) => format!("\"token\":{token},\"owner\":{}", json_str(owner)),
        None => "\"token\":null".to_owned(),
    }
}

/// Appends one event line to `buf`:
/// `{"t":"e","seq":…,"token":…,"owner":…,"ts":…,"payload":…}`, where
/// `fence` is [`fence_json`]'s text and `payload` already serialised JSON.
pub(super) fn push_event_line(buf: &mut String, seq: u64, fence: &str, ts: u64, payload: &str) {
    let _ = writeln!(
        buf,
        "{{\"t\":\"e\",\"seq\":{seq},{fence},\"ts\":{ts},\"payload\":{payload}}}"
    );
}

/// A deletion line: `{"t":"d","token":…,"owner":…,"ts":…}`, where `fence`
/// is [`fence_json`]'s text.
pub(super) fn deletion_line(fence: &str, ts: u64) -> String {
    format!("{{\"t\":\"d\",{fence},\"ts\":{ts}}}\n")
}

/// The session id in the header of the file at `path`; `None` when the
/// file is gone or its header is incomplete.
pub(super) fn read_header_id(path: &Path) -> Result<Option<String>, StoreError> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(open_flags())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("opening session file", path, e)),
    };
    // A header is at most a few kilobytes: a 256-byte id escaped, plus fields.
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StoreError::io("reading session header", path, e)),
        }
    }
    let Some(end) = buf[..n].iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    let rec: Record = serde_json::from_slice(&buf[..end]).map_err(|e| StoreError::Corrupt {
        path: path.to_owned(),
        line: Some(1),
        message: "not a store record".to_owned(),
        source: Some(e),
    })?;
    match (rec.t.as_str(), rec.id) {
        ("h", Some(id)) => Ok(Some(id)),
        _ => Err(StoreError::corrupt(
            path,
            Some(1),
            "the first line is not a header",
        )),
    }
}
