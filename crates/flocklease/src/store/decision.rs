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
                    return Ok(Plan::nothing(Err(LeaseError::held(Some(holder.clone())))));
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
