//! Acquire: one transaction that takes the session if it is free and
//! otherwise reads its key and guard; [`classify`], with no I/O, says what
//! was found; a round acts on it, and the driver runs rounds within a
//! [`Budget`].

use std::time::{Duration, Instant};

use lease_port::{Lease, LeaseError, OwnerId, SessionId};

use crate::keys::{decode_owner, decode_value, encode_value};
use crate::shared_lease::Grant;
use crate::txn::{
    held_unchanged, lapsed_unchanged, raft_term, read_kv, revision, take_if_free,
    take_if_unchanged, token_of,
};
use crate::wire::messages::{Compare, KeyValue, TxnResponse};
use crate::{EtcdError, Inner};

/// How often an acquire retries when the key or the etcd lease changed
/// between its steps.
const ACQUIRE_ATTEMPTS: usize = 4;

/// How often an acquire waits out part of a lapsed hold; a wait spends no
/// attempt.
const LAPSED_WAITS: usize = 4;

/// What the take-if-free transaction found (see [`classify`]).
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// Neither the key nor its guard existed: the transaction took the
    /// session, at `revision`.
    Free { revision: i64 },
    /// The compare failed, yet neither the key nor its guard was there to
    /// read: released since the compare.
    Released,
    /// The caller's owner holds the key, on etcd lease `lease`, at
    /// `revision`.
    HeldByUs { lease: i64, revision: i64 },
    /// Another owner holds the key.
    HeldByOther { holder: OwnerId },
    /// The key holds a value this crate did not write.
    Foreign,
    /// The key is gone but its guard, at `guard_revision`, is left: a hold
    /// of the caller's owner whose etcd lease ended. The same owner takes
    /// it back at once, as it may re-acquire a live hold.
    LapsedOurs { guard_revision: i64 },
    /// The key is gone but its guard, at `guard_revision`, is left: a hold
    /// of another owner (`holder`, when the guard names one) whose etcd
    /// lease ended, taken over only once seen lapsed for `wait` (see
    /// `lapsed`).
    LapsedOther {
        guard_revision: i64,
        holder: Option<OwnerId>,
        wait: Duration,
    },
}

/// Judges the answer of [`take_if_free`] for `owner`, who counts on `ttl`,
/// with this client's `grace`. No I/O: the caller acts on the verdict.
fn classify(
    mut answer: TxnResponse,
    owner: &OwnerId,
    ttl: Duration,
    grace: Duration,
) -> Result<Found, LeaseError> {
    if answer.succeeded {
        return revision(&answer)
            .map(|revision| Found::Free { revision })
            .ok_or_else(|| LeaseError::transient("acquire: etcd answered without a revision"));
    }
    let Some(kv) = read_kv(&mut answer, 0) else {
        return Ok(match read_kv(&mut answer, 1) {
            Some(guard) => lapsed(&guard, owner, ttl, grace),
            None => Found::Released,
        });
    };
    Ok(match decode_owner(&kv.value) {
        Some(holder) if &holder == owner => Found::HeldByUs {
            lease: kv.lease,
            revision: kv.mod_revision,
        },
        Some(holder) => Found::HeldByOther { holder },
        None => Found::Foreign,
    })
}

/// A guard left without its key: the key's etcd lease ended without a
/// release.
fn lapsed(guard: &KeyValue, owner: &OwnerId, ttl: Duration, grace: Duration) -> Found {
    let guard_revision = guard.mod_revision;
    let (holder, holder_ttl) = decode_value(&guard.value).unzip();
    if holder.as_ref() == Some(owner) {
        return Found::LapsedOurs { guard_revision };
    }
    // The holder counts on its own TTL, which may be longer than ours.
    let wait = holder_ttl.unwrap_or(ttl).max(ttl) + grace;
    Found::LapsedOther {
        guard_revision,
        holder,
        wait,
    }
}

/// The answer to a session whose key holds a value this crate did not
/// write: held, by nobody it can name.
fn foreign(session: &SessionId) -> LeaseError {
    LeaseError::held(None).with_source(EtcdError::Malformed {
        call: "Txn",
        detail: format!("the key of {session} holds a value this crate did not write"),
    })
}

/// What to do about another owner's lapsed hold.
#[derive(Debug, PartialEq, Eq)]
enum LapsedStep {
    /// Answer `Held`: the hold must be seen lapsed for longer than the
    /// caller is willing to wait.
    Refuse,
    /// Wait out the rest, then look again.
    Wait,
    /// Take it over.
    TakeOver,
}

