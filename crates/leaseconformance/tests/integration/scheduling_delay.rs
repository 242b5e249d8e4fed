//! Real-time cases measure their own scheduling delay: a failure that
//! follows a stall past the case's timing margin runs again, and nothing
//! else does. Checked with memlease on real time behind a wrapper that
//! stalls chosen calls, as a descheduled worker would.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{AuthorityId, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use leaseconformance::timing::{CaseFailure, try_case};
use leaseconformance::{RealTimeFactory, cases};
use memlease::MemLease;

const TTL: Duration = Duration::from_secs(1);

/// memlease whose `acquire` first sleeps `stall` while `stalls_left` lasts;
/// with `expired_grants`, every grant it hands out has already expired (a
/// broken backend).
#[derive(Debug, Clone)]
struct Stalling {
    inner: MemLease,
    stall: Duration,
    stalls_left: Arc<AtomicUsize>,
    expired_grants: bool,
}

#[async_trait]
impl SessionLease for Stalling {
    async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
        let stall = self
            .stalls_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if stall {
            tokio::time::sleep(self.stall).await;
        }
        let lease = self.inner.acquire(s, o).await?;
        if self.expired_grants {
            return Ok(Lease::new(
                lease.session_id().clone(),
                lease.owner().clone(),
                lease.token(),
                SystemTime::UNIX_EPOCH,
            ));
        }
        Ok(lease)
    }
    async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.inner.renew(l).await
    }
    async fn release(&self, l: &Lease) -> Result<(), LeaseError> {
        self.inner.release(l).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.inner.authority().await
    }
}

fn factory(
    ttl: Duration,
    stalls_left: Arc<AtomicUsize>,
    broken: bool,
) -> RealTimeFactory<Stalling> {
    let inner = MemLease::new(ttl);
    RealTimeFactory::new(ttl, move || Stalling {
        inner: inner.clone(),
        stall: ttl * 3 / 5,
        stalls_left: stalls_left.clone(),
        expired_grants: broken,
    })
}

/// Runs `expiry` (acquire, ½ TTL, a competitor must be refused, then past
/// expiry it wins) through `try_case`, counting attempts.
async fn expiry_case(stalls: usize) -> (Result<(), CaseFailure>, usize) {
    let stalls_left = Arc::new(AtomicUsize::new(stalls));
    let attempts = Arc::new(AtomicUsize::new(0));
    let result = try_case("expiry", |meter| {
        attempts.fetch_add(1, Ordering::SeqCst);
        let f = factory(TTL, stalls_left.clone(), false);
        async move {
            meter.start(&f);
            leaseconformance::timing::scoped(meter, cases::expiry(&f)).await;
        }
    })
    .await;
    (result, attempts.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_a_stall_runs_again_and_passes() {
    // The first two acquires stall: the competitor's acquire lands after
    // the holder's lease expired, so the first attempt fails — on time, not
    // on the backend.
    let (result, attempts) = expiry_case(2).await;
    assert!(result.is_ok(), "{:?}", result.err().map(|e| e.message()));
    assert_eq!(
        attempts, 2,
        "the stalled attempt should have been repeated once"
    );
}

/// A grant that is already expired fails `acquire_free` within a few
/// microseconds of work; with a 2 s TTL a retry would need the machine to
/// stall 0.6 s inside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_without_a_stall_is_not_retried() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let result = try_case("acquire_free", |meter| {
        attempts.fetch_add(1, Ordering::SeqCst);
        let f = factory(Duration::from_secs(2), Arc::new(AtomicUsize::new(0)), true);
        async move {
            meter.start(&f);
            leaseconformance::timing::scoped(meter, cases::acquire_free(&f)).await;
        }
    })
    .await;
    let attempts = attempts.load(Ordering::SeqCst);
    match result {
        Err(CaseFailure::Panicked(_)) => {}
        other => panic!("a broken backend must fail the case: {other:?}"),
    }
    assert_eq!(attempts, 1, "a failure with no stall is final");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_in_every_attempt_fail_the_case_instead_of_passing_it() {
    let (result, attempts) = expiry_case(usize::MAX).await;
    match result {
        Err(CaseFailure::Inconclusive(message)) => {
            assert!(message.contains("never checked"), "{message}")
        }
        other => panic!("an unchecked backend must not pass: {other:?}"),
    }
    assert!(attempts > 1);
}
