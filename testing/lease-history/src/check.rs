//! The checker: the lease model, the three properties, the verdict.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use crate::history::{Fault, FaultKind, History, Op, OpKind, Outcome, Rewind, ms};

/// The properties a history must keep, per session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Property {
    /// (a) At most one owner holds a valid lease at any instant.
    SingleHolder,
    /// (b) A grant's token is above every token granted earlier to another
    /// owner, never below the owner's own earlier tokens, and a renewal
    /// keeps the token.
    TokenOrder,
    /// (c) The store never accepts a write whose token is below one it
    /// accepted before, nor an equal token from another owner; it keeps
    /// what it acknowledged, drops what it refused, and its order agrees
    /// with real time.
    StoreFencing,
    /// (d) A session server's runs never interleave in its log: once an
    /// event of a later run is stored, no event of an earlier run follows.
    RunOrder,
    /// (e) A session server's log is whole: sequence numbers follow each
    /// other, every run is well formed and every run a client saw end is
    /// stored as the client saw it.
    LogIntegrity,
    /// (f) State that went back, or may, is refused, never used: no client
    /// from before a [rewind](crate::Rewind) succeeds at what went back
    /// once it has, and nothing succeeds while the authority runs with an
    /// evicting memory policy ([`FaultKind::EvictingPolicy`]).
    Rewound,
    /// (g) Side effects fenced at their destination by the run's token and
    /// idempotency key: a key is performed at most once, none under a token
    /// below one performed for its session before, and each names a run the
    /// session's log holds under that token.
    EffectFencing,
}

impl Property {
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Property::SingleHolder => "single-holder",
            Property::TokenOrder => "token-order",
            Property::StoreFencing => "store-fencing",
            Property::RunOrder => "run-order",
            Property::LogIntegrity => "log-integrity",
            Property::Rewound => "rewound",
            Property::EffectFencing => "effect-fencing",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A span during which, by the lease model, `owner` may act for `session`
/// under `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The session held.
    pub session: Arc<str>,
    /// Who holds it.
    pub owner: Arc<str>,
    /// Under which token.
    pub token: u64,
    /// The grant's completion: the holder cannot count on it earlier.
    pub from: Duration,
    /// The grant's expiry counted from its invocation on the authority's
    /// clock, or the invocation of the holder's release of it if earlier.
    pub until: Duration,
    /// The acquire or renew that granted it.
    pub op: u64,
}

/// One broken rule, with the operations that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which property.
    pub property: Property,
    /// The session it happened on.
    pub session: Arc<str>,
    /// When it became visible on the history's timeline.
    pub at: Duration,
    /// The operations involved (ids).
    pub ops: Vec<u64>,
    /// What is wrong, in one sentence.
    pub message: String,
    /// The involved operations and a few of the session's operations
    /// either side, one per line, the involved ones marked `>>`.
    pub context: String,
}

/// The result of [`check`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Operations checked.
    pub ops: usize,
    /// Faults in the history, by [`FaultKind::name`].
    pub faults: BTreeMap<&'static str, usize>,
    /// Violations found, by property (properties without any are absent).
    pub violations: BTreeMap<Property, usize>,
    /// The earliest violation on the timeline.
    pub first: Option<Violation>,
    /// Operations completed up to the first violation.
    pub ops_to_first: Option<usize>,
    /// Per property, operations completed up to its first violation.
    pub ops_to_first_by: BTreeMap<Property, usize>,
}

impl Verdict {
    /// No violation of any property.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Violations of all properties together.
    pub fn total(&self) -> usize {
        self.violations.values().sum()
    }

    /// Violations of one property.
    pub fn count(&self, property: Property) -> usize {
        self.violations.get(&property).copied().unwrap_or(0)
    }

    /// Faults of all kinds together.
    pub fn fault_total(&self) -> usize {
        self.faults.values().sum()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "operations: {}", self.ops)?;
        write!(f, "faults: {}", self.fault_total())?;
        for (kind, n) in &self.faults {
            write!(f, "  {kind}={n}")?;
        }
        writeln!(f)?;
        write!(f, "violations: {}", self.total())?;
        for (p, n) in &self.violations {
            write!(f, "  {p}={n}")?;
        }
        writeln!(f)?;
        if let Some(v) = &self.first {
            writeln!(
                f,
                "first violation ({}, session {}, at {:.3}ms, after {} operations): {}",
                v.property,
                v.session,
                ms(v.at),
                self.ops_to_first.unwrap_or(0),
                v.message
            )?;
            f.write_str(&v.context)?;
        }
        Ok(())
    }
}

