//! The end-to-end check of a session server: what its store holds at the
//! end, session by session, against the lease rules and against what its
//! clients were told.
//!
//! A session server (`mecated`) writes every run as a `run_started` event
//! (naming its owner and token), the agent's events (`progress` steps
//! counted from 1, then a `message`) and a `run_ended`. A run left without
//! an end (its process died) is ended by the session's next owner, before
//! that owner's own run: a `takeover` under the new token, then a
//! `run_ended` with status `interrupted` naming the run (`run_seq`,
//! `run_token`); with resumption, that end says `resumed: {attempt}` and
//! is followed at once by a `run_started` of the same `input` naming what
//! it `resumes`. Clients record
//! every HTTP request with its invocation and completion and, for runs
//! and follows, the events they received. [`check_server`] then verifies,
//! per session:
//!
//! - **store fencing** ([`Property::StoreFencing`]) — in the store's order
//!   no event carries a token below an earlier one, and one token is only
//!   ever written by one writer;
//! - **run order** ([`Property::RunOrder`]) — once an event of a later run
//!   is stored, no event of an earlier run follows it;
//! - **log integrity** ([`Property::LogIntegrity`]) — sequence numbers
//!   start at 1 and follow each other, every event belongs to a run that
//!   started before it and fits that run's shape, a run's events carry the
//!   token its `run_started` names, every run ends (once) before the next
//!   one starts, an input is run again only right after its run's
//!   interrupted end announced it, once, one attempt further, and every
//!   run a client saw end, and
//!   every event a client received, is stored exactly as the client saw it;
//! - **effect fencing** ([`Property::EffectFencing`]) — of the side effects
//!   the runs' agents sent to a service that fences them by token and
//!   idempotency key ([`EffectAttempt`]), a key is performed at most once,
//!   none is performed under a token below one performed for its session
//!   before, and each performed one names a run the log holds under its
//!   token.
//!
//! [`server_timeline`] turns the record into a [`History`] that
//! [`write_svg`](crate::write_svg) draws: one lane per client and per
//! writer, requests as ticks, stored runs as bars coloured by token, stored
//! events as ticks.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::check::{Property, Verdict, Violation};
use crate::history::{Ambiguity, Fault, History, Op, OpKind, Outcome, ms};

mod effects;

pub use effects::EffectAttempt;

/// One event as the store holds it at the end of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// The store's sequence number.
    pub seq: u64,
    /// The fencing token it was written under; `None` when unfenced.
    pub token: Option<u64>,
    /// The writer (owner and incarnation) the store recorded, when the
    /// store keeps it.
    pub writer: Option<Arc<str>>,
    /// When the store accepted it, on the history's timeline.
    pub at: Duration,
    /// The event.
    pub payload: Value,
}

/// What a client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKind {
    /// `POST /v1/sessions`.
    Create,
    /// `POST /v1/sessions/{id}/runs`, optionally waiting for the session.
    Run,
    /// `GET /v1/sessions/{id}/events` as Server-Sent Events, to a run's end.
    Follow,
    /// `DELETE /v1/sessions/{id}/runs/current`.
    Cancel,
    /// `GET /v1/sessions/{id}/events`, a page at a time.
    Read,
}

impl RequestKind {
    /// Lower-case name, as printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Create => "create",
            RequestKind::Run => "run",
            RequestKind::Follow => "follow",
            RequestKind::Cancel => "cancel",
            RequestKind::Read => "read",
        }
    }
}

/// One event a client received, as it received it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenEvent {
    /// Its sequence number.
    pub seq: u64,
    /// Its token (`None` when unfenced or not given).
    pub token: Option<u64>,
    /// The event.
    pub payload: Value,
}

/// A run a client saw end: the server answered the run request with its
/// outcome, or a follow received the run's end.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenRun {
    /// The token the server said the run wrote under.
    pub token: Option<u64>,
    /// How the server said it ended (`completed`, `cancelled`, …).
    pub status: String,
    /// The run's events the client received, `run_started` first.
    pub events: Vec<SeenEvent>,
}

