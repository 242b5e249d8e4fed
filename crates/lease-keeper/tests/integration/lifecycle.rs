//! The lifecycle rules, each against memlease (wrapped, where a fault must
//! be injected) with the backend's wall time on a `ManualClock` and the
//! keeper's monotonic time on tokio's paused clock.

use std::future::pending;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{
    DEFAULT_WRITE_WAIT, KeeperErrorKind, KeeperMetrics, LeaseKeeper, LossReason, RenewOutcome,
};
use lease_port::{
    AuthorityId, FencingToken, Lease, LeaseError, LeaseErrorKind, ManualClock, OwnerId, SessionId,
    SessionLease,
};
use memlease::MemLease;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Acquire,
    Renew {
        at: Instant,
        sent: Lease,
        got: Option<Lease>,
    },
    Release {
        lease: Lease,
        done: bool,
    },
}

#[derive(Debug, Default)]
struct Faults {
    acquire: Option<LeaseErrorKind>,
    /// Renewals that succeed before every later one fails with this kind.
    renew_ok_then: Option<(usize, LeaseErrorKind)>,
    release_delay: Option<Duration>,
    release_hangs: bool,
    /// Releases still to fail (transiently) before they succeed again.
    release_fails: usize,
    /// Every renewal call from now on never answers.
    renew_hangs: bool,
    /// Acquire answers only after this long.
    acquire_delay: Option<Duration>,
}

/// memlease with a call log and injectable faults.
#[derive(Debug, Clone)]
struct Probe {
    real: MemLease,
    calls: Arc<Mutex<Vec<Call>>>,
    faults: Arc<Mutex<Faults>>,
    renews_ok: Arc<AtomicUsize>,
}

impl Probe {
    fn new(real: MemLease) -> Self {
        Self {
            real,
            calls: Arc::default(),
            faults: Arc::default(),
            renews_ok: Arc::default(),
        }
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    fn count(&self, f: impl Fn(&Call) -> bool) -> usize {
        self.calls().iter().filter(|c| f(c)).count()
    }
    fn renews(&self) -> Vec<(Instant, Lease, Option<Lease>)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Renew { at, sent, got } => Some((at, sent, got)),
                _ => None,
            })
            .collect()
    }
}

#[async_trait]
impl SessionLease for Probe {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.calls.lock().unwrap().push(Call::Acquire);
        let (fault, delay) = {
            let f = self.faults.lock().unwrap();
            (f.acquire, f.acquire_delay)
        };
        if let Some(d) = delay {
            sleep(d).await;
        }
        match fault {
            Some(kind) => Err(LeaseError::new(kind, "injected")),
            None => self.real.acquire(session, owner).await,
        }
    }

    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        self.calls.lock().unwrap().push(Call::Acquire);
        let fault = self.faults.lock().unwrap().acquire;
        match fault {
            Some(kind) => Err(LeaseError::new(kind, "injected")),
            None => self.real.acquire_above(session, owner, floor).await,
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let at = Instant::now();
        let (fault, hangs) = {
            let f = self.faults.lock().unwrap();
            (f.renew_ok_then, f.renew_hangs)
        };
        if hangs {
            self.calls.lock().unwrap().push(Call::Renew {
                at,
                sent: lease.clone(),
                got: None,
            });
            pending::<()>().await;
        }
        let result = match fault {
            Some((n, kind)) if self.renews_ok.load(Ordering::SeqCst) >= n => {
                Err(LeaseError::new(kind, "injected"))
            }
            _ => self.real.renew(lease).await,
        };
        if result.is_ok() {
            self.renews_ok.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.lock().unwrap().push(Call::Renew {
            at,
            sent: lease.clone(),
            got: result.as_ref().ok().cloned(),
        });
        result
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let (delay, hangs) = {
            let f = self.faults.lock().unwrap();
            (f.release_delay, f.release_hangs)
        };
        self.calls.lock().unwrap().push(Call::Release {
            lease: lease.clone(),
            done: false,
        });
        if hangs {
            pending::<()>().await;
        }
        if let Some(d) = delay {
            sleep(d).await;
        }
        let fail = {
            let mut f = self.faults.lock().unwrap();
            let fail = f.release_fails > 0;
            f.release_fails = f.release_fails.saturating_sub(1);
            fail
        };
        let r = if fail {
            Err(LeaseError::transient("injected"))
        } else {
            self.real.release(lease).await
        };
        self.calls.lock().unwrap().push(Call::Release {
            lease: lease.clone(),
            done: true,
        });
        r
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.real.authority().await
    }
}