/// Checks `history` against the lease model; see the [crate
/// documentation](crate#the-lease-model) for the model and the rules.
pub fn check(history: &History) -> Verdict {
    let by_session = ops_by_session(history);
    let jumps = ClockSteps::new(history);
    let eras = Eras::new(history);
    let mut found = Vec::new();
    for (session, ops) in &by_session {
        for ops in eras.split(ops) {
            let holds = holds_of(&ops, &jumps);
            single_holder(session, &holds, &ops, &mut found);
            token_order(session, &ops, &mut found);
        }
        if let Some(log) = history.store_logs.get(session) {
            store_fencing(session, ops, log, &history.rewinds, &mut found);
        }
        rewound(session, ops, history, &mut found);
    }
    let mut verdict = Verdict {
        ops: history.ops.len(),
        ..Verdict::default()
    };
    for fault in &history.faults {
        *verdict.faults.entry(fault.kind.name()).or_default() += 1;
    }
    let mut completions: Vec<Duration> = history.ops.iter().map(|op| op.completed).collect();
    completions.sort_unstable();
    let ops_until = |at: Duration| completions.partition_point(|c| *c <= at);
    let mut first_at: BTreeMap<Property, Duration> = BTreeMap::new();
    for v in &found {
        *verdict.violations.entry(v.property).or_default() += 1;
        let at = first_at.entry(v.property).or_insert(v.at);
        *at = (*at).min(v.at);
    }
    verdict.ops_to_first_by = first_at
        .into_iter()
        .map(|(p, at)| (p, ops_until(at)))
        .collect();
    if let Some(first) = found
        .into_iter()
        .min_by_key(|v| (v.at, v.property, v.ops.clone()))
    {
        verdict.ops_to_first = Some(ops_until(first.at));
        let ops = &by_session[&first.session];
        let context = context(ops, &first.ops, &history.faults);
        verdict.first = Some(Violation { context, ..first });
    }
    verdict
}

/// Every hold in `history` by the lease model, per session (and per era
/// between accepted rewinds) in order of start.
pub fn holds(history: &History) -> Vec<Hold> {
    let jumps = ClockSteps::new(history);
    let eras = Eras::new(history);
    ops_by_session(history)
        .values()
        .flat_map(|ops| eras.split(ops))
        .flat_map(|ops| holds_of(&ops, &jumps))
        .collect()
}

/// The eras of a history: from one accepted rewind to the next. Clients of
/// an era hold and take over under one state; the clients that accepted a
/// rewind start over on the older state, so holds and tokens are judged
/// per era (what lies across is the rewind rule's to judge).
struct Eras {
    /// The epochs that began an era, in order.
    starts: Vec<u32>,
}

impl Eras {
    fn new(history: &History) -> Self {
        let mut starts: Vec<u32> = history
            .rewinds
            .iter()
            .filter_map(|r| r.accepted_by)
            .collect();
        starts.sort_unstable();
        starts.dedup();
        Eras { starts }
    }

    fn of(&self, op: &Op) -> usize {
        self.starts.partition_point(|&e| e <= op.epoch)
    }

    /// `ops` (in order) split by era, each part in the same order.
    fn split<'a>(&self, ops: &[&'a Op]) -> Vec<Vec<&'a Op>> {
        let mut parts = vec![Vec::new(); self.starts.len() + 1];
        for op in ops {
            parts[self.of(op)].push(*op);
        }
        parts.retain(|p| !p.is_empty());
        parts
    }
}

/// Each session's operations, in order of invocation.
fn ops_by_session(history: &History) -> BTreeMap<Arc<str>, Vec<&Op>> {
    let mut by: BTreeMap<Arc<str>, Vec<&Op>> = BTreeMap::new();
    for op in &history.ops {
        by.entry(Arc::clone(&op.session)).or_default().push(op);
    }
    for session in history.store_logs.keys() {
        by.entry(Arc::clone(session)).or_default();
    }
    for ops in by.values_mut() {
        ops.sort_by_key(|op| (op.invoked, op.id));
    }
    by
}

