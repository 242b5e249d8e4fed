//! Symmetry reduction: processes are interchangeable, and so are
//! sessions.
//!
//! Every process runs the same keeper from the same start, and every
//! session starts free, so a state with two processes (or two sessions)
//! swapped behaves exactly as the state itself: the same actions lead to
//! states swapped alike, and every property judges them alike. Exploring
//! one state of each such class is enough, and with two processes and two
//! sessions it visits about a quarter of the states. A process configured
//! with another authority ([`Bounds::foreign_processes`](crate::Bounds))
//! is interchangeable only with another such. The class's
//! representative is its least member, found by trying every
//! permutation: at most 3! × 2! of them within the bounds explored.

use stateright::Representative;

use crate::system::{Action, Authority, Message, Owner, State, put_in_flight};

impl Representative for State {
    fn representative(&self) -> Self {
        let mut least: Option<State> = None;
        // Only processes configured alike are interchangeable.
        let alike = |renaming: &&Vec<u8>| {
            (0..).zip(renaming.iter()).all(|(from, &to): (usize, &u8)| {
                self.processes[from].authority == self.processes[usize::from(to)].authority
            })
        };
        for processes in permutations(self.processes.len()).iter().filter(alike) {
            for sessions in &permutations(self.store.len()) {
                let candidate = self.permuted(processes, sessions);
                if least.as_ref().is_none_or(|l| candidate < *l) {
                    least = Some(candidate);
                }
            }
        }
        least.unwrap_or_else(|| self.clone())
    }
}

impl State {
    /// This state with process `i` renamed `processes[i]` and session `j`
    /// renamed `sessions[j]`, wherever either is named.
    pub fn permuted(&self, processes: &[u8], sessions: &[u8]) -> State {
        let owner = |o: Owner| Owner {
            process: processes[usize::from(o.process)],
            ..o
        };
        let place = |len: usize, to: &[u8]| -> Vec<usize> {
            let mut at = vec![0; len];
            for (from, &to) in to.iter().enumerate() {
                at[usize::from(to)] = from;
            }
            at
        };
        let by_session = place(self.store.len(), sessions);
        let by_process = place(self.processes.len(), processes);
        let records = |records: &[Authority]| -> Vec<Authority> {
            if records.is_empty() {
                return Vec::new();
            }
            by_session
                .iter()
                .map(|&from| {
                    let mut a = records[from].clone();
                    a.holder = a
                        .holder
                        .map(|(o, token, expires)| (owner(o), token, expires));
                    for grant in a.grants.iter_mut().chain(&mut a.released) {
                        grant.1 = owner(grant.1);
                    }
                    a.grants.sort();
                    a.released.sort();
                    a
                })
                .collect()
        };
        let mut state = State {
            now: self.now,
            processes: by_process
                .iter()
                .map(|&from| {
                    let p = &self.processes[from];
                    let mut moved = p.clone();
                    moved.held = by_session.iter().map(|&s| p.held[s]).collect();
                    moved.waiting = by_session.iter().map(|&s| p.waiting[s]).collect();
                    moved.writing = by_session.iter().map(|&s| p.writing[s].clone()).collect();
                    moved.unreleased = by_session.iter().map(|&s| p.unreleased[s]).collect();
                    moved
                })
                .collect(),
            authority: records(&self.authority),
            foreign: records(&self.foreign),
            store: by_session
                .iter()
                .map(|&from| {
                    let mut st = self.store[from].clone();
                    st.mark = st.mark.map(|(token, o)| (token, owner(o)));
                    for landed in &mut st.log {
                        landed.owner = owner(landed.owner);
                    }
                    st
                })
                .collect(),
            network: Vec::with_capacity(self.network.len()),
            ..self.clone()
        };
        for &message in &self.network {
            put_in_flight(&mut state, message.permuted(processes, sessions));
        }
        state
    }
}

impl Message {
    /// This message with processes and sessions renamed as in
    /// [`State::permuted`].
    pub fn permuted(self, processes: &[u8], sessions: &[u8]) -> Message {
        let owner = |o: Owner| Owner {
            process: processes[usize::from(o.process)],
            ..o
        };
        let session = |s: u8| sessions[usize::from(s)];
        match self {
            Message::ToAuthority {
                op,
                owner: o,
                session: s,
                request,
                sent,
            } => Message::ToAuthority {
                op,
                owner: owner(o),
                session: session(s),
                request,
                sent,
            },
            Message::FromAuthority {
                op,
                owner: o,
                session: s,
                request,
                sent,
                answer,
            } => Message::FromAuthority {
                op,
                owner: owner(o),
                session: session(s),
                request,
                sent,
                answer,
            },
            Message::ToStore {
                op,
                owner: o,
                session: s,
                token,
            } => Message::ToStore {
                op,
                owner: owner(o),
                session: session(s),
                token,
            },
            Message::FromStore {
                op,
                owner: o,
                session: s,
                written,
            } => Message::FromStore {
                op,
                owner: owner(o),
                session: session(s),
                written,
            },
        }
    }
}

impl Action {
    /// This action with processes and sessions renamed as in
    /// [`State::permuted`]: taken from the renamed state, it leads to the
    /// renamed next state.
    pub fn permuted(&self, processes: &[u8], sessions: &[u8]) -> Action {
        let p = |p: u8| processes[usize::from(p)];
        let s = |s: u8| sessions[usize::from(s)];
        match *self {
            Action::Tick => Action::Tick,
            Action::SlowTick(process) => Action::SlowTick(p(process)),
            Action::Acquire(process, session) => Action::Acquire(p(process), s(session)),
            Action::Renew(process, session) => Action::Renew(p(process), s(session)),
            Action::Release(process, session) => Action::Release(p(process), s(session)),
            Action::Write(process, session) => Action::Write(p(process), s(session)),
            Action::Deliver(m) => Action::Deliver(m.permuted(processes, sessions)),
            Action::Lose(m) => Action::Lose(m.permuted(processes, sessions)),
            Action::Duplicate(m) => Action::Duplicate(m.permuted(processes, sessions)),
            Action::Crash(process) => Action::Crash(p(process)),
            Action::GiveUp(process, session) => Action::GiveUp(p(process), s(session)),
        }
    }
}

/// Every ordering of `0..n`, as the name each index takes.
pub fn permutations(n: usize) -> Vec<Vec<u8>> {
    let Some(last) = n.checked_sub(1) else {
        return vec![Vec::new()];
    };
    let last = u8::try_from(last).unwrap_or(u8::MAX);
    permutations(n - 1)
        .into_iter()
        .flat_map(|shorter| {
            (0..=shorter.len()).map(move |at| {
                let mut longer = shorter.clone();
                longer.insert(at, last);
                longer
            })
        })
        .collect()
}