/// One HTTP request and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Unique within the history.
    pub id: u64,
    /// The client task that sent it.
    pub client: u32,
    /// The replica it was sent to.
    pub replica: Arc<str>,
    /// The session it named.
    pub session: Arc<str>,
    /// What it asked.
    pub kind: RequestKind,
    /// When it was sent, on the history's timeline.
    pub invoked: Duration,
    /// When its answer (or the failure) arrived.
    pub completed: Duration,
    /// The HTTP status, when an answer came.
    pub status: Option<u16>,
    /// The answer in a few words (error code, run status, transport error).
    pub outcome: String,
    /// Events the client received that are not part of a run it saw end
    /// (a follow cut short, a page read).
    pub events: Vec<SeenEvent>,
    /// The run the client saw end, if it did.
    pub run: Option<SeenRun>,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "req #{:<5} {:>10.3}..{:<10.3}ms  c{:<2} {:<12} {:<6} {:<7} -> ",
            self.id,
            ms(self.invoked),
            ms(self.completed),
            self.client,
            self.replica,
            self.session,
            self.kind.name(),
        )?;
        match self.status {
            Some(s) => write!(f, "{s} {}", self.outcome)?,
            None => write!(f, "{}", self.outcome)?,
        }
        if let Some(run) = &self.run {
            let first = run.events.first().map_or(0, |e| e.seq);
            let last = run.events.last().map_or(0, |e| e.seq);
            write!(
                f,
                " [run token {} {} seq {first}..{last}]",
                run.token.map_or("-".into(), |t| t.to_string()),
                run.status
            )?;
        }
        Ok(())
    }
}

/// Everything an end-to-end run recorded: the input of [`check_server`].
#[derive(Debug, Clone, Default)]
pub struct ServerHistory {
    /// Every request, in any order.
    pub requests: Vec<Request>,
    /// Every fault injected.
    pub faults: Vec<Fault>,
    /// Per session, what the store holds at the end, in its order.
    pub logs: BTreeMap<Arc<str>, Vec<StoredEvent>>,
    /// The effects the runs' agents asked their destination for, in the
    /// order it judged them (empty when the agents perform none).
    pub effects: Vec<EffectAttempt>,
}

/// Ids of the timeline's operations for stored events and runs start here,
/// above any request id.
const STORED_IDS: u64 = 1 << 40;

/// Stored events shown either side of a violation.
const CONTEXT_EVENTS: usize = 5;

/// Requests shown around a violation.
const CONTEXT_REQUESTS: usize = 8;

/// The timeline id of each stored event, by session and sequence number;
/// the ids [`server_timeline`] gives them.
fn stored_ids(h: &ServerHistory) -> HashMap<(Arc<str>, u64), u64> {
    let mut ids = HashMap::new();
    let mut next = STORED_IDS;
    for (session, log) in &h.logs {
        for e in log {
            ids.insert((Arc::clone(session), e.seq), next);
            next += 1;
        }
    }
    ids
}

/// A run as the log shows it, while the log is read in order.
#[derive(Debug)]
struct LoggedRun {
    /// Position among the session's runs.
    index: usize,
    start_seq: u64,
    token: Option<u64>,
    writer: Option<Arc<str>>,
    owner: Option<String>,
    /// The next progress step it may write.
    next_step: u64,
    /// Steps it announced (`of`), once known.
    of: Option<u64>,
    messaged: bool,
    ended: bool,
    /// It wrote its `run_cut_off` (shutdown cut it off, its end is the
    /// next owner's): nothing of its own may follow.
    cut_off: bool,
    /// The input its `run_started` recorded.
    input: Value,
    /// How many times its input was run again before it: 0 for a
    /// client's run, else its `resumes.attempt`.
    attempt: u64,
    /// Its interrupted end, when it has one: that end's seq and the
    /// attempt the end says runs its input again next, if any.
    interrupted: Option<(u64, Option<u64>)>,
    /// Whether a later run resumed it.
    resumed: bool,
}