struct World {
    clock: ManualClock,
    backend: MemLease,
    probe: Probe,
}

fn world() -> World {
    let clock = ManualClock::new();
    let backend = MemLease::builder()
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .build();
    let probe = Probe::new(backend.clone());
    World {
        clock,
        backend,
        probe,
    }
}

fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn keeper(w: &World, jitter: f64) -> LeaseKeeper {
    LeaseKeeper::builder(Arc::new(w.probe.clone()), owner("a"), TTL)
        .jitter(jitter)
        .build()
        .unwrap()
}

fn is_release_done(c: &Call) -> bool {
    matches!(c, Call::Release { done: true, .. })
}

fn is_release(c: &Call) -> bool {
    matches!(c, Call::Release { done: false, .. })
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl_passing_the_newest_value() {
    let w = world();
    let k = keeper(&w, 0.0);
    let start = Instant::now();
    let guard = k.acquire(&sid("s")).await.unwrap();
    let first = guard.lease().unwrap();
    // Move the backend's wall clock along with tokio's, so each renewal
    // returns a distinct expiry.
    for _ in 0..95 {
        w.clock.advance(Duration::from_secs(1));
        sleep(Duration::from_secs(1)).await;
    }
    let renews = w.probe.renews();
    assert_eq!(renews.len(), 9, "renewals at 10 s, 20 s, … 90 s");
    for (i, (at, _, _)) in renews.iter().enumerate() {
        assert_eq!(*at - start, TTL / 3 * (i as u32 + 1));
    }
    let mut newest = first;
    for (_, sent, got) in &renews {
        assert_eq!(sent, &newest, "each renewal passes the previous answer");
        let got = got.clone().expect("renewed");
        assert!(got.expiry() > newest.expiry());
        newest = got;
    }
    assert_eq!(guard.lease(), Some(newest.clone()));
    assert_eq!(*guard.watch().borrow(), Some(newest));
    assert!(!guard.is_lost());
    guard.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_the_interval_within_its_bounds() {
    let w = world();
    let k = keeper(&w, 0.2);
    let start = Instant::now();
    let guard = k.acquire(&sid("s")).await.unwrap();
    sleep(TTL * 10).await;
    let mut prev = start;
    let mut gaps = Vec::new();
    for (at, _, _) in w.probe.renews() {
        gaps.push(at - prev);
        prev = at;
    }
    assert!(gaps.len() >= 20, "{gaps:?}");
    let (lo, hi) = (TTL / 3 * 8 / 10, TTL / 3 * 12 / 10);
    assert!(gaps.iter().all(|g| *g >= lo && *g <= hi), "{gaps:?}");
    assert!(
        gaps.iter().any(|g| *g != gaps[0]),
        "jitter applied: {gaps:?}"
    );
    assert!(!guard.is_lost());
}

#[tokio::test(start_paused = true)]
async fn held_on_renew_cancels_the_run_and_never_releases_the_stale_lease() {
    let w = world();
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    let ours = guard.lease().unwrap();

    // The run: works until the loss signal fires.
    let lost = guard.loss_signal();
    let run = tokio::spawn(async move {
        tokio::select! {
            () = lost.lost() => "cancelled",
            () = pending::<()>() => "finished",
        }
    });

    // Backend time passes the expiry (we were paused); b takes over.
    w.clock.advance(TTL + Duration::from_secs(1));
    let theirs = w.backend.acquire(&sid("s"), &owner("b")).await.unwrap();
    assert!(theirs.token() > ours.token());

    timeout(TTL, guard.lost()).await.expect("loss fires");
    assert_eq!(
        guard.loss(),
        Some(LossReason::Held {
            holder: Some(owner("b"))
        })
    );
    assert_eq!(timeout(TTL, run).await.unwrap().unwrap(), "cancelled");
    assert_eq!(k.held_leases(), 0);

    guard.finish().await.unwrap();
    sleep(TTL).await;
    assert_eq!(w.probe.count(is_release), 0, "stale lease never released");
    // b's hold is untouched.
    let renewed = w.backend.renew(&theirs).await.unwrap();
    assert_eq!(renewed.token(), theirs.token());
}

#[tokio::test(start_paused = true)]
async fn transient_renew_failures_until_the_expiry_are_loss() {
    let w = world();
    // The first renewal succeeds; every later one fails transiently.
    w.probe.faults.lock().unwrap().renew_ok_then = Some((1, LeaseErrorKind::Transient));
    let k = keeper(&w, 0.0);
    let start = Instant::now();
    let guard = k.acquire(&sid("s")).await.unwrap();

    timeout(TTL * 3, guard.lost()).await.expect("loss fires");
    let lost_at = Instant::now();
    assert_eq!(guard.loss(), Some(LossReason::Expired));

    let renews = w.probe.renews();
    let last_ok = renews.iter().rfind(|r| r.2.is_some()).unwrap().0;
    assert_eq!(last_ok - start, TTL / 3);
    let failures = renews.iter().filter(|r| r.2.is_none()).count();
    assert!(failures >= 2, "transient failures are retried: {failures}");
    // Loss comes at the expiry counted from when the last successful
    // renewal was sent — not from the acquisition, and not later.
    assert_eq!(lost_at, last_ok + TTL);
    assert!(renews.iter().all(|r| r.0 < last_ok + TTL));
}

#[tokio::test(start_paused = true)]
async fn a_transient_blip_is_not_loss() {
    let w = world();
    w.probe.faults.lock().unwrap().renew_ok_then = Some((0, LeaseErrorKind::Transient));
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    sleep(TTL / 2).await;
    w.probe.faults.lock().unwrap().renew_ok_then = None;
    sleep(TTL * 2).await;
    assert!(!guard.is_lost());
    assert!(w.probe.renews().iter().any(|r| r.2.is_none()));
    assert!(w.probe.renews().last().unwrap().2.is_some());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_callers_future_still_releases() {
    let w = world();
    let k = keeper(&w, 0.0);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let k2 = k.clone();
    let request = tokio::spawn(async move {
        let guard = k2.acquire(&sid("s")).await.unwrap();
        tx.send(guard.token()).unwrap();
        pending::<()>().await; // the client never finishes
        drop(guard);
    });
    let token = rx.await.unwrap().unwrap();
    request.abort(); // a client disconnect drops the request future
    assert!(request.await.unwrap_err().is_cancelled());

    let taken = timeout(Duration::from_secs(5), async {
        loop {
            match w.backend.acquire(&sid("s"), &owner("b")).await {
                Ok(l) => return l,
                Err(_) => sleep(Duration::from_millis(1)).await,
            }
        }
    })
    .await
    .expect("the detached release freed the session");
    assert!(taken.token() > token);
    assert_eq!(w.probe.count(is_release_done), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_finish_midway_does_not_cancel_the_release() {
    let w = world();
    w.probe.faults.lock().unwrap().release_delay = Some(Duration::from_secs(2));
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    let finish = timeout(Duration::from_millis(10), guard.finish()).await;
    assert!(finish.is_err(), "finish was cut short");
    assert_eq!(w.probe.count(is_release_done), 0);
    sleep(Duration::from_secs(3)).await;
    assert_eq!(w.probe.count(is_release_done), 1);
    w.backend.acquire(&sid("s"), &owner("b")).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_everything_and_refuses_new_runs() {
    let w = world();
    let k = keeper(&w, 0.0);
    let ids: Vec<SessionId> = (0..3).map(|i| sid(&format!("s{i}"))).collect();
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(k.acquire(id).await.unwrap());
    }
    let k2 = k.clone();
    let first = ids[0].clone();
    let waiter = tokio::spawn(async move {
        k2.acquire_within(&first, Duration::from_secs(60))
            .await
            .map(|_| ())
    });
    sleep(Duration::from_millis(5)).await;

    let report = k.shutdown().await;
    assert_eq!(report.ended_runs, 3);
    assert!(report.complete);
    assert_eq!(k.held_leases(), 0);
    for g in &guards {
        assert!(g.is_lost());
        assert_eq!(g.loss(), Some(LossReason::Shutdown));
    }
    assert_eq!(
        waiter.await.unwrap().unwrap_err().kind(),
        KeeperErrorKind::ShuttingDown
    );
    for id in &ids {
        w.backend.acquire(id, &owner("b")).await.expect("released");
    }
    assert_eq!(
        k.acquire(&sid("new")).await.unwrap_err().kind(),
        KeeperErrorKind::ShuttingDown
    );
    drop(guards); // releasing again is a no-op
    sleep(Duration::from_secs(1)).await;
    assert_eq!(w.probe.count(is_release), 3);
}

#[tokio::test(start_paused = true)]
async fn shutdown_is_bounded_when_a_release_hangs() {
    let w = world();
    w.probe.faults.lock().unwrap().release_hangs = true;
    let k = LeaseKeeper::builder(Arc::new(w.probe.clone()), owner("a"), TTL)
        .shutdown_timeout(Duration::from_secs(2))
        .release_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let _guard = k.acquire(&sid("s")).await.unwrap();
    let report = timeout(Duration::from_secs(10), k.shutdown())
        .await
        .expect("bounded");
    assert_eq!(report.ended_runs, 1);
    assert!(!report.complete);
}

/// A backend that cannot lease at all, counting how often it is asked.
#[derive(Debug, Default)]
struct NoLeases {
    calls: AtomicUsize,
}

#[async_trait]
impl SessionLease for NoLeases {
    async fn acquire(&self, _: &SessionId, _: &OwnerId) -> Result<Lease, LeaseError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(LeaseError::unsupported("no coordination here"))
    }
    async fn renew(&self, _: &Lease) -> Result<Lease, LeaseError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(LeaseError::unsupported("no coordination here"))
    }
    async fn release(&self, _: &Lease) -> Result<(), LeaseError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(LeaseError::unsupported("no coordination here"))
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        Err(LeaseError::unsupported("no coordination here"))
    }
}

#[tokio::test(start_paused = true)]
async fn unsupported_is_consulted_once_then_runs_go_unleased() {
    let backend = Arc::new(NoLeases::default());
    let k = LeaseKeeper::builder(backend.clone(), owner("a"), TTL)
        .allow_unleased(true)
        .build()
        .unwrap();
    for i in 0..3 {
        let g = k.acquire(&sid(&format!("s{i}"))).await.unwrap();
        assert!(!g.is_leased());
        assert_eq!(g.token(), None);
        assert_eq!(g.lease(), None);
        sleep(TTL * 2).await;
        assert!(!g.is_lost());
        g.finish().await.unwrap();
    }
    assert!(k.is_unleased());
    assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
    // Unleased runs of one session are still serialised in-process.
    let g = k.acquire(&sid("s0")).await.unwrap();
    let busy = k.acquire_within(&sid("s0"), Duration::from_secs(1)).await;
    assert_eq!(busy.unwrap_err().kind(), KeeperErrorKind::Busy);
    drop(g);
}

#[tokio::test(start_paused = true)]
async fn a_keeper_that_may_not_run_unleased_fails_runs_and_keeps_asking() {
    let backend = Arc::new(NoLeases::default());
    let k = LeaseKeeper::builder(backend.clone(), owner("a"), TTL)
        .allow_unleased(false)
        .build()
        .unwrap();
    for i in 0..3 {
        let err = k.acquire(&sid(&format!("s{i}"))).await.unwrap_err();
        assert_eq!(err.kind(), KeeperErrorKind::Unavailable, "{err}");
        assert!(err.is_retryable());
    }
    assert!(!k.is_unleased(), "a leased keeper turned unleased");
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        3,
        "the backend must be asked again on every run"
    );
    let fault = k.backend_fault().expect("the refusal is reported");
    assert!(fault.contains("no coordination here"), "{fault}");
}

#[tokio::test(start_paused = true)]
async fn a_failing_backend_is_reported_until_a_call_succeeds() {
    let w = world();
    let k = keeper(&w, 0.0);
    assert_eq!(k.backend_fault(), None);
    w.probe.faults.lock().unwrap().acquire = Some(LeaseErrorKind::Transient);
    let err = k.acquire(&sid("s")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Unavailable);
    assert!(
        k.backend_fault().is_some(),
        "a failing acquire left no fault"
    );
    w.probe.faults.lock().unwrap().acquire = None;
    let g = k.acquire(&sid("s")).await.unwrap();
    assert_eq!(
        k.backend_fault(),
        None,
        "a successful acquire kept the fault"
    );
    g.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_second_run_of_a_live_session_is_refused_at_once_but_waits_for_a_release() {
    let w = world();
    w.probe.faults.lock().unwrap().release_delay = Some(Duration::from_secs(1));
    let k = keeper(&w, 0.0);
    let first = k.acquire(&sid("s")).await.unwrap();
    let t1 = first.token().unwrap();

    // Live here: refused at once, as a run elsewhere is.
    let asked = tokio::time::Instant::now();
    let err = k.acquire(&sid("s")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Busy);
    assert_eq!(asked.elapsed(), Duration::ZERO, "a live run was waited for");
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(TTL));

    // A wait asked for is a bound, not a promise.
    let err = k
        .acquire_within(&sid("s"), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Busy);

    // A cancelled waiter leaves nothing behind.
    let cancelled = timeout(
        Duration::from_millis(10),
        k.acquire_within(&sid("s"), Duration::from_secs(60)),
    )
    .await;
    assert!(cancelled.is_err());

    // Once the first run's release has begun, a plain acquire waits for it
    // (1 s here) instead of being refused for a session nobody runs.
    let k2 = k.clone();
    drop(first); // released on a detached task, taking 1 s
    let second = tokio::spawn(async move { k2.acquire(&sid("s")).await });
    sleep(Duration::from_millis(10)).await;
    assert!(!second.is_finished());
    let second = second.await.unwrap().unwrap();
    // The second run started only after the first lease was released.
    let calls = w.probe.calls();
    let released = calls.iter().position(is_release_done).unwrap();
    let acquires: Vec<usize> = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == Call::Acquire)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(acquires.len(), 2);
    assert!(acquires[1] > released);
    assert!(second.token().unwrap() > t1);
    // And its fresh lease is live on the backend.
    assert_eq!(
        w.backend
            .acquire(&sid("s"), &owner("b"))
            .await
            .unwrap_err()
            .kind(),
        LeaseErrorKind::Held
    );
}

