//! The decision taken under a lease file's lock: from the record as read,
//! the operation and the time, what to write, whether to sync it, and what
//! to answer.
//!
//! [`decide`] is pure — no file I/O, no clock, no shared state: the driver
//! in [`super`] reads the record and the clock, hands them over with what
//! this instance knows of the file (the ceiling it is armed with), and
//! applies the returned [`Plan`].

use std::time::{Duration, SystemTime};

use lease_port::{FencingToken, Lease, LeaseError, OwnerId, SessionId};

use super::clock_domain::{from_nanos, to_nanos};
use crate::LeaseFileError;
use crate::record::Record;

pub(crate) enum Op {
    /// Acquire with a token above the floor (0 for a plain acquire: every
    /// token is at least 1).
    Acquire(SessionId, OwnerId, u64),
    Renew(Lease),
    Release(Lease),
    /// Reads the live holder; writes nothing.
    Current(SessionId),
}

pub(crate) enum Reply {
    Granted(Lease),
    Released,
    Current(Option<Lease>),
}

impl Op {
    pub(crate) fn session(&self) -> &SessionId {
        match self {
            Op::Acquire(s, _, _) | Op::Current(s) => s,
            Op::Renew(l) | Op::Release(l) => l.session_id(),
        }
    }

    pub(crate) fn creates_file(&self) -> bool {
        matches!(self, Op::Acquire(..))
    }

    /// Only a read: it opens the file read-only and shares the lock with
    /// other readers, so reporting a holder never holds up another reader,
    /// and a writer only for the few microseconds of one `pread`.
    pub(crate) fn reads_only(&self) -> bool {
        matches!(self, Op::Current(..))
    }

    /// The answer when the session's file does not exist: nothing was ever
    /// issued for it.
    pub(crate) fn reply_without_file(&self) -> Result<Reply, LeaseError> {
        match self {
            Op::Release(_) => Ok(Reply::Released),
            Op::Current(_) => Ok(Reply::Current(None)),
            _ => Err(LeaseError::held(None)),
        }
    }
}

/// What to do under the lock, decided from the record read.
pub(crate) struct Plan {
    pub(crate) write: Option<Record>,
    /// fdatasync the file (and the directory, unless this instance knows the
    /// file's name durable) before replying.
    pub(crate) sync: bool,
    /// A new reservation ceiling: once synced, this instance is armed with
    /// it for the file.
    pub(crate) arm: Option<u64>,
    pub(crate) reply: Result<Reply, LeaseError>,
}

impl Plan {
    pub(crate) fn needs_sync(&self) -> bool {
        self.sync
    }

    /// Writes nothing and answers `reply`.
    fn nothing(reply: Result<Reply, LeaseError>) -> Plan {
        Plan {
            write: None,
            sync: false,
            arm: None,
            reply,
        }
    }
}

/// The terms the deciding instance grants on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// How long a grant lasts.
    pub(crate) ttl: Duration,
    /// How many tokens one synced reservation covers (≥ 1).
    pub(crate) reservation: u64,
    /// The instance's clock domain (boot id mixed with the time namespace);
    /// zero when unknown, and then expiry is judged on the wall clock.
    pub(crate) clock_domain: [u8; 16],
}

/// The clock's two readings at the moment of the decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    /// The wall clock.
    pub(crate) wall: SystemTime,
    /// The monotonic clock, as nanoseconds of `CLOCK_MONOTONIC` in the
    /// instance's clock domain.
    pub(crate) mono: u64,
}