impl LoggedRun {
    /// Whether `e` can be this run's next event.
    fn accepts(&self, e: &StoredEvent) -> bool {
        !self.ended && self.fits(e)
    }

    /// Whether `e`, stored after a later run started, is this run's: its
    /// next event, or one it would be had the next owner not ended it as
    /// interrupted (its owner writing on after the end, which a fence
    /// refuses; unfenced, nothing does).
    fn owns_late(&self, e: &StoredEvent) -> bool {
        (!self.ended || self.interrupted.is_some()) && self.fits(e)
    }

    /// Whether `e` fits this run's token, writer and shape, ended or not.
    fn fits(&self, e: &StoredEvent) -> bool {
        if self.cut_off || e.token != self.token {
            return false;
        }
        if let (Some(w), Some(ew)) = (&self.writer, &e.writer)
            && w != ew
        {
            return false;
        }
        match kind(&e.payload) {
            "progress" => !self.messaged && e.payload["step"].as_u64() == Some(self.next_step),
            "message" => !self.messaged && self.of.is_none_or(|of| self.next_step == of + 1),
            _ => true,
        }
    }

    fn take(&mut self, e: &StoredEvent) {
        match kind(&e.payload) {
            "progress" => {
                self.next_step += 1;
                self.of = e.payload["of"].as_u64();
            }
            "message" => self.messaged = true,
            "run_ended" => self.ended = true,
            "run_cut_off" => self.cut_off = true,
            _ => {}
        }
    }

    fn describe(&self) -> String {
        format!(
            "run {} (started at seq {}, token {}, owner {})",
            self.index,
            self.start_seq,
            self.token.map_or("none".into(), |t| t.to_string()),
            self.owner.as_deref().unwrap_or("?")
        )
    }
}

fn kind(payload: &Value) -> &str {
    payload["type"].as_str().unwrap_or("")
}

/// The end a run's next owner records for it when it recorded none.
fn is_interrupted_end(payload: &Value) -> bool {
    kind(payload) == "run_ended" && payload["status"] == "interrupted"
}

/// Whether `e`, in a run a client saw end, is the close of that run by its
/// next owner: its `takeover` or the `interrupted` end naming the run.
fn closes_run(e: &StoredEvent, run_token: Option<u64>) -> bool {
    kind(&e.payload) == "takeover"
        || (is_interrupted_end(&e.payload) && e.payload["run_token"].as_u64() == run_token)
}

/// Same writer, where incarnations of one owner id count as different
/// writers (`owner#incarnation`).
fn token_writer_conflict(known: &Option<Arc<str>>, writer: &Option<Arc<str>>) -> bool {
    matches!((known, writer), (Some(a), Some(b)) if a != b)
}

struct Found {
    property: Property,
    session: Arc<str>,
    at: Duration,
    /// Stored events involved (sequence numbers).
    seqs: Vec<u64>,
    /// Requests involved (ids).
    requests: Vec<u64>,
    message: String,
}

