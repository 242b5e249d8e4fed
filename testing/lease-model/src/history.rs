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

/// The history of the path `steps` (each state with the action taken from
/// it; the last one's action is `None`).
pub fn history_of(steps: &[(State, Option<Action>)]) -> History {
    let mut pending: BTreeMap<u8, Pending> = BTreeMap::new();
    let mut ops = Vec::new();
    let complete = |ops: &mut Vec<Op>, op: u8, call: Pending, at: Duration, outcome| {
        ops.push(Op {
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
    };
    for (step, (state, action)) in steps.iter().enumerate() {
        let Some(action) = action else { break };
        let start = TICK * u32::from(state.now);
        let within = Duration::from_millis(u64::try_from(step + 1).unwrap_or(u64::MAX));
        let at = start + within;
        match *action {
            Action::Acquire(p, s)
            | Action::Renew(p, s)
            | Action::Release(p, s)
            | Action::Write(p, s) => {
                let proc = &state.processes[usize::from(p)];
                let held = proc.holds(s, state.now).map(|h| u64::from(h.token));
                let (kind, token) = match action {
                    Action::Acquire(..) => (OpKind::Acquire, None),
                    Action::Renew(..) => (OpKind::Renew, held),
                    Action::Release(..) => (OpKind::Release, held),
                    _ => (OpKind::Write, held),
                };
                let call = Pending {
                    worker: u32::from(p),
                    owner: proc.owner(p),
                    session: s,
                    kind,
                    token,
                    invoked: start,
                };
                pending.insert(state.next_op, call);
            }
            Action::Deliver(Message::FromAuthority {
                op,
                owner,
                session,
                request,
                answer,
                ..
            }) => {
                let proc = &state.processes[usize::from(owner.process)];
                let waited = proc.incarnation == owner.incarnation
                    && proc.waiting[usize::from(session)] == Some(op);
                if let Some(call) = pending.remove(&op).filter(|_| waited) {
                    let outcome = match (request, answer) {
                        (_, Answer::Granted(token)) => Outcome::Granted {
                            token: u64::from(token),
                            valid_for: TICK * u32::from(TTL),
                        },
                        (Request::Release(_), _) | (_, Answer::Released) => Outcome::Done,
                        (_, Answer::Refused) => Outcome::Held,
                    };
                    complete(&mut ops, op, call, at, outcome);
                }
            }
            Action::Deliver(Message::FromStore {
                op, owner, written, ..
            }) => {
                let proc = &state.processes[usize::from(owner.process)];
                let waited = proc.incarnation == owner.incarnation;
                if let Some(call) = pending.remove(&op).filter(|_| waited) {
                    let outcome = if written {
                        Outcome::Done
                    } else {
                        Outcome::Fenced
                    };
                    complete(&mut ops, op, call, at, outcome);
                }
            }
            Action::Crash(p) => {
                let gone: Vec<u8> = pending
                    .iter()
                    .filter(|(_, c)| c.worker == u32::from(p))
                    .map(|(&op, _)| op)
                    .collect();
                for op in gone {
                    if let Some(call) = pending.remove(&op) {
                        complete(
                            &mut ops,
                            op,
                            call,
                            at,
                            Outcome::Ambiguous(Ambiguity::Timeout),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    let last = steps.last().map(|(s, _)| s);
    let end = TICK * (u32::from(last.map_or(0, |s| s.now)) + u32::from(TTL) + 1);
    for (op, call) in std::mem::take(&mut pending) {
        complete(
            &mut ops,
            op,
            call,
            end,
            Outcome::Ambiguous(Ambiguity::Timeout),
        );
    }
    ops.sort_by_key(|o| (o.completed, o.id));
    let mut store_logs = BTreeMap::new();
    if let Some(last) = last {
        for (session, store) in last.store.iter().enumerate() {
            let log = store
                .log
                .iter()
                .zip(1..)
                .map(|(landed, seq)| Logged {
                    seq,
                    op: u64::from(landed.op),
                })
                .collect();
            store_logs.insert(Arc::from(format!("s{session}")), log);
        }
    }
    History {
        ops,
        store_logs,
        ..History::default()
    }
}
