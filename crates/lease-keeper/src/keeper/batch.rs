//! Batch renewal, for a backend whose `renew_many` costs one exchange for
//! many leases ([`SessionLease::renews_in_batches`](lease_port::SessionLease::renews_in_batches)):
//! one keeper-wide driver sends the renewals of every run that is due
//! together, and each run keeps exactly the rules of the one-by-one renew
//! loop.
//!
//! Why it stays as safe as renewing one by one:
//!
//! - A run joins a batch only *early*: when its renewal is due within the
//!   batch window (`KeeperCore::batch_window`) of the batch being sent,
//!   and never after its own due time. A batch waits for nobody.
//! - Each run keeps its own deadline: `ttl` after the call that granted or
//!   last renewed *it* was sent (for a batch, when the batch was sent).
//!   While a batch is unanswered each member is taken as lost exactly at
//!   its own deadline, while the others keep waiting up to theirs; an
//!   answer arriving at or after a member's deadline does not count for it.
//! - A run whose release began while its lease was in a batch is not
//!   waited for: the release goes ahead at once, and the batch's answer for
//!   it is ignored (see `Run::store_renewed`). It is never put back on the
//!   schedule.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use lease_port::{Lease, LeaseErrorKind};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, info_span, warn};

use super::lock;
use super::renew::{Settled, expire_unanswered, settle};
use super::run::{LossReason, Run};
use super::state::KeeperCore;
use crate::RenewOutcome;

/// A leased run waiting for its next renewal (not in a batch in flight).
pub(super) struct BatchSlot {
    pub(super) run: Arc<Run>,
    /// When the lease must be taken as lost: `ttl` after the call that
    /// granted or last renewed it was sent.
    pub(super) deadline: Instant,
    /// When its next renewal is due.
    pub(super) due: Instant,
}

/// The runs waiting for their next batch, and when the driver means to
/// look at them next.
#[derive(Default)]
pub(super) struct BatchSchedule {
    /// Keyed by run id.
    slots: HashMap<u64, BatchSlot>,
    /// When the driver wakes next on its own; `None` while nothing is
    /// scheduled. A run due earlier must wake it.
    wake_at: Option<Instant>,
}

impl BatchSchedule {
    /// Schedules `slot`; true when the driver must be woken to see it in
    /// time. Most runs are due after the driver's next wake, so scheduling
    /// one costs no wake-up and no scan.
    pub(super) fn insert(&mut self, slot: BatchSlot) -> bool {
        let at = slot.due.min(slot.deadline);
        self.slots.insert(slot.run.id, slot);
        match self.wake_at {
            Some(wake_at) if wake_at <= at => false,
            _ => {
                self.wake_at = Some(at);
                true
            }
        }
    }

    pub(super) fn remove(&mut self, run: u64) {
        self.slots.remove(&run);
    }
}

/// One run's place in a batch in flight.
struct Member {
    run: Arc<Run>,
    /// The value the batch passes for it.
    lease: Lease,
    deadline: Instant,
    /// False once it was lost at its deadline while the batch was out.
    waiting: bool,
}

/// Sends every due renewal in batches, sleeping until the next one is due
/// or until a run is scheduled (`wake`). Ends when the keeper is gone; with
/// nothing scheduled it wakes every `idle` to notice that.
pub(super) async fn batch_driver(core: Weak<KeeperCore>, idle: Duration, wake: Arc<Notify>) {
    loop {
        let wake_at = {
            let Some(core) = core.upgrade() else {
                return;
            };
            send_due(&core)
        };
        let wake_at = wake_at.unwrap_or_else(|| Instant::now() + idle);
        // Biased: either branch only wakes the loop, and a fixed order
        // keeps a simulated run's schedule a function of its seed.
        tokio::select! {
            biased;
            () = wake.notified() => {}
            () = sleep_until(wake_at) => {}
        }
    }
}

