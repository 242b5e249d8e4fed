//! In-memory [`SessionLease`]: leases between the tasks of one process.
//!
//! # When to choose it
//!
//! - Tests of code that uses leases: inject a `lease_port::ManualClock`
//!   (feature `test-util` of `lease-port`, so not linked from here) and
//!   move time without sleeping.
//! - A single-process server that wants the full lease lifecycle (fencing
//!   tokens, cancellation on loss) with nothing to deploy.
//!
//! It does **not** coordinate separate processes: every process has its own
//! table, and each table is an authority of its own (its tokens start over
//! at 1), unless [`MemLeaseBuilder::authority`] names a stable one for a
//! single process over a persistent store. For several processes on one
//! host use `flocklease`; across hosts, a backend over a service they
//! share.
//!
//! # Example
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use lease_port::{LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};
//! use memlease::MemLease;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = ManualClock::new();
//! let leases = MemLease::builder()
//!     .ttl(Duration::from_secs(30))
//!     .clock(Arc::new(clock.clone()))
//!     .build();
//! let (a, b) = (OwnerId::new("a")?, OwnerId::new("b")?);
//! let chat = SessionId::new("chat-1")?;
//!
//! let held = leases.acquire(&chat, &a).await?;
//! let err = leases.acquire(&chat, &b).await.unwrap_err();
//! assert_eq!(err.kind(), LeaseErrorKind::Held);
//! assert_eq!(err.holder(), Some(&a));
//!
//! clock.advance(Duration::from_secs(31)); // a stopped renewing
//! let taken = leases.acquire(&chat, &b).await?;
//! assert!(taken.token() > held.token());
//! assert_eq!(leases.renew(&held).await.unwrap_err().kind(), LeaseErrorKind::Held);
//! # Ok::<(), lease_port::LeaseError>(())
//! # }).unwrap();
//! ```
//!
//! # Behaviour
//!
//! The table is split into shards, each behind its own mutex and chosen by
//! the session id's hash, so operations on different sessions rarely meet on
//! one lock. Each shard keeps its own token counter: a session always lives
//! in the same shard, so its tokens rise strictly for the life of the
//! instance, across releases and expiries, without keeping a record of every
//! session ever leased. Released entries are removed; expired entries are
//! removed when next touched or by [`MemLease::purge_expired`].
//!
//! [`acquire_above`](SessionLease::acquire_above) raises the shard's
//! counter to its floor under the same lock as the grant: the grant, and
//! every later one in the shard, exceeds the floor. A live holder whose
//! token does not exceed it gets a new one, and its old value no longer
//! renews.
//!
//! Expiry is judged on the clock's wall time, as the contract defines
//! liveness ("live while the backend's clock reads before its expiry"):
//! every reader of a lease's expiry agrees with the table. A wall-clock
//! step therefore moves every hold — forward, it ends holds early while
//! their keepers, timing their leases on the monotonic clock, still act;
//! the store's fence is what refuses their writes then. Give the table a
//! [`MonotonicWallClock`](lease_port::MonotonicWallClock) where the host's
//! wall clock may step.
//!
//! Renewing an expired lease succeeds when its record is still the caller's
//! (nobody acquired since): the check and the update happen under one shard
//! lock, which is the proof the contract asks for.
//!
//! Clones share one table: hand a clone to each task that competes.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease,
    SystemClock,
};

/// The TTL granted when none is configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Shard count when none is configured: enough that two busy threads rarely
/// share a lock, small enough to stay cheap to create.
pub const DEFAULT_SHARDS: usize = 64;

#[derive(Debug)]
struct Holder {
    session: SessionId,
    owner: OwnerId,
    token: FencingToken,
    expiry: SystemTime,
}

/// One lock's worth of the table. Entries are found by a hash computed once
/// per operation, which also picked the shard, so no key is hashed twice.
#[derive(Debug, Default)]
struct Shard {
    held: HashTable<Holder>,
    last_token: u64,
}

impl Shard {
    fn find(&mut self, hash: u64, session: &SessionId) -> Option<&mut Holder> {
        self.held.find_mut(hash, |h| h.session == *session)
    }
}

/// A shard on cache lines of its own: two threads working on sessions in
/// neighbouring shards must not bounce one line between their cores.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(Mutex<Shard>);

struct Table {
    shards: Box<[Padded]>,
    hasher: RandomState,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    authority: AuthorityId,
}

/// The in-memory lease table. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct MemLease {
    table: Arc<Table>,
}