/// Checks what the store holds against the rules above; see the [module
/// documentation](self).
pub fn check_server(h: &ServerHistory) -> Verdict {
    let mut found = Vec::new();
    for (session, log) in &h.logs {
        check_log(session, log, &mut found);
    }
    for r in &h.requests {
        check_request(h, r, &mut found);
    }
    effects::check_effects(&h.effects, &h.logs, &mut found);

    let ids = stored_ids(h);
    let mut verdict = Verdict {
        ops: h.requests.len(),
        ..Verdict::default()
    };
    for fault in &h.faults {
        *verdict.faults.entry(fault.kind.name()).or_default() += 1;
    }
    let mut completions: Vec<Duration> = h.requests.iter().map(|r| r.completed).collect();
    completions.sort_unstable();
    let requests_until = |at: Duration| completions.partition_point(|c| *c <= at);
    let mut first_at: BTreeMap<Property, Duration> = BTreeMap::new();
    for v in &found {
        *verdict.violations.entry(v.property).or_default() += 1;
        let at = first_at.entry(v.property).or_insert(v.at);
        *at = (*at).min(v.at);
    }
    verdict.ops_to_first_by = first_at
        .into_iter()
        .map(|(p, at)| (p, requests_until(at)))
        .collect();
    if let Some(first) = found
        .into_iter()
        .min_by_key(|v| (v.at, v.property, v.seqs.clone(), v.requests.clone()))
    {
        verdict.ops_to_first = Some(requests_until(first.at));
        let mut ops: Vec<u64> = first
            .seqs
            .iter()
            .filter_map(|s| ids.get(&(Arc::clone(&first.session), *s)).copied())
            .collect();
        ops.extend(&first.requests);
        let context = context(h, &first);
        verdict.first = Some(Violation {
            property: first.property,
            session: first.session,
            at: first.at,
            ops,
            message: first.message,
            context,
        });
    }
    verdict
}

/// The store-side checks of one session's log.
fn check_log(session: &Arc<str>, log: &[StoredEvent], found: &mut Vec<Found>) {
    let mut push = |property, e: &StoredEvent, seqs: Vec<u64>, message: String| {
        found.push(Found {
            property,
            session: Arc::clone(session),
            at: e.at,
            seqs,
            requests: Vec::new(),
            message,
        });
    };
    let mut expected_seq = 1;
    let mut highest: Option<(u64, u64)> = None; // (token, seq)
    let mut token_writers: HashMap<u64, (Option<Arc<str>>, u64)> = HashMap::new();
    // A second writer of a token is reported once, not at each event.
    let mut reported: std::collections::HashSet<(u64, Option<Arc<str>>)> = Default::default();
    let mut runs: Vec<LoggedRun> = Vec::new();
    for e in log {
        if e.seq != expected_seq {
            push(
                Property::LogIntegrity,
                e,
                vec![e.seq],
                format!(
                    "sequence numbers do not follow each other: seq {} where {expected_seq} was due",
                    e.seq
                ),
            );
        }
        expected_seq = e.seq + 1;

        // Fencing: tokens never go back, one token has one writer.
        if let Some(token) = e.token {
            if let Some((high, at)) = highest
                && token < high
            {
                push(
                    Property::StoreFencing,
                    e,
                    vec![at, e.seq],
                    format!(
                        "seq {} carries token {token}, below token {high} accepted at seq {at}",
                        e.seq
                    ),
                );
            }
            if highest.is_none_or(|(high, _)| token > high) {
                highest = Some((token, e.seq));
            }
            match token_writers.get(&token) {
                Some((w, at))
                    if token_writer_conflict(w, &e.writer)
                        && reported.insert((token, e.writer.clone())) =>
                {
                    push(
                        Property::StoreFencing,
                        e,
                        vec![*at, e.seq],
                        format!(
                            "token {token} written by two writers: {} at seq {at}, {} at seq {}",
                            w.as_deref().unwrap_or("?"),
                            e.writer.as_deref().unwrap_or("?"),
                            e.seq
                        ),
                    )
                }
                Some(_) => {}
                None => {
                    token_writers.insert(token, (e.writer.clone(), e.seq));
                }
            }
        }

        if let Some(problems) = run_boundary(e, &mut runs) {
            for (seqs, message) in problems {
                push(Property::LogIntegrity, e, seqs, message);
            }
            continue;
        }
        let Some(current) = runs.last_mut() else {
            push(
                Property::LogIntegrity,
                e,
                vec![e.seq],
                format!("seq {} is stored before any run started", e.seq),
            );
            continue;
        };
        if current.accepts(e) {
            current.take(e);
            continue;
        }
        // Not the current run's: an earlier run's, still writing after a
        // later one started, or no run's at all.
        let current_start = current.start_seq;
        let current_desc = current.describe();
        let before = runs.len() - 1;
        let earlier = runs[..before].iter_mut().rev().find(|r| r.owns_late(e));
        match earlier {
            Some(r) => {
                r.take(e);
                push(
                    Property::RunOrder,
                    e,
                    vec![r.start_seq, current_start, e.seq],
                    format!(
                        "seq {} ({}) belongs to {}, stored after {} started",
                        e.seq,
                        kind(&e.payload),
                        r.describe(),
                        current_desc
                    ),
                );
            }
            None => push(
                Property::LogIntegrity,
                e,
                vec![current_start, e.seq],
                format!(
                    "seq {} ({}, token {:?}) fits no run: the current one is {}",
                    e.seq,
                    kind(&e.payload),
                    e.token,
                    current_desc
                ),
            ),
        }
    }
}

