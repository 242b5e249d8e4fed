//! What this client saw, kept to notice a database that went back: a
//! restore from a backup, or a failover to an asynchronous standby that had
//! not received the last commits. Either can bring back a mark below a
//! token this client saw accepted, and a stale owner could then write.
//!
//! Two floors, as in pglease: the highest write-ahead log position any
//! statement ran at (a later statement running below it ran on a database
//! that lost commits this client saw), and per session the highest
//! sequence number and mark this client saw (a session row showing less,
//! or gone, lost its history). Write statements are handed the floors and
//! refuse inside the statement, before writing; reads are checked on the
//! answer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lease_port::SessionId;

/// Sessions remembered per client; past it, the half seen longest ago is
/// forgotten (its sessions then rely on the log position alone).
const MAX_SESSIONS: usize = 100_000;

/// What this client saw of one session's row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SessionFloor {
    /// The highest last sequence number seen; 0 when none.
    pub(crate) seq: u64,
    /// The highest mark seen; `None` when none.
    pub(crate) mark: Option<u64>,
}

impl SessionFloor {
    /// Whether anything of the session was seen.
    pub(crate) fn any(&self) -> bool {
        self.seq > 0 || self.mark.is_some()
    }

    /// Whether `row` (a session row's sequence number and mark; `None`
    /// when the row is gone) shows less than this floor.
    pub(crate) fn above(&self, row: Option<SessionFloor>) -> bool {
        match row {
            None => self.any(),
            Some(row) => row.seq < self.seq || row.mark < self.mark,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Floors {
    lsn: AtomicU64,
    sessions: Mutex<HashMap<SessionId, (u64, SessionFloor)>>,
    /// Bumped at every sighting: how recently each session was seen.
    clock: AtomicU64,
}

/// What this client had seen when it sent a statement. An answer is held
/// only against what was known before it was asked: statements on several
/// connections finish in any order, and one sent earlier may rightly run
/// at a lower log position, or read a row older, than one answered before
/// it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    pub(crate) lsn: u64,
    pub(crate) session: SessionFloor,
}

impl Sent {
    /// The log position as PostgreSQL spells a `pg_lsn`.
    pub(crate) fn lsn_text(&self) -> String {
        format!("{:X}/{:X}", self.lsn >> 32, self.lsn & 0xffff_ffff)
    }
}

/// `X/Y` (hexadecimal halves) as one number.
pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    if hi > u64::from(u32::MAX) || lo > u64::from(u32::MAX) {
        return None;
    }
    Some(hi << 32 | lo)
}

impl Floors {
    /// What is known now, before sending a statement about `session`.
    pub(crate) fn sent(&self, session: Option<&SessionId>) -> Sent {
        let floor = session
            .and_then(|s| {
                let all = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                all.get(s).map(|&(_, f)| f)
            })
            .unwrap_or_default();
        Sent {
            lsn: self.lsn.load(Ordering::Acquire),
            session: floor,
        }
    }

    /// Whether a statement sent with `sent` ran below the log position
    /// seen before it was sent (`lsn`, as PostgreSQL answered it); raises
    /// the floor otherwise. `None` for an unreadable position.
    pub(crate) fn lsn_went_back(&self, lsn: &str, sent: &Sent) -> Option<bool> {
        let lsn = parse_lsn(lsn)?;
        if lsn < sent.lsn {
            return Some(true);
        }
        self.lsn.fetch_max(lsn, Ordering::AcqRel);
        Some(false)
    }

    /// Remembers that `session`'s row showed `seen`.
    pub(crate) fn saw(&self, session: &SessionId, seen: SessionFloor) {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut all = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_SESSIONS && !all.contains_key(session) {
            let mut ages: Vec<u64> = all.values().map(|&(at, _)| at).collect();
            let (_, cut, _) = ages.select_nth_unstable(all.len() / 2);
            let cut = *cut;
            all.retain(|_, (at, _)| *at >= cut);
        }
        let entry = all.entry(session.clone()).or_insert((now, seen));
        entry.0 = now;
        entry.1.seq = entry.1.seq.max(seen.seq);
        entry.1.mark = entry.1.mark.max(seen.mark);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_positions_read_as_numbers_and_print_back() {
        assert_eq!(parse_lsn("0/16B3748"), Some(0x16B3748));
        assert_eq!(parse_lsn("1/0"), Some(1 << 32));
        for bad in ["", "16B3748", "x/1", "1/2/3", "100000000/0"] {
            assert_eq!(parse_lsn(bad), None, "{bad}");
        }
        let f = Floors::default();
        assert_eq!(f.lsn_went_back("1/10", &f.sent(None)), Some(false));
        let early = f.sent(None);
        assert_eq!(early.lsn_text(), "1/10");
        assert_eq!(parse_lsn(&early.lsn_text()), Some(early.lsn));
        assert_eq!(f.lsn_went_back("1/11", &f.sent(None)), Some(false));
        // Sent before 1/11 was seen: it may have run lower.
        assert_eq!(f.lsn_went_back("1/10", &early), Some(false));
        assert_eq!(f.lsn_went_back("1/F", &f.sent(None)), Some(true));
    }

    #[test]
    fn a_row_below_what_was_seen_or_gone_is_below_the_floor() {
        let f = Floors::default();
        let s = SessionId::new("s").unwrap();
        let before = f.sent(Some(&s));
        assert!(
            !before.session.above(None),
            "nothing seen: a missing row is no loss"
        );
        f.saw(
            &s,
            SessionFloor {
                seq: 5,
                mark: Some(3),
            },
        );
        f.saw(&s, SessionFloor { seq: 2, mark: None }); // floors never go down
        let now = f.sent(Some(&s)).session;
        assert_eq!(
            now,
            SessionFloor {
                seq: 5,
                mark: Some(3)
            }
        );
        assert!(!now.above(Some(SessionFloor {
            seq: 5,
            mark: Some(3)
        })));
        assert!(!now.above(Some(SessionFloor {
            seq: 9,
            mark: Some(4)
        })));
        assert!(now.above(Some(SessionFloor {
            seq: 4,
            mark: Some(3)
        })));
        assert!(now.above(Some(SessionFloor { seq: 5, mark: None })));
        assert!(now.above(None));
        let zero = SessionFloor {
            seq: 0,
            mark: Some(0),
        };
        assert!(zero.any() && zero.above(Some(SessionFloor::default())));
    }

    #[test]
    fn a_full_map_forgets_the_sessions_seen_longest_ago() {
        let f = Floors::default();
        let id = |i: usize| SessionId::new(format!("s{i}")).unwrap();
        let one = SessionFloor { seq: 1, mark: None };
        for i in 0..MAX_SESSIONS {
            f.saw(&id(i), one);
        }
        for i in 0..MAX_SESSIONS / 2 {
            f.saw(&id(i), one);
        }
        f.saw(&id(MAX_SESSIONS), one);
        let all = f.sessions.lock().unwrap();
        assert!(all.contains_key(&id(0)), "a recent sighting was forgotten");
        assert!(
            !all.contains_key(&id(MAX_SESSIONS - 1)),
            "an old one was kept"
        );
    }
}
