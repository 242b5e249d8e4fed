//! What the engine knows for working beside other replicas: the runs of
//! this process with their tokens, and a view of the lease backend to
//! learn of runs elsewhere.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use lease_port::{FencingToken, SessionId};
use tokio_util::sync::DropGuard;

use super::Engine;
use crate::lease_view::{HolderState, LeaseView};

/// The engine's replica state.
#[derive(Default)]
pub(super) struct Replicas {
    view: OnceLock<LeaseView>,
    local: Mutex<HashMap<SessionId, LocalRun>>,
}

/// A run of this process.
struct LocalRun {
    /// `None` when unleased.
    token: Option<FencingToken>,
    /// The sequence number of its `run_started` event.
    first_seq: u64,
    /// Stops the run's watch for cancel requests when the run ends.
    _watch: Option<DropGuard>,
}

/// The run of a session that is live now, wherever it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LiveRun {
    /// No run is live.
    None,
    /// The run writing under this token (in this process or another);
    /// `None` for an unleased run of this process.
    Run(Option<FencingToken>),
    /// The lease backend cannot say.
    Unknown,
}

impl Replicas {
    fn local(&self) -> MutexGuard<'_, HashMap<SessionId, LocalRun>> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Engine {
    /// Lets the engine read lease holders (set once, at start-up): without
    /// it, runs of other replicas are unknown to it.
    pub fn set_lease_view(&self, view: LeaseView) {
        let _ = self.inner.replicas.view.set(view);
    }

    /// The lease holder of `session`, as the backend reports it.
    pub async fn lease_holder(&self, session: &SessionId) -> HolderState {
        match self.inner.replicas.view.get() {
            Some(view) if self.inner.leased => view.holder(session).await,
            _ => HolderState::Unknown,
        }
    }

    /// Records a run of this process, with the guard that ends its
    /// watch for cancel requests.
    pub(super) fn register_local_run(
        &self,
        session: &SessionId,
        token: Option<FencingToken>,
        first_seq: u64,
        watch: Option<DropGuard>,
    ) {
        self.inner.replicas.local().insert(
            session.clone(),
            LocalRun {
                token,
                first_seq,
                _watch: watch,
            },
        );
    }

    /// Where this process's run of `session` started in its log: runs
    /// without a lease all carry no token, so only this tells them apart.
    pub(super) fn local_run_start(&self, session: &SessionId) -> Option<u64> {
        self.inner
            .replicas
            .local()
            .get(session)
            .map(|r| r.first_seq)
    }

    /// Forgets a run of this process (it ended), and wakes its
    /// followers' tail, which rested on it.
    pub(super) fn unregister_local_run(&self, session: &SessionId) {
        self.inner.replicas.local().remove(session);
        self.wake_tail(session);
    }

    /// The token of this process's run of `session`, if it has one.
    pub(super) fn local_run(&self, session: &SessionId) -> Option<Option<FencingToken>> {
        self.inner.replicas.local().get(session).map(|r| r.token)
    }

    /// The run of `session` live now: this process's, or the lease
    /// holder's.
    pub(crate) async fn live_run(&self, session: &SessionId) -> LiveRun {
        if let Some(token) = self.local_run(session) {
            return LiveRun::Run(token);
        }
        if !self.inner.leased {
            // Unleased, only this process runs sessions.
            return LiveRun::None;
        }
        match self.lease_holder(session).await {
            HolderState::Held(h) => LiveRun::Run(Some(h.token)),
            HolderState::Free => LiveRun::None,
            HolderState::Unknown => LiveRun::Unknown,
        }
    }
}