/// The events the server writes about runs themselves (a `takeover`, an
/// `interrupted` end, a `run_started`), taken into `runs`: `None` when `e`
/// is none of those, else the log-integrity problems it shows (seqs
/// involved, what is wrong).
fn run_boundary(e: &StoredEvent, runs: &mut Vec<LoggedRun>) -> Option<Vec<(Vec<u64>, String)>> {
    let mut problems = Vec::new();
    if kind(&e.payload) == "takeover" {
        // A new owner fencing out the owner of a run left without an
        // end, before it ends that run: its own, naming its token.
        if e.payload["token"].as_u64() != e.token {
            problems.push((
                vec![e.seq],
                format!(
                    "takeover at seq {} names token {:?} but was written under {:?}",
                    e.seq, e.payload["token"], e.token
                ),
            ));
        }
        return Some(problems);
    }
    if is_interrupted_end(&e.payload) {
        // The next owner's end of the last run: open, named, and
        // written under a greater token than that run's.
        match runs.last_mut() {
            Some(r)
                if !r.ended
                    && e.payload["run_seq"].as_u64() == Some(r.start_seq)
                    && e.payload["run_token"].as_u64() == r.token
                    && (e.token > r.token || e.token.is_none()) =>
            {
                r.ended = true;
                r.interrupted = Some((e.seq, e.payload["resumed"]["attempt"].as_u64()));
            }
            last => {
                let last = last.map_or("none".into(), |r| r.describe());
                problems.push((
                    vec![e.seq],
                    format!(
                        "seq {} ends run {} (token {}) as interrupted, but the last run is {last}",
                        e.seq, e.payload["run_seq"], e.payload["run_token"]
                    ),
                ));
            }
        }
        return Some(problems);
    }
    if kind(&e.payload) == "run_started" {
        let named = e.payload["token"].as_u64();
        if named != e.token {
            problems.push((
                vec![e.seq],
                format!(
                    "run_started at seq {} names token {named:?} but was written under {:?}",
                    e.seq, e.token
                ),
            ));
        }
        problems.extend(resumption_problems(e, runs));
        if let Some(open) = runs.last().filter(|r| !r.ended) {
            problems.push((
                vec![open.start_seq, e.seq],
                format!(
                    "a run starts at seq {} while {} has no end: a run whose process \
                         died is ended, as interrupted, before the next one starts",
                    e.seq,
                    open.describe()
                ),
            ));
        }
        runs.push(LoggedRun {
            index: runs.len(),
            start_seq: e.seq,
            token: e.token,
            writer: e.writer.clone(),
            owner: e.payload["owner"].as_str().map(str::to_owned),
            next_step: 1,
            of: None,
            messaged: false,
            ended: false,
            cut_off: false,
            input: e.payload["input"].clone(),
            attempt: e.payload["resumes"]["attempt"].as_u64().unwrap_or(0),
            interrupted: None,
            resumed: false,
        });
        return Some(problems);
    }
    None
}

