//! A path of the model as the history a fault run would have recorded of
//! it, for `lease-history`'s checker to judge.
//!
//! A tick is a second of the history's timeline. A call is invoked at the
//! start of the tick it is sent in, and completes within the tick its
//! answer arrives in, at the step's place in the path: a lease counted from
//! its invocation therefore ends before anything of the tick it expires in
//! happens, as in the model, where a lease is over at the tick it expires.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lease_history::{Ambiguity, History, Logged, Op, OpKind, Outcome};

use crate::system::{Action, Answer, Message, Owner, Request, State, TTL};

/// One tick of the model on the history's timeline.
const TICK: Duration = Duration::from_secs(1);

/// A call sent and not yet answered.
struct Pending {
    worker: u32,
    owner: Owner,
    session: u8,
    kind: OpKind,
    token: Option<u64>,
    invoked: Duration,
}

/// The operations of a path as they are sent and answered.
#[derive(Default)]
struct Record {
    pending: BTreeMap<u8, Pending>,
    ops: Vec<Op>,
}

impl Record {
    fn complete(&mut self, op: u8, at: Duration, outcome: Outcome) {
        let Some(call) = self.pending.remove(&op) else {
            return;
        };
        self.ops.push(Op {
            id: u64::from(op),
            worker: call.worker,
            owner: Arc::from(call.owner.to_string()),
            session: Arc::from(format!("s{}", call.session)),
            kind: call.kind,
            token: call.token,
            invoked: call.invoked,
            completed: at,
            outcome,
            epoch: 0,
        });
    }

    /// A call sent by the step `action` from `state`.
    fn send(&mut self, state: &State, action: &Action, p: u8, session: u8) {
        let proc = &state.processes[usize::from(p)];
        let held = proc.holds(session, state.now).map(|h| u64::from(h.token));
        let (kind, token) = match action {
            Action::Acquire(..) => (OpKind::Acquire, None),
            Action::Renew(..) => (OpKind::Renew, held),
            Action::Release(..) => (OpKind::Release, held),
            _ => (OpKind::Write, held),
        };
        let call = Pending {
            worker: u32::from(p),
            owner: proc.owner(p),
            session,
            kind,
            token,
            invoked: TICK * u32::from(state.now),
        };
        self.pending.insert(state.next_op, call);
    }

    /// A reply delivered at `at`; it completes its call only if the call
    /// still waits for it, as the keeper takes it.
    fn reply(&mut self, state: &State, message: Message, at: Duration) {
        match message {
            Message::FromAuthority {
                op,
                owner,
                session,
                request,
                answer,
                ..
            } => {
                let proc = &state.processes[usize::from(owner.process)];
                if proc.incarnation != owner.incarnation
                    || proc.waiting[usize::from(session)] != Some(op)
                {
                    return;
                }
                let outcome = match (request, answer) {
                    (_, Answer::Granted(token)) => Outcome::Granted {
                        token: u64::from(token),
                        valid_for: TICK * u32::from(TTL),
                    },
                    (Request::Release(_), _) | (_, Answer::Released) => Outcome::Done,
                    (_, Answer::Refused) => Outcome::Held,
                };
                self.complete(op, at, outcome);
            }
            Message::FromStore {
                op, owner, written, ..
            } => {
                let proc = &state.processes[usize::from(owner.process)];
                if proc.incarnation != owner.incarnation {
                    return;
                }
                let outcome = if written {
                    Outcome::Done
                } else {
                    Outcome::Fenced
                };
                self.complete(op, at, outcome);
            }
            _ => {}
        }
    }

    /// Every call of `worker` still waiting ends without an answer at `at`.
    fn give_up(&mut self, worker: Option<u32>, at: Duration) {
        let gone: Vec<u8> = self
            .pending
            .iter()
            .filter(|(_, c)| worker.is_none_or(|w| c.worker == w))
            .map(|(&op, _)| op)
            .collect();
        for op in gone {
            self.complete(op, at, Outcome::Ambiguous(Ambiguity::Timeout));
        }
    }
}

/// The history of the path `steps` (each state with the action taken from
/// it; the last one's action is `None`).
pub fn history_of(steps: &[(State, Option<Action>)]) -> History {
    let mut record = Record::default();
    for (step, (state, action)) in steps.iter().enumerate() {
        let Some(action) = action else { break };
        let within = Duration::from_millis(u64::try_from(step + 1).unwrap_or(u64::MAX));
        let at = TICK * u32::from(state.now) + within;
        match *action {
            Action::Acquire(p, s)
            | Action::Renew(p, s)
            | Action::Release(p, s)
            | Action::Write(p, s) => record.send(state, action, p, s),
            Action::Deliver(message) => record.reply(state, message, at),
            Action::Crash(p) => record.give_up(Some(u32::from(p)), at),
            Action::GiveUp(p, s) => {
                if let Some(op) = state.processes[usize::from(p)].waiting[usize::from(s)] {
                    record.complete(op, at, Outcome::Ambiguous(Ambiguity::Timeout));
                }
            }
            _ => {}
        }
    }
    let last = steps.last().map(|(s, _)| s);
    let end = TICK * (u32::from(last.map_or(0, |s| s.now)) + u32::from(TTL) + 1);
    record.give_up(None, end);
    let mut ops = record.ops;
    ops.sort_by_key(|o| (o.completed, o.id));
    let store_logs = last.map_or_else(BTreeMap::new, |last| {
        last.store
            .iter()
            .enumerate()
            .map(|(session, store)| {
                let log = store
                    .log
                    .iter()
                    .zip(1..)
                    .map(|(landed, seq)| Logged {
                        seq,
                        op: u64::from(landed.op),
                    })
                    .collect();
                (Arc::from(format!("s{session}")), log)
            })
            .collect()
    });
    History {
        ops,
        store_logs,
        ..History::default()
    }
}
