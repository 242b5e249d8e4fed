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
    /// The authority handled the release of a lease while a write made
    /// under it was still running: released early, the write could land
    /// inside the next owner's run.
    ReleaseBeforeWritesSettle,
}

impl Rule {
    /// The rule's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Rule::OneOwnerPerToken => "one-owner-per-token",
            Rule::StoreOrder => "store-order",
            Rule::OneWriterPerToken => "one-writer-per-token",
            Rule::HolderBelief => "holder-belief",
            Rule::ReleaseBeforeWritesSettle => "release-before-writes-settle",
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
    /// When the authority last granted or renewed each token.
    refreshed: BTreeMap<u64, Duration>,
    /// Writes running per token: begun and not yet ended.
    writes_running: BTreeMap<u64, u32>,
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
    /// When the authority's clock was stepped forward, beyond what the
    /// keeper assumes: a lease the authority last granted or renewed
    /// before such a step may end early, for a TTL after it.
    forward_steps: Vec<Duration>,
    ttl: Duration,
    counts: Counts,
}

/// The simulation's omniscient record. One per run, shared by every host.
#[derive(Debug, Default)]
pub struct World {
    inner: Mutex<Inner>,
}

/// Counters of what a run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Acquisitions the authority granted.
    pub grants: u64,
    /// Renewals the authority granted (each lease of a batch counts).
    pub renewals: u64,
    /// Releases the authority handled.
    pub releases: u64,
    /// Acquisitions and renewals the authority refused or failed.
    pub refusals: u64,
    /// Other lease calls (reads of the current holder).
    pub reads: u64,
    /// Writes the store applied.
    pub writes_applied: u64,
    /// Writes the store refused by their fence.
    pub writes_refused: u64,
    /// Faults injected.
    pub faults: u64,
}

impl Counts {
    /// Lease calls the authority answered.
    pub fn lease_calls(&self) -> u64 {
        self.grants + self.renewals + self.releases + self.refusals + self.reads
    }

    /// Writes that reached the store.
    pub fn writes(&self) -> u64 {
        self.writes_applied + self.writes_refused
    }
}

/// A write under way; the world counts it as running until this is dropped
/// (its answer came, its patience ran out, or its host crashed).
#[derive(Debug)]
pub(crate) struct RunningWrite {
    world: std::sync::Arc<World>,
    session: String,
    token: u64,
}

impl Drop for RunningWrite {
    fn drop(&mut self) {
        let mut g = self.world.lock();
        if let Some(state) = g.sessions.get_mut(&self.session)
            && let Some(n) = state.writes_running.get_mut(&self.token)
        {
            *n = n.saturating_sub(1);
        }
    }
}

impl World {
    /// A record of a run whose leases last `ttl`, printing every event to
    /// standard error when `trace`.
    pub fn new(ttl: Duration, trace: bool) -> Self {
        let world = World::default();
        {
            let mut g = world.lock();
            g.trace = trace;
            g.ttl = ttl;
        }
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
        g.counts.faults += 1;
        g.record(format!("{:>10.4} fault: {what}", at.as_secs_f64()));
    }

    /// The authority's clock was stepped forward at `at`.
    pub(crate) fn forward_step(&self, at: Duration) {
        let mut g = self.lock();
        let ttl = g.ttl;
        g.forward_steps.retain(|step| *step + ttl > at);
        g.forward_steps.push(at);
    }

    /// The authority granted `token` of `session` to `owner`.
    pub(crate) fn granted(&self, at: Duration, session: &str, token: u64, owner: &str) {
        let mut g = self.lock();
        g.counts.grants += 1;
        let state = g.sessions.entry(session.to_owned()).or_default();
        state.refreshed.insert(token, at);
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

    /// The authority renewed `token` of `session`.
    pub(crate) fn renewed(&self, at: Duration, session: &str, token: u64) {
        let mut g = self.lock();
        g.counts.renewals += 1;
        let state = g.sessions.entry(session.to_owned()).or_default();
        state.refreshed.insert(token, at);
        g.record(format!(
            "{:>10.4} authority: {session} token {token} renewed",
            at.as_secs_f64()
        ));
    }

    /// The authority refused (or failed) an acquisition or renewal.
    pub(crate) fn refused(&self, at: Duration, session: &str, what: &str) {
        let mut g = self.lock();
        g.counts.refusals += 1;
        g.record(format!(
            "{:>10.4} authority: {session} {what} refused",
            at.as_secs_f64()
        ));
    }

    /// The authority is about to handle the release of `token` of
    /// `session`: no write made under it may still be running.
    pub(crate) fn releasing(&self, at: Duration, session: &str, token: u64) {
        let mut g = self.lock();
        g.counts.releases += 1;
        let running = g
            .sessions
            .get(session)
            .and_then(|s| s.writes_running.get(&token).copied())
            .unwrap_or(0);
        g.record(format!(
            "{:>10.4} authority: {session} token {token} released",
            at.as_secs_f64()
        ));
        if running > 0 {
            g.violate(
                Rule::ReleaseBeforeWritesSettle,
                at,
                format!("{session}: token {token} released with {running} of its writes running"),
            );
        }
    }

    /// A lease call that neither grants nor releases (a read).
    pub(crate) fn read(&self) {
        self.lock().counts.reads += 1;
    }

    /// A write under `token` of `session` begins; it runs until the
    /// returned value is dropped.
    pub(crate) fn write_begins(
        self: &std::sync::Arc<Self>,
        session: &str,
        token: u64,
    ) -> RunningWrite {
        let mut g = self.lock();
        let state = g.sessions.entry(session.to_owned()).or_default();
        *state.writes_running.entry(token).or_default() += 1;
        RunningWrite {
            world: std::sync::Arc::clone(self),
            session: session.to_owned(),
            token,
        }
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
        let state = g.sessions.entry(session.to_owned()).or_default();
        if !admit(state.mark.as_ref(), &fence) {
            let line = format!(
                "{:>10.4} store: {session} refused {tag} (token {} by {}; mark {:?})",
                at.as_secs_f64(),
                fence.token,
                fence.writer,
                state.mark.as_ref().map(|m| m.token)
            );
            g.counts.writes_refused += 1;
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
        g.counts.writes_applied += 1;
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
        let agrees = held
            .as_ref()
            .is_some_and(|(t, o)| *t == token && o == owner);
        if !agrees && !g.excused(session, token, at) {
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

    /// The violation as it stands, whether or not its later events are in.
    pub fn violation_now(&self) -> Option<Violation> {
        self.lock().violation.clone()
    }

    /// What the run did so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// A digest of every event in order: two runs of one seed must give
    /// the same.
    pub fn digest(&self) -> u64 {
        self.lock().digest
    }
}

impl Inner {
    /// Whether a belief in `token` of `session` at `at` is beyond the
    /// keeper's assumptions: the authority last granted or renewed it
    /// before a forward step of its clock less than a TTL ago.
    fn excused(&self, session: &str, token: u64, at: Duration) -> bool {
        let refreshed = self
            .sessions
            .get(session)
            .and_then(|s| s.refreshed.get(&token).copied());
        self.forward_steps
            .iter()
            .any(|&step| step <= at && at < step + self.ttl && refreshed.is_none_or(|r| r <= step))
    }

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