/// Configures a [`MemLease`].
#[derive(Debug)]
pub struct MemLeaseBuilder {
    ttl: Duration,
    clock: Arc<dyn Clock>,
    shards: usize,
    authority: Option<AuthorityId>,
}

impl MemLeaseBuilder {
    /// How long a grant lasts unless renewed. Default [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The clock expiries are judged by. Default [`SystemClock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Number of independently locked shards (at least 1). Default
    /// [`DEFAULT_SHARDS`].
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Names the table's authority instead of a new one.
    ///
    /// By default every table, in every process, is an authority of its
    /// own (`mem:<pid>:<n>:<random>`), since its tokens start over at 1. A
    /// persistent store remembers the authority that fenced it and refuses
    /// any other, so a single-process server over a `JsonlStore` with the
    /// default would be refused at its second start. Naming a stable
    /// authority lets it start; because the new table's tokens start low
    /// again, acquire *above* what the store has seen
    /// ([`acquire_above`](SessionLease::acquire_above) with the store's
    /// high-water mark, as the lease keeper's `acquire_above_within` does)
    /// or the store fences the first writes.
    ///
    /// Never give one authority to two tables that live at once: both
    /// would issue the same tokens to different owners, and since a table
    /// coordinates nothing between processes, two processes over one store
    /// would then both run its sessions (only the store's fence would keep
    /// their writes apart). Name one only where the deployment ensures one
    /// process per store at a time; otherwise keep the default, under which
    /// a second process over the store fails at `bind_authority` — the
    /// safer failure.
    pub fn authority(mut self, authority: AuthorityId) -> Self {
        self.authority = Some(authority);
        self
    }

    /// Builds the table.
    pub fn build(self) -> MemLease {
        let authority = self
            .authority
            .unwrap_or_else(|| new_authority(&*self.clock));
        MemLease {
            table: Arc::new(Table {
                shards: (0..self.shards).map(|_| Padded::default()).collect(),
                hasher: RandomState::new(),
                ttl: self.ttl,
                clock: self.clock,
                authority,
            }),
        }
    }
}

impl MemLease {
    /// A table granting `ttl` on the system clock.
    pub fn new(ttl: Duration) -> Self {
        Self::builder().ttl(ttl).build()
    }

    /// A builder with the defaults.
    pub fn builder() -> MemLeaseBuilder {
        MemLeaseBuilder {
            ttl: DEFAULT_TTL,
            clock: Arc::new(SystemClock),
            shards: DEFAULT_SHARDS,
            authority: None,
        }
    }

    /// The TTL this table grants.
    pub fn ttl(&self) -> Duration {
        self.table.ttl
    }

    /// Drops expired entries from every shard and returns how many went.
    /// Tokens stay monotonic: counters are per shard, not per entry.
    pub fn purge_expired(&self) -> usize {
        let now = self.table.clock.now();
        let mut removed = 0;
        for shard in self.table.shards.iter() {
            let mut shard = lock(&shard.0);
            let before = shard.held.len();
            shard.held.retain(|h| now < h.expiry);
            removed += before - shard.held.len();
        }
        removed
    }

    /// How many sessions are held live right now.
    pub fn live_count(&self) -> usize {
        let now = self.table.clock.now();
        self.table
            .shards
            .iter()
            .map(|s| lock(&s.0).held.iter().filter(|h| now < h.expiry).count())
            .sum()
    }

    /// The session's hash and its locked shard.
    fn shard(&self, session: &SessionId) -> (u64, MutexGuard<'_, Shard>) {
        let t = &*self.table;
        let hash = t.hasher.hash_one(session);
        // The table uses the low bits to place entries; pick the shard by the
        // high ones so entries within a shard still spread.
        let idx = ((hash >> 32) as usize) % t.shards.len();
        (hash, lock(&t.shards[idx].0))
    }

    fn expiry_from(&self, now: SystemTime) -> Result<SystemTime, LeaseError> {
        now.checked_add(self.table.ttl)
            .ok_or_else(|| LeaseError::invalid("TTL overflows the clock"))
    }