/// The step for a lapsed hold that must still be seen lapsed for
/// `remaining`, when the caller waits up to `patience` and `may_wait` says
/// whether the budget has a wait left. A hold is taken over only once it
/// has been seen lapsed for its whole wait: with the waits used up and
/// time still left, it is refused (its holder may still count on it).
fn lapsed_step(remaining: Duration, patience: Duration, may_wait: bool) -> LapsedStep {
    if remaining.is_zero() {
        LapsedStep::TakeOver
    } else if remaining <= patience && may_wait {
        LapsedStep::Wait
    } else {
        LapsedStep::Refuse
    }
}

/// What an acquire may still spend. A round that found the key or the
/// etcd lease changed under it spends an attempt; a round that waited out
/// part of a lapsed hold spends a wait instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Budget {
    attempts: usize,
    waits: usize,
}

impl Budget {
    const ACQUIRE: Budget = Budget {
        attempts: ACQUIRE_ATTEMPTS,
        waits: LAPSED_WAITS,
    };

    fn may_wait(self) -> bool {
        self.waits > 0
    }

    fn spend_wait(&mut self) {
        self.waits = self.waits.saturating_sub(1);
    }

    /// Spends an attempt; false when that was the last.
    fn spend_attempt(&mut self) -> bool {
        self.attempts = self.attempts.saturating_sub(1);
        self.attempts > 0
    }
}

/// How one round of an acquire ended.
enum Round {
    Acquired(Lease),
    /// Wait this long (for a lapsed hold), then try again.
    Wait(Duration),
    /// Something changed between the steps: try again.
    Retry,
    /// The answer came from another raft term than the grant behind it, or
    /// a conditional write did not land: try again with a keep-alive sent
    /// after now.
    RefreshAndRetry,
}

/// One acquire call: what it writes, and when it began.
struct Call<'a> {
    session: &'a SessionId,
    owner: &'a OwnerId,
    key: Vec<u8>,
    guard: Vec<u8>,
    value: Vec<u8>,
    /// The caller counts the lease from when it called (a keeper: from
    /// when it sent the acquire, plus the TTL). A grant refreshed before
    /// that would lapse earlier, and another owner could take the
    /// session while the caller still counts it as its own: only a
    /// keep-alive sent after the call began may back it.
    started: Instant,
}

impl Call<'_> {
    fn lease(&self, revision: i64, grant: &Grant) -> Lease {
        Lease::new(
            self.session.clone(),
            self.owner.clone(),
            token_of(revision),
            grant.expiry(),
        )
    }
}

/// The etcd lease a round writes on and the grant backing it.
#[derive(Clone, Copy)]
struct Backing {
    id: i64,
    grant: Grant,
}

