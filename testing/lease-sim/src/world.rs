//! What the simulation sees that no process can: every grant, every write
//! the store applied, and the authority's table at the instant a process
//! counts on its lease. The checks run here, as things happen, and the
//! recent events are kept to show what led to a violation.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How many recent events are kept for a violation's report.
const KEPT_EVENTS: usize = 400;
/// Events shown before a violation, and recorded after it.
const SHOWN_BEFORE: usize = 60;
const SHOWN_AFTER: usize = 10;

/// A rule the simulation saw broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The authority granted one token of a session to two owners.
    OneOwnerPerToken,
    /// The store applied a write with a lower token than one it had
    /// applied: after a takeover, the old owner changed the session.
    StoreOrder,
    /// The store applied writes of one token from two writers, or from a
    /// writer whose owner was not granted that token.
    OneWriterPerToken,
    /// A process counted on its lease (time left by its keeper's
    /// reckoning) while the authority did not hold that lease for it, with
    /// every clock within the bound the keeper assumes.
    HolderBelief,
}

impl Rule {
    /// The rule's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Rule::OneOwnerPerToken => "one-owner-per-token",
            Rule::StoreOrder => "store-order",
            Rule::OneWriterPerToken => "one-writer-per-token",
            Rule::HolderBelief => "holder-belief",
        }
    }
}

/// The first rule broken, what broke it, and the events around it.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// Simulated time of the violation.
    pub at: Duration,
    /// What happened, in words.
    pub detail: String,
    /// The events before the violation and a few after, one per line.
    pub around: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} broken at {:.3} s: {}",
            self.rule.name(),
            self.at.as_secs_f64(),
            self.detail
        )?;
        writeln!(f, "events around it:")?;
        for line in &self.around {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// The fence a write carried, as the store reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub token: u64,
    pub writer: String,
}

#[derive(Debug, Default)]
struct SessionState {
    /// The store's high-water mark, bound to the writer that set it.
    mark: Option<Mark>,
    /// The last write applied, and the writers seen per token.
    last_applied: Option<u64>,
    writers: BTreeMap<u64, String>,
    /// The owner each token was granted to.
    grants: BTreeMap<u64, String>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Every event is also printed, as it happens.
    trace: bool,
    events: VecDeque<String>,
    digest: u64,
    sessions: BTreeMap<String, SessionState>,
    violation: Option<Violation>,
    after_violation: usize,
    /// Until when a holder's belief is not judged: a clock left the bound.
    excused_until: Duration,
    lease_calls: u64,
    writes: u64,
    faults: u64,
}

/// The simulation's omniscient record. One per run, shared by every host.
#[derive(Debug, Default)]
pub struct World {
    inner: Mutex<Inner>,
}

/// Counters of what a run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Lease calls answered by the authority (each lease of a batch counts).
    pub lease_calls: u64,
    /// Writes that reached the store, applied or refused.
    pub writes: u64,
    /// Faults injected.
    pub faults: u64,
}