/// Decides `op` on the session's record as read (`Ok(None)`: a file created
/// but never written), at `now`, for an instance granting on `terms` and
/// armed with ceiling `armed` for this file.
///
/// `Err` for a record that could not be read (never taken for free), a
/// clock outside the record's range, or a TTL or token overflowing it;
/// otherwise the plan, whose reply may itself be an error (`Held`) that
/// writes nothing.
pub(crate) fn decide(
    terms: &Terms,
    read: Result<Option<Record>, LeaseFileError>,
    armed: Option<u64>,
    op: &Op,
    now: Now,
) -> Result<Plan, LeaseError> {
    let record = read?;
    let judge = Judge::new(terms, now)?;
    match op {
        Op::Acquire(session, owner, floor) => judge.acquire(record, armed, session, owner, *floor),
        Op::Renew(lease) => judge.renew(record, lease),
        Op::Current(session) => Ok(judge.current(record, session)),
        Op::Release(lease) => Ok(release(record, lease)),
    }
}

/// The terms and the time of one decision.
struct Judge<'a> {
    terms: &'a Terms,
    wall: SystemTime,
    /// `wall` in nanoseconds since the Unix epoch.
    now: u64,
    mono: u64,
}

impl<'a> Judge<'a> {
    fn new(terms: &'a Terms, now: Now) -> Result<Self, LeaseError> {
        Ok(Judge {
            terms,
            wall: now.wall,
            now: to_nanos(now.wall)?,
            mono: now.mono,
        })
    }

    /// The wall-clock expiry of a grant made now.
    fn expiry(&self) -> Result<u64, LeaseError> {
        self.wall
            .checked_add(self.terms.ttl)
            .ok_or_else(|| LeaseError::invalid("TTL overflows the clock"))
            .and_then(to_nanos)
    }