/// Takes the runs due within the batch window off the schedule and sends
/// them (in batches of at most the batch limit), takes the runs past their
/// deadline as lost, and answers when the driver must look again.
fn send_due(core: &Arc<KeeperCore>) -> Option<Instant> {
    let now = Instant::now();
    let horizon = now + core.batch_window();
    let mut expired = Vec::new();
    let mut due = Vec::new();
    let next_wake = {
        let mut schedule = lock(&core.batch_schedule);
        let slots = &mut schedule.slots;
        slots.retain(|_, slot| {
            if slot.run.stop.is_cancelled() {
                false
            } else if now >= slot.deadline {
                expired.push(Arc::clone(&slot.run));
                false
            } else {
                true
            }
        });
        // Only a run that is due now starts a batch; the others due within
        // the window merely join it.
        if slots.values().any(|slot| slot.due <= now) {
            slots.retain(|_, slot| {
                if slot.due <= horizon {
                    due.push((Arc::clone(&slot.run), slot.deadline));
                    false
                } else {
                    true
                }
            });
        }
        let next_wake = slots.values().map(|s| s.due.min(s.deadline)).min();
        schedule.wake_at = next_wake;
        next_wake
    };
    // In the order the runs began, not the map's: which runs share a batch,
    // and the order losses are told in, then depend on the runs alone, and
    // a schedule replays.
    expired.sort_unstable_by_key(|run| run.id);
    due.sort_unstable_by_key(|(run, _)| run.id);
    for run in expired {
        run.lose(core, LossReason::Expired);
    }
    let mut members: Vec<Member> = due
        .into_iter()
        .filter_map(|(run, deadline)| {
            let lease = run.current()?;
            Some(Member {
                run,
                lease,
                deadline,
                waiting: true,
            })
        })
        .collect();
    while !members.is_empty() {
        let rest = members.split_off(members.len().min(core.batch_limit));
        let batch = std::mem::replace(&mut members, rest);
        let span = info_span!("lease_keeper.renew_batch", size = batch.len());
        tokio::spawn(renew_batch(Arc::clone(core), batch).instrument(span));
    }
    next_wake
}

/// One `renew_many` call for `members`, each answer applied to its run
/// with the rules of the one-by-one path; every run still held goes back
/// on the schedule.
async fn renew_batch(core: Arc<KeeperCore>, mut members: Vec<Member>) {
    let leases: Vec<Lease> = members.iter().map(|m| m.lease.clone()).collect();
    core.metrics.renew_batch(leases.len());
    let sent = Instant::now();
    let call = core.backend.renew_many(&leases);
    tokio::pin!(call);
    let answers = loop {
        // The earliest deadline among the members still waiting: a batch
        // carries runs renewed at different times, and each is lost at its
        // own deadline, not at the batch's earliest or latest.
        let Some(earliest) = members
            .iter()
            .filter(|m| m.waiting)
            .map(|m| m.deadline)
            .min()
        else {
            // Every member is lost: nobody needs the answer any more.
            return;
        };
        tokio::select! {
            biased;
            answers = &mut call => break answers,
            () = sleep_until(earliest) => {
                let now = Instant::now();
                for m in members.iter_mut().filter(|m| m.waiting && m.deadline <= now) {
                    m.waiting = false;
                    if !m.run.stop.is_cancelled() {
                        expire_unanswered(&core, &m.run, now - sent);
                    }
                }
            }
        }
    };
    let now = Instant::now();
    let latency = now - sent;
    if answers.len() != members.len() {
        warn!(
            sent = members.len(),
            answered = answers.len(),
            "renew_many answered a different number of results than leases sent; \
             no answer can be matched to its lease, so every run in the batch is lost"
        );
        for m in members.iter().filter(|m| m.waiting) {
            if !m.run.stop.is_cancelled() {
                core.metrics.renew_latency(latency, RenewOutcome::Failed);
                m.run.lose(
                    &core,
                    LossReason::Rejected {
                        kind: LeaseErrorKind::Invalid,
                    },
                );
            }
        }
        return;
    }
    let interval = core.next_interval();
    let mut back = Vec::new();
    for (m, answer) in members.into_iter().zip(answers) {
        if !m.waiting || m.run.stop.is_cancelled() {
            // Lost at its deadline already, or ended meanwhile: the answer
            // is about a run that no longer exists.
            continue;
        }
        if now >= m.deadline {
            expire_unanswered(&core, &m.run, latency);
            continue;
        }
        match settle(&core, &m.run, &m.lease, answer, latency) {
            Settled::Renewed => back.push(BatchSlot {
                run: {
                    m.run.renewed_at(&core, sent);
                    m.run
                },
                deadline: sent + core.ttl,
                // One jitter draw per batch: its members stay together in
                // later batches, while separate keepers still drift apart.
                due: sent + interval,
            }),
            Settled::Retry => back.push(BatchSlot {
                run: m.run,
                deadline: m.deadline,
                due: now + core.retry_interval(),
            }),
            Settled::Over => {}
        }
    }
    if !back.is_empty() {
        core.reschedule(back);
    }
}
