//! What the store knows of a session file — where each event's line lies,
//! the next sequence number, the high-water token — and how that knowledge
//! is brought up to date from the file, reading only what was appended.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use lease_port::SessionId;

use super::format::{FORMAT_VERSION, Record};
use crate::StoreError;

/// What the store knows of a session file up to `pos`, the end of its
/// last complete line.
#[derive(Debug)]
pub(super) struct FileIndex {
    pub(super) valid: bool,
    pub(super) pos: u64,
    pub(super) lines: u64,
    pub(super) id: Option<String>,
    pub(super) live: bool,
    pub(super) next_seq: u64,
    /// The high-water mark: the largest token on any line, deleted
    /// incarnations included, and the writer that first wrote it.
    pub(super) high_water: Option<Mark>,
    /// The current incarnation's events.
    pub(super) events: Vec<EventSpan>,
    /// Bytes after `pos` with no line end: a torn write.
    pub(super) torn: u64,
    pub(super) last_sync: Option<Instant>,
}

impl Default for FileIndex {
    fn default() -> Self {
        Self {
            valid: false,
            pos: 0,
            lines: 0,
            id: None,
            live: false,
            next_seq: 1,
            high_water: None,
            events: Vec::new(),
            torn: 0,
            last_sync: None,
        }
    }
}

/// A session's high-water mark: the largest token accepted and the writer
/// (owner) it belongs to — the first line that carried it. `owner` is
/// `None` for a mark set by a line written before lines named their
/// writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mark {
    pub(super) token: u64,
    pub(super) owner: Option<String>,
}

impl FileIndex {
    /// Raises the mark to `token` (bound to `owner`) when higher; an equal
    /// token leaves the mark with the writer that reached it first.
    pub(super) fn raise_mark(&mut self, token: u64, owner: Option<&str>) {
        if self.high_water.as_ref().is_none_or(|m| token > m.token) {
            self.high_water = Some(Mark {
                token,
                owner: owner.map(str::to_owned),
            });
        }
    }
}

/// Where one event's line lies in the session file (`len` counts its line
/// end).
#[derive(Debug, Clone, Copy)]
pub(super) struct EventSpan {
    pub(super) seq: u64,
    pub(super) off: u64,
    pub(super) len: u64,
}

/// The end of a page starting at `start`: at most `limit` events and
/// `budget` bytes of lines, but at least one event.
pub(super) fn page_end(events: &[EventSpan], start: usize, limit: usize, budget: u64) -> usize {
    let last = events.len().min(start.saturating_add(limit));
    let mut end = start;
    let mut bytes = 0u64;
    while end < last {
        bytes = bytes.saturating_add(events[end].len);
        if end > start && bytes > budget {
            break;
        }
        end += 1;
    }
    end
}

/// Brings `index` up to date with the file of length `size`: reads only
/// what was appended since, unless the file shrank (a torn line removed
/// by another process) or the index is new, when it reads it all.
pub(super) fn refresh(
    file: &File,
    path: &Path,
    size: u64,
    index: &mut FileIndex,
    expect: Option<&SessionId>,
) -> Result<(), StoreError> {
    if !index.valid || size < index.pos {
        let last_sync = index.last_sync;
        *index = FileIndex {
            last_sync,
            ..FileIndex::default()
        };
        index.valid = true;
    }
    if size == index.pos {
        index.torn = 0;
    } else {
        let mut buf = vec![0u8; (size - index.pos) as usize];
        file.read_exact_at(&mut buf, index.pos)
            .map_err(|e| StoreError::io("reading session file", path, e))?;
        let mut at = 0usize;
        while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
            let line = &buf[at..at + nl];
            let off = index.pos;
            let no = index.lines + 1;
            if let Err(e) = apply_line(line, off, no, index, path) {
                index.valid = false;
                return Err(e);
            }
            index.lines = no;
            index.pos += nl as u64 + 1;
            at += nl + 1;
        }
        index.torn = (buf.len() - at) as u64;
    }
    if let (Some(expect), Some(id)) = (expect, &index.id) {
        if id != expect.as_str() {
            return Err(StoreError::corrupt(
                path,
                Some(1),
                format!(
                    "the file belongs to session {id:?}, not {:?}",
                    expect.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// Applies complete line number `no`, found at offset `off`, to `index`.
fn apply_line(
    line: &[u8],
    off: u64,
    no: u64,
    index: &mut FileIndex,
    path: &Path,
) -> Result<(), StoreError> {
    let rec: Record = serde_json::from_slice(line).map_err(|e| StoreError::Corrupt {
        path: path.to_owned(),
        line: Some(no),
        message: "not a store record".to_owned(),
        source: Some(e),
    })?;
    let bad = |m: &str| Err(StoreError::corrupt(path, Some(no), m.to_owned()));
    if no == 1 && rec.t != "h" {
        return bad("the first line is not a header");
    }
    match rec.t.as_str() {
        "h" => {
            if rec.v != Some(FORMAT_VERSION) {
                return bad("unsupported format version");
            }
            let Some(id) = rec.id else {
                return bad("header without a session id");
            };
            if index.id.as_ref().is_some_and(|known| *known != id) {
                return bad("a second header names another session");
            }
            index.id = Some(id);
            index.live = true;
            index.events.clear();
        }
        "e" => {
            if !index.live {
                return bad("an event of a deleted session");
            }
            if rec.seq != Some(index.next_seq) {
                return bad("event sequence numbers are not consecutive");
            }
            index.events.push(EventSpan {
                seq: index.next_seq,
                off,
                len: line.len() as u64 + 1,
            });
            index.next_seq += 1;
            if let Some(t) = rec.token {
                index.raise_mark(t, rec.owner.as_deref());
            }
        }
        "d" => {
            if !index.live {
                return bad("a deletion of a deleted session");
            }
            index.live = false;
            index.events.clear();
            if let Some(t) = rec.token {
                index.raise_mark(t, rec.owner.as_deref());
            }
        }
        _ => return bad("unknown record type"),
    }
    Ok(())
}