    /// Grants `session` to `owner` with a token above `floor` (0: no
    /// floor). The shard's counter is raised to `floor` under the same lock
    /// as the grant, so this grant and every later one in the shard stay
    /// above it.
    fn acquire_now(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        let now = self.table.clock.now();
        let expiry = self.expiry_from(now)?;
        let (hash, mut guard) = self.shard(session);
        let shard = &mut *guard;
        let hasher = &self.table.hasher;
        let entry = shard.held.entry(
            hash,
            |h| h.session == *session,
            |h| hasher.hash_one(&h.session),
        );
        let token = match entry {
            Entry::Occupied(mut e) => {
                let h = e.get_mut();
                if now < h.expiry && h.owner != *owner {
                    let left = h.expiry.duration_since(now).unwrap_or_default();
                    return Err(LeaseError::held(Some(h.owner.clone())).with_held_for(left));
                }
                if now < h.expiry && h.token > floor {
                    // The live holder re-acquiring keeps its epoch.
                    h.expiry = expiry;
                    h.token
                } else {
                    // A takeover, or the live holder whose token a store
                    // already passed: a new epoch.
                    let token = next_token_above(&mut shard.last_token, floor)?;
                    debug_assert!(
                        token > h.token && token > floor,
                        "token {token} issued for {session} is not above {} and {floor}",
                        h.token
                    );
                    h.owner = owner.clone();
                    h.token = token;
                    h.expiry = expiry;
                    token
                }
            }
            Entry::Vacant(e) => {
                let token = next_token_above(&mut shard.last_token, floor)?;
                e.insert(Holder {
                    session: session.clone(),
                    owner: owner.clone(),
                    token,
                    expiry,
                });
                token
            }
        };
        Ok(Lease::new(session.clone(), owner.clone(), token, expiry))
    }

    fn renew_now(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let now = self.table.clock.now();
        let expiry = self.expiry_from(now)?;
        let (hash, mut shard) = self.shard(lease.session_id());
        match shard.find(hash, lease.session_id()) {
            // Expired but unchanged since: the shard lock proves no one raced us.
            Some(h) if h.owner == *lease.owner() && h.token == lease.token() => {
                h.expiry = expiry;
                Ok(lease.with_expiry(expiry))
            }
            Some(h) if now < h.expiry => Err(LeaseError::held(Some(h.owner.clone()))),
            _ => Err(LeaseError::held(None)),
        }
    }

    fn current_now(&self, session: &SessionId) -> Option<Lease> {
        let now = self.table.clock.now();
        let (hash, mut shard) = self.shard(session);
        let h = shard.find(hash, session)?;
        (now < h.expiry).then(|| Lease::new(session.clone(), h.owner.clone(), h.token, h.expiry))
    }

    fn release_now(&self, lease: &Lease) {
        let (hash, mut shard) = self.shard(lease.session_id());
        let ours = |h: &Holder| {
            h.session == *lease.session_id()
                && h.owner == *lease.owner()
                && h.token == lease.token()
        };
        if let Ok(e) = shard.held.find_entry(hash, ours) {
            e.remove();
        }
    }
}

/// Raises the shard's counter to at least `floor`, then takes the next
/// token: greater than every token the shard issued and than `floor`.
fn next_token_above(last: &mut u64, floor: FencingToken) -> Result<FencingToken, LeaseError> {
    // Unreachable in practice (2^64 takeovers, or a floor of u64::MAX), but
    // a wrapped token would silently re-admit old owners: refuse instead.
    let (before, base) = (*last, (*last).max(floor.get()));
    *last = base
        .checked_add(1)
        .ok_or_else(|| LeaseError::invalid(format!("no fencing token exceeds {base}")))?;
    debug_assert!(*last > before, "the shard's token counter went back");
    Ok(FencingToken::new(*last))
}

/// `mem:<pid>:<n>:<random>`: tables of one process differ by `n`, tables
/// of processes that reuse a pid by the random part.
fn new_authority(clock: &dyn Clock) -> AuthorityId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let random = clock.random();
    AuthorityId::new(format!("mem:{}:{n}:{random:016x}", std::process::id()))
        .expect("a generated authority id is valid")
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // No code path panics while holding a shard lock, and every update is a
    // single assignment, so a poisoned shard is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for MemLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemLease")
            .field("ttl", &self.table.ttl)
            .field("shards", &self.table.shards.len())
            .field("clock", &self.table.clock)
            .finish()
    }
}