#[tokio::test(start_paused = true)]
async fn acquire_maps_backend_answers_to_keeper_errors() {
    let w = world();
    let k = keeper(&w, 0.0);
    w.backend.acquire(&sid("held"), &owner("b")).await.unwrap();
    let err = k.acquire(&sid("held")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::LeasedElsewhere);
    assert_eq!(err.holder(), Some(&owner("b")));
    assert!(!err.is_retryable());
    assert!(std::error::Error::source(&err).is_some());

    w.probe.faults.lock().unwrap().acquire = Some(LeaseErrorKind::Transient);
    let err = k.acquire(&sid("x")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Unavailable);
    assert!(err.is_retryable());
    assert_eq!(k.held_leases(), 0);

    w.probe.faults.lock().unwrap().acquire = Some(LeaseErrorKind::Invalid);
    let err = k.acquire(&sid("x")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Invalid);
    assert!(!k.is_unleased());

    // An authority whose state went back: never retryable, and reported
    // as the backend's fault until a call succeeds.
    w.probe.faults.lock().unwrap().acquire = Some(LeaseErrorKind::Rewound);
    let err = k.acquire(&sid("x")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Rewound);
    assert!(!err.is_retryable());
    assert!(k.backend_fault().is_some_and(|f| f.contains("went back")));
    assert_eq!(k.held_leases(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_run_acquired_above_a_floor_writes_above_it() {
    let w = world();
    let k = keeper(&w, 0.0);
    let first = k.acquire(&sid("s")).await.unwrap();
    let token = first.token().unwrap();
    first.finish().await.unwrap();
    let floor = FencingToken::new(token.get() + 100);
    let raised = k.acquire_above_within(&sid("s"), TTL, floor).await.unwrap();
    assert!(raised.token().unwrap() > floor, "{:?}", raised.token());
    raised.finish().await.unwrap();
    let next = k.acquire(&sid("s")).await.unwrap();
    assert!(next.token().unwrap() > floor, "the floor was not kept");
    next.finish().await.unwrap();
}

#[test]
fn bad_configuration_is_invalid() {
    let backend: Arc<dyn SessionLease> = Arc::new(MemLease::new(TTL));
    let b = || LeaseKeeper::builder(backend.clone(), owner("a"), TTL);
    for built in [
        LeaseKeeper::builder(backend.clone(), owner("a"), Duration::ZERO).build(),
        b().renew_fraction(0.0).build(),
        b().renew_fraction(1.0).build(),
        b().renew_fraction(f64::NAN).build(),
        b().jitter(-0.1).build(),
        b().jitter(0.9).build(),
    ] {
        assert_eq!(built.unwrap_err().kind(), KeeperErrorKind::Invalid);
    }
}

#[derive(Debug, Default)]
struct Counting {
    gauge: Mutex<Vec<usize>>,
    acquired: AtomicUsize,
    lost: AtomicUsize,
    renewed: AtomicUsize,
    released: AtomicUsize,
}

impl KeeperMetrics for Counting {
    fn held_leases(&self, count: usize) {
        self.gauge.lock().unwrap().push(count);
    }
    fn acquired(&self, _: &SessionId) {
        self.acquired.fetch_add(1, Ordering::SeqCst);
    }
    fn lost(&self, _: &SessionId, _: &LossReason) {
        self.lost.fetch_add(1, Ordering::SeqCst);
    }
    fn renew_latency(&self, _: Duration, outcome: RenewOutcome) {
        if outcome == RenewOutcome::Renewed {
            self.renewed.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn released(&self, _: &SessionId, ok: bool) {
        assert!(ok);
        self.released.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_hooks_see_the_lifecycle() {
    let w = world();
    let m = Arc::new(Counting::default());
    let k = LeaseKeeper::builder(Arc::new(w.probe.clone()), owner("a"), TTL)
        .jitter(0.0)
        .metrics(m.clone())
        .build()
        .unwrap();
    let g1 = k.acquire(&sid("one")).await.unwrap();
    let g2 = k.acquire(&sid("two")).await.unwrap();
    sleep(TTL / 2).await;
    g1.finish().await.unwrap();
    w.clock.advance(TTL * 2);
    w.backend.acquire(&sid("two"), &owner("b")).await.unwrap();
    timeout(TTL, g2.lost()).await.unwrap();
    assert_eq!(m.acquired.load(Ordering::SeqCst), 2);
    assert_eq!(m.lost.load(Ordering::SeqCst), 1);
    assert_eq!(m.released.load(Ordering::SeqCst), 1);
    assert!(m.renewed.load(Ordering::SeqCst) >= 2);
    assert_eq!(*m.gauge.lock().unwrap(), vec![1, 2, 1, 0]);
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_release_the_next_run_gets_a_greater_token() {
    let w = world();
    w.probe.faults.lock().unwrap().release_fails = 1;
    let k = keeper(&w, 0.0);
    let first = k.acquire(&sid("s")).await.unwrap();
    let used = first.token().unwrap();
    let err = first.finish().await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Unavailable);

    // The backend still holds the lease for us: a same-owner acquire would
    // hand back the token the previous run wrote under.
    let next = k.acquire(&sid("s")).await.unwrap();
    assert!(
        next.token().unwrap() > used,
        "the next run reuses token {used} after a failed release"
    );
    next.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_hung_renew_is_loss_at_the_expiry_counted_from_the_last_renewal_sent() {
    let w = world();
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    // One good renewal, then every renewal hangs.
    sleep(TTL / 3 + Duration::from_secs(1)).await;
    let renewed_at = w.probe.renews()[0].0;
    w.probe.faults.lock().unwrap().renew_hangs = true;

    timeout(TTL * 2, guard.lost()).await.expect("loss fires");
    assert_eq!(Instant::now(), renewed_at + TTL);
    assert_eq!(guard.loss(), Some(LossReason::Expired));
    let hung = w
        .probe
        .renews()
        .into_iter()
        .filter(|r| r.2.is_none())
        .count();
    assert_eq!(hung, 1, "the hung renewal was sent and never answered");
    guard.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_acquire_answering_after_the_ttl_is_not_a_live_lease() {
    let w = world();
    // An acquire timeout longer than the TTL, and an acquire that answers
    // after the lease it grants must be taken as expired.
    w.probe.faults.lock().unwrap().acquire_delay = Some(TTL + Duration::from_secs(1));
    let k = LeaseKeeper::builder(Arc::new(w.probe.clone()), owner("a"), TTL)
        .jitter(0.0)
        .acquire_timeout(TTL * 2)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = k.acquire(&sid("s")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Unavailable);
    assert_eq!(Instant::now(), started + TTL, "bounded by the TTL");
    assert_eq!(k.held_leases(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_release_failing_again_fails_the_next_run_until_the_lease_lapses() {
    let w = world();
    w.probe.faults.lock().unwrap().release_fails = 2;
    let k = keeper(&w, 0.0);
    let first = k.acquire(&sid("s")).await.unwrap();
    let used = first.token().unwrap();
    first.finish().await.unwrap_err();

    // Re-granted the old token, and it cannot be given back: no run.
    let err = k.acquire(&sid("s")).await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::Unavailable);
    assert_eq!(k.held_leases(), 0);

    // Once the old lease has lapsed, the backend grants a greater token.
    w.clock.advance(TTL + Duration::from_secs(1));
    sleep(TTL + Duration::from_secs(1)).await;
    let next = k.acquire(&sid("s")).await.unwrap();
    assert!(next.token().unwrap() > used);
    next.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_release_waits_for_the_writes_in_flight() {
    let w = world();
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    let write = guard.begin_write().unwrap();
    let gate = guard.write_gate();
    let finish = tokio::spawn(guard.finish());

    sleep(DEFAULT_WRITE_WAIT / 2).await;
    assert_eq!(w.probe.count(is_release), 0, "released under a write");
    // The next run waits for the ending one, and for its write.
    let k2 = k.clone();
    let next = tokio::spawn(async move { k2.acquire(&sid("s")).await });
    sleep(Duration::from_millis(10)).await;
    assert!(!next.is_finished(), "the next run started under a write");
    let refused = gate.begin().unwrap_err();
    assert_eq!(refused.kind(), KeeperErrorKind::RunEnded);

    drop(write);
    finish.await.unwrap().unwrap();
    assert_eq!(w.probe.count(is_release_done), 1);
    next.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn writes_outliving_the_write_wait_keep_the_lease_to_lapse_and_the_session_busy() {
    let w = world();
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    let used = guard.token().unwrap();
    let write = guard.begin_write().unwrap();

    let started = Instant::now();
    let err = guard.finish().await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::WritesInFlight);
    assert_eq!(Instant::now(), started + DEFAULT_WRITE_WAIT);
    assert_eq!(w.probe.count(is_release), 0, "the lease is left to lapse");
    // Nobody else gets the session while the write may still land.
    let held = w.backend.acquire(&sid("s"), &owner("b")).await.unwrap_err();
    assert_eq!(held.kind(), LeaseErrorKind::Held);
    // And no run of it starts here either.
    let busy = k
        .acquire_within(&sid("s"), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), KeeperErrorKind::Busy);
    sleep(TTL * 2).await;
    let busy = k
        .acquire_within(&sid("s"), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), KeeperErrorKind::Busy);

    // The write ends: the next run starts, under a greater token although
    // the backend (whose clock did not move) still holds the old lease.
    drop(write);
    // The lock is given up on a task once the write ended: past the bound
    // on waiting for a release, the next run asks to wait for it.
    let next = timeout(
        Duration::from_secs(1),
        k.acquire_within(&sid("s"), Duration::from_secs(1)),
    )
    .await
    .expect("the session is free once the write ended")
    .unwrap();
    assert!(next.token().unwrap() > used);
    next.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn no_write_starts_once_ownership_is_lost() {
    let w = world();
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    let gate = guard.write_gate();
    drop(gate.begin().unwrap());

    w.clock.advance(TTL + Duration::from_secs(1));
    w.backend.acquire(&sid("s"), &owner("b")).await.unwrap();
    timeout(TTL, guard.lost()).await.expect("loss fires");
    assert_eq!(gate.begin().unwrap_err().kind(), KeeperErrorKind::RunEnded);
    guard.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unleased_run_holds_the_session_until_its_writes_end() {
    let w = world();
    w.probe.faults.lock().unwrap().acquire = Some(LeaseErrorKind::Unsupported);
    let k = LeaseKeeper::builder(Arc::new(w.probe.clone()), owner("a"), TTL)
        .allow_unleased(true)
        .write_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    let guard = k.acquire(&sid("s")).await.unwrap();
    assert!(!guard.is_leased());
    let write = guard.begin_write().unwrap();
    let err = guard.finish().await.unwrap_err();
    assert_eq!(err.kind(), KeeperErrorKind::WritesInFlight);
    let busy = k
        .acquire_within(&sid("s"), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), KeeperErrorKind::Busy);
    drop(write);
    timeout(
        Duration::from_secs(1),
        k.acquire_within(&sid("s"), Duration::from_secs(1)),
    )
    .await
    .expect("free once the write ended")
    .unwrap();
}

/// The time an agent may still start a side effect in: a TTL from the
/// last renewal's send, less one renewal interval; it moves on with each
/// renewal, runs down when renewals stop answering (to zero an interval
/// before the loss), and is zero once the lease is lost.
#[tokio::test(start_paused = true)]
async fn safe_time_is_the_deadline_less_an_interval_and_zero_once_lost() {
    let w = world();
    // The first renewal (at TTL/3) succeeds; every later one fails.
    w.probe.faults.lock().unwrap().renew_ok_then = Some((1, LeaseErrorKind::Transient));
    let k = keeper(&w, 0.0);
    let guard = k.acquire(&sid("s")).await.unwrap();
    let interval = TTL / 3;
    assert_eq!(guard.safe_for(), Some(TTL - interval));
    let gate = guard.write_gate();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        gate.safe_for(),
        Some(TTL - interval - Duration::from_secs(5))
    );
    // Renewed at TTL/3: the deadline is a TTL from then.
    w.clock.advance(interval);
    sleep(interval - Duration::from_secs(5) + Duration::from_millis(1)).await;
    let renewed_at = Instant::now() - Duration::from_millis(1);
    assert_eq!(
        gate.safe_for(),
        Some(renewed_at + TTL - interval - Instant::now())
    );
    // Renewals fail from now on: the safe time reaches zero an interval
    // before the loss, and stays there.
    sleep_until_safe_time_is_zero(&gate).await;
    assert_eq!(Instant::now(), renewed_at + TTL - interval);
    assert!(!guard.is_lost());
    timeout(TTL, guard.lost()).await.expect("loss fires");
    assert_eq!(Instant::now(), renewed_at + TTL);
    assert_eq!(gate.safe_for(), Some(Duration::ZERO));
    drop(guard);

    // Unleased, nothing bounds a run.
    let w = world();
    w.probe.faults.lock().unwrap().acquire = Some(LeaseErrorKind::Unsupported);
    let unleased = LeaseKeeper::builder(Arc::new(w.probe.clone()), owner("u"), TTL)
        .allow_unleased(true)
        .build()
        .unwrap();
    let guard = unleased.acquire(&sid("s")).await.unwrap();
    assert!(!guard.is_leased());
    assert_eq!(guard.safe_for(), None);
}

async fn sleep_until_safe_time_is_zero(gate: &lease_keeper::WriteGate) {
    loop {
        match gate.safe_for() {
            Some(d) if d.is_zero() => return,
            Some(d) => sleep(d).await,
            None => panic!("leased"),
        }
    }
}
