//! The system the model explores: processes with a keeper each, one lease
//! authority, one fenced store, and a network between them that loses,
//! delays, reorders and duplicates.

use std::fmt;

use stateright::{Model, Property};

use crate::variant::Variant;

/// Ticks of the model's clock a lease lasts.
pub const TTL: u8 = 3;

/// The bounds of one exploration. Everything is bounded so that the state
/// space is finite and exploring it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Processes, each a keeper acting as its own owner.
    pub processes: u8,
    /// Sessions they contend for.
    pub sessions: u8,
    /// The clock stops at this tick.
    pub max_time: u8,
    /// Requests sent in all, lease requests and writes together.
    pub max_ops: u8,
    /// Writes each process may send.
    pub writes_per_process: u8,
    /// Messages the network may lose.
    pub losses: u8,
    /// Lease calls a keeper may give up on (its call timed out): it stops
    /// waiting, ignores the answer if one still comes, and may call again.
    /// Without them a lost message would only be one never delivered.
    pub timeouts: u8,
    /// Requests to the authority the network may deliver twice (a client's
    /// retry of a call it thought lost).
    pub duplicates: u8,
    /// Crashes in all; a crashed process restarts at once as a new
    /// incarnation, another owner.
    pub crashes: u8,
    /// Ticks each process's clock may fall behind the authority's over a
    /// run: a clock running slow, which counts a lease longer than the
    /// authority keeps it. Monotonic still: a slow clock misses ticks, it
    /// never steps back.
    pub clock_lag: u8,
    /// Ticks the keeper takes off each lease it counts, for clocks that
    /// run slow by up to that many ticks per TTL: the rate bound it
    /// assumes. The real keeper takes none; it assumes its monotonic
    /// clock and the authority's run at one rate.
    pub keeper_margin: u8,
    /// How many of the processes (the last ones) are configured with
    /// another lease authority (another lease directory, say) for the same
    /// store: its tokens count from 1 apart from the first's, so only the
    /// store's binding to one authority keeps them out.
    pub foreign_processes: u8,
}

impl Bounds {
    /// Two processes, one session, a crash: what CI explores exhaustively.
    pub const SMALL: Bounds = Bounds {
        processes: 2,
        sessions: 1,
        max_time: 4,
        max_ops: 4,
        writes_per_process: 1,
        losses: 1,
        timeouts: 0,
        duplicates: 0,
        crashes: 1,
        clock_lag: 0,
        keeper_margin: 0,
        foreign_processes: 0,
    };

    /// [`Bounds::SMALL`] with a duplicated request instead of a crash.
    pub const SMALL_DUPLICATING: Bounds = Bounds {
        duplicates: 1,
        crashes: 0,
        ..Bounds::SMALL
    };

    /// [`Bounds::SMALL`] with a lease call given up on (a timeout) instead
    /// of a crash: the keeper may then call again while its first call is
    /// still on its way, and a release it gave up on may still be handled.
    pub const SMALL_TIMEOUTS: Bounds = Bounds {
        timeouts: 1,
        crashes: 0,
        ..Bounds::SMALL
    };

    /// [`Bounds::SMALL`] with each process's clock free to fall a tick
    /// behind the authority's (a third of a TTL: a rate far past any real
    /// clock's), and a keeper whose margin covers it.
    pub const SMALL_SLOW_CLOCKS: Bounds = Bounds {
        clock_lag: 1,
        keeper_margin: 1,
        ..Bounds::SMALL
    };
}

/// An owner: a process's incarnation. A restarted process acts as a new
/// owner, as a restarted server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The process.
    pub process: u8,
    /// Its incarnation, from 0.
    pub incarnation: u8,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}.{}", self.process, self.incarnation)
    }
}

/// What a process asks the authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    /// Take the session, or extend one's own live lease.
    Acquire,
    /// Extend the lease of this token.
    Renew(u8),
    /// Give up the lease of this token.
    Release(u8),
}

/// What the authority answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// The lease is the caller's, with this token, for a TTL counted from
    /// when the authority handled the request.
    Granted(u8),
    /// Held by another owner, or the renewed lease was lost.
    Refused,
    /// The release was handled.
    Released,
}