/// The resumption rules, for the `run_started` `e` after `runs`: a run
/// that resumes an interrupted one (`resumes`) comes right after that
/// run's interrupted end, which announced it, runs the same input, counts
/// its attempt on, and is the only one to resume that interruption; an end
/// that announced a resumption is followed by it.
fn resumption_problems(e: &StoredEvent, runs: &mut [LoggedRun]) -> Vec<(Vec<u64>, String)> {
    let resumes = &e.payload["resumes"];
    let last = runs.last_mut();
    if resumes.is_null() {
        return match last {
            Some(r) if r.interrupted.is_some_and(|(_, next)| next.is_some()) && !r.resumed => {
                vec![(
                    vec![r.start_seq, e.seq],
                    format!(
                        "the interrupted end of {} announced its resumption, but seq {} \
                         starts a run that resumes nothing",
                        r.describe(),
                        e.seq
                    ),
                )]
            }
            _ => Vec::new(),
        };
    }
    let attempt = resumes["attempt"].as_u64();
    let fits = |r: &LoggedRun| {
        !r.resumed
            && resumes["after_seq"].as_u64() == Some(r.start_seq)
            && resumes["run_token"].as_u64() == r.token
            && r.interrupted == Some((e.seq - 1, attempt))
            && attempt == Some(r.attempt + 1)
            && e.payload["input"] == r.input
    };
    match last {
        Some(r) if fits(r) => {
            r.resumed = true;
            Vec::new()
        }
        last => vec![(
            vec![e.seq],
            format!(
                "seq {} resumes the run at seq {} (attempt {}), but the run before it is {}: \
                 a run is resumed once, right after its interrupted end, on its own input",
                e.seq,
                resumes["after_seq"],
                resumes["attempt"],
                last.map_or("none".into(), |r| format!(
                    "{} (interrupted: {:?}, resumed already: {})",
                    r.describe(),
                    r.interrupted,
                    r.resumed
                ))
            ),
        )],
    }
}

/// What a client received must be what the store holds; a run it saw end
/// must be stored whole and contiguous.
fn check_request(h: &ServerHistory, r: &Request, found: &mut Vec<Found>) {
    let empty = Vec::new();
    let log = h.logs.get(&r.session).unwrap_or(&empty);
    let by_seq: HashMap<u64, &StoredEvent> = log.iter().map(|e| (e.seq, e)).collect();
    let mut push = |seqs: Vec<u64>, message: String| {
        found.push(Found {
            property: Property::LogIntegrity,
            session: Arc::clone(&r.session),
            at: r.completed,
            seqs,
            requests: vec![r.id],
            message,
        });
    };
    let differs = |seen: &SeenEvent| -> Option<String> {
        match by_seq.get(&seen.seq) {
            None => Some(format!("seq {} is not in the store", seen.seq)),
            Some(stored) if stored.payload != seen.payload => Some(format!(
                "seq {} is stored as {} but the client received {}",
                seen.seq, stored.payload, seen.payload
            )),
            Some(stored) if seen.token.is_some() && stored.token != seen.token => Some(format!(
                "seq {} is stored under token {:?} but the client received it under {:?}",
                seen.seq, stored.token, seen.token
            )),
            Some(_) => None,
        }
    };
    for seen in &r.events {
        if let Some(why) = differs(seen) {
            push(
                vec![seen.seq],
                format!(
                    "req #{} received an event the store does not hold: {why}",
                    r.id
                ),
            );
            return;
        }
    }
    let Some(run) = &r.run else {
        return;
    };
    let Some(first) = run.events.first() else {
        push(
            Vec::new(),
            format!("req #{} saw a run end without any of its events", r.id),
        );
        return;
    };
    if kind(&first.payload) != "run_started" || first.payload["token"].as_u64() != run.token {
        push(
            vec![first.seq],
            format!(
                "req #{} saw a run (token {:?}) whose first event is not its run_started: {}",
                r.id, run.token, first.payload
            ),
        );
        return;
    }
    for pair in run.events.windows(2) {
        if pair[1].seq != pair[0].seq + 1 {
            push(
                vec![pair[0].seq, pair[1].seq],
                format!(
                    "req #{} saw its run's events at seq {} then {}: not contiguous",
                    r.id, pair[0].seq, pair[1].seq
                ),
            );
            return;
        }
    }
    for seen in &run.events {
        if let Some(why) = differs(seen) {
            push(
                vec![first.seq, seen.seq],
                format!(
                    "a run req #{} saw end ({}, token {:?}) is not stored whole: {why}",
                    r.id, run.status, run.token
                ),
            );
            return;
        }
        if let Some(stored) = by_seq.get(&seen.seq)
            && stored.token != run.token
            && !closes_run(stored, run.token)
        {
            push(
                vec![first.seq, seen.seq],
                format!(
                    "a run req #{} saw end under token {:?} holds seq {} of token {:?}",
                    r.id, run.token, seen.seq, stored.token
                ),
            );
            return;
        }
    }
}

