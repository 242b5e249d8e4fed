//! The in-process lock around its edges: the next request after a run
//! ended, waiters behind a release, unbounded waits, and cancelled waiters.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{KeeperErrorKind, LeaseKeeper};
use lease_port::{
    AuthorityId, FencingToken, Lease, LeaseError, ManualClock, OwnerId, SessionId, SessionLease,
};
use memlease::MemLease;
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(30);

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}
fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

/// memlease whose release takes `delay`.
#[derive(Clone)]
struct SlowRelease {
    real: MemLease,
    delay: Duration,
}

#[async_trait]
impl SessionLease for SlowRelease {
    async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
        self.real.acquire(s, o).await
    }
    async fn acquire_above(
        &self,
        s: &SessionId,
        o: &OwnerId,
        f: FencingToken,
    ) -> Result<Lease, LeaseError> {
        self.real.acquire_above(s, o, f).await
    }
    async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.real.renew(l).await
    }
    async fn release(&self, l: &Lease) -> Result<(), LeaseError> {
        sleep(self.delay).await;
        self.real.release(l).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.real.authority().await
    }
}

fn mem(clock: &ManualClock) -> MemLease {
    MemLease::builder()
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .build()
}

// P1: dropping the guard (not finish) does not mark the slot "ending" until
// the spawned release task first runs; a request right after is refused.
#[tokio::test(start_paused = true)]
async fn the_next_request_after_a_dropped_guard_waits_for_its_release() {
    let clock = ManualClock::new();
    let k = LeaseKeeper::new(Arc::new(mem(&clock)), owner("a"), TTL).unwrap();
    let run = k.acquire(&sid("s")).await.unwrap();
    drop(run); // the run answered; its release "has begun"
    let next = k.acquire(&sid("s")).await;
    assert!(
        next.is_ok(),
        "next request after a dropped run was refused: {:?}",
        next.err().map(|e| e.to_string())
    );
}

// P2: two waiters queue behind an ending run; the first gets the lock and is
// live, but the second keeps its "ending" deadline and waits ~10 s for a LIVE
// run instead of being refused at once.
#[tokio::test(start_paused = true)]
async fn a_waiter_behind_a_release_is_refused_once_the_lock_passed_to_a_live_run() {
    let clock = ManualClock::new();
    let backend = SlowRelease {
        real: mem(&clock),
        delay: Duration::from_secs(1),
    };
    let k = LeaseKeeper::new(Arc::new(backend), owner("a"), TTL).unwrap();
    let first = k.acquire(&sid("s")).await.unwrap();
    let finishing = tokio::spawn(first.finish());
    sleep(Duration::from_millis(1)).await; // release has begun (mark_ending ran)

    let (k1, k2) = (k.clone(), k.clone());
    let w1 = tokio::spawn(async move { k1.acquire(&sid("s")).await });
    sleep(Duration::from_millis(1)).await;
    let t2 = Instant::now();
    let w2 = tokio::spawn(async move {
        let r = k2.acquire(&sid("s")).await;
        (r, Instant::now())
    });
    finishing.await.unwrap().unwrap();
    let live = w1
        .await
        .unwrap()
        .expect("w1 gets the session after the release");
    assert!(live.is_leased());
    // `live` is now a live run of the session; w2 is a competitor of a live run.
    let (r2, done) = w2.await.unwrap();
    let waited = done - t2;
    eprintln!(
        "w2: {:?} after {:?}",
        r2.as_ref().map(|_| ()).map_err(|e| e.kind()),
        waited
    );
    assert!(
        waited < Duration::from_secs(2),
        "w2 waited {waited:?} for a live run (rule 1: refused at once)"
    );
    drop(live);
}

// P3a: a "wait forever" bound panics on Instant overflow, even with the lock free.
#[tokio::test(start_paused = true)]
async fn an_unbounded_lock_wait_does_not_overflow() {
    let clock = ManualClock::new();
    let k = LeaseKeeper::new(Arc::new(mem(&clock)), owner("a"), TTL).unwrap();
    let r = tokio::spawn(async move { k.acquire_within(&sid("s"), Duration::MAX).await.map(drop) })
        .await;
    assert!(r.is_ok(), "acquire_within(MAX) panicked: {:?}", r.err());
}