#[async_trait]
impl SessionLease for MemLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.acquire_now(session, owner, FencingToken::new(0))
    }

    /// Raises the shard's token counter above `floor` in the same step as
    /// the grant: never answers `Rewound`.
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        floor.check_floor()?;
        self.acquire_now(session, owner, floor)
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.renew_now(lease)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.release_now(lease);
        Ok(())
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        Ok(self.current_now(session))
    }

    /// Unique to this table unless the builder named one: its tokens start
    /// over in any other.
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        Ok(self.table.authority.clone())
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.table.ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_port::{LeaseErrorKind, ManualClock};

    fn setup() -> (MemLease, ManualClock) {
        let clock = ManualClock::new();
        let leases = MemLease::builder()
            .ttl(Duration::from_secs(10))
            .clock(Arc::new(clock.clone()))
            .build();
        (leases, clock)
    }

    fn ids() -> (SessionId, OwnerId, OwnerId) {
        (
            SessionId::new("s").unwrap(),
            OwnerId::new("a").unwrap(),
            OwnerId::new("b").unwrap(),
        )
    }

    #[tokio::test]
    async fn release_removes_the_entry_but_tokens_keep_rising() {
        let (leases, _) = setup();
        let (s, a, b) = ids();
        let first = leases.acquire(&s, &a).await.unwrap();
        leases.release(&first).await.unwrap();
        assert_eq!(leases.live_count(), 0);
        let second = leases.acquire(&s, &b).await.unwrap();
        assert!(second.token() > first.token());
    }

    #[tokio::test]
    async fn single_shard_still_keeps_sessions_apart() {
        let clock = ManualClock::new();
        let leases = MemLease::builder().shards(0).clock(Arc::new(clock)).build();
        let (s, a, b) = ids();
        let t = SessionId::new("t").unwrap();
        leases.acquire(&s, &a).await.unwrap();
        leases.acquire(&t, &b).await.unwrap();
        assert_eq!(leases.live_count(), 2);
    }

    #[tokio::test]
    async fn current_reports_only_a_live_holder() {
        let (leases, clock) = setup();
        let (s, a, _) = ids();
        assert_eq!(leases.current(&s).await.unwrap(), None);
        let lease = leases.acquire(&s, &a).await.unwrap();
        assert_eq!(leases.current(&s).await.unwrap(), Some(lease.clone()));
        clock.advance(leases.ttl());
        assert_eq!(leases.current(&s).await.unwrap(), None, "expired");
        let lease = leases.acquire(&s, &a).await.unwrap();
        leases.release(&lease).await.unwrap();
        assert_eq!(leases.current(&s).await.unwrap(), None, "released");
    }

    #[tokio::test]
    async fn purge_drops_only_expired_entries() {
        let (leases, clock) = setup();
        let (s, a, _) = ids();
        let t = SessionId::new("t").unwrap();
        leases.acquire(&s, &a).await.unwrap();
        clock.advance(Duration::from_secs(6));
        let later = leases.acquire(&t, &a).await.unwrap();
        clock.advance(Duration::from_secs(5));
        assert_eq!(leases.purge_expired(), 1);
        assert_eq!(leases.live_count(), 1);
        assert!(leases.renew(&later).await.is_ok());
    }

    #[tokio::test]
    async fn renew_reclaims_an_unraced_expired_lease_with_the_same_token() {
        let (leases, clock) = setup();
        let (s, a, _) = ids();
        let lease = leases.acquire(&s, &a).await.unwrap();
        clock.advance(Duration::from_secs(20));
        let renewed = leases.renew(&lease).await.unwrap();
        assert_eq!(renewed.token(), lease.token());
        assert!(renewed.expiry() > clock.now());
    }

    #[tokio::test]
    async fn forged_lease_values_are_refused_without_panic() {
        let (leases, _) = setup();
        let (s, a, b) = ids();
        let real = leases.acquire(&s, &a).await.unwrap();
        let forged = Lease::new(s.clone(), b.clone(), real.token(), real.expiry());
        let err = leases.renew(&forged).await.unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Held);
        assert_eq!(err.holder(), Some(&a));
        leases.release(&forged).await.unwrap();
        let max = Lease::new(
            s.clone(),
            a.clone(),
            FencingToken::new(u64::MAX),
            real.expiry(),
        );
        assert_eq!(
            leases.renew(&max).await.unwrap_err().kind(),
            LeaseErrorKind::Held
        );
        assert!(
            leases.renew(&real).await.is_ok(),
            "forgeries changed nothing"
        );
    }

    fn floor(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    #[tokio::test]
    async fn acquire_above_grants_above_the_floor_and_later_takeovers_stay_above() {
        let (leases, clock) = setup();
        let (s, a, b) = ids();
        let first = leases.acquire(&s, &a).await.unwrap();
        assert!(first.token() < floor(100));
        leases.release(&first).await.unwrap();

        let raised = leases.acquire_above(&s, &b, floor(100)).await.unwrap();
        assert!(raised.token() > floor(100), "{}", raised.token());
        assert_eq!(leases.current(&s).await.unwrap(), Some(raised.clone()));

        // Plain acquisitions after it never fall back below the floor.
        leases.release(&raised).await.unwrap();
        let after_release = leases.acquire(&s, &a).await.unwrap();
        assert!(after_release.token() > raised.token());
        clock.advance(leases.ttl());
        let after_expiry = leases.acquire(&s, &b).await.unwrap();
        assert!(after_expiry.token() > after_release.token());
    }

    #[tokio::test]
    async fn a_floor_below_the_record_changes_nothing() {
        let (leases, _) = setup();
        let (s, a, b) = ids();
        let first = leases.acquire_above(&s, &a, floor(50)).await.unwrap();
        leases.release(&first).await.unwrap();
        let second = leases.acquire_above(&s, &b, floor(3)).await.unwrap();
        assert_eq!(second.token().get(), first.token().get() + 1);
        let zero = leases.acquire_above(&s, &b, floor(0)).await.unwrap();
        assert_eq!(
            zero.token(),
            second.token(),
            "the live holder keeps its epoch"
        );
    }

    #[tokio::test]
    async fn the_live_holder_below_the_floor_gets_a_new_greater_token() {
        let (leases, _) = setup();
        let (s, a, _) = ids();
        let old = leases.acquire(&s, &a).await.unwrap();
        let mark = floor(old.token().get() + 10);
        let raised = leases.acquire_above(&s, &a, mark).await.unwrap();
        assert!(raised.token() > mark);
        assert_eq!(
            leases.renew(&old).await.unwrap_err().kind(),
            LeaseErrorKind::Held,
            "the old epoch is over"
        );
        let renewed = leases.renew(&raised).await.unwrap();
        assert_eq!(renewed.token(), raised.token());
    }

    #[tokio::test]
    async fn the_live_holder_above_the_floor_keeps_its_token() {
        let (leases, clock) = setup();
        let (s, a, _) = ids();
        let held = leases.acquire_above(&s, &a, floor(20)).await.unwrap();
        clock.advance(Duration::from_secs(5));
        let again = leases
            .acquire_above(&s, &a, FencingToken::new(held.token().get() - 1))
            .await
            .unwrap();
        assert_eq!(again.token(), held.token());
        assert!(again.expiry() > held.expiry());
        assert!(leases.renew(&held).await.is_ok());
    }

    #[tokio::test]
    async fn a_floor_never_takes_a_session_held_by_another_owner() {
        let (leases, _) = setup();
        let (s, a, b) = ids();
        let held = leases.acquire(&s, &a).await.unwrap();
        let err = leases.acquire_above(&s, &b, floor(1000)).await.unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Held);
        assert_eq!(err.holder(), Some(&a));
        assert_eq!(leases.current(&s).await.unwrap(), Some(held));
    }

    #[tokio::test]
    async fn a_floor_no_token_can_exceed_is_invalid_and_grants_nothing() {
        let (leases, _) = setup();
        let (s, a, _) = ids();
        let err = leases
            .acquire_above(&s, &a, floor(u64::MAX))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
        assert_eq!(leases.current(&s).await.unwrap(), None);
        let held = leases.acquire(&s, &a).await.unwrap();
        let err = leases
            .acquire_above(&s, &a, floor(u64::MAX))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
        assert!(leases.renew(&held).await.is_ok(), "the grant is untouched");
    }

    #[tokio::test]
    async fn tables_are_authorities_of_their_own_unless_one_is_named() {
        let (a, b) = (MemLease::new(DEFAULT_TTL), MemLease::new(DEFAULT_TTL));
        assert_ne!(a.authority().await.unwrap(), b.authority().await.unwrap());
        let named = AuthorityId::new("mem:chat-backend").unwrap();
        let c = MemLease::builder().authority(named.clone()).build();
        assert_eq!(c.authority().await.unwrap(), named);
        assert_eq!(c.granted_ttl(), Some(DEFAULT_TTL));
    }

    #[tokio::test]
    async fn ttl_overflowing_the_clock_is_invalid_not_a_panic() {
        let leases = MemLease::builder().ttl(Duration::MAX).build();
        let (s, a, _) = ids();
        let err = leases.acquire(&s, &a).await.unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
    }
}