    /// The monotonic expiry of a grant made now.
    fn mono_expiry(&self) -> u64 {
        self.mono
            .saturating_add(u64::try_from(self.terms.ttl.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Whether `r`'s expiry is judged on this boot's monotonic clock (it was
    /// written in this boot and time namespace) rather than the wall clock.
    fn judged_on_monotonic(&self, r: &Record) -> bool {
        let domain = self.terms.clock_domain;
        domain != [0; 16] && r.boot_id == domain && r.mono_expiry_nanos != 0
    }

    /// How long `r`'s hold has left: on this boot's monotonic clock when the
    /// record was written in this boot, so wall-clock steps move nothing; on
    /// the wall clock only across a reboot (or for records of older
    /// versions).
    fn left(&self, r: &Record) -> Duration {
        let nanos = if self.judged_on_monotonic(r) {
            r.mono_expiry_nanos.saturating_sub(self.mono)
        } else {
            r.expiry_nanos.saturating_sub(self.now)
        };
        Duration::from_nanos(nanos)
    }

    fn live(&self, r: &Record) -> bool {
        !self.left(r).is_zero()
    }

    fn acquire(
        &self,
        record: Option<Record>,
        armed: Option<u64>,
        session: &SessionId,
        owner: &OwnerId,
        floor: u64,
    ) -> Result<Plan, LeaseError> {
        // Armed: this instance reserved the current ceiling itself, after any
        // host crash that could have rolled the file back, and saw it synced;
        // so the record's token is the latest issued and every token up to
        // the ceiling is ours to hand out without a sync.
        let armed = |r: &Record| armed == Some(r.reserved);
        let (token, reserved, sync, arm) = match &record {
            Some(
                r @ Record {
                    owner: Some(holder),
                    ..
                },
            ) if self.live(r) => {
                if holder != owner {
                    return Ok(Plan::nothing(Err(
                        LeaseError::held(Some(holder.clone())).with_held_for(self.left(r))
                    )));
                }
                if r.token > floor {
                    // The live holder re-acquiring keeps its epoch. Sync
                    // unless the ceiling is known durable: the token may come
                    // from a reservation whose fdatasync failed.
                    (r.token, r.reserved, !armed(r), None)
                } else {
                    // Its token is at or below a store's mark: a new, greater
                    // one, reserved past the floor.
                    reserve_above(self.terms, record.as_ref(), floor)?
                }
            }
            Some(r) if r.holder_lost && self.live(r) => {
                return Ok(Plan::nothing(Err(LeaseError::held(None))));
            }
            Some(r) if r.token < r.reserved && r.token >= floor && armed(r) && !r.holder_lost => {
                (r.token + 1, r.reserved, false, None)
            }
            // Not armed, the reservation used up, or a floor above it: jump
            // past every token a lost write could have issued and past the
            // floor, and make the new ceiling durable before answering.
            _ => reserve_above(self.terms, record.as_ref(), floor)?,
        };
        let expiry_nanos = self.expiry()?;
        Ok(Plan {
            write: Some(Record {
                session: session.clone(),
                owner: Some(owner.clone()),
                holder_lost: false,
                token,
                reserved,
                expiry_nanos,
                mono_expiry_nanos: self.mono_expiry(),
                boot_id: self.terms.clock_domain,
            }),
            sync,
            arm,
            reply: Ok(Reply::Granted(Lease::new(
                session.clone(),
                owner.clone(),
                FencingToken::new(token),
                from_nanos(expiry_nanos),
            ))),
        })
    }

    fn renew(&self, record: Option<Record>, lease: &Lease) -> Result<Plan, LeaseError> {
        Ok(match record {
            // Ours, live or expired: nobody wrote since (the lock proves it),
            // so extending is safe.
            Some(r)
                if r.owner.as_ref() == Some(lease.owner()) && r.token == lease.token().get() =>
            {
                let expiry_nanos = self.expiry()?;
                Plan {
                    write: Some(Record {
                        expiry_nanos,
                        mono_expiry_nanos: self.mono_expiry(),
                        boot_id: self.terms.clock_domain,
                        ..r
                    }),
                    sync: false,
                    arm: None,
                    reply: Ok(Reply::Granted(lease.with_expiry(from_nanos(expiry_nanos)))),
                }
            }
            Some(r) if self.live(&r) => Plan::nothing(Err(LeaseError::held(r.owner))),
            _ => Plan::nothing(Err(LeaseError::held(None))),
        })
    }

    /// Judged exactly as acquire judges it: reported live here means another
    /// owner's acquire would be refused now. The expiry is counted on the
    /// clock that judged it, from now, so a wall-clock step since the write
    /// does not show in it.
    fn current(&self, record: Option<Record>, session: &SessionId) -> Plan {
        match record {
            Some(r) if self.live(&r) => match &r.owner {
                Some(holder) => Plan::nothing(Ok(Reply::Current(Some(Lease::new(
                    session.clone(),
                    holder.clone(),
                    FencingToken::new(r.token),
                    self.wall + self.left(&r),
                ))))),
                // Held, but a torn write lost the holder's name: a lease
                // cannot be reported without one.
                None => Plan::nothing(Err(LeaseError::held(None))),
            },
            _ => Plan::nothing(Ok(Reply::Current(None))),
        }
    }
}

fn release(record: Option<Record>, lease: &Lease) -> Plan {
    match record {
        Some(r) if r.owner.as_ref() == Some(lease.owner()) && r.token == lease.token().get() => {
            Plan {
                // The token and the ceiling stay: the next grant must exceed
                // the token.
                write: Some(Record {
                    owner: None,
                    expiry_nanos: 0,
                    mono_expiry_nanos: 0,
                    ..r
                }),
                sync: false,
                arm: None,
                reply: Ok(Reply::Released),
            }
        }
        _ => Plan::nothing(Ok(Reply::Released)),
    }
}

/// A new reservation: the token `max(token, ceiling, floor) + 1` — past
/// every token a lost write could have issued and past `floor` — and a
/// ceiling `reservation - 1` above it, to be synced before answering
/// (token, ceiling, sync, arm).
fn reserve_above(
    terms: &Terms,
    record: Option<&Record>,
    floor: u64,
) -> Result<(u64, u64, bool, Option<u64>), LeaseError> {
    let token = record
        .map_or(0, |r| r.token.max(r.reserved))
        .max(floor)
        .checked_add(1)
        .ok_or_else(|| LeaseError::invalid("fencing tokens exhausted for this session"))?;
    let ceiling = token.saturating_add(terms.reservation - 1);
    Ok((token, ceiling, true, Some(ceiling)))
}

#[cfg(test)]
mod tests {
    //! The decision alone, without files: one table per operation, each row
    //! a record as read, the ceiling this instance is armed with, the
    //! operation, and the outcome.

    use std::path::PathBuf;

    use lease_port::LeaseErrorKind;

    use super::*;

    const SEC: i64 = 1_000_000_000;
    const TTL: Duration = Duration::from_secs(10);
    /// Tokens one reservation covers.
    const N: u64 = 100;
    const DOMAIN: [u8; 16] = *b"this boot and ns";
    const OTHER_DOMAIN: [u8; 16] = *b"an earlier boot.";
    const TERMS: Terms = Terms {
        ttl: TTL,
        reservation: N,
        clock_domain: DOMAIN,
    };
    /// The wall clock at the decision, in seconds since the Unix epoch.
    const WALL: i64 = 1_800_000_000;
    /// The monotonic clock at the decision, in seconds.
    const MONO: i64 = 5_000;

    fn now() -> Now {
        Now {
            wall: from_nanos((WALL * SEC) as u64),
            mono: (MONO * SEC) as u64,
        }
    }

    fn session() -> SessionId {
        SessionId::new("chat/7").unwrap()
    }

    fn id(name: &str) -> OwnerId {
        OwnerId::new(name).unwrap()
    }

    /// `holder`'s hold at `token` under `ceiling`, written in this clock
    /// domain with `left` seconds to go (negative: expired) on both clocks.
    fn held(holder: &str, token: u64, ceiling: u64, left: i64) -> Record {
        Record {
            session: session(),
            owner: Some(id(holder)),
            holder_lost: false,
            token,
            reserved: ceiling,
            expiry_nanos: ((WALL + left) * SEC) as u64,
            mono_expiry_nanos: ((MONO + left) * SEC) as u64,
            boot_id: DOMAIN,
        }
    }

    /// Released at `token`: the token and the ceiling kept.
    fn free(token: u64, ceiling: u64) -> Record {
        Record {
            owner: None,
            expiry_nanos: 0,
            mono_expiry_nanos: 0,
            ..held("gone", token, ceiling, 0)
        }
    }

    /// A hold whose owner sector a power cut tore: holder unknown.
    fn torn(token: u64, ceiling: u64, left: i64) -> Record {
        Record {
            owner: None,
            holder_lost: true,
            ..held("lost", token, ceiling, left)
        }
    }

    /// A record that does not decode (its header fails its checksum).
    fn unreadable() -> Result<Option<Record>, LeaseFileError> {
        Err(LeaseFileError::Checksum {
            path: PathBuf::from("/leases/chat_7.lease"),
            stored: 1,
            computed: 2,
        })
    }

    fn acquire(owner: &str, floor: u64) -> Op {
        Op::Acquire(session(), id(owner), floor)
    }

    fn lease(owner: &str, token: u64) -> Lease {
        Lease::new(
            session(),
            id(owner),
            FencingToken::new(token),
            from_nanos((WALL * SEC) as u64),
        )
    }

    /// What a plan amounts to, checked for what every plan of its kind must
    /// hold on the way.
    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        /// A grant (or renewal) of `token`, writing the grantee's hold with
        /// `ceiling`, fdatasynced when `sync`, arming `arm` once synced.
        Granted {
            token: u64,
            ceiling: u64,
            sync: bool,
            arm: Option<u64>,
        },
        /// `Held` naming the holder when known; nothing written.
        Held(Option<OwnerId>),
        /// Released; `Some((token, ceiling))` when the hold was rewritten
        /// as free keeping those, `None` when nothing was written.
        Released(Option<(u64, u64)>),
        /// A holder report: owner, token and time left; nothing written.
        Current(Option<(OwnerId, u64, Duration)>),
        /// No plan at all: the decision failed with this kind.
        Failed(LeaseErrorKind),
    }
    use Outcome::{Current, Failed, Granted, Held, Released};

    fn outcome(planned: Result<Plan, LeaseError>) -> Outcome {
        let plan = match planned {
            Ok(plan) => plan,
            Err(e) => return Failed(e.kind()),
        };
        let reply = match plan.reply {
            Err(e) => {
                assert!(plan.write.is_none() && !plan.sync && plan.arm.is_none());
                assert_eq!(e.kind(), LeaseErrorKind::Held, "{e:?}");
                return Held(e.holder().cloned());
            }
            Ok(reply) => reply,
        };
        match reply {
            Reply::Granted(lease) => {
                let w = plan.write.expect("a grant writes its hold");
                assert_eq!(w.session, session());
                assert_eq!(w.owner.as_ref(), Some(lease.owner()));
                assert!(!w.holder_lost);
                assert_eq!(w.token, lease.token().get());
                assert!(w.token <= w.reserved, "token above its ceiling: {w:?}");
                // Granted for the TTL from now, on both clocks, in this
                // clock domain.
                assert_eq!(lease.expiry(), now().wall + TTL);
                assert_eq!(from_nanos(w.expiry_nanos), now().wall + TTL);
                assert_eq!(w.mono_expiry_nanos, now().mono + TTL.as_nanos() as u64);
                assert_eq!(w.boot_id, DOMAIN);
                // Only a synced write arms, and only with the ceiling it
                // writes.
                assert!(plan.arm.is_none() || (plan.sync && plan.arm == Some(w.reserved)));
                Granted {
                    token: w.token,
                    ceiling: w.reserved,
                    sync: plan.sync,
                    arm: plan.arm,
                }
            }
            Reply::Released => {
                assert!(!plan.sync && plan.arm.is_none());
                Released(plan.write.map(|w| {
                    assert!(w.owner.is_none() && !w.holder_lost);
                    assert_eq!((w.expiry_nanos, w.mono_expiry_nanos), (0, 0));
                    (w.token, w.reserved)
                }))
            }
            Reply::Current(holder) => {
                assert!(plan.write.is_none() && !plan.sync && plan.arm.is_none());
                Current(holder.map(|l| {
                    let left = l.expiry().duration_since(now().wall).unwrap();
                    (l.owner().clone(), l.token().get(), left)
                }))
            }
        }
    }

    struct Case {
        name: &'static str,
        read: Result<Option<Record>, LeaseFileError>,
        armed: Option<u64>,
        op: Op,
        want: Outcome,
    }

    fn check(cases: Vec<Case>) {
        for case in cases {
            let got = outcome(decide(&TERMS, case.read, case.armed, &case.op, now()));
            assert_eq!(got, case.want, "{}", case.name);
        }
    }

    /// A grant that keeps or issues `token` under the ceiling `ceiling`.
    fn plain(token: u64, ceiling: u64, sync: bool) -> Outcome {
        Granted {
            token,
            ceiling,
            sync,
            arm: None,
        }
    }

    /// A grant of `token` from a new reservation: synced, arming its
    /// ceiling `token + N - 1`.
    fn reserved(token: u64) -> Outcome {
        let ceiling = token + N - 1;
        Granted {
            token,
            ceiling,
            sync: true,
            arm: Some(ceiling),
        }
    }

    #[test]
    fn acquire_decisions() {
        let case = |name, read, armed, op, want| Case {
            name,
            read,
            armed,
            op,
            want,
        };
        check(vec![
            case(
                "free, never written: the first token reserves",
                Ok(None),
                None,
                acquire("a", 0),
                reserved(1),
            ),
            case(
                "released, armed with its ceiling: the next token, no sync",
                Ok(Some(free(5, 100))),
                Some(100),
                acquire("b", 0),
                plain(6, 100, false),
            ),
            case(
                "released, not armed: reserve past the ceiling",
                Ok(Some(free(5, 100))),
                None,
                acquire("b", 0),
                reserved(101),
            ),
            case(
                "released, armed with another ceiling (another instance reserved since)",
                Ok(Some(free(5, 100))),
                Some(50),
                acquire("b", 0),
                reserved(101),
            ),
            case(
                "expired hold of another owner, armed: taken over, no sync",
                Ok(Some(held("a", 5, 100, -1))),
                Some(100),
                acquire("b", 0),
                plain(6, 100, false),
            ),
            case(
                "expired hold of another owner, not armed: reserve",
                Ok(Some(held("a", 5, 100, -1))),
                None,
                acquire("b", 0),
                reserved(101),
            ),
            case(
                "expiring this very instant: expired",
                Ok(Some(held("a", 5, 100, 0))),
                Some(100),
                acquire("b", 0),
                plain(6, 100, false),
            ),
            case(
                "live hold of the same owner, armed: keeps its token, no sync",
                Ok(Some(held("a", 5, 100, 5))),
                Some(100),
                acquire("a", 0),
                plain(5, 100, false),
            ),
            case(
                "live hold of the same owner, not armed: keeps its token, synced",
                Ok(Some(held("a", 5, 100, 5))),
                None,
                acquire("a", 0),
                plain(5, 100, true),
            ),
            case(
                "live hold of another owner: Held, naming it",
                Ok(Some(held("a", 5, 100, 5))),
                Some(100),
                acquire("b", 0),
                Held(Some(id("a"))),
            ),
        ]);
    }

    /// A used-up reservation, a record torn by a power cut, one that does
    /// not decode, a session out of tokens.
    #[test]
    fn acquire_decisions_on_used_up_and_damaged_records() {
        let case = |name, read, armed, op, want| Case {
            name,
            read,
            armed,
            op,
            want,
        };
        check(vec![
            case(
                "reservation used up, armed: a new reservation",
                Ok(Some(free(100, 100))),
                Some(100),
                acquire("b", 0),
                reserved(101),
            ),
            case(
                "torn record, live: held by a holder nobody can name",
                Ok(Some(torn(5, 100, 5))),
                Some(100),
                acquire("b", 0),
                Held(None),
            ),
            case(
                "torn record, expired: taken over past its ceiling, even armed",
                Ok(Some(torn(5, 100, -1))),
                Some(100),
                acquire("b", 0),
                reserved(101),
            ),
            case(
                "unreadable record: an error, never free",
                unreadable(),
                Some(100),
                acquire("a", 0),
                Failed(LeaseErrorKind::Transient),
            ),
            case(
                "every token used",
                Ok(Some(free(u64::MAX, u64::MAX))),
                Some(u64::MAX),
                acquire("a", 0),
                Failed(LeaseErrorKind::Invalid),
            ),
        ]);
    }

    /// `acquire_above`: the token is above the floor, and so is the record
    /// written (reserving past the floor when the next token would not be).
    #[test]
    fn acquire_above_decisions() {
        let case = |name, read, armed, op, want| Case {
            name,
            read,
            armed,
            op,
            want,
        };
        check(vec![
            case(
                "live hold of another owner, above a floor: Held all the same",
                Ok(Some(held("a", 5, 100, 5))),
                Some(100),
                acquire("b", 1_000),
                Held(Some(id("a"))),
            ),
            case(
                "floor below the token: costs nothing more than acquire",
                Ok(Some(free(5, 100))),
                Some(100),
                acquire("b", 3),
                plain(6, 100, false),
            ),
            case(
                "floor at the token: the next token is above it",
                Ok(Some(free(5, 100))),
                Some(100),
                acquire("b", 5),
                plain(6, 100, false),
            ),
            case(
                "floor above the token, within the ceiling: reserve past both",
                Ok(Some(free(5, 100))),
                Some(100),
                acquire("b", 50),
                reserved(101),
            ),
            case(
                "floor above the ceiling: reserve past the floor",
                Ok(Some(free(5, 100))),
                Some(100),
                acquire("b", 5_000),
                reserved(5_001),
            ),
            case(
                "floor on a file never written",
                Ok(None),
                None,
                acquire("a", 7),
                reserved(8),
            ),
            case(
                "live holder re-acquiring at its token's floor: a new, greater token",
                Ok(Some(held("a", 5, 100, 5))),
                Some(100),
                acquire("a", 5),
                reserved(101),
            ),
            case(
                "live holder re-acquiring above a lower floor: keeps its token",
                Ok(Some(held("a", 5, 100, 5))),
                Some(100),
                acquire("a", 4),
                plain(5, 100, false),
            ),
        ]);
    }

    #[test]
    fn renew_decisions() {
        let case = |name, read, lease, want| Case {
            name,
            read,
            armed: Some(100),
            op: Op::Renew(lease),
            want,
        };
        check(vec![
            case(
                "own, live: same token and ceiling, later expiry, no sync",
                Ok(Some(held("a", 5, 100, 5))),
                lease("a", 5),
                plain(5, 100, false),
            ),
            case(
                "own, expired and unraced: reclaimed",
                Ok(Some(held("a", 5, 100, -1))),
                lease("a", 5),
                plain(5, 100, false),
            ),
            Case {
                armed: None,
                ..case(
                    "own, not armed: still no sync",
                    Ok(Some(held("a", 5, 100, 5))),
                    lease("a", 5),
                    plain(5, 100, false),
                )
            },
            case(
                "lost to another owner, live",
                Ok(Some(held("b", 6, 100, 5))),
                lease("a", 5),
                Held(Some(id("b"))),
            ),
            case(
                "lost to its own owner's later token, live",
                Ok(Some(held("a", 6, 100, 5))),
                lease("a", 5),
                Held(Some(id("a"))),
            ),
            case(
                "lost to another owner, since expired",
                Ok(Some(held("b", 6, 100, -1))),
                lease("a", 5),
                Held(None),
            ),
            case(
                "released",
                Ok(Some(free(5, 100))),
                lease("a", 5),
                Held(None),
            ),
            case(
                "torn record, live",
                Ok(Some(torn(5, 100, 5))),
                lease("a", 5),
                Held(None),
            ),
            case("never written", Ok(None), lease("a", 5), Held(None)),
            case(
                "unreadable record",
                unreadable(),
                lease("a", 5),
                Failed(LeaseErrorKind::Transient),
            ),
        ]);
    }

    #[test]
    fn release_decisions() {
        let case = |name, read, lease, want| Case {
            name,
            read,
            armed: Some(100),
            op: Op::Release(lease),
            want,
        };
        check(vec![
            case(
                "own, live: freed, the token and the ceiling kept",
                Ok(Some(held("a", 5, 100, 5))),
                lease("a", 5),
                Released(Some((5, 100))),
            ),
            case(
                "own, expired: freed",
                Ok(Some(held("a", 5, 100, -1))),
                lease("a", 5),
                Released(Some((5, 100))),
            ),
            case(
                "own owner, another token: nothing written",
                Ok(Some(held("a", 6, 100, 5))),
                lease("a", 5),
                Released(None),
            ),
            case(
                "another owner's hold under the same token: nothing written",
                Ok(Some(held("b", 5, 100, 5))),
                lease("a", 5),
                Released(None),
            ),
            case(
                "already free",
                Ok(Some(free(5, 100))),
                lease("a", 5),
                Released(None),
            ),
            case(
                "torn record",
                Ok(Some(torn(5, 100, 5))),
                lease("a", 5),
                Released(None),
            ),
            case("never written", Ok(None), lease("a", 5), Released(None)),
            case(
                "unreadable record",
                unreadable(),
                lease("a", 5),
                Failed(LeaseErrorKind::Transient),
            ),
        ]);
    }

    #[test]
    fn current_decisions() {
        let case = |name, read, want| Case {
            name,
            read,
            armed: Some(100),
            op: Op::Current(session()),
            want,
        };
        check(vec![
            case(
                "live: the holder, its token and the time left",
                Ok(Some(held("a", 5, 100, 5))),
                Current(Some((id("a"), 5, Duration::from_secs(5)))),
            ),
            case("expired", Ok(Some(held("a", 5, 100, -1))), Current(None)),
            case("released", Ok(Some(free(5, 100))), Current(None)),
            case("never written", Ok(None), Current(None)),
            case(
                "torn record, live: Held without a holder, not None",
                Ok(Some(torn(5, 100, 5))),
                Held(None),
            ),
            case(
                "torn record, expired",
                Ok(Some(torn(5, 100, -1))),
                Current(None),
            ),
            case(
                "unreadable record",
                unreadable(),
                Failed(LeaseErrorKind::Transient),
            ),
        ]);
    }

    /// A hold written in this clock domain is judged on the monotonic clock
    /// whatever the wall clock says; one from another domain (an earlier
    /// boot, another time namespace) or an older version, on the wall
    /// clock.
    #[test]
    fn expiry_is_judged_on_the_clock_of_the_records_domain() {
        let with = |wall_left: i64, mono_left: i64, domain| Record {
            expiry_nanos: ((WALL + wall_left) * SEC) as u64,
            mono_expiry_nanos: ((MONO + mono_left) * SEC) as u64,
            boot_id: domain,
            ..held("a", 5, 100, 0)
        };
        let version_2 = Record {
            mono_expiry_nanos: 0,
            boot_id: [0; 16],
            ..with(5, -1, DOMAIN)
        };
        let case = |name, record, want| Case {
            name,
            read: Ok(Some(record)),
            armed: Some(100),
            op: acquire("b", 0),
            want,
        };
        check(vec![
            case(
                "this domain: live on the monotonic clock, past on the wall",
                with(-3_600, 5, DOMAIN),
                Held(Some(id("a"))),
            ),
            case(
                "this domain: expired on the monotonic clock, ahead on the wall",
                with(3_600, -1, DOMAIN),
                plain(6, 100, false),
            ),
            case(
                "another domain: expired on the wall clock",
                with(-1, 3_600, OTHER_DOMAIN),
                plain(6, 100, false),
            ),
            case(
                "another domain: live on the wall clock",
                with(5, -1, OTHER_DOMAIN),
                Held(Some(id("a"))),
            ),
            case(
                "no monotonic expiry (version 2): the wall clock",
                version_2,
                Held(Some(id("a"))),
            ),
        ]);
        // An instance that does not know its own domain judges every hold
        // on the wall clock, its own too.
        let unknown = Terms {
            clock_domain: [0; 16],
            ..TERMS
        };
        let record = Record {
            boot_id: [0; 16],
            ..with(-1, 3_600, [0; 16])
        };
        let plan = decide(&unknown, Ok(Some(record)), None, &acquire("b", 0), now()).unwrap();
        assert_eq!(plan.write.map(|w| w.token), Some(101));
    }

    /// Errors of the clock come before any answer, but the TTL is only
    /// added to the clock for a grant: a refusal never fails on it.
    #[test]
    fn a_clock_outside_the_records_range_is_invalid() {
        let before_1970 = Now {
            wall: SystemTime::UNIX_EPOCH - Duration::from_secs(1),
            ..now()
        };
        for op in [
            acquire("a", 0),
            Op::Renew(lease("a", 5)),
            Op::Release(lease("a", 5)),
            Op::Current(session()),
        ] {
            let read = Ok(Some(held("a", 5, 100, 5)));
            let err = decide(&TERMS, read, Some(100), &op, before_1970).err();
            assert_eq!(err.map(|e| e.kind()), Some(LeaseErrorKind::Invalid));
        }
        let endless = Terms {
            ttl: Duration::from_secs(u64::MAX / 4),
            ..TERMS
        };
        let read = || Ok(Some(held("a", 5, 100, 5)));
        let grant = decide(&endless, read(), Some(100), &acquire("a", 0), now());
        assert_eq!(outcome(grant), Failed(LeaseErrorKind::Invalid));
        let refusal = decide(&endless, read(), Some(100), &acquire("b", 0), now());
        assert_eq!(outcome(refusal), Held(Some(id("a"))));
    }
}