/// What the authority's clock did, at an instant of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ClockChange {
    /// Stepped by this many nanoseconds, signed, at some instant between
    /// the fault's start and end (here, in nanoseconds of the timeline).
    Step {
        by: i128,
        started: i128,
        ended: i128,
    },
    /// Runs at this many thousandths of real time from here on.
    Rate(i128),
}

/// Steps and rate spells of the authority's clock, in timeline order.
///
/// A step happened at an unknown instant within its fault's record, and a
/// grant read the authority's clock at an unknown instant between its
/// invocation and completion. Every choice below ends holds as early as
/// the clock could have, so no hold is longer than the backend's:
/// - a forward step shortens every hold invoked before the step's record
///   ended, from the step's start or the invocation, whichever is later;
/// - a backward step lengthens only holds granted (completed) before the
///   step's record began, and only from the record's end;
/// - a fast spell is recorded from before it began to after it ended, a
///   slow one within its true span.
struct ClockSteps {
    /// Forward steps at their start, backward steps at their end, rate
    /// changes where recorded.
    changes: Vec<(Duration, ClockChange)>,
    /// The longest record of a forward step: how far back one may start
    /// and still straddle an invocation.
    longest_forward: Duration,
}

const NORMAL_RATE: i128 = 1000;

impl ClockSteps {
    fn new(history: &History) -> Self {
        let mut changes = Vec::new();
        let mut longest_forward = Duration::ZERO;
        for f in &history.faults {
            let (started, ended) = (f.started.as_nanos() as i128, f.ended.as_nanos() as i128);
            match f.kind {
                FaultKind::ClockForward(by) => {
                    longest_forward = longest_forward.max(f.ended.saturating_sub(f.started));
                    let by = by.as_nanos() as i128;
                    changes.push((f.started, ClockChange::Step { by, started, ended }));
                }
                FaultKind::ClockBackward(by) => {
                    let by = -(by.as_nanos() as i128);
                    changes.push((f.ended, ClockChange::Step { by, started, ended }));
                }
                FaultKind::ClockRate(per_mille) => {
                    changes.push((f.started, ClockChange::Rate(i128::from(per_mille.max(1)))));
                    changes.push((f.ended, ClockChange::Rate(NORMAL_RATE)));
                }
                _ => {}
            }
        }
        changes.sort();
        ClockSteps {
            changes,
            longest_forward,
        }
    }

    /// The instant on the timeline when `valid_for` has passed on the
    /// authority's clock for a grant invoked at `invoked` and completed at
    /// `completed`, counted from its invocation.
    fn deadline(&self, invoked: Duration, completed: Duration, valid_for: Duration) -> Duration {
        let start = self.changes.partition_point(|(at, _)| *at < invoked);
        let mut rate = self.changes[..start]
            .iter()
            .rev()
            .find_map(|(_, c)| match c {
                ClockChange::Rate(r) => Some(*r),
                ClockChange::Step { .. } => None,
            })
            .unwrap_or(NORMAL_RATE);
        let mut t = invoked.as_nanos() as i128;
        let done = completed.as_nanos() as i128;
        // Nanoseconds of the authority's clock still to pass.
        let mut left = valid_for.as_nanos() as i128;
        // A forward step whose record straddles the invocation may have
        // come after the grant read the clock: it counts at once.
        let reach = invoked.saturating_sub(self.longest_forward);
        for (at, change) in self.changes[..start].iter().rev() {
            if *at < reach {
                break;
            }
            if let ClockChange::Step { by, ended, .. } = *change
                && by > 0
                && ended > t
            {
                left -= by;
            }
        }
        if left <= 0 {
            return invoked;
        }
        for &(at, change) in &self.changes[start..] {
            let at = at.as_nanos() as i128;
            let passes = (at - t) * rate / NORMAL_RATE;
            if passes >= left {
                break;
            }
            left -= passes;
            t = at;
            match change {
                ClockChange::Step { by, started, .. } => {
                    // A backward step that may have come before the grant
                    // read the clock lengthens nothing.
                    if by < 0 && started < done {
                        continue;
                    }
                    left -= by;
                    if left <= 0 {
                        return nanos(t);
                    }
                }
                ClockChange::Rate(r) => rate = r,
            }
        }
        nanos(t + left * NORMAL_RATE / rate)
    }
}