impl Inner {
    pub(crate) async fn acquire(
        &self,
        session: &SessionId,
        owner: &OwnerId,
    ) -> Result<Lease, LeaseError> {
        let key = self.keys.session_key(session);
        let call = Call {
            session,
            owner,
            guard: self.keys.guard_of(&key),
            value: encode_value(session, owner, self.ttl),
            key,
            started: Instant::now(),
        };
        // Set when an answer came from another raft term than the grant
        // behind it: the next round needs a keep-alive sent after that.
        let mut refresh_after: Option<Instant> = None;
        let mut budget = Budget::ACQUIRE;
        loop {
            let round = self.acquire_round(&call, refresh_after, budget.may_wait());
            match round.await? {
                Round::Acquired(lease) => return Ok(lease),
                Round::Wait(wait) => {
                    budget.spend_wait();
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Round::Retry => {}
                Round::RefreshAndRetry => refresh_after = Some(Instant::now()),
            }
            if !budget.spend_attempt() {
                return Err(LeaseError::transient(
                    "acquire: the key or the etcd lease kept changing; try again",
                ));
            }
        }
    }

    /// One round: a grant sent after the call began, the take-if-free
    /// transaction on it, and what follows from what that found.
    async fn acquire_round(
        &self,
        call: &Call<'_>,
        refresh_after: Option<Instant>,
        may_wait: bool,
    ) -> Result<Round, LeaseError> {
        let Some(backing) = self.backing(call.started, refresh_after).await? else {
            return Ok(Round::Retry);
        };
        let Some(answer) = self.send_take_if_free(call, backing).await? else {
            return Ok(Round::Retry);
        };
        let proven = raft_term(&answer.header) == Some(backing.grant.term);
        match classify(answer, call.owner, self.ttl, self.shared.grace())? {
            Found::Free { revision } => self.took_free(call, backing, revision, proven).await,
            Found::Released => Ok(Round::Retry), // released since the compare
            Found::HeldByUs { lease, revision } => {
                self.held_by_us(call, backing, lease, revision, proven)
                    .await
            }
            Found::HeldByOther { holder } => {
                // Answered: nothing of ours was written.
                self.held.forget_unknown(&call.key);
                Err(LeaseError::held(Some(holder)))
            }
            Found::Foreign => {
                self.held.forget_unknown(&call.key);
                Err(foreign(call.session))
            }
            Found::LapsedOurs { guard_revision } => {
                self.take_lapsed(call, backing, guard_revision).await
            }
            Found::LapsedOther {
                guard_revision,
                holder,
                wait,
            } => {
                let wait = self
                    .lapsed
                    .remaining(&call.guard, guard_revision, Instant::now(), wait);
                match lapsed_step(wait, self.lapsed_hold_wait, may_wait) {
                    LapsedStep::Refuse => Err(LeaseError::held(holder)
                        .with_source(EtcdError::LapsedHold { free_in: wait })),
                    LapsedStep::Wait => Ok(Round::Wait(wait)),
                    LapsedStep::TakeOver => self.take_lapsed(call, backing, guard_revision).await,
                }
            }
        }
    }

    /// Sends the take-if-free transaction on the round's etcd lease. `None`
    /// when etcd no longer has that lease.
    async fn send_take_if_free(
        &self,
        call: &Call<'_>,
        Backing { id, grant }: Backing,
    ) -> Result<Option<TxnResponse>, LeaseError> {
        // Known before it is sent: if this call is dropped while the
        // write is on its way, the key is on our etcd lease and only
        // the sweep would ever remove it.
        let until = self.shared.etcd_deadline(&grant);
        self.held
            .hold_if_unknown(&call.key, id, call.value.clone(), until);
        let take = take_if_free(&call.key, &call.guard, &call.value, id);
        match self.client.txn(take).await {
            Err(e) if e.is_lease_not_found() => {
                self.shared.forget(id);
                Ok(None)
            }
            Err(e) => {
                // The put may have landed: remember the key so that it
                // is swept unless its owner acquires it again.
                let (key, value) = (call.key.clone(), call.value.clone());
                self.held.hold(key, id, None, value, until);
                Err(e.into_lease_error("acquire: transaction failed"))
            }
            Ok(answer) => Ok(Some(answer)),
        }
    }

    /// This client's etcd lease, with a grant sent after the call began
    /// (and after `refresh_after`, when set). A grant sent before is
    /// refreshed first, so every acquire hands out a whole TTL from the
    /// call, and the transaction after it proves the keep-alive (see
    /// `Grant::term`); concurrent acquires share one keep-alive. `None`
    /// when etcd no longer has the lease.
    async fn backing(
        &self,
        started: Instant,
        refresh_after: Option<Instant>,
    ) -> Result<Option<Backing>, LeaseError> {
        let (id, grant) = self
            .shared
            .ensure()
            .await
            .map_err(|e| e.into_lease_error("grant an etcd lease"))?;
        if refresh_after.is_none() && grant.sent_at >= started {
            return Ok(Some(Backing { id, grant }));
        }
        let not_before = refresh_after.unwrap_or(started);
        match self.shared.keep_alive(id, not_before).await {
            Ok(fresh) => Ok(fresh.map(|grant| Backing { id, grant })),
            Err(e) => Err(e.into_lease_error("acquire: keep-alive failed")),
        }
    }

    /// The take-if-free transaction took the session at `revision`.
    async fn took_free(
        &self,
        call: &Call<'_>,
        Backing { id, grant }: Backing,
        revision: i64,
        proven: bool,
    ) -> Result<Round, LeaseError> {
        let until = self.shared.etcd_deadline(&grant);
        let (key, value) = (call.key.clone(), call.value.clone());
        self.held.hold(key, id, Some(revision), value, until);
        if !proven {
            // Ours, but the grant is unproven: the next round
            // refreshes it and finds the key ours.
            return Ok(Round::RefreshAndRetry);
        }
        self.sweep().await;
        Ok(Round::Acquired(call.lease(revision, &grant)))
    }

    /// The caller's owner holds the key, on etcd lease `on`, at `revision`.
    /// The live holder re-acquiring keeps its token; a hold whose reported
    /// expiry has passed (etcd keeps it for the grace) is taken anew, with
    /// a greater token, as any takeover is.
    async fn held_by_us(
        &self,
        call: &Call<'_>,
        backing: Backing,
        on: i64,
        revision: i64,
        proven: bool,
    ) -> Result<Round, LeaseError> {
        let Backing { id, grant } = backing;
        let live = on == id
            && self
                .held
                .renewed_past(&call.key, revision, Instant::now() + self.shared.grace());
        if live && !proven {
            return Ok(Round::RefreshAndRetry);
        }
        if live {
            // Nothing to write, the token stays.
            let until = self.shared.etcd_deadline(&grant);
            let (key, value) = (call.key.clone(), call.value.clone());
            self.held.hold(key, id, Some(revision), value, until);
            return Ok(Round::Acquired(call.lease(revision, &grant)));
        }
        // The same owner holds it, but not as a live hold of this
        // client (another client's, or one whose reported expiry has
        // passed): rewrite it under our etcd lease, which raises the
        // token.
        let unchanged = held_unchanged(&call.key, revision);
        Ok(match self.take(call, backing, unchanged).await? {
            Some(lease) => Round::Acquired(lease),
            None => Round::RefreshAndRetry,
        })
    }

    /// Takes over a lapsed hold whose guard is at `guard_revision`, if it
    /// is still so.
    async fn take_lapsed(
        &self,
        call: &Call<'_>,
        backing: Backing,
        guard_revision: i64,
    ) -> Result<Round, LeaseError> {
        let unchanged = lapsed_unchanged(&call.key, &call.guard, guard_revision);
        Ok(match self.take(call, backing, unchanged).await? {
            Some(lease) => {
                self.lapsed.forget(&call.guard);
                Round::Acquired(lease)
            }
            None => Round::RefreshAndRetry,
        })
    }

    /// Writes the session key (on the round's etcd lease) and its guard if
    /// `unchanged` holds, which raises the token. `None` when it did not
    /// hold, or the grant backing the write is unproven: the caller tries
    /// again.
    async fn take(
        &self,
        call: &Call<'_>,
        Backing { id, grant }: Backing,
        unchanged: Vec<Compare>,
    ) -> Result<Option<Lease>, LeaseError> {
        let (key, value) = (&call.key, &call.value);
        self.held
            .hold_if_unknown(key, id, value.clone(), self.shared.etcd_deadline(&grant));
        let rewrite = take_if_unchanged(key, &call.guard, value, id, unchanged);
        match self.client.txn(rewrite).await {
            Ok(answer) if answer.succeeded => {
                let rev = revision(&answer).ok_or_else(|| {
                    LeaseError::transient("acquire: etcd answered without a revision")
                })?;
                let until = self.shared.etcd_deadline(&grant);
                self.held
                    .hold(key.clone(), id, Some(rev), value.clone(), until);
                if raft_term(&answer.header) != Some(grant.term) {
                    return Ok(None);
                }
                Ok(Some(call.lease(rev, &grant)))
            }
            Ok(_) => Ok(None),
            Err(e) if e.is_lease_not_found() => {
                self.shared.forget(id);
                Ok(None)
            }
            Err(e) => {
                let until = self.shared.etcd_deadline(&grant);
                self.held.hold(key.clone(), id, None, value.clone(), until);
                Err(e.into_lease_error("acquire: transaction failed"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lease_port::LeaseErrorKind;

    use super::*;
    use crate::wire::messages::{RangeResponse, Response, ResponseHeader, ResponseOp};

    const TTL: Duration = Duration::from_secs(10);
    const GRACE: Duration = Duration::from_secs(1);

    fn owner(name: &str) -> OwnerId {
        OwnerId::new(name).unwrap()
    }

    fn value_of(name: &str, ttl: Duration) -> Vec<u8> {
        encode_value(&SessionId::new("chat-7").unwrap(), &owner(name), ttl)
    }

    fn kv(value: Vec<u8>, lease: i64, mod_revision: i64) -> KeyValue {
        KeyValue {
            value,
            lease,
            mod_revision,
            ..Default::default()
        }
    }

    /// The answer of a take-if-free whose compare failed: the key, then
    /// the guard, each read or absent.
    fn read(key: Option<KeyValue>, guard: Option<KeyValue>) -> TxnResponse {
        let op = |kv: Option<KeyValue>| ResponseOp {
            response: Some(Response::Range(RangeResponse {
                kvs: kv.into_iter().collect(),
                ..Default::default()
            })),
        };
        TxnResponse {
            header: Some(ResponseHeader {
                revision: 40,
                raft_term: 2,
                ..Default::default()
            }),
            succeeded: false,
            responses: vec![op(key), op(guard)],
        }
    }

    fn judged(answer: TxnResponse, me: &str) -> Found {
        classify(answer, &owner(me), TTL, GRACE).unwrap()
    }

    #[test]
    fn a_free_session_is_taken_at_the_answers_revision() {
        let answer = TxnResponse {
            header: Some(ResponseHeader {
                revision: 41,
                ..Default::default()
            }),
            succeeded: true,
            responses: vec![],
        };
        assert_eq!(judged(answer, "a"), Found::Free { revision: 41 });
    }

    #[test]
    fn a_take_answered_without_a_revision_is_transient() {
        let answer = TxnResponse {
            succeeded: true,
            ..Default::default()
        };
        let err = classify(answer, &owner("a"), TTL, GRACE).unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Transient);
    }

    #[test]
    fn nothing_to_read_after_a_failed_compare_is_a_release_since() {
        assert_eq!(judged(read(None, None), "a"), Found::Released);
        // An answer that read nothing at all is judged the same.
        assert_eq!(judged(TxnResponse::default(), "a"), Found::Released);
    }

    #[test]
    fn a_key_names_its_holder() {
        let key = kv(value_of("a", TTL), 7, 30);
        let guard = kv(value_of("a", TTL), 0, 30);
        assert_eq!(
            judged(read(Some(key.clone()), Some(guard.clone())), "a"),
            Found::HeldByUs {
                lease: 7,
                revision: 30
            }
        );
        assert_eq!(
            judged(read(Some(key), Some(guard)), "b"),
            Found::HeldByOther { holder: owner("a") }
        );
    }

    #[test]
    fn a_key_this_crate_did_not_write_is_foreign() {
        let key = kv(b"by hand".to_vec(), 7, 30);
        assert_eq!(judged(read(Some(key), None), "a"), Found::Foreign);
    }

    #[test]
    fn a_guard_without_its_key_is_a_lapsed_hold() {
        let guard = kv(value_of("a", TTL), 0, 30);
        assert_eq!(
            judged(read(None, Some(guard.clone())), "a"),
            Found::LapsedOurs { guard_revision: 30 }
        );
        assert_eq!(
            judged(read(None, Some(guard)), "b"),
            Found::LapsedOther {
                guard_revision: 30,
                holder: Some(owner("a")),
                wait: TTL + GRACE,
            }
        );
    }

    #[test]
    fn a_lapsed_hold_is_waited_out_for_the_longer_ttl() {
        let longer = kv(value_of("a", TTL * 3), 0, 30);
        let shorter = kv(value_of("a", TTL / 2), 0, 31);
        let unreadable = kv(b"by hand".to_vec(), 0, 32);
        let wait = |guard| match judged(read(None, Some(guard)), "b") {
            Found::LapsedOther { wait, .. } => wait,
            other => panic!("{other:?}"),
        };
        assert_eq!(wait(longer), TTL * 3 + GRACE);
        assert_eq!(wait(shorter), TTL + GRACE);
        assert_eq!(wait(unreadable.clone()), TTL + GRACE);
        assert!(matches!(
            judged(read(None, Some(unreadable)), "b"),
            Found::LapsedOther { holder: None, .. }
        ));
    }

    #[test]
    fn a_lapsed_hold_is_refused_waited_for_or_taken() {
        let (second, patience) = (Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(
            lapsed_step(patience + second, patience, true),
            LapsedStep::Refuse
        );
        assert_eq!(lapsed_step(patience, patience, true), LapsedStep::Wait);
        assert_eq!(lapsed_step(second, patience, true), LapsedStep::Wait);
        assert_eq!(
            lapsed_step(Duration::ZERO, patience, true),
            LapsedStep::TakeOver
        );
        // A caller that waits for nothing is refused while any wait is left.
        assert_eq!(
            lapsed_step(second, Duration::ZERO, true),
            LapsedStep::Refuse
        );
        assert_eq!(
            lapsed_step(Duration::ZERO, Duration::ZERO, true),
            LapsedStep::TakeOver
        );
        // With the waits used up, a hold with time left is refused, never
        // taken over early.
        assert_eq!(lapsed_step(second, patience, false), LapsedStep::Refuse);
        assert_eq!(
            lapsed_step(Duration::ZERO, patience, false),
            LapsedStep::TakeOver
        );
        assert_eq!(
            lapsed_step(patience + second, patience, false),
            LapsedStep::Refuse
        );
    }

    #[test]
    fn waits_spend_no_attempts() {
        let mut budget = Budget::ACQUIRE;
        for _ in 0..LAPSED_WAITS {
            assert!(budget.may_wait());
            budget.spend_wait();
        }
        assert!(!budget.may_wait());
        assert_eq!(budget.attempts, ACQUIRE_ATTEMPTS);
        let rounds = std::iter::from_fn(|| Some(budget.spend_attempt()))
            .take_while(|&more| more)
            .count();
        // Every attempt but the last is followed by another.
        assert_eq!(rounds + 1, ACQUIRE_ATTEMPTS);
    }
}
