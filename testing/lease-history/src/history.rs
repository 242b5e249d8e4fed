//! The record of a run: operations, faults and what the store kept.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lease_port::{FencingToken, OwnerId, SessionId};

/// What an operation tried to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `SessionLease::acquire`.
    Acquire,
    /// `SessionLease::renew` of the lease carrying [`Op::token`].
    Renew,
    /// `SessionLease::release` of the lease carrying [`Op::token`].
    Release,
    /// `SessionStore::append` fenced by [`Op::token`].
    Write,
}

impl OpKind {
    /// Lower-case name, as printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Release => "release",
            OpKind::Write => "write",
        }
    }
}

/// Why an outcome is unknown: the operation may or may not have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ambiguity {
    /// No answer within the caller's deadline; the future was dropped.
    Timeout,
    /// The backend or store answered with a transient fault.
    Transient,
    /// Any other error (I/O, a busy lock): the caller cannot tell either.
    Other,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An acquire or renew succeeded: the caller holds `token` for
    /// `valid_for`, counted from the operation's invocation on the lease
    /// authority's clock.
    Granted {
        /// The token of the lease returned.
        token: u64,
        /// Time left on the grant as seen at invocation (never more than
        /// the backend's TTL).
        valid_for: Duration,
    },
    /// A release or a write succeeded.
    Done,
    /// An acquire or renew was refused: held elsewhere, or lost.
    Held,
    /// A write was refused by the store's fence.
    Fenced,
    /// The caller cannot know whether the operation took effect.
    Ambiguous(Ambiguity),
    /// Refused because the authority or the store answered from older state
    /// than the caller had seen, or runs so that it may lose state (an
    /// evicting memory policy): `LeaseErrorKind::Rewound`,
    /// `StoreErrorKind::Rewound`. Never a success; a lease write answered so
    /// may still have been applied (its hold lapses at its TTL), so it is
    /// judged as ambiguous where that matters.
    Rewound,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Granted { token, valid_for } => {
                write!(f, "granted token {token} for {}ms", valid_for.as_millis())
            }
            Outcome::Done => f.write_str("ok"),
            Outcome::Held => f.write_str("held"),
            Outcome::Fenced => f.write_str("fenced"),
            Outcome::Ambiguous(why) => write!(f, "ambiguous ({why:?})"),
            Outcome::Rewound => f.write_str("rewound"),
        }
    }
}

/// One completed operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Unique within the history, in order of invocation.
    pub id: u64,
    /// The worker (task, thread or process) that ran it.
    pub worker: u32,
    /// The owner the worker acts as.
    pub owner: Arc<str>,
    /// The session operated on.
    pub session: Arc<str>,
    /// What was tried.
    pub kind: OpKind,
    /// The token presented (renew, release, write); `None` for acquire.
    pub token: Option<u64>,
    /// When the call was made, from the start of the history.
    pub invoked: Duration,
    /// When its answer arrived (or the caller gave up), same timeline.
    pub completed: Duration,
    /// How it ended.
    pub outcome: Outcome,
    /// The incarnation of the clients it went through: 0 at the start of
    /// a run, one more at every restart of all of them
    /// ([`Restarts`](crate::Restarts)).
    pub epoch: u32,
}

