//! What this client saw, kept to notice a database that went back: a
//! restore from a backup, or a failover to an asynchronous standby that had
//! not received the last commits. Either can hand out again a token
//! already used, which no fence downstream could then tell apart.
//!
//! Two floors: the highest write-ahead log position any statement ran at
//! (a later statement running below it ran on a database that lost WAL
//! this client depended on), and per session the highest token this client
//! was granted (a row showing less, or gone, lost its history).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lease_port::{FencingToken, LeaseError, SessionId};

/// Sessions remembered per client; past it, the oldest-inserted half is
/// forgotten (its sessions then rely on the log position alone).
const MAX_SESSIONS: usize = 100_000;

#[derive(Debug, Default)]
pub(crate) struct Floors {
    lsn: AtomicU64,
    granted: Mutex<HashMap<SessionId, (u64, FencingToken)>>,
    /// Bumped at every grant: how recently each session was granted.
    clock: AtomicU64,
}

/// What this client had seen when it sent a statement. An answer is held
/// only against what was known before it was asked: statements on several
/// connections finish in any order, and one sent earlier may rightly run
/// at a lower log position, or read a row older, than one answered before
/// it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    lsn: u64,
    token: Option<FencingToken>,
}

/// `X/Y` (hexadecimal halves) as one number.
fn parse_lsn(text: &str) -> Result<u64, LeaseError> {
    let bad = || LeaseError::invalid(format!("PostgreSQL answered a log position {text:?}"));
    let (hi, lo) = text.split_once('/').ok_or_else(bad)?;
    let hi = u64::from_str_radix(hi, 16).map_err(|_| bad())?;
    let lo = u64::from_str_radix(lo, 16).map_err(|_| bad())?;
    if hi > u64::from(u32::MAX) || lo > u64::from(u32::MAX) {
        return Err(bad());
    }
    Ok(hi << 32 | lo)
}

impl Mark {
    /// The log position seen, as PostgreSQL spells a `pg_lsn`: a write
    /// sent with it changes nothing on a database behind it.
    pub(crate) fn lsn_text(&self) -> String {
        format!("{:X}/{:X}", self.lsn >> 32, self.lsn & u64::from(u32::MAX))
    }
}

impl Floors {
    /// What is known now, before sending a statement about `session`.
    pub(crate) fn mark(&self, session: Option<&SessionId>) -> Mark {
        let token = session.and_then(|s| {
            let granted = self.granted.lock().unwrap_or_else(|p| p.into_inner());
            granted.get(s).map(|&(_, t)| t)
        });
        Mark {
            lsn: self.lsn.load(Ordering::Acquire),
            token,
        }
    }

    /// Refuses a statement that ran below the log position seen before it
    /// was sent; raises the floor otherwise.
    pub(crate) fn note_lsn(&self, text: &str, mark: &Mark) -> Result<(), LeaseError> {
        let lsn = parse_lsn(text)?;
        if lsn < mark.lsn {
            return Err(LeaseError::rewound(format!(
                "PostgreSQL's write-ahead log is at {text}, behind a position this client already \
                 saw: the database was restored or failed over to a standby that had not received \
                 every commit. Tokens it grants may repeat; stop every client, then move the token \
                 rows above what the stores saw before serving again"
            )));
        }
        self.lsn.fetch_max(lsn, Ordering::AcqRel);
        Ok(())
    }

    /// Remembers that this client was granted `token` for `session`.
    pub(crate) fn note_grant(&self, session: &SessionId, token: FencingToken) {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut granted = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        if granted.len() >= MAX_SESSIONS && !granted.contains_key(session) {
            // Forget the half granted longest ago, by the entries present.
            let mut ages: Vec<u64> = granted.values().map(|&(at, _)| at).collect();
            let (_, cut, _) = ages.select_nth_unstable(granted.len() / 2);
            let cut = *cut;
            granted.retain(|_, (at, _)| *at >= cut);
        }
        let entry = granted.entry(session.clone()).or_insert((now, token));
        *entry = (now, entry.1.max(token));
    }

