//! Serves: k8slease tests and fault runs — no kubectl test injects a fault.
//!
//! Injected faults: added latency, failing replies, and writes that commit
//! but whose reply never arrives.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use crate::verb::Verb;

/// A 5xx answer given instead of doing the request (nothing is written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 500, reason `InternalError`.
    InternalError,
    /// 503, reason `ServiceUnavailable`.
    ServiceUnavailable,
    /// 504, reason `Timeout`.
    GatewayTimeout,
}

/// How the reply to a committed write is lost. The API server does both:
/// a connection can break after etcd committed, and the request timeout
/// can fire after the write landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DroppedReply {
    /// Close the connection without answering.
    CloseConnection,
    /// Answer 504 `Timeout` although the write committed.
    Timeout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultAction {
    Fail(Failure),
    DropReply(DroppedReply),
}

#[derive(Debug, Clone)]
struct Rule {
    action: FaultAction,
    remaining: u32,
    verb: Option<Verb>,
}

#[derive(Debug, Default)]
struct State {
    latency: Duration,
    failures: Vec<Rule>,
    drops: Vec<Rule>,
}

/// The fault injection handle. Faults apply to requests on resources
/// (not discovery), in the order they were added; each rule is used up by
/// `count` matching requests. Clones share the rules.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    inner: Arc<Mutex<State>>,
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Rules are plain values: a panic elsewhere leaves them consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Delays every request on a resource by `latency` before it is
    /// handled (zero turns it off).
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// The next `count` requests (with `verb`, or any verb when `None`)
    /// answer `failure` without being carried out.
    pub fn fail_next(&self, count: u32, failure: Failure, verb: Option<Verb>) {
        self.lock().failures.push(Rule {
            action: FaultAction::Fail(failure),
            remaining: count,
            verb,
        });
    }

    /// The next `count` successful requests (with `verb`, or any verb when
    /// `None`) are carried out, and committed if they write, but their
    /// reply is lost as `how` says. Requests that fail are answered
    /// normally and do not use the rule up.
    pub fn drop_reply_after_commit(&self, count: u32, how: DroppedReply, verb: Option<Verb>) {
        self.lock().drops.push(Rule {
            action: FaultAction::DropReply(how),
            remaining: count,
            verb,
        });
    }

    /// Removes every fault and the latency.
    pub fn clear(&self) {
        let mut state = self.lock();
        *state = State::default();
    }

    /// Injected faults not used up yet (failures and dropped replies).
    pub fn pending(&self) -> u32 {
        let state = self.lock();
        state
            .failures
            .iter()
            .chain(state.drops.iter())
            .map(|r| r.remaining)
            .sum()
    }

    pub(crate) fn latency(&self) -> Duration {
        self.lock().latency
    }

    pub(crate) fn take_failure(&self, verb: Verb) -> Option<Failure> {
        match take(&mut self.lock().failures, verb)? {
            FaultAction::Fail(f) => Some(f),
            FaultAction::DropReply(_) => None,
        }
    }

    pub(crate) fn take_drop(&self, verb: Verb) -> Option<DroppedReply> {
        match take(&mut self.lock().drops, verb)? {
            FaultAction::DropReply(d) => Some(d),
            FaultAction::Fail(_) => None,
        }
    }
}

fn take(rules: &mut Vec<Rule>, verb: Verb) -> Option<FaultAction> {
    let rule = rules
        .iter_mut()
        .find(|r| r.remaining > 0 && r.verb.is_none_or(|v| v == verb))?;
    rule.remaining -= 1;
    let action = rule.action;
    rules.retain(|r| r.remaining > 0);
    Some(action)
}