/// The surrounding stored events and requests of a violation, one per
/// line, the involved ones marked `>>`, and the faults near it.
fn context(h: &ServerHistory, v: &Found) -> String {
    let mut text = String::new();
    let empty = Vec::new();
    let log = h.logs.get(&v.session).unwrap_or(&empty);
    let positions: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, e)| v.seqs.contains(&e.seq))
        .map(|(i, _)| i)
        .collect();
    let mut show: Vec<usize> = positions
        .iter()
        .flat_map(|&p| p.saturating_sub(CONTEXT_EVENTS)..(p + CONTEXT_EVENTS + 1).min(log.len()))
        .collect();
    show.sort_unstable();
    show.dedup();
    let _ = writeln!(text, "stored events of {}:", v.session);
    let mut last = None;
    for i in show {
        if last.is_some_and(|l: usize| i > l + 1) {
            text.push_str("   ...\n");
        }
        let e = &log[i];
        let mark = if v.seqs.contains(&e.seq) { ">>" } else { "  " };
        let _ = writeln!(
            text,
            "{mark} seq {:<5} {:>10.3}ms token {:<5} writer {:<24} {}",
            e.seq,
            ms(e.at),
            e.token.map_or("-".into(), |t| t.to_string()),
            e.writer.as_deref().unwrap_or("-"),
            e.payload
        );
        last = Some(i);
    }
    // The requests of the session around the moments involved.
    let mut moments: Vec<Duration> = positions.iter().map(|&p| log[p].at).collect();
    moments.push(v.at);
    let (lo, hi) = (
        moments.iter().min().copied().unwrap_or_default(),
        moments.iter().max().copied().unwrap_or_default(),
    );
    let mut requests: Vec<&Request> = h
        .requests
        .iter()
        .filter(|r| r.session == v.session)
        .collect();
    requests.sort_by_key(|r| (r.invoked, r.id));
    let overlapping: Vec<&Request> = requests
        .iter()
        .copied()
        .filter(|r| v.requests.contains(&r.id) || (r.completed >= lo && r.invoked <= hi))
        .collect();
    let shown = if overlapping.len() > CONTEXT_REQUESTS {
        // The involved ones first, then the nearest to the moment.
        let mut s: Vec<&Request> = overlapping
            .iter()
            .copied()
            .filter(|r| v.requests.contains(&r.id))
            .collect();
        let mut rest: Vec<&Request> = overlapping
            .iter()
            .copied()
            .filter(|r| !v.requests.contains(&r.id))
            .collect();
        rest.sort_by_key(|r| r.invoked.abs_diff(v.at));
        s.extend(rest.into_iter().take(CONTEXT_REQUESTS));
        s.sort_by_key(|r| (r.invoked, r.id));
        s
    } else {
        overlapping
    };
    let _ = writeln!(text, "requests of {} around it:", v.session);
    for r in shown {
        let mark = if v.requests.contains(&r.id) {
            ">>"
        } else {
            "  "
        };
        let _ = writeln!(text, "{mark} {r}");
    }
    effects::write_context(&mut text, &h.effects, v);
    write_faults(&mut text, &h.faults, lo, hi);
    text
}

