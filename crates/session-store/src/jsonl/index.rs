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
    /// When the session was deleted (`ts` of its deletion record, ms since
    /// the Unix epoch), while it is.
    pub(super) deleted_at: Option<u64>,
    /// Bytes after `pos` that are not committed records: a torn write.
    pub(super) torn: u64,
    /// Writes to the file are framed (end in a commit line): since a
    /// version-2 header or a framing line.
    pub(super) framed: bool,
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
            deleted_at: None,
            torn: 0,
            framed: false,
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
        if let Err(e) = scan(&buf, index, path) {
            index.valid = false;
            return Err(e);
        }
    }
    if let (Some(expect), Some(id)) = (expect, &index.id)
        && id != expect.as_str()
    {
        return Err(StoreError::corrupt(
            path,
            Some(1),
            format!(
                "the file belongs to session {id:?}, not {:?}",
                expect.as_str()
            ),
        ));
    }
    Ok(())
}

/// A record line read but not yet committed: where it starts in the
/// buffer, its length with its line end, what it says.
struct Pending {
    at: usize,
    len: usize,
    rec: Record,
}

/// Applies to `index` every committed record in `buf` (the file from
/// `index.pos` on) and sets `index.torn` to the bytes after the last one.
///
/// Unframed lines (files written before commits existed) commit one by
/// one. A frame — from a framing line or a version-2 header on — commits
/// as a whole at its commit line, when the line count, length and CRC-32
/// of the lines before it match. Where the file stops making sense (a line
/// that is not a record, a commit that does not match), what follows is a
/// torn tail left by a crash — unless a later commit line matches the
/// lines before it, or (unframed) a later line is a record: then stored
/// data lies beyond the damage and the file is `Corrupt`.
fn scan(buf: &[u8], index: &mut FileIndex, path: &Path) -> Result<(), StoreError> {
    let base = index.pos;
    let mut committed = 0usize;
    let mut at = 0usize;
    let mut pending: Vec<Pending> = Vec::new();
    // (start of the damaged region, its line number, what is wrong,
    // whether it lies outside any frame)
    let mut damage: Option<(usize, u64, String, bool)> = None;
    while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
        let next = at + nl + 1;
        let no = index.lines + pending.len() as u64 + 1;
        let frame_start = pending.first().map_or(at, |p| p.at);
        let rec: Record = match serde_json::from_slice(&buf[at..at + nl]) {
            Ok(rec) => rec,
            Err(e) => {
                let unframed = !index.framed && pending.is_empty();
                damage = Some((
                    frame_start,
                    no,
                    format!("not a store record ({e})"),
                    unframed,
                ));
                break;
            }
        };
        let framed = index.framed || !pending.is_empty();
        if !framed && !rec.starts_frame() {
            apply_line(&rec, base + at as u64, nl as u64 + 1, no, index, path)?;
            index.lines = no;
            index.pos = base + next as u64;
            committed = next;
        } else if rec.t == "c" {
            let first = index.lines + 1;
            if !commits(&rec, &buf[frame_start..at], pending.len()) {
                let what = "a write that does not match its commit line".to_owned();
                damage = Some((frame_start, first, what, false));
                break;
            }
            for (i, p) in pending.drain(..).enumerate() {
                let off = base + p.at as u64;
                apply_line(&p.rec, off, p.len as u64, first + i as u64, index, path)?;
            }
            index.lines = no;
            index.pos = base + next as u64;
            index.framed = true;
            committed = next;
        } else {
            pending.push(Pending {
                at,
                len: nl + 1,
                rec,
            });
        }
        at = next;
    }
    if let Some((from, no, what, unframed)) = damage
        && stored_beyond(buf, from, unframed)
    {
        return Err(StoreError::corrupt(
            path,
            Some(no),
            format!("{what}, with stored records after it"),
        ));
    }
    index.torn = (buf.len() - committed) as u64;
    Ok(())
}

/// Whether the commit line `rec` commits `lines`, the `count` lines
/// before it.
pub(super) fn commits(rec: &Record, lines: &[u8], count: usize) -> bool {
    count > 0
        && rec.n == Some(count as u64)
        && rec.len == Some(lines.len() as u64)
        && rec.crc == Some(u64::from(crc32fast::hash(lines)))
}

/// Whether stored data lies in `buf` after `from`: a commit line matching
/// the lines before it (all after `from`), or — when `unframed` — any
/// record line after the one at `from`.
pub(super) fn stored_beyond(buf: &[u8], from: usize, unframed: bool) -> bool {
    let mut at = from;
    let mut first = true;
    while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
        let next = at + nl + 1;
        if let Ok(rec) = serde_json::from_slice::<Record>(&buf[at..at + nl]) {
            if rec.t == "c" {
                let committed = rec
                    .len
                    .and_then(|len| usize::try_from(len).ok())
                    .and_then(|len| at.checked_sub(len))
                    .filter(|&start| start >= from)
                    .is_some_and(|start| {
                        let lines = &buf[start..at];
                        let count = lines.iter().filter(|&&b| b == b'\n').count();
                        commits(&rec, lines, count)
                    });
                if committed {
                    return true;
                }
            } else if unframed && !first && rec.is_known() {
                return true;
            }
        }
        first = false;
        at = next;
    }
    false
}

/// Applies record line number `no`, found at offset `off` and `len` bytes
/// long with its line end, to `index`.
fn apply_line(
    rec: &Record,
    off: u64,
    len: u64,
    no: u64,
    index: &mut FileIndex,
    path: &Path,
) -> Result<(), StoreError> {
    let bad = |m: &str| Err(StoreError::corrupt(path, Some(no), m.to_owned()));
    if no == 1 && rec.t != "h" {
        return bad("the first line is not a header");
    }
    match rec.t.as_str() {
        "h" => {
            if !rec.v.is_some_and(|v| (1..=FORMAT_VERSION).contains(&v)) {
                return bad("unsupported format version");
            }
            let Some(id) = rec.id.clone() else {
                return bad("header without a session id");
            };
            if index.id.as_ref().is_some_and(|known| *known != id) {
                return bad("a second header names another session");
            }
            index.id = Some(id);
            index.live = true;
            index.deleted_at = None;
            index.events.clear();
            // Carried over from the graveyard when the file was made
            // again after its predecessor was reclaimed.
            if let Some(t) = rec.token {
                index.raise_mark(t, rec.owner.as_deref());
            }
            if let Some(next) = rec.seq {
                index.next_seq = index.next_seq.max(next);
            }
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
                len,
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
            index.deleted_at = Some(rec.ts.unwrap_or(0));
            index.events.clear();
            if let Some(t) = rec.token {
                index.raise_mark(t, rec.owner.as_deref());
            }
        }
        // The framing line: what follows is committed by commit lines.
        "f" => {}
        _ => return bad("unknown record type"),
    }
    Ok(())
}