/// A message in flight. Each carries the request's op number (to match a
/// reply to the call that waits for it, as an RPC does) and the tick it was
/// sent at, on its sender's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    /// A lease request on its way to the authority.
    ToAuthority {
        /// The call.
        op: u8,
        /// Who asks.
        owner: Owner,
        /// For which session.
        session: u8,
        /// What.
        request: Request,
        /// When it was sent.
        sent: u8,
    },
    /// The authority's answer on its way back.
    FromAuthority {
        /// The call answered.
        op: u8,
        /// Who asked.
        owner: Owner,
        /// For which session.
        session: u8,
        /// What was asked.
        request: Request,
        /// When it was sent.
        sent: u8,
        /// The answer.
        answer: Answer,
    },
    /// A fenced write on its way to the store.
    ToStore {
        /// The call.
        op: u8,
        /// The writer.
        owner: Owner,
        /// To which session.
        session: u8,
        /// The fencing token it carries.
        token: u8,
    },
    /// The store's answer: written, or refused by the fence.
    FromStore {
        /// The call answered.
        op: u8,
        /// The writer.
        owner: Owner,
        /// To which session.
        session: u8,
        /// Whether it was written.
        written: bool,
    },
}

/// A lease as its holder's keeper counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    /// The lease's token.
    pub token: u8,
    /// The tick of its own clock from which the keeper no longer counts
    /// on it.
    pub until: u8,
}

/// One process: a keeper and the writes it has sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Process {
    /// The incarnation running.
    pub incarnation: u8,
    /// Per session, the lease held.
    pub held: Vec<Option<Held>>,
    /// Per session, the lease call waiting for its answer.
    pub waiting: Vec<Option<u8>>,
    /// Per session, the writes waiting for their answer (op numbers).
    pub writing: Vec<Vec<u8>>,
    /// Writes it may still send.
    pub writes_left: u8,
    /// Ticks its clock has fallen behind the authority's.
    pub lag: u8,
    /// Per session, the token of a release it gave up waiting for: the
    /// lease may still be held for it, and an acquire would hand that
    /// token back while writes under it might still be about. A grant of
    /// it or below is not counted on (the real keeper releases it and
    /// leaves a second such grant to lapse); a greater one clears it.
    pub unreleased: Vec<Option<u8>>,
    /// The authority it is configured with: 0, or 1 for a process of
    /// [`Bounds::foreign_processes`].
    pub authority: u8,
}

impl Process {
    /// The owner it acts as now.
    pub fn owner(&self, process: u8) -> Owner {
        Owner {
            process,
            incarnation: self.incarnation,
        }
    }

    /// The time on its own clock when the authority's shows `now`.
    pub fn local(&self, now: u8) -> u8 {
        now - self.lag
    }

    /// Whether its keeper counts on the lease of `session` when the
    /// authority's clock shows `now` (its own, [`local`](Self::local),
    /// decides).
    pub fn holds(&self, session: u8, now: u8) -> Option<Held> {
        let local = self.local(now);
        self.held[usize::from(session)].filter(|h| h.until > local)
    }
}

/// The authority's record of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Authority {
    /// The lease: owner, token, and the tick it expires at.
    pub holder: Option<(Owner, u8, u8)>,
    /// The last token handed out.
    pub last_token: u8,
    /// Every (token, owner) granted, for the property that a token has
    /// one owner.
    pub grants: Vec<(u8, Owner)>,
    /// Every (token, owner) whose release was handled, for the property
    /// that writes settle before their release.
    pub released: Vec<(u8, Owner)>,
}

/// One write the store kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Landed {
    /// The write's op number.
    pub op: u8,
    /// Who wrote it.
    pub owner: Owner,
    /// The token it carried.
    pub token: u8,
}

/// The store's record of one session: its high-water mark, bound to the
/// writer that set it, and what it kept, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Store {
    /// The highest token written, and by whom.
    pub mark: Option<(u8, Owner)>,
    /// The writes kept.
    pub log: Vec<Landed>,
    /// A write landed after the authority handled its lease's release.
    pub landed_after_release: bool,
    /// The authority whose tokens it takes, bound by its first write.
    pub authority: Option<u8>,
}