impl Op {
    /// A success: granted, or done.
    pub fn succeeded(&self) -> bool {
        matches!(self.outcome, Outcome::Granted { .. } | Outcome::Done)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{:<6} {:>10.3}..{:<10.3}ms  w{:<2} {:<10} {:<8} {:<7}",
            self.id,
            ms(self.invoked),
            ms(self.completed),
            self.worker,
            self.owner,
            self.session,
            self.kind.name()
        )?;
        if let Some(t) = self.token {
            write!(f, " token {t}")?;
        }
        write!(f, " -> {}", self.outcome)?;
        if self.epoch > 0 {
            write!(f, " (epoch {})", self.epoch)?;
        }
        Ok(())
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What kind of fault was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The lease authority's wall clock stepped forward by this much.
    ClockForward(Duration),
    /// The lease authority's wall clock stepped back by this much.
    ClockBackward(Duration),
    /// The lease authority's wall clock ran at this many thousandths of
    /// real time (fast above 1000, slow below) while the fault lasted.
    ClockRate(u32),
    /// A holder stopped (did nothing, renewed nothing) past its TTL, then
    /// went on as if it still held the lease.
    HolderPause,
    /// A holder's own process stopped with SIGSTOP past its TTL, then
    /// resumed with SIGCONT: whatever it was doing carries on late.
    HolderStopped,
    /// A holder's own process killed with SIGKILL mid-operation (and a new
    /// one started in its place).
    HolderKilled,
    /// A service process stopped with SIGSTOP, then resumed with SIGCONT.
    ServicePause,
    /// A service process killed with SIGKILL (and started again).
    ServiceKill,
    /// A service restarted cleanly.
    ServiceRestart,
    /// Traffic through the fault proxy delayed.
    ProxyDelay,
    /// Connections through the fault proxy closed.
    ProxyDrop,
    /// Traffic through the fault proxy swallowed, connections kept open.
    ProxyBlackhole,
    /// Requests forwarded, replies discarded: writes commit unanswered.
    ProxyDropReplies,
    /// A service delays every request it handles.
    ServiceLatency,
    /// A service answers requests with 5xx errors instead of handling them.
    ServiceErrors,
    /// A service commits writes and then loses their replies.
    ServiceDropsReplies,
    /// Links of a network cut (packets vanish, nothing is refused), then
    /// healed.
    Partition,
    /// A second handle on the same lease store opened, used and closed in
    /// the holders' process (a descriptor closed under their locks).
    HandleChurn,
    /// A service's state went back to an older copy: restarted from an
    /// older snapshot, its storage rewound, a directory put back from a
    /// backup. What went back, and whether the loss was accepted, is in
    /// [`History::rewinds`].
    Rewind,
    /// The authority ran with a memory policy that evicts keys (named in
    /// the fault's target) and under memory pressure: every operation
    /// invoked meanwhile must be refused.
    EvictingPolicy,
}

impl FaultKind {
    /// Short name, the key of the per-kind counts.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ClockForward(_) => "clock-forward",
            FaultKind::ClockBackward(_) => "clock-backward",
            FaultKind::ClockRate(per_mille) if per_mille >= 1000 => "clock-fast",
            FaultKind::ClockRate(_) => "clock-slow",
            FaultKind::HolderPause => "holder-pause",
            FaultKind::HolderStopped => "holder-sigstop",
            FaultKind::HolderKilled => "holder-sigkill",
            FaultKind::ServicePause => "service-pause",
            FaultKind::ServiceKill => "service-kill",
            FaultKind::ServiceRestart => "service-restart",
            FaultKind::ProxyDelay => "proxy-delay",
            FaultKind::ProxyDrop => "proxy-drop",
            FaultKind::ProxyBlackhole => "proxy-blackhole",
            FaultKind::ProxyDropReplies => "proxy-drop-replies",
            FaultKind::ServiceLatency => "service-latency",
            FaultKind::ServiceErrors => "service-errors",
            FaultKind::ServiceDropsReplies => "service-drops-replies",
            FaultKind::HandleChurn => "handle-churn",
            FaultKind::Partition => "partition",
            FaultKind::Rewind => "rewind",
            FaultKind::EvictingPolicy => "evicting-policy",
        }
    }
}

/// One injected fault and how long it lasted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What was done.
    pub kind: FaultKind,
    /// What it was done to (a service, a worker, a proxy).
    pub target: Arc<str>,
    /// When injection began.
    pub started: Duration,
    /// When the fault was healed.
    pub ended: Duration,
}

/// One event the store kept, in the store's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// The store's sequence number.
    pub seq: u64,
    /// The id of the write [`Op`] that carried it.
    pub op: u64,
}

/// State that went back: a lease authority or a store (or both) came back
/// from an older copy of itself, losing what was done after the copy.
///
/// A rewind is data loss the deployment suffers; what must hold is that no
/// client that saw the newer state acts on the older one (its operations
/// fail [`Outcome::Rewound`]) until the clients are restarted to accept it
/// ([`accepted_by`](Self::accepted_by)), and that afterwards the rules hold
/// again. See the [crate documentation](crate#state-that-went-back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewind {
    /// What went back (a service, a directory), for reports.
    pub target: Arc<str>,
    /// The lease authority went back: its grants and tokens.
    pub leases: bool,
    /// The store went back: its events and high-water marks.
    pub store: bool,
    /// When the copy it went back to began to be taken: whatever was done
    /// before is in it.
    pub copy_started: Duration,
    /// When the copy was complete: whatever was done after is not in it.
    pub copy_ended: Duration,
    /// When the state began to go back.
    pub started: Duration,
    /// When it had gone back.
    pub ended: Duration,
    /// The epoch of the clients started to accept the older state, if
    /// they were; `None`: the rewind was never accepted, and every loss it
    /// caused counts.
    pub accepted_by: Option<u32>,
}