fn nanos(n: i128) -> Duration {
    Duration::from_nanos(n.clamp(0, u64::MAX as i128) as u64)
}

fn holds_of(ops: &[&Op], jumps: &ClockSteps) -> Vec<Hold> {
    // Invocations per (owner, token), in order, of what ends a grant: a
    // release, or a later grant of the same lease (a renewal, the holder's
    // own re-acquire), whose expiry replaces the earlier one's — and may
    // come sooner, after the authority's clock stepped back.
    let mut releases: HashMap<(&str, u64), Vec<Duration>> = HashMap::new();
    let mut regrants: HashMap<(&str, u64), Vec<Duration>> = HashMap::new();
    // Releases that may take effect after a later grant of the same lease
    // (the holder re-acquired its live lease while its release was in
    // doubt): per (owner, token), the instant from which that is possible.
    let mut late_releases: HashMap<(&str, u64), Vec<(Duration, Duration)>> = HashMap::new();
    // A grant to the same owner under any token (an acquire above a floor
    // answers a live holder a new one): the authority keeps one grant per
    // owner, so it replaces the earlier one, whose value no longer renews.
    let mut reacquires: HashMap<&str, Vec<Duration>> = HashMap::new();
    for op in ops {
        if let (OpKind::Release, Some(token)) = (op.kind, op.token) {
            releases
                .entry((&op.owner, token))
                .or_default()
                .push(op.invoked);
            // Answered, it took effect by its completion; unanswered, at
            // any time after its invocation.
            let lands_by = match op.outcome {
                Outcome::Done => op.completed,
                _ => Duration::MAX,
            };
            late_releases
                .entry((&op.owner, token))
                .or_default()
                .push((op.invoked, lands_by));
        }
        if let Outcome::Granted { token, .. } = op.outcome {
            regrants
                .entry((&op.owner, token))
                .or_default()
                .push(op.invoked);
            if op.kind == OpKind::Acquire {
                reacquires.entry(&op.owner).or_default().push(op.invoked);
            }
        }
    }
    for invocations in regrants.values_mut().chain(reacquires.values_mut()) {
        invocations.sort();
    }
    let mut holds = Vec::new();
    for op in ops {
        let Outcome::Granted { token, valid_for } = op.outcome else {
            continue;
        };
        let mut until = jumps.deadline(op.invoked, op.completed, valid_for);
        if let Some(rel) = releases.get(&(&*op.owner, token)) {
            let i = rel.partition_point(|at| *at < op.invoked);
            if let Some(&at) = rel.get(i) {
                until = until.min(at);
            }
        }
        // A release of this very lease invoked before the grant that may
        // land after its invocation can end it at any moment: the grant
        // promises nothing (the owner raced its own release).
        if let Some(late) = late_releases.get(&(&*op.owner, token))
            && late
                .iter()
                .any(|&(invoked, lands_by)| invoked < op.invoked && lands_by > op.invoked)
        {
            until = until.min(op.completed);
        }
        if let Some(next) = regrants.get(&(&*op.owner, token)) {
            let i = next.partition_point(|at| *at <= op.invoked);
            if let Some(&at) = next.get(i) {
                until = until.min(at);
            }
        }
        if let Some(next) = reacquires.get(&*op.owner) {
            let i = next.partition_point(|at| *at <= op.invoked);
            if let Some(&at) = next.get(i) {
                until = until.min(at);
            }
        }
        if until > op.completed {
            holds.push(Hold {
                session: Arc::clone(&op.session),
                owner: Arc::clone(&op.owner),
                token,
                from: op.completed,
                until,
                op: op.id,
            });
        }
    }
    holds.sort_by_key(|h| (h.from, h.op));
    holds
}