/// Everything at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// The clock, in ticks; every process's and the authority's alike.
    pub now: u8,
    /// Per process.
    pub processes: Vec<Process>,
    /// Per session, the records of the authority most processes use.
    pub authority: Vec<Authority>,
    /// Per session, the records of the foreign authority; empty without
    /// [`Bounds::foreign_processes`].
    pub foreign: Vec<Authority>,
    /// Per session.
    pub store: Vec<Store>,
    /// The messages in flight, sorted: the network is a multiset.
    pub network: Vec<Message>,
    /// The next op number.
    pub next_op: u8,
    /// Losses, duplicates and crashes the bounds still allow.
    pub losses_left: u8,
    /// See [`Bounds::duplicates`].
    pub duplicates_left: u8,
    /// See [`Bounds::timeouts`].
    pub timeouts_left: u8,
    /// See [`Bounds::crashes`].
    pub crashes_left: u8,
}

/// One step of the system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock advances one tick.
    Tick,
    /// The clock advances one tick, but this process's clock does not: it
    /// runs slow, within [`Bounds::clock_lag`].
    SlowTick(u8),
    /// A process asks for a session's lease.
    Acquire(u8, u8),
    /// A process's keeper renews a lease it counts on.
    Renew(u8, u8),
    /// A process releases a lease, once its writes to the session are
    /// answered.
    Release(u8, u8),
    /// A process writes to a session under the lease it counts on.
    Write(u8, u8),
    /// The network delivers a message.
    Deliver(Message),
    /// The network loses a message.
    Lose(Message),
    /// The network delivers a request to the authority and keeps a copy
    /// in flight, to be delivered again (a client's retry of a call it
    /// thought lost).
    Duplicate(Message),
    /// A process crashes, losing what it held in memory, and starts again
    /// as a new owner.
    Crash(u8),
    /// A process's keeper gives up on its lease call for a session: the
    /// call timed out. What it counts on stays as it was (a renewal's loss
    /// is still counted from its last send).
    GiveUp(u8, u8),
}

/// The model: the bounds of the exploration and the variant of the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSystem {
    /// How far to explore.
    pub bounds: Bounds,
    /// The rules as built, or with one broken.
    pub variant: Variant,
}

impl LeaseSystem {
    /// The system of `variant` within `bounds`.
    pub fn new(bounds: Bounds, variant: Variant) -> Self {
        Self { bounds, variant }
    }

    fn send(&self, state: &mut State, message: Message) {
        put_in_flight(state, message);
        state.next_op += 1;
    }

    fn lease_request(&self, state: &mut State, p: u8, session: u8, request: Request) {
        let op = state.next_op;
        let proc = &mut state.processes[usize::from(p)];
        proc.waiting[usize::from(session)] = Some(op);
        if matches!(request, Request::Release(_)) {
            // The keeper stops counting on the lease when it asks to give
            // it up, not when the answer comes.
            proc.held[usize::from(session)] = None;
        }
        let owner = proc.owner(p);
        let sent = proc.local(state.now);
        self.send(
            state,
            Message::ToAuthority {
                op,
                owner,
                session,
                request,
                sent,
            },
        );
    }

    fn handle_at_authority(
        &self,
        state: &mut State,
        owner: Owner,
        session: u8,
        request: Request,
    ) -> Answer {
        let now = state.now;
        let records = if state.processes[usize::from(owner.process)].authority == 0 {
            &mut state.authority
        } else {
            &mut state.foreign
        };
        let record = &mut records[usize::from(session)];
        let live = record.holder.filter(|&(_, _, expires)| expires > now);
        match request {
            Request::Acquire => match live {
                Some((holder, token, _)) if holder == owner => {
                    record.holder = Some((owner, token, now + TTL));
                    Answer::Granted(token)
                }
                Some(_) => Answer::Refused,
                None => {
                    let keeps = matches!(
                        self.variant,
                        Variant::TakeoverKeepsToken | Variant::RepeatedTokenAcceptedByStore
                    );
                    let token = if keeps && record.last_token > 0 {
                        record.last_token
                    } else {
                        record.last_token + 1
                    };
                    record.last_token = token;
                    record.holder = Some((owner, token, now + TTL));
                    if !record.grants.contains(&(token, owner)) {
                        record.grants.push((token, owner));
                        record.grants.sort();
                    }
                    Answer::Granted(token)
                }
            },
            Request::Renew(token) => match live {
                Some((holder, held, _)) if holder == owner && held == token => {
                    record.holder = Some((owner, token, now + TTL));
                    Answer::Granted(token)
                }
                // The broken authority answers a lost renewal as a success,
                // leaving the lease with whoever has it.
                _ if self.variant == Variant::RenewOfLostLeaseGranted => Answer::Granted(token),
                _ => Answer::Refused,
            },
            Request::Release(token) => {
                let own = record
                    .holder
                    .is_some_and(|(holder, held, _)| holder == owner && held == token);
                if own || self.variant == Variant::ReleaseFreesOthers {
                    record.holder = None;
                }
                if own && !record.released.contains(&(token, owner)) {
                    record.released.push((token, owner));
                    record.released.sort();
                }
                Answer::Released
            }
        }
    }