    /// Refuses a row (by its token, `None` when it is gone) that shows
    /// less than this client had been granted for its session when the
    /// statement was sent.
    pub(crate) fn check_row(
        &self,
        session: &SessionId,
        row_token: Option<i64>,
        mark: &Mark,
    ) -> Result<(), LeaseError> {
        let Some(ours) = mark.token else {
            return Ok(());
        };
        let shown = row_token.and_then(|t| u64::try_from(t).ok());
        if shown.is_none_or(|t| t < ours.get()) {
            return Err(LeaseError::rewound(format!(
                "PostgreSQL's lease row for session {session} shows {}, below token {ours} this \
                 client was granted: the table went back (a restore, a lagging standby promoted, \
                 rows deleted by hand). Stop every client, then move the row's token above what \
                 the stores saw before serving again",
                shown.map_or_else(|| "no row".to_owned(), |t| format!("token {t}"))
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seen_position_is_spelt_as_postgresql_reads_it() {
        let f = Floors::default();
        f.note_lsn("A/16B3748", &f.mark(None)).unwrap();
        assert_eq!(f.mark(None).lsn_text(), "A/16B3748");
        assert_eq!(parse_lsn(&f.mark(None).lsn_text()).unwrap(), 0xA_016B_3748);
        assert_eq!(Floors::default().mark(None).lsn_text(), "0/0");
    }

    #[test]
    fn log_positions_read_as_numbers_and_going_back_is_refused() {
        let f = Floors::default();
        assert_eq!(parse_lsn("0/16B3748").unwrap(), 0x16B3748);
        assert_eq!(parse_lsn("1/0").unwrap(), 1 << 32);
        for bad in ["", "16B3748", "x/1", "1/2/3", "100000000/0"] {
            assert!(parse_lsn(bad).is_err(), "{bad}");
        }
        f.note_lsn("1/10", &f.mark(None)).unwrap();
        f.note_lsn("1/10", &f.mark(None)).unwrap();
        // Sent before 1/11 was seen: it may have run lower.
        let early = f.mark(None);
        f.note_lsn("1/11", &f.mark(None)).unwrap();
        f.note_lsn("1/10", &early).unwrap();
        let e = f.note_lsn("1/F", &f.mark(None)).unwrap_err();
        assert_eq!(e.kind(), lease_port::LeaseErrorKind::Rewound);
        f.note_lsn("2/0", &f.mark(None)).unwrap();
    }

    #[test]
    fn a_row_below_a_granted_token_or_gone_is_refused() {
        let f = Floors::default();
        let s = SessionId::new("s").unwrap();
        let before = f.mark(Some(&s));
        f.check_row(&s, None, &before).unwrap(); // never granted here: nothing known
        f.note_grant(&s, FencingToken::new(5));
        f.note_grant(&s, FencingToken::new(3)); // floors never go down
        let m = f.mark(Some(&s));
        f.check_row(&s, Some(5), &m).unwrap();
        f.check_row(&s, Some(9), &m).unwrap();
        assert!(f.check_row(&s, Some(4), &m).is_err());
        assert!(f.check_row(&s, None, &m).is_err());
        // A statement sent before the grant is not held to it.
        f.check_row(&s, Some(1), &before).unwrap();
    }

    #[test]
    fn a_full_map_forgets_the_sessions_granted_longest_ago() {
        let f = Floors::default();
        let id = |i: usize| SessionId::new(format!("s{i}")).unwrap();
        for i in 0..MAX_SESSIONS {
            f.note_grant(&id(i), FencingToken::new(1));
        }
        // The first half is granted again: now the most recent.
        for i in 0..MAX_SESSIONS / 2 {
            f.note_grant(&id(i), FencingToken::new(2));
        }
        f.note_grant(&id(MAX_SESSIONS), FencingToken::new(1));
        let granted = f.granted.lock().unwrap();
        assert!(granted.len() >= MAX_SESSIONS / 2, "{}", granted.len());
        assert!(granted.contains_key(&id(0)), "a recent grant was forgotten");
        assert!(
            !granted.contains_key(&id(MAX_SESSIONS - 1)),
            "an old grant was kept"
        );
    }
}