/// The two largest values seen, kept for two different owners, so the
/// largest of "every owner but X" is one comparison away.
#[derive(Default)]
struct TopTwo<'a> {
    best: Option<(u128, &'a str, u64)>,
    second: Option<(u128, &'a str, u64)>,
}

impl<'a> TopTwo<'a> {
    fn offer(&mut self, value: u128, owner: &'a str, op: u64) {
        let entry = Some((value, owner, op));
        match self.best {
            Some((v, o, _)) if o == owner => {
                if value > v {
                    self.best = entry;
                }
            }
            Some((v, _, _)) if value > v => {
                self.second = self.best;
                self.best = entry;
            }
            None => self.best = entry,
            Some(_) => {
                if self.second.is_none_or(|(v, _, _)| value > v) {
                    self.second = entry;
                }
            }
        }
        // The owner may have been second and just overtaken best.
        if let (Some(b), Some(s)) = (self.best, self.second)
            && b.1 == s.1
        {
            self.second = None;
        }
    }

    fn other_than(&self, owner: &str) -> Option<(u128, &'a str, u64)> {
        match self.best {
            Some(b) if b.1 != owner => Some(b),
            _ => self.second,
        }
    }
}

fn single_holder(session: &Arc<str>, holds: &[Hold], ops: &[&Op], out: &mut Vec<Violation>) {
    let _ = ops;
    let mut top = TopTwo::default();
    let mut tokens: HashMap<u64, u64> = HashMap::new();
    for h in holds {
        if let Some((until, owner, op)) = top.other_than(&h.owner)
            && until > h.from.as_nanos()
        {
            out.push(Violation {
                property: Property::SingleHolder,
                session: Arc::clone(session),
                at: h.from,
                ops: vec![op, h.op],
                message: format!(
                    "{} holds token {} from {:.3}ms while {} holds token {} until {:.3}ms",
                    h.owner,
                    h.token,
                    ms(h.from),
                    owner,
                    tokens.get(&op).copied().unwrap_or(0),
                    ms(nanos(until as i128))
                ),
                context: String::new(),
            });
        }
        tokens.insert(h.op, h.token);
        top.offer(h.until.as_nanos(), &h.owner, h.op);
    }
}

fn token_order(session: &Arc<str>, ops: &[&Op], out: &mut Vec<Violation>) {
    let granted: Vec<(&Op, u64)> = ops
        .iter()
        .filter_map(|op| match op.outcome {
            Outcome::Granted { token, .. } => Some((*op, token)),
            _ => None,
        })
        .collect();
    let mut by_completion = granted.clone();
    by_completion.sort_by_key(|(op, _)| (op.completed, op.id));
    let mut seen = 0;
    let mut top = TopTwo::default();
    let mut own_max: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut violation = |op: &Op, other: Option<u64>, message: String| {
        let mut involved: Vec<u64> = other.into_iter().collect();
        involved.push(op.id);
        out.push(Violation {
            property: Property::TokenOrder,
            session: Arc::clone(session),
            at: op.completed,
            ops: involved,
            message,
            context: String::new(),
        });
    };
    for &(op, token) in &granted {
        while let Some(&(earlier, t)) = by_completion.get(seen) {
            if earlier.completed >= op.invoked {
                break;
            }
            top.offer(u128::from(t), &earlier.owner, earlier.id);
            let own = own_max.entry(&earlier.owner).or_insert((t, earlier.id));
            if t > own.0 {
                *own = (t, earlier.id);
            }
            seen += 1;
        }
        if op.kind == OpKind::Renew && op.token != Some(token) {
            violation(
                op,
                None,
                format!(
                    "renew of token {} answered token {token}",
                    op.token.unwrap_or(0)
                ),
            );
        }
        if let Some((other, other_owner, other_op)) = top.other_than(&op.owner) {
            let other = other as u64;
            if other >= token {
                let message = match op.kind {
                    OpKind::Renew if other > token => format!(
                        "renew of token {token} by {} succeeded after {other_owner} was granted token {other}",
                        op.owner
                    ),
                    _ if other == token => format!(
                        "token {token} granted to {} after it was granted to {other_owner}",
                        op.owner
                    ),
                    _ => format!(
                        "takeover by {} got token {token}, not above token {other} granted earlier to {other_owner}",
                        op.owner
                    ),
                };
                violation(op, Some(other_op), message);
                continue;
            }
        }
        if op.kind == OpKind::Acquire
            && let Some(&(own, own_op)) = own_max.get(&*op.owner)
            && own > token
        {
            violation(
                op,
                Some(own_op),
                format!(
                    "{} acquired token {token} after holding token {own}",
                    op.owner
                ),
            );
        }
    }
}

fn store_fencing(
    session: &Arc<str>,
    ops: &[&Op],
    log: &[crate::history::Logged],
    rewinds: &[Rewind],
    out: &mut Vec<Violation>,
) {
    // A write a store rewind may have taken away, accepted by clients
    // started after the write's: done after its copy began.
    let lost_in_rewind = |op: &Op| {
        rewinds.iter().any(|r| {
            r.store && r.accepted_by.is_some_and(|e| op.epoch < e) && op.completed >= r.copy_started
        })
    };
    let writes: HashMap<u64, &Op> = ops
        .iter()
        .filter(|op| op.kind == OpKind::Write)
        .map(|op| (op.id, *op))
        .collect();
    let mut violation = |at: Duration, involved: Vec<u64>, message: String| {
        out.push(Violation {
            property: Property::StoreFencing,
            session: Arc::clone(session),
            at,
            ops: involved,
            message,
            context: String::new(),
        });
    };
    let mut mark: Option<(u64, &str, u64)> = None;
    let mut latest_invocation: Option<(Duration, u64)> = None;
    let mut landed = HashSet::new();
    let mut twice = Vec::new();
    for entry in log {
        let Some(op) = writes.get(&entry.op) else {
            violation(
                Duration::MAX,
                vec![entry.op],
                format!(
                    "the store holds event {} from op #{}, which no write of this session carried",
                    entry.seq, entry.op
                ),
            );
            continue;
        };
        if !landed.insert(op.id) {
            // A write applied twice: the session's state is not what any
            // writer made it, fenced or not.
            twice.push(Violation {
                property: Property::LogIntegrity,
                session: Arc::clone(session),
                at: op.completed,
                ops: vec![op.id],
                message: format!(
                    "the store holds the write of op #{} by {} twice (again at seq {})",
                    op.id, op.owner, entry.seq
                ),
                context: String::new(),
            });
            continue;
        }
        let token = op.token.unwrap_or(0);
        // An ambiguous write may have landed any time after its invocation.
        let seen_at = match op.outcome {
            Outcome::Done | Outcome::Fenced => op.completed,
            _ => op.invoked,
        };
        if op.outcome == Outcome::Fenced {
            violation(
                seen_at,
                vec![op.id],
                format!(
                    "write of token {token} by {} was refused, yet the store holds it (seq {})",
                    op.owner, entry.seq
                ),
            );
        }
        match mark {
            Some((m, m_owner, m_op)) if token < m => violation(
                seen_at,
                vec![m_op, op.id],
                format!(
                    "the store accepted token {token} from {} (seq {}) after accepting token {m} from {m_owner}",
                    op.owner, entry.seq
                ),
            ),
            Some((m, m_owner, m_op)) if token == m && m_owner != &*op.owner => violation(
                seen_at,
                vec![m_op, op.id],
                format!(
                    "the store accepted token {token} from {} (seq {}) while its mark {m} belongs to {m_owner}",
                    op.owner, entry.seq
                ),
            ),
            Some((m, _, _)) if token <= m => {}
            _ => mark = Some((token, &op.owner, op.id)),
        }
        if op.outcome == Outcome::Done
            && let Some((inv, inv_op)) = latest_invocation
            && op.completed < inv
        {
            violation(
                op.completed,
                vec![inv_op, op.id],
                format!(
                    "the store ordered op #{} (seq {}) after op #{inv_op}, which began only after #{} had been answered",
                    op.id, entry.seq, op.id
                ),
            );
        }
        if latest_invocation.is_none_or(|(inv, _)| op.invoked > inv) {
            latest_invocation = Some((op.invoked, op.id));
        }
    }
    for op in writes.values() {
        if op.outcome == Outcome::Done && !landed.contains(&op.id) && !lost_in_rewind(op) {
            violation(
                op.completed,
                vec![op.id],
                format!(
                    "write of token {} by {} was acknowledged but the store does not hold it",
                    op.token.unwrap_or(0),
                    op.owner
                ),
            );
        }
    }
    out.append(&mut twice);
}

/// (f): nothing succeeds on state that went back, or may.
fn rewound(session: &Arc<str>, ops: &[&Op], history: &History, out: &mut Vec<Violation>) {
    let mut violation = |op: &Op, message: String| {
        out.push(Violation {
            property: Property::Rewound,
            session: Arc::clone(session),
            at: op.completed,
            ops: vec![op.id],
            message,
            context: String::new(),
        });
    };
    for r in &history.rewinds {
        // The clients that were in use when it went back, up to those that
        // accepted it.
        let before = |op: &Op| {
            history.epoch_start(op.epoch) < r.started && r.accepted_by.is_none_or(|e| op.epoch < e)
        };
        // A release only gives up the caller's own hold (and succeeds,
        // doing nothing, where the older state has none); should it end a
        // hold the accepting clients took, their era shows two holders.
        let concerned = |op: &Op| match op.kind {
            OpKind::Write => r.store,
            OpKind::Acquire | OpKind::Renew => r.leases,
            OpKind::Release => false,
        };
        for op in ops {
            if op.invoked > r.ended && op.succeeded() && concerned(op) && before(op) {
                violation(
                    op,
                    format!(
                        "{}{} by {} through a client of epoch {} succeeded ({}) after {} went \
                         back ({:.3}..{:.3}ms), before its clients were restarted to accept it",
                        op.kind.name(),
                        op.token.map_or(String::new(), |t| format!(" of token {t}")),
                        op.owner,
                        op.epoch,
                        op.outcome,
                        r.target,
                        ms(r.started),
                        ms(r.ended)
                    ),
                );
            }
        }
    }
    for f in history
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::EvictingPolicy)
    {
        for op in ops {
            if op.invoked >= f.started && op.invoked <= f.ended && op.succeeded() {
                violation(
                    op,
                    format!(
                        "{} by {} succeeded ({}) while {} could evict ({:.3}..{:.3}ms)",
                        op.kind.name(),
                        op.owner,
                        op.outcome,
                        f.target,
                        ms(f.started),
                        ms(f.ended)
                    ),
                );
            }
        }
    }
}