    fn handle_at_store(
        &self,
        state: &mut State,
        op: u8,
        owner: Owner,
        session: u8,
        token: u8,
    ) -> bool {
        let authority = state.processes[usize::from(owner.process)].authority;
        let store = &mut state.store[usize::from(session)];
        let bound_elsewhere = store.authority.is_some_and(|a| a != authority)
            && self.variant != Variant::StoreIgnoresAuthority;
        let written = match store.mark {
            _ if bound_elsewhere => false,
            None => true,
            Some(_) if self.variant == Variant::StoreWithoutFencing => true,
            Some((mark, writer)) if token == mark => {
                writer == owner || self.variant == Variant::RepeatedTokenAcceptedByStore
            }
            Some((mark, _)) => token > mark,
        };
        if written {
            store.authority.get_or_insert(authority);
            let records = if authority == 0 {
                &state.authority
            } else {
                &state.foreign
            };
            if records[usize::from(session)]
                .released
                .contains(&(token, owner))
            {
                store.landed_after_release = true;
            }
            if store.mark.is_none_or(|(mark, _)| token >= mark) {
                store.mark = Some((token, owner));
            }
            store.log.push(Landed { op, owner, token });
        }
        written
    }

    /// A reply reaching its process: the keeper acts on it if its call is
    /// still waiting (a reply to a call of an earlier incarnation, or a
    /// second copy, finds none).
    fn handle_reply(&self, state: &mut State, message: Message) {
        let now = state.now;
        match message {
            Message::FromAuthority {
                op,
                owner,
                session,
                request,
                sent,
                answer,
            } => {
                let proc = &mut state.processes[usize::from(owner.process)];
                let s = usize::from(session);
                if proc.incarnation != owner.incarnation || proc.waiting[s] != Some(op) {
                    return;
                }
                proc.waiting[s] = None;
                // Loss is counted from when the request was sent: the
                // authority started the lease no earlier. Less the margin
                // for a clock slower than the authority's.
                let from = if self.variant == Variant::LossCountedFromReceipt {
                    proc.local(now)
                } else {
                    sent
                };
                let until = (from + TTL).saturating_sub(self.bounds.keeper_margin);
                match (request, answer) {
                    (Request::Acquire, Answer::Granted(token))
                        if proc.unreleased[s].is_some_and(|stale| token <= stale)
                            && self.variant != Variant::ReacquireTrustsTokenInDoubt => {}
                    (Request::Acquire, Answer::Granted(token)) => {
                        proc.unreleased[s] = None;
                        proc.held[s] = Some(Held { token, until });
                    }
                    (Request::Renew(renewed), Answer::Granted(token)) => {
                        if let Some(h) = proc.held[s].as_mut().filter(|h| h.token == renewed) {
                            h.token = token;
                            h.until = h.until.max(until);
                        }
                    }
                    (Request::Renew(renewed), Answer::Refused)
                        if proc.held[s].is_some_and(|h| h.token == renewed) =>
                    {
                        proc.held[s] = None;
                    }
                    _ => {}
                }
            }
            Message::FromStore {
                op, owner, session, ..
            } => {
                let proc = &mut state.processes[usize::from(owner.process)];
                if proc.incarnation == owner.incarnation {
                    proc.writing[usize::from(session)].retain(|&w| w != op);
                }
            }
            _ => {}
        }
    }

    fn deliver(&self, state: &mut State, message: Message) {
        match message {
            Message::ToAuthority {
                op,
                owner,
                session,
                request,
                sent,
            } => {
                let answer = self.handle_at_authority(state, owner, session, request);
                let reply = Message::FromAuthority {
                    op,
                    owner,
                    session,
                    request,
                    sent,
                    answer,
                };
                put_in_flight(state, reply);
            }
            Message::ToStore {
                op,
                owner,
                session,
                token,
            } => {
                let written = self.handle_at_store(state, op, owner, session, token);
                let reply = Message::FromStore {
                    op,
                    owner,
                    session,
                    written,
                };
                put_in_flight(state, reply);
            }
            reply => self.handle_reply(state, reply),
        }
    }