/// The faults that overlap `lo..hi`, or ended up to five seconds before.
fn write_faults(text: &mut String, faults: &[Fault], lo: Duration, hi: Duration) {
    let near: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.ended + Duration::from_secs(5) >= lo && f.started <= hi)
        .collect();
    if !near.is_empty() {
        text.push_str("faults around it:\n");
        for f in near {
            let _ = writeln!(
                text,
                "   {} on {} {:.3}..{:.3}ms",
                f.kind.name(),
                f.target,
                ms(f.started),
                ms(f.ended)
            );
        }
    }
}

/// The record drawn as a lease [`History`], for
/// [`write_svg`](crate::write_svg) with the [`Verdict`] of
/// [`check_server`]: each request a tick on its client's lane (green
/// answered 2xx, red refused 4xx, grey failed or unanswered), each stored
/// run a bar on its writer's lane from its `run_started` to its last
/// event, coloured by token, each stored event a tick there.
pub fn server_timeline(h: &ServerHistory) -> History {
    let mut ops = Vec::new();
    for r in &h.requests {
        ops.push(Op {
            id: r.id,
            worker: r.client,
            owner: format!("client-{} via {}", r.client, r.kind.name()).into(),
            session: Arc::clone(&r.session),
            kind: OpKind::Write,
            token: r.run.as_ref().and_then(|run| run.token),
            invoked: r.invoked,
            completed: r.completed,
            outcome: match r.status {
                Some(200..=299) => Outcome::Done,
                Some(400..=499) => Outcome::Fenced,
                _ => Outcome::Ambiguous(Ambiguity::Other),
            },
            epoch: 0,
        });
    }
    let ids = stored_ids(h);
    let mut next_run_id = STORED_IDS + ids.len() as u64;
    for (session, log) in &h.logs {
        let mut i = 0;
        while i < log.len() {
            let start = &log[i];
            let mut end = i + 1;
            while end < log.len()
                && kind(&log[end].payload) != "run_started"
                && log[end].token == start.token
            {
                end += 1;
            }
            let lane: Arc<str> = start
                .writer
                .clone()
                .or_else(|| start.payload["owner"].as_str().map(Arc::from))
                .unwrap_or_else(|| "unfenced".into());
            if kind(&start.payload) == "run_started" {
                let until = log[end - 1].at;
                ops.push(Op {
                    id: next_run_id,
                    worker: 0,
                    owner: Arc::clone(&lane),
                    session: Arc::clone(session),
                    kind: OpKind::Acquire,
                    token: None,
                    invoked: start.at,
                    completed: start.at,
                    outcome: Outcome::Granted {
                        token: start.token.unwrap_or(0),
                        valid_for: until.saturating_sub(start.at),
                    },
                    epoch: 0,
                });
                next_run_id += 1;
            }
            for e in &log[i..end] {
                ops.push(Op {
                    id: ids[&(Arc::clone(session), e.seq)],
                    worker: 0,
                    owner: e.writer.clone().unwrap_or_else(|| Arc::clone(&lane)),
                    session: Arc::clone(session),
                    kind: OpKind::Write,
                    token: e.token,
                    invoked: e.at,
                    completed: e.at,
                    outcome: Outcome::Done,
                    epoch: 0,
                });
            }
            i = end;
        }
    }
    ops.sort_by_key(|op| (op.completed, op.id));
    History {
        ops,
        faults: h.faults.clone(),
        store_logs: BTreeMap::new(),
        ..History::default()
    }
}