/// How many of the session's operations either side of the violation the
/// report shows.
const CONTEXT_OPS: usize = 4;

fn context(ops: &[&Op], involved: &[u64], faults: &[Fault]) -> String {
    let positions: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| involved.contains(&op.id))
        .map(|(i, _)| i)
        .collect();
    let mut show: Vec<usize> = Vec::new();
    for &p in &positions {
        show.extend(p.saturating_sub(CONTEXT_OPS)..(p + CONTEXT_OPS + 1).min(ops.len()));
    }
    show.sort_unstable();
    show.dedup();
    let mut text = String::new();
    let mut last = None;
    for i in show {
        if last.is_some_and(|l: usize| i > l + 1) {
            text.push_str("   ...\n");
        }
        let mark = if involved.contains(&ops[i].id) {
            ">>"
        } else {
            "  "
        };
        let _ = writeln!(text, "{mark} {}", ops[i]);
        last = Some(i);
    }
    // The faults that were under way while those operations ran, and one
    // TTL's worth before: a fault's effect outlives its healing.
    let shown = positions.iter().flat_map(|&p| {
        let from = p.saturating_sub(CONTEXT_OPS);
        let to = (p + CONTEXT_OPS).min(ops.len().saturating_sub(1));
        [ops[from].invoked, ops[to].completed]
    });
    let (Some(lo), Some(hi)) = (shown.clone().min(), shown.max()) else {
        return text;
    };
    let lo = lo.saturating_sub(FAULT_LOOKBACK);
    let mut nearby: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.ended >= lo && f.started <= hi)
        .collect();
    nearby.sort_by_key(|f| f.started);
    if !nearby.is_empty() {
        text.push_str("   faults around it:\n");
    }
    for f in nearby {
        let _ = writeln!(
            text,
            "   !! {:>10.3}..{:<10.3}ms {} on {}",
            ms(f.started),
            ms(f.ended),
            f.kind.name(),
            f.target
        );
    }
    text
}

/// How far before the reported operations a fault is still listed.
const FAULT_LOOKBACK: Duration = Duration::from_secs(5);