// P3b: write_wait(Duration::MAX) makes every acquire panic (Duration add).
#[tokio::test(start_paused = true)]
async fn an_unbounded_write_wait_does_not_overflow() {
    let clock = ManualClock::new();
    let k = LeaseKeeper::builder(Arc::new(mem(&clock)), owner("a"), TTL)
        .write_wait(Duration::MAX)
        .build()
        .unwrap();
    let r = tokio::spawn(async move { k.acquire(&sid("s")).await.map(drop) }).await;
    assert!(
        r.is_ok(),
        "acquire with write_wait(MAX) panicked: {:?}",
        r.err()
    );
}

// P4: two keepers with one owner id over one backend: both hold the session
// at once, under the same token; one's release frees the other's lease.
// P5: a wall-clock step forward on memlease's clock (no monotonic time passes)
// lets a second keeper take the session while the first still believes it
// holds it for 30 s: memlease's grants are shorter than its granted_ttl.
// P6: Display includes the source AND source() returns it: a chain printer
// (anyhow's {:#}, tracing's error chain) prints every cause twice.
// P7: Retry-After value from memlease's held_for is the exact wall time left:
// sub-second near the end of the lease (a consumer that truncates gets 0).
// P8: the ending wait is counted from when the waiter started, not from when
// the release began: a waiter whose holder begins ending late is refused
// although the release finishes within write_wait + release_timeout.
#[tokio::test(start_paused = true)]
async fn the_wait_for_a_release_counts_from_when_the_release_began() {
    let clock = ManualClock::new();
    let backend = SlowRelease {
        real: mem(&clock),
        delay: Duration::from_secs(3),
    };
    let k = LeaseKeeper::new(Arc::new(backend), owner("a"), TTL).unwrap();
    let first = k.acquire(&sid("s")).await.unwrap();
    let k2 = k.clone();
    let w = tokio::spawn(async move { k2.acquire_within(&sid("s"), Duration::from_secs(9)).await });
    sleep(Duration::from_secs(8)).await;
    let fin = tokio::spawn(first.finish()); // release begins at 8 s, takes 3 s (< 5 s timeout)
    let r = w.await.unwrap();
    fin.await.unwrap().unwrap();
    assert!(
        r.is_ok(),
        "a waiter was refused while the run's release (begun, within its bound) was under way: {:?}",
        r.err().map(|e| e.to_string())
    );
}

// P9: a waiter that is cancelled after the holder ended but before it is
// polled again: does the next acquire still work (no wedged slot)?
#[tokio::test(start_paused = true)]
async fn a_waiter_cancelled_after_the_handoff_leaves_the_session_usable() {
    let clock = ManualClock::new();
    let k = LeaseKeeper::builder(Arc::new(mem(&clock)), owner("a"), TTL)
        .build()
        .unwrap();
    let first = k.acquire(&sid("s")).await.unwrap();
    let k2 = k.clone();
    let mut waiter =
        Box::pin(async move { k2.acquire_within(&sid("s"), Duration::from_secs(60)).await });
    assert!(futures_poll_once(&mut waiter).await.is_none());
    first.finish().await.unwrap(); // lock handed to the (unpolled) waiter
    drop(waiter);
    let again = tokio::time::timeout(Duration::from_secs(1), k.acquire(&sid("s"))).await;
    assert!(
        matches!(again, Ok(Ok(_))),
        "{:?}",
        again.map(|r| r.map(drop).map_err(|e| e.kind()))
    );
}

async fn futures_poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

// P10: shutdown while a write task is pending, and a waiter waits on the
// ending run; then write lands after shutdown? (fence check vs. store)
// P1b: the same on a multi-threaded runtime (real time), counted over many tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_request_after_a_dropped_guard_waits_on_a_multi_threaded_runtime() {
    let k = LeaseKeeper::new(Arc::new(MemLease::new(TTL)), owner("a"), TTL).unwrap();
    let mut busy = 0;
    for i in 0..500 {
        let s = sid(&format!("s{i}"));
        let run = k.acquire(&s).await.unwrap();
        drop(run);
        match k.acquire(&s).await {
            Ok(g) => g.finish().await.unwrap(),
            Err(e) if e.kind() == KeeperErrorKind::Busy => busy += 1,
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!("Busy right after a dropped guard: {busy}/500");
    assert_eq!(busy, 0);
}