/// Every client of a run restarted: operations from here on go through
/// clients of a new epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    /// The new clients' epoch.
    pub epoch: u32,
    /// When they took over.
    pub at: Duration,
}

/// Everything a run did: the input of [`check`](crate::check).
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Every operation, in order of completion.
    pub ops: Vec<Op>,
    /// Every fault, in order of healing.
    pub faults: Vec<Fault>,
    /// Per session, what the store holds at the end, in its own order.
    /// The write check needs it: an ambiguous write is judged by whether
    /// it landed, which only the store can say.
    pub store_logs: BTreeMap<Arc<str>, Vec<Logged>>,
    /// State that went back, in order.
    pub rewinds: Vec<Rewind>,
    /// Restarts of every client, in order.
    pub restarts: Vec<Restart>,
}

impl History {
    /// When the clients of `epoch` took over (zero for the first).
    pub fn epoch_start(&self, epoch: u32) -> Duration {
        self.restarts
            .iter()
            .find(|r| r.epoch == epoch)
            .map_or(Duration::ZERO, |r| r.at)
    }
}

#[derive(Debug)]
struct Shared {
    origin: Instant,
    next_id: AtomicU64,
    ops: Mutex<Vec<Op>>,
    faults: Mutex<Vec<Fault>>,
    logs: Mutex<BTreeMap<Arc<str>, Vec<Logged>>>,
    rewinds: Mutex<Vec<Rewind>>,
    restarts: Mutex<Vec<Restart>>,
    /// Operations invoked and not yet completed, by invocation.
    in_flight: Mutex<BTreeSet<(Duration, u64)>>,
}

/// A thread-safe recorder: clones share one history and one timeline.
#[derive(Debug, Clone)]
pub struct Recorder {
    shared: Arc<Shared>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

/// An operation invoked and not yet completed.
#[derive(Debug)]
#[must_use = "complete the invocation, or the operation is missing from the history"]
pub struct Invocation {
    id: u64,
    worker: u32,
    owner: Arc<str>,
    session: Arc<str>,
    kind: OpKind,
    token: Option<u64>,
    invoked: Duration,
    at: Instant,
    epoch: u32,
    /// Where it is counted as in flight until completed or dropped.
    shared: Arc<Shared>,
}

impl Drop for Invocation {
    fn drop(&mut self) {
        lock(&self.shared.in_flight).remove(&(self.invoked, self.id));
    }
}

impl Invocation {
    /// Marks the operation as going through clients of `epoch` (see
    /// [`Op::epoch`]); 0 unless set.
    pub fn in_epoch(mut self, epoch: u32) -> Self {
        self.epoch = epoch;
        self
    }

    /// The id the operation will have in the history; a write puts it in
    /// its payload so the store's log can be matched with the history.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The monotonic instant of invocation, for the caller's own deadlines.
    pub fn instant(&self) -> Instant {
        self.at
    }
}

/// A fault being injected.
#[derive(Debug)]
#[must_use = "end the fault, or it is missing from the history"]
pub struct FaultInvocation {
    kind: FaultKind,
    target: Arc<str>,
    started: Duration,
}

impl Recorder {
    /// A recorder whose timeline starts now.
    pub fn new() -> Self {
        Recorder {
            shared: Arc::new(Shared {
                origin: Instant::now(),
                next_id: AtomicU64::new(0),
                ops: Mutex::new(Vec::new()),
                faults: Mutex::new(Vec::new()),
                logs: Mutex::new(BTreeMap::new()),
                rewinds: Mutex::new(Vec::new()),
                restarts: Mutex::new(Vec::new()),
                in_flight: Mutex::new(BTreeSet::new()),
            }),
        }
    }

    /// Time on the history's timeline.
    pub fn now(&self) -> Duration {
        self.shared.origin.elapsed()
    }