impl World {
    /// A record that prints every event to standard error when `trace`.
    pub fn new(trace: bool) -> Self {
        let world = World::default();
        world.lock().trace = trace;
        world
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an event at simulated time `at`.
    pub(crate) fn event(&self, at: Duration, what: impl fmt::Display) {
        self.lock()
            .record(format!("{:>10.4} {what}", at.as_secs_f64()));
    }

    /// Records an injected fault.
    pub(crate) fn fault(&self, at: Duration, what: impl fmt::Display) {
        let mut g = self.lock();
        g.faults += 1;
        g.record(format!("{:>10.4} fault: {what}", at.as_secs_f64()));
    }

    /// Holder beliefs are not judged until `until`: a clock was moved
    /// beyond what the keeper assumes.
    pub(crate) fn excuse_until(&self, until: Duration) {
        let mut g = self.lock();
        g.excused_until = g.excused_until.max(until);
    }

    /// The authority granted `token` of `session` to `owner`.
    pub(crate) fn granted(&self, at: Duration, session: &str, token: u64, owner: &str) {
        let mut g = self.lock();
        g.lease_calls += 1;
        let state = g.sessions.entry(session.to_owned()).or_default();
        let earlier = state.grants.insert(token, owner.to_owned());
        if let Some(earlier) = earlier
            && earlier != owner
        {
            g.violate(
                Rule::OneOwnerPerToken,
                at,
                format!("{session}: token {token} granted to {earlier}, then to {owner}"),
            );
        }
        g.record(format!(
            "{:>10.4} authority: {session} token {token} to {owner}",
            at.as_secs_f64()
        ));
    }

    /// A lease call other than a grant was answered.
    pub(crate) fn lease_call(&self) {
        self.lock().lease_calls += 1;
    }

    /// The store received a write; `admit` decides it from the session's
    /// mark. Answers whether it was applied, after checking what applying
    /// it means.
    pub(crate) fn store_write(
        &self,
        at: Duration,
        session: &str,
        fence: Mark,
        tag: &str,
        admit: impl FnOnce(Option<&Mark>, &Mark) -> bool,
    ) -> bool {
        let mut g = self.lock();
        g.writes += 1;
        let state = g.sessions.entry(session.to_owned()).or_default();
        if !admit(state.mark.as_ref(), &fence) {
            let line = format!(
                "{:>10.4} store: {session} refused {tag} (token {} by {}; mark {:?})",
                at.as_secs_f64(),
                fence.token,
                fence.writer,
                state.mark.as_ref().map(|m| m.token)
            );
            g.record(line);
            return false;
        }
        if state.mark.as_ref().is_none_or(|m| fence.token > m.token) {
            state.mark = Some(fence.clone());
        }
        let mut broken = Vec::new();
        if let Some(last) = state.last_applied
            && fence.token < last
        {
            broken.push((
                Rule::StoreOrder,
                format!(
                    "{session}: applied {tag} with token {} after a write with token {last}",
                    fence.token
                ),
            ));
        }
        state.last_applied = Some(state.last_applied.unwrap_or(0).max(fence.token));
        let first = state
            .writers
            .entry(fence.token)
            .or_insert_with(|| fence.writer.clone());
        if *first != fence.writer {
            broken.push((
                Rule::OneWriterPerToken,
                format!(
                    "{session}: token {} written by {first}, then by {} ({tag})",
                    fence.token, fence.writer
                ),
            ));
        }
        let owner = fence.writer.split('#').next().unwrap_or_default();
        match state.grants.get(&fence.token) {
            Some(granted) if granted != owner => broken.push((
                Rule::OneWriterPerToken,
                format!(
                    "{session}: {} wrote {tag} with token {}, which was granted to {granted}",
                    fence.writer, fence.token
                ),
            )),
            _ => {}
        }
        g.record(format!(
            "{:>10.4} store: {session} applied {tag} (token {} by {})",
            at.as_secs_f64(),
            fence.token,
            fence.writer
        ));
        for (rule, detail) in broken {
            g.violate(rule, at, detail);
        }
        true
    }

    /// `owner` counts on `token` of `session` at `at`; the authority's live
    /// lease for it is `held` (token and owner), if any.
    pub(crate) fn belief(
        &self,
        at: Duration,
        session: &str,
        owner: &str,
        token: u64,
        held: Option<(u64, String)>,
    ) {
        let mut g = self.lock();
        if at < g.excused_until {
            return;
        }
        let agrees = held
            .as_ref()
            .is_some_and(|(t, o)| *t == token && o == owner);
        if !agrees {
            g.violate(
                Rule::HolderBelief,
                at,
                format!(
                    "{owner} counts on {session} token {token}, but the authority holds {}",
                    match held {
                        Some((t, o)) => format!("token {t} for {o}"),
                        None => "no lease".to_owned(),
                    }
                ),
            );
        }
    }

    /// The first violation, once its events after it are in.
    pub fn violation(&self) -> Option<Violation> {
        let g = self.lock();
        g.violation
            .clone()
            .filter(|_| g.after_violation >= SHOWN_AFTER)
    }

    /// Whether a violation was seen (its report may still be filling).
    pub fn violated(&self) -> bool {
        self.lock().violation.is_some()
    }

    /// The violation as it stands, whether or not its later events are in.
    pub fn violation_now(&self) -> Option<Violation> {
        self.lock().violation.clone()
    }

    /// What the run did so far.
    pub fn counts(&self) -> Counts {
        let g = self.lock();
        Counts {
            lease_calls: g.lease_calls,
            writes: g.writes,
            faults: g.faults,
        }
    }

    /// A digest of every event in order: two runs of one seed must give
    /// the same.
    pub fn digest(&self) -> u64 {
        self.lock().digest
    }
}

impl Inner {
    fn record(&mut self, line: String) {
        if self.trace {
            eprintln!("{line}");
        }
        // FNV-1a over the event's text: a stable digest, no dependency.
        for b in line.bytes() {
            self.digest = (self.digest ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        if let Some(v) = &mut self.violation
            && self.after_violation < SHOWN_AFTER
        {
            v.around.push(line.clone());
            self.after_violation += 1;
        }
        if self.events.len() == KEPT_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(line);
    }

    fn violate(&mut self, rule: Rule, at: Duration, detail: String) {
        if self.violation.is_some() {
            return;
        }
        let skip = self.events.len().saturating_sub(SHOWN_BEFORE);
        let mut around: Vec<String> = self.events.iter().skip(skip).cloned().collect();
        around.push(format!(
            "{:>10.4} VIOLATION {}: {detail}",
            at.as_secs_f64(),
            rule.name()
        ));
        self.violation = Some(Violation {
            rule,
            at,
            detail,
            around,
        });
    }
}
