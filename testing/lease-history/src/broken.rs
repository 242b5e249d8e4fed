//! Deliberately broken wrappers around real backends and stores, and
//! settings that turn a real client's detection off: the checker must
//! find every one of them. Behind the `broken` feature, for this crate's
//! tests and the fault runs; never a backend: nothing here may be used
//! for real.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId,
    SessionLease,
};
use serde_json::Value;
use session_store::{
    AppendReceipt, Fence, Page, SessionStore, StoreError, StoreErrorKind, WriteFence,
};

/// How a [`BrokenLease`] breaks the lease contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseBreakage {
    /// A takeover hands out the previous holder's token again.
    NoTokenBump,
    /// A renew refused as lost is answered as a success.
    RenewIgnoresLoss,
    /// A release also frees every other owner's hold on the session.
    ReleaseOthersHold,
}

/// How a [`BrokenStore`] breaks the fencing rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreBreakage {
    /// A refused write is written anyway (under the mark's own fence).
    NoFence,
    /// A write refused for presenting the mark's token from another owner
    /// is written anyway.
    EqualTokenFromOther,
}

/// A rule broken by how a real client is configured rather than by a
/// wrapper: the setting that turns a detection off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SettingBreakage {
    /// Redis clients that read the server's memory policy only at connect
    /// (`policy_check_interval` of [`POLICY_NEVER_RECHECKED`]): a policy
    /// changed to an evicting one later is never seen, and they go on
    /// using a Redis that drops lease grants and marks.
    PolicyNeverRechecked,
    /// A JSONL store opened without its generation check
    /// (`GenerationCheck::Off`): a store directory put back from an older
    /// copy opens as if it were the newest.
    GenerationCheckOff,
    /// Kubernetes leases whose renewals judge a session live from what
    /// the client remembers of its owner lease, sending nothing
    /// (`k8slease`'s `broken_trust_remembered_owner_lease`): a session
    /// judged live by a stale owner record, after another owner revoked
    /// that owner lease and took the session.
    OwnerRecordTrusted,
}

/// The policy re-check interval of [`SettingBreakage::PolicyNeverRechecked`]:
/// longer than any run.
pub const POLICY_NEVER_RECHECKED: Duration = Duration::from_secs(24 * 3600);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A real backend behind a wrapper that breaks one rule of the contract.
/// Share one wrapper between all workers: it keeps what it needs to
/// break the rule (the leases it handed out).
pub struct BrokenLease {
    inner: Arc<dyn SessionLease>,
    breakage: LeaseBreakage,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    /// The token last handed out per session, and to whom.
    handed: Mutex<HashMap<SessionId, (OwnerId, FencingToken)>>,
    /// The backend's own lease behind each (session, owner).
    real: Mutex<HashMap<(SessionId, OwnerId), Lease>>,
}

impl BrokenLease {
    /// `inner` broken by `breakage`; `ttl` and `clock` make up the expiry
    /// of a renewal it fakes.
    pub fn new(
        inner: Arc<dyn SessionLease>,
        breakage: LeaseBreakage,
        ttl: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        BrokenLease {
            inner,
            breakage,
            ttl,
            clock,
            handed: Mutex::new(HashMap::new()),
            real: Mutex::new(HashMap::new()),
        }
    }

    fn remember(&self, lease: &Lease) {
        lock(&self.real).insert(
            (lease.session_id().clone(), lease.owner().clone()),
            lease.clone(),
        );
    }

    /// The backend's lease behind `lease`, for the token-keeping variant.
    fn real_of(&self, lease: &Lease) -> Lease {
        match self.breakage {
            LeaseBreakage::NoTokenBump => lock(&self.real)
                .get(&(lease.session_id().clone(), lease.owner().clone()))
                .cloned()
                .unwrap_or_else(|| lease.clone()),
            _ => lease.clone(),
        }
    }
}

#[async_trait]
impl SessionLease for BrokenLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        let real = self.inner.acquire(session, owner).await?;
        self.remember(&real);
        if self.breakage != LeaseBreakage::NoTokenBump {
            return Ok(real);
        }
        let mut handed = lock(&self.handed);
        let token = handed.get(session).map_or(real.token(), |(_, t)| *t);
        handed.insert(session.clone(), (owner.clone(), token));
        Ok(Lease::new(
            session.clone(),
            owner.clone(),
            token,
            real.expiry(),
        ))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        match self.inner.renew(&self.real_of(lease)).await {
            Ok(real) => {
                self.remember(&real);
                Ok(lease.with_expiry(real.expiry()))
            }
            Err(e)
                if e.kind() == LeaseErrorKind::Held
                    && self.breakage == LeaseBreakage::RenewIgnoresLoss =>
            {
                Ok(lease.with_expiry(self.clock.now() + self.ttl))
            }
            Err(e) => Err(e),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inner.release(&self.real_of(lease)).await?;
        if self.breakage == LeaseBreakage::ReleaseOthersHold {
            let others: Vec<Lease> = lock(&self.real)
                .iter()
                .filter(|((s, o), _)| s == lease.session_id() && o != lease.owner())
                .map(|(_, l)| l.clone())
                .collect();
            for other in others {
                self.inner.release(&other).await?;
            }
        }
        Ok(())
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.inner.authority().await
    }
}

/// A real store behind a wrapper that breaks the fencing rule: when the
/// store refuses a write, the wrapper writes it anyway under the fence of
/// the last write it saw accepted.
pub struct BrokenStore {
    inner: Arc<dyn SessionStore>,
    breakage: StoreBreakage,
    mark: Mutex<HashMap<SessionId, Fence>>,
}

impl BrokenStore {
    /// `inner` broken by `breakage`.
    pub fn new(inner: Arc<dyn SessionStore>, breakage: StoreBreakage) -> Self {
        BrokenStore {
            inner,
            breakage,
            mark: Mutex::new(HashMap::new()),
        }
    }

    fn note_accepted(&self, session: &SessionId, fence: &WriteFence) {
        if let WriteFence::Fenced(f) = fence {
            let mut marks = lock(&self.mark);
            let mark = marks.entry(session.clone()).or_insert_with(|| f.clone());
            if f.token() > mark.token() {
                *mark = f.clone();
            }
        }
    }
}

#[async_trait]
impl SessionStore for BrokenStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        self.inner.create(session).await
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        match self.inner.append(session, fence.clone(), events).await {
            Ok(receipt) => {
                self.note_accepted(session, &fence);
                Ok(receipt)
            }
            Err(e) if e.kind() == StoreErrorKind::Fenced => {
                let WriteFence::Fenced(presented) = &fence else {
                    return Err(e);
                };
                // The store names its mark's owner when it refuses; a
                // wrapper in another process than the mark's writer learns
                // it only so.
                let mark = match &e {
                    StoreError::Fenced {
                        high_water,
                        high_water_owner: Some(owner),
                        ..
                    } => Some(Fence::new(*high_water, owner.clone())),
                    _ => lock(&self.mark).get(session).cloned(),
                };
                match mark {
                    Some(mark)
                        if self.breakage == StoreBreakage::NoFence
                            || mark.token() == presented.token() =>
                    {
                        self.inner.append(session, mark.into(), events).await
                    }
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.inner.read(session, from_seq, limit).await
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.inner.list().await
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        self.inner.delete(session, fence).await
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        self.inner.high_water(session).await
    }

    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        self.inner.bind_authority(authority).await
    }

    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.inner.recorded_authority().await
    }
}