    /// Records that `worker`, acting as `owner`, is calling `kind` on
    /// `session`, presenting `token` (renew, release, write).
    pub fn invoke(
        &self,
        worker: u32,
        owner: &OwnerId,
        session: &SessionId,
        kind: OpKind,
        token: Option<FencingToken>,
    ) -> Invocation {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        // Counted in flight from before its instant is taken: whoever waits
        // for the operations invoked before some instant sees it.
        let mut in_flight = lock(&self.shared.in_flight);
        let at = Instant::now();
        let invoked = at.duration_since(self.shared.origin);
        in_flight.insert((invoked, id));
        drop(in_flight);
        Invocation {
            id,
            worker,
            owner: owner.as_str().into(),
            session: session.as_str().into(),
            kind,
            token: token.map(FencingToken::get),
            invoked,
            at,
            epoch: 0,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Records the answer to `inv`.
    pub fn complete(&self, inv: Invocation, outcome: Outcome) {
        let op = Op {
            id: inv.id,
            worker: inv.worker,
            owner: Arc::clone(&inv.owner),
            session: Arc::clone(&inv.session),
            kind: inv.kind,
            token: inv.token,
            invoked: inv.invoked,
            completed: self.now(),
            outcome,
            epoch: inv.epoch,
        };
        lock(&self.shared.ops).push(op);
        // `inv` leaves the in-flight set as it is dropped, after the push:
        // an operation no longer in flight is in the history.
        drop(inv);
    }

    /// Waits until every operation invoked before `before` has completed
    /// (or was dropped), polling, for at most `within`. False when some
    /// were still running then.
    pub async fn settled(&self, before: Duration, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let oldest = lock(&self.shared.in_flight).first().map(|(at, _)| *at);
            if oldest.is_none_or(|at| at >= before) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The operations completed at or after `since`, about in order of
    /// completion.
    pub fn ops_since(&self, since: Duration) -> Vec<Op> {
        let ops = lock(&self.shared.ops);
        // Pushed in about the order of completion: two threads may push in
        // the other order than their instants, never a second apart.
        let far_before = since.saturating_sub(Duration::from_secs(1));
        let first = ops
            .iter()
            .rposition(|op| op.completed < far_before)
            .map_or(0, |i| i + 1);
        ops[first..]
            .iter()
            .filter(|op| op.completed >= since)
            .cloned()
            .collect()
    }

    /// Records that state went back (see [`Rewind`]); the clients that
    /// accept it are recorded by [`Restarts::restart`](crate::Restarts::restart),
    /// given the index this returns.
    pub fn rewind(&self, rewind: Rewind) -> usize {
        let mut rewinds = lock(&self.shared.rewinds);
        rewinds.push(rewind);
        rewinds.len() - 1
    }

    /// Records that the clients of `epoch` took over now, accepting the
    /// rewind of index `accepts`, if any.
    pub(crate) fn restarted(&self, epoch: u32, accepts: Option<usize>) {
        let at = self.now();
        lock(&self.shared.restarts).push(Restart { epoch, at });
        if let Some(i) = accepts
            && let Some(r) = lock(&self.shared.rewinds).get_mut(i)
        {
            r.accepted_by = Some(epoch);
        }
    }

    /// Records that a fault is being injected into `target`.
    pub fn fault(&self, kind: FaultKind, target: &str) -> FaultInvocation {
        FaultInvocation {
            kind,
            target: target.into(),
            started: self.now(),
        }
    }

    /// Records that the fault is healed.
    pub fn heal(&self, fault: FaultInvocation) {
        let fault = Fault {
            kind: fault.kind,
            target: fault.target,
            started: fault.started,
            ended: self.now(),
        };
        lock(&self.shared.faults).push(fault);
    }

    /// Records what the store holds for `session` at the end of the run.
    pub fn store_log(&self, session: &SessionId, log: Vec<Logged>) {
        lock(&self.shared.logs).insert(session.as_str().into(), log);
    }

    /// Operations completed so far.
    pub fn op_count(&self) -> usize {
        lock(&self.shared.ops).len()
    }

    /// Faults healed so far.
    pub fn fault_count(&self) -> usize {
        lock(&self.shared.faults).len()
    }

    /// A copy of everything recorded so far.
    pub fn history(&self) -> History {
        History {
            ops: lock(&self.shared.ops).clone(),
            faults: lock(&self.shared.faults).clone(),
            store_logs: lock(&self.shared.logs).clone(),
            rewinds: lock(&self.shared.rewinds).clone(),
            restarts: lock(&self.shared.restarts).clone(),
        }
    }
}

/// A panic elsewhere while pushing cannot leave a half-pushed record.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