    fn process_actions(&self, state: &State, p: u8, actions: &mut Vec<Action>) {
        let proc = &state.processes[usize::from(p)];
        if state.crashes_left > 0 {
            actions.push(Action::Crash(p));
        }
        if state.timeouts_left > 0 {
            for session in 0..self.bounds.sessions {
                if proc.waiting[usize::from(session)].is_some() {
                    actions.push(Action::GiveUp(p, session));
                }
            }
        }
        if state.next_op >= self.bounds.max_ops {
            return;
        }
        for session in 0..self.bounds.sessions {
            let s = usize::from(session);
            if proc.waiting[s].is_some() {
                continue;
            }
            match proc.holds(session, state.now) {
                None => actions.push(Action::Acquire(p, session)),
                Some(_) => {
                    actions.push(Action::Renew(p, session));
                    if proc.writes_left > 0 {
                        actions.push(Action::Write(p, session));
                    }
                    // The keeper releases once every write it sent under
                    // the lease has been answered.
                    if proc.writing[s].is_empty()
                        || self.variant == Variant::ReleaseBeforeWritesSettle
                    {
                        actions.push(Action::Release(p, session));
                    }
                }
            }
        }
    }
}

impl Model for LeaseSystem {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let sessions = usize::from(self.bounds.sessions);
        let process = Process {
            incarnation: 0,
            held: vec![None; sessions],
            waiting: vec![None; sessions],
            writing: vec![Vec::new(); sessions],
            writes_left: self.bounds.writes_per_process,
            lag: 0,
            authority: 0,
            unreleased: vec![None; sessions],
        };
        let mut processes = vec![process; usize::from(self.bounds.processes)];
        let foreign = usize::from(self.bounds.foreign_processes).min(processes.len());
        let first_foreign = processes.len() - foreign;
        for p in &mut processes[first_foreign..] {
            p.authority = 1;
        }
        vec![State {
            now: 0,
            processes,
            authority: vec![Authority::default(); sessions],
            foreign: if foreign > 0 {
                vec![Authority::default(); sessions]
            } else {
                Vec::new()
            },
            store: vec![Store::default(); sessions],
            network: Vec::new(),
            next_op: 0,
            losses_left: self.bounds.losses,
            duplicates_left: self.bounds.duplicates,
            timeouts_left: self.bounds.timeouts,
            crashes_left: self.bounds.crashes,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.bounds.max_time {
            actions.push(Action::Tick);
            for (p, proc) in (0..).zip(&state.processes) {
                if proc.lag < self.bounds.clock_lag {
                    actions.push(Action::SlowTick(p));
                }
            }
        }
        for p in 0..self.bounds.processes {
            self.process_actions(state, p, actions);
        }
        let mut previous = None;
        for &message in &state.network {
            if previous == Some(message) {
                continue;
            }
            previous = Some(message);
            actions.push(Action::Deliver(message));
            if state.losses_left > 0 {
                actions.push(Action::Lose(message));
            }
            if state.duplicates_left > 0 && matches!(message, Message::ToAuthority { .. }) {
                actions.push(Action::Duplicate(message));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.now += 1,
            Action::SlowTick(p) => {
                state.now += 1;
                state.processes[usize::from(p)].lag += 1;
            }
            Action::Acquire(p, s) => self.lease_request(&mut state, p, s, Request::Acquire),
            Action::Renew(p, s) => {
                let token = state.processes[usize::from(p)].holds(s, state.now)?.token;
                self.lease_request(&mut state, p, s, Request::Renew(token));
            }
            Action::Release(p, s) => {
                let token = state.processes[usize::from(p)].holds(s, state.now)?.token;
                self.lease_request(&mut state, p, s, Request::Release(token));
            }
            Action::Write(p, session) => {
                let op = state.next_op;
                let proc = &mut state.processes[usize::from(p)];
                let token = proc.holds(session, state.now)?.token;
                proc.writes_left -= 1;
                proc.writing[usize::from(session)].push(op);
                let owner = proc.owner(p);
                self.send(
                    &mut state,
                    Message::ToStore {
                        op,
                        owner,
                        session,
                        token,
                    },
                );
            }
            Action::Deliver(message) => {
                let at = state.network.iter().position(|m| *m == message)?;
                state.network.remove(at);
                self.deliver(&mut state, message);
            }
            Action::Lose(message) => {
                let at = state.network.iter().position(|m| *m == message)?;
                state.network.remove(at);
                state.losses_left -= 1;
            }
            Action::Duplicate(message) => {
                // Delivered, and a copy stays in flight: when the copy was
                // made cannot be observed, only that a second one arrives.
                state.duplicates_left -= 1;
                self.deliver(&mut state, message);
            }
            Action::GiveUp(p, session) => {
                state.timeouts_left -= 1;
                let s = usize::from(session);
                let op = state.processes[usize::from(p)].waiting[s].take();
                let released = state.network.iter().find_map(|m| match *m {
                    Message::ToAuthority {
                        op: o,
                        request: Request::Release(token),
                        ..
                    }
                    | Message::FromAuthority {
                        op: o,
                        request: Request::Release(token),
                        ..
                    } if Some(o) == op => Some(token),
                    _ => None,
                });
                if let Some(token) = released {
                    let doubt = &mut state.processes[usize::from(p)].unreleased[s];
                    *doubt = Some(doubt.map_or(token, |d| d.max(token)));
                }
            }
            Action::Crash(p) => {
                // Down and up again at once, as a new owner: a process that
                // stays down a while is one that takes no step meanwhile.
                state.crashes_left -= 1;
                let sessions = usize::from(self.bounds.sessions);
                let proc = &mut state.processes[usize::from(p)];
                proc.held = vec![None; sessions];
                proc.waiting = vec![None; sessions];
                proc.writing = vec![Vec::new(); sessions];
                proc.unreleased = vec![None; sessions];
                proc.incarnation += 1;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(crate::SINGLE_HOLDER, |_, s| single_holder(s)),
            Property::always(crate::ONE_OWNER_PER_TOKEN, |_, s| one_owner_per_token(s)),
            Property::always(crate::STORE_FENCING, |_, s| store_fenced(s)),
            Property::always(crate::WRITES_SETTLE_BEFORE_RELEASE, |_, s| {
                writes_settle_before_release(s)
            }),
            Property::sometimes("a takeover is written", |_, s: &State| {
                s.store
                    .iter()
                    .any(|st| st.log.windows(2).any(|w| w[0].owner != w[1].owner))
            }),
        ]
    }
}

/// `message` into the network, kept sorted so that one multiset of
/// messages is one state.
pub(crate) fn put_in_flight(state: &mut State, message: Message) {
    let at = state.network.partition_point(|m| *m < message);
    state.network.insert(at, message);
}

/// No two processes count on the same session's lease at once.
pub fn single_holder(state: &State) -> bool {
    (0..state.store.len()).all(|session| {
        let session = u8::try_from(session).unwrap_or(u8::MAX);
        state
            .processes
            .iter()
            .filter(|p| p.holds(session, state.now).is_some())
            .count()
            <= 1
    })
}

/// An authority grants a token to one owner only.
pub fn one_owner_per_token(state: &State) -> bool {
    state
        .authority
        .iter()
        .chain(&state.foreign)
        .all(|a| a.grants.windows(2).all(|w| w[0].0 != w[1].0))
}

/// In the store's order, tokens never go down, and one token has one
/// writer: after a takeover is written, nothing the previous owner sends
/// changes the session. And every write kept carries a token that the
/// authority the store is bound to granted its writer.
pub fn store_fenced(state: &State) -> bool {
    (0..)
        .zip(&state.store)
        .all(|(session, st): (usize, &Store)| {
            let ordered = st.log.windows(2).all(|w| {
                w[0].token < w[1].token || (w[0].token == w[1].token && w[0].owner == w[1].owner)
            });
            let records = match st.authority {
                Some(0) | None => &state.authority,
                Some(_) => &state.foreign,
            };
            let granted = st
                .log
                .iter()
                .all(|w| records[session].grants.contains(&(w.token, w.owner)));
            ordered && granted
        })
}

/// No write lands after the authority handled the release of the lease it
/// was sent under: a keeper gives a session back only once its writes are
/// answered, so the next owner never finds one of them landing late. (A
/// lease that expires with a write in flight promises nothing of the kind;
/// the store's fence orders that write.)
pub fn writes_settle_before_release(state: &State) -> bool {
    state.store.iter().all(|st| !st.landed_after_release)
}
