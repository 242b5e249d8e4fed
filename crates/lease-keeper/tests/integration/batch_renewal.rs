//! Batch renewal: against memlease wrapped as a backend that renews in
//! batches, recording every `renew_many` call, with the backend's wall
//! time on a `ManualClock` and the keeper's monotonic time on tokio's
//! paused clock (so deadlines are checked to the instant).

use std::collections::HashMap;
use std::future::pending;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_keeper::{KeeperMetrics, LeaseGuard, LeaseKeeper, LossReason, RenewOutcome};
use lease_port::{
    AuthorityId, FencingToken, Lease, LeaseError, LeaseErrorKind, ManualClock, OwnerId, SessionId,
    SessionLease,
};
use memlease::MemLease;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout};

const TTL: Duration = Duration::from_secs(30);
const INTERVAL: Duration = Duration::from_secs(10);

/// One `renew_many` call as the backend saw it.
#[derive(Debug, Clone)]
struct Batch {
    at: Instant,
    sessions: Vec<SessionId>,
    /// The kind of each failed answer, `None` for a renewal; empty while
    /// the call has not answered.
    answers: Vec<Option<LeaseErrorKind>>,
}

#[derive(Debug, Default)]
struct Faults {
    /// Per session, batch answers still to fail transiently.
    transient: HashMap<SessionId, usize>,
    /// Every batch from now on is recorded and never answers.
    hang: bool,
    /// The next batch renews for real, then answers only once notified.
    hold_answer: Option<Arc<Notify>>,
    /// The next batch renews for real, then answers at this instant.
    answer_at: Option<Instant>,
    /// Every batch answers one result fewer than it was sent.
    short_answer: bool,
}

/// memlease renewing in batches, with a call log and injectable faults.
#[derive(Debug, Clone)]
struct Batcher {
    real: MemLease,
    batches: Arc<Mutex<Vec<Batch>>>,
    single_renews: Arc<AtomicUsize>,
    releases: Arc<Mutex<Vec<(SessionId, FencingToken)>>>,
    faults: Arc<Mutex<Faults>>,
}

impl Batcher {
    fn batches(&self) -> Vec<Batch> {
        self.batches.lock().unwrap().clone()
    }
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap()
    }
    /// The batches that carried `session`, with its answer in each.
    fn answers_for(&self, session: &SessionId) -> Vec<(Instant, Option<Option<LeaseErrorKind>>)> {
        self.batches()
            .into_iter()
            .filter_map(|b| {
                let i = b.sessions.iter().position(|s| s == session)?;
                Some((b.at, b.answers.get(i).copied()))
            })
            .collect()
    }
}

#[async_trait]
impl SessionLease for Batcher {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.real.acquire(session, owner).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.single_renews.fetch_add(1, Ordering::SeqCst);
        self.real.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.releases
            .lock()
            .unwrap()
            .push((lease.session_id().clone(), lease.token()));
        self.real.release(lease).await
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.real.authority().await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        let index = {
            let mut batches = self.batches.lock().unwrap();
            batches.push(Batch {
                at: Instant::now(),
                sessions: leases.iter().map(|l| l.session_id().clone()).collect(),
                answers: Vec::new(),
            });
            batches.len() - 1
        };
        let (hang, hold, answer_at, short) = {
            let mut f = self.faults();
            (
                f.hang,
                f.hold_answer.take(),
                f.answer_at.take(),
                f.short_answer,
            )
        };
        if hang {
            pending::<()>().await;
        }
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            let fail = {
                let mut f = self.faults();
                match f.transient.get_mut(lease.session_id()) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    _ => false,
                }
            };
            out.push(if fail {
                Err(LeaseError::transient("injected"))
            } else {
                self.real.renew(lease).await
            });
        }
        if let Some(gate) = hold {
            gate.notified().await;
        }
        if let Some(at) = answer_at {
            sleep_until(at).await;
        }
        if short {
            out.pop();
        }
        self.batches.lock().unwrap()[index].answers = out
            .iter()
            .map(|r| r.as_ref().err().map(LeaseError::kind))
            .collect();
        out
    }

    fn renews_in_batches(&self) -> bool {
        true
    }
}

#[derive(Debug, Default)]
struct Counting {
    batch_sizes: Mutex<Vec<usize>>,
    outcomes: Mutex<Vec<RenewOutcome>>,
}

impl KeeperMetrics for Counting {
    fn renew_batch(&self, size: usize) {
        self.batch_sizes.lock().unwrap().push(size);
    }
    fn renew_latency(&self, _: Duration, outcome: RenewOutcome) {
        self.outcomes.lock().unwrap().push(outcome);
    }
}

struct World {
    clock: ManualClock,
    backend: MemLease,
    batcher: Batcher,
    metrics: Arc<Counting>,
}

fn world() -> World {
    let clock = ManualClock::new();
    let backend = MemLease::builder()
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .build();
    let batcher = Batcher {
        real: backend.clone(),
        batches: Arc::default(),
        single_renews: Arc::default(),
        releases: Arc::default(),
        faults: Arc::default(),
    };
    World {
        clock,
        backend,
        batcher,
        metrics: Arc::default(),
    }
}

fn keeper(w: &World, jitter: f64) -> LeaseKeeper {
    LeaseKeeper::builder(Arc::new(w.batcher.clone()), owner("a"), TTL)
        .jitter(jitter)
        .metrics(w.metrics.clone())
        .build()
        .unwrap()
}

fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

/// Waits `total`, moving the backend's wall clock along with tokio's.
async fn pass(w: &World, total: Duration) {
    let mut done = Duration::ZERO;
    while done < total {
        let step = (total - done).min(Duration::from_millis(500));
        w.clock.advance(step);
        sleep(step).await;
        done += step;
    }
}

/// When each guard's loss signal fires, by index.
fn loss_times(guards: &[LeaseGuard]) -> Arc<Mutex<Vec<Option<Instant>>>> {
    let times = Arc::new(Mutex::new(vec![None; guards.len()]));
    for (i, g) in guards.iter().enumerate() {
        let (lost, times) = (g.lost(), Arc::clone(&times));
        tokio::spawn(async move {
            lost.await;
            times.lock().unwrap()[i] = Some(Instant::now());
        });
    }
    times
}

#[tokio::test(start_paused = true)]
async fn fifty_runs_renew_in_a_few_batches_and_never_one_by_one() {
    let w = world();
    let k = keeper(&w, 0.1);
    let ids: Vec<SessionId> = (0..50).map(|i| sid(&format!("s{i}"))).collect();
    let start = Instant::now();
    let mut guards = Vec::new();
    // Acquired over five seconds, so their renewals are not due together
    // by coincidence: any batching is the keeper's doing.
    for id in &ids {
        guards.push(k.acquire(id).await.unwrap());
        pass(&w, Duration::from_millis(100)).await;
    }
    pass(&w, TTL * 3).await;
    let elapsed = Instant::now() - start;

    assert_eq!(w.batcher.single_renews.load(Ordering::SeqCst), 0);
    assert!(guards.iter().all(|g| !g.is_lost()));
    let batches = w.batcher.batches();
    let periods = (elapsed.as_secs_f64() / INTERVAL.as_secs_f64()).ceil() as usize;
    // A batch sweeps every run due within a quarter interval, so the next
    // one goes out later than that: at most four calls per renew period,
    // however many runs there are (one by one would be 50).
    for pair in batches.windows(2) {
        assert!(pair[1].at - pair[0].at > INTERVAL / 4, "{pair:?}");
    }
    assert!(
        batches.len() <= 4 * periods,
        "{} calls in {periods} renew periods for 50 runs",
        batches.len()
    );
    // Every run is renewed at least once per longest jittered interval.
    for id in &ids {
        let at: Vec<Instant> = w
            .batcher
            .answers_for(id)
            .into_iter()
            .map(|(at, answer)| {
                assert_eq!(answer, Some(None), "{id} renewed");
                at
            })
            .collect();
        assert!(at.len() >= 8, "{id} renewed {} times", at.len());
        assert!(at[0] - start <= INTERVAL * 11 / 10 + Duration::from_secs(5));
        for pair in at.windows(2) {
            assert!(pair[1] - pair[0] <= INTERVAL * 11 / 10, "{id}: {at:?}");
        }
    }
    // The hooks saw each call's size and each lease's outcome.
    let sizes: Vec<usize> = batches.iter().map(|b| b.sessions.len()).collect();
    assert_eq!(*w.metrics.batch_sizes.lock().unwrap(), sizes);
    let outcomes = w.metrics.outcomes.lock().unwrap().clone();
    assert_eq!(outcomes.len(), sizes.iter().sum::<usize>());
    assert!(outcomes.iter().all(|o| *o == RenewOutcome::Renewed));
    // Held at the backend all along.
    for id in &ids {
        let err = w.backend.acquire(id, &owner("b")).await.unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Held);
    }
    for g in guards {
        g.finish().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_taken_over_out_of_band_loses_only_its_run() {
    let w = world();
    let k = keeper(&w, 0.0);
    let ids: Vec<SessionId> = (0..10).map(|i| sid(&format!("s{i}"))).collect();
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(k.acquire(id).await.unwrap());
    }
    let taken = &ids[3];
    let stale = guards[3].lease().unwrap();
    w.backend.release(&stale).await.unwrap();
    let theirs = w.backend.acquire(taken, &owner("b")).await.unwrap();

    timeout(TTL, guards[3].lost()).await.expect("loss fires");
    assert_eq!(
        guards[3].loss(),
        Some(LossReason::Held {
            holder: Some(owner("b"))
        })
    );
    let lost_at = Instant::now();
    pass(&w, TTL * 2).await;
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_lost(), i == 3, "run {i}");
    }
    assert_eq!(k.held_leases(), 9);
    // The others kept renewing in later batches; the lost run left them.
    let later: Vec<Batch> = w
        .batcher
        .batches()
        .into_iter()
        .filter(|b| b.at > lost_at)
        .collect();
    assert!(later.len() >= 4, "{later:?}");
    for b in &later {
        assert_eq!(b.sessions.len(), 9);
        assert!(!b.sessions.contains(taken));
        assert!(b.answers.iter().all(Option::is_none));
    }
    let mut guards = guards.into_iter();
    for g in guards.by_ref().take(3) {
        g.finish().await.unwrap();
    }
    guards.next().unwrap().finish().await.unwrap();
    assert!(
        !w.batcher
            .releases
            .lock()
            .unwrap()
            .iter()
            .any(|(s, _)| s == taken),
        "the stale lease was released"
    );
    let still = w.backend.renew(&theirs).await.unwrap();
    assert_eq!(still.token(), theirs.token());
    assert_eq!(w.batcher.single_renews.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lease_failing_transiently_in_a_batch_retries_and_survives() {
    let w = world();
    let k = keeper(&w, 0.0);
    let ids: Vec<SessionId> = (0..5).map(|i| sid(&format!("s{i}"))).collect();
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(k.acquire(id).await.unwrap());
    }
    let flaky = &ids[2];
    w.batcher.faults().transient.insert(flaky.clone(), 2);
    pass(&w, TTL * 2).await;

    assert!(guards.iter().all(|g| !g.is_lost()));
    let answers = w.batcher.answers_for(flaky);
    let kinds: Vec<_> = answers.iter().map(|a| a.1).collect();
    assert_eq!(
        kinds[..3],
        [
            Some(Some(LeaseErrorKind::Transient)),
            Some(Some(LeaseErrorKind::Transient)),
            Some(None)
        ]
    );
    // The retries went out on their own, a quarter interval apart, without
    // the runs that had renewed.
    assert_eq!(answers[1].0 - answers[0].0, INTERVAL / 4);
    assert_eq!(answers[2].0 - answers[1].0, INTERVAL / 4);
    let retry = w
        .batcher
        .batches()
        .into_iter()
        .find(|b| b.at == answers[1].0)
        .unwrap();
    assert_eq!(retry.sessions, vec![flaky.clone()]);
    for id in &ids {
        let err = w.backend.acquire(id, &owner("b")).await.unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Held, "{id}");
    }
    let outcomes = w.metrics.outcomes.lock().unwrap().clone();
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == RenewOutcome::Transient)
            .count(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_failing_transiently_until_its_deadline_is_lost_then_alone() {
    let w = world();
    let k = keeper(&w, 0.0);
    let start = Instant::now();
    let ids: Vec<SessionId> = (0..3).map(|i| sid(&format!("s{i}"))).collect();
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(k.acquire(id).await.unwrap());
    }
    w.batcher
        .faults()
        .transient
        .insert(ids[0].clone(), usize::MAX);
    let times = loss_times(&guards);
    pass(&w, TTL * 2).await;

    // Never renewed: lost at the TTL after its acquisition was sent.
    assert_eq!(times.lock().unwrap()[0], Some(start + TTL));
    assert_eq!(guards[0].loss(), Some(LossReason::Expired));
    assert!(!guards[1].is_lost() && !guards[2].is_lost());
    let tries = w.batcher.answers_for(&ids[0]);
    assert!(tries.len() >= 3, "{tries:?}");
    assert!(tries.iter().all(|(at, _)| *at < start + TTL));
}

#[tokio::test(start_paused = true)]
async fn a_hung_batch_loses_each_run_at_its_own_deadline() {
    let w = world();
    let k = keeper(&w, 0.0);
    let start = Instant::now();
    let mut guards = Vec::new();
    // Acquired a second apart: one batch will carry three deadlines.
    for i in 0..3 {
        guards.push(k.acquire(&sid(&format!("s{i}"))).await.unwrap());
        sleep(Duration::from_secs(1)).await;
    }
    w.batcher.faults().hang = true;
    let times = loss_times(&guards);
    sleep(TTL * 2).await;

    let batches = w.batcher.batches();
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert_eq!(batches[0].at, start + INTERVAL);
    assert_eq!(batches[0].sessions.len(), 3);
    let times = times.lock().unwrap().clone();
    for (i, at) in times.iter().enumerate() {
        assert_eq!(
            *at,
            Some(start + TTL + Duration::from_secs(i as u64)),
            "run {i} lost at its own deadline: {times:?}"
        );
    }
    for g in &guards {
        assert_eq!(g.loss(), Some(LossReason::Expired));
    }
    assert_eq!(k.held_leases(), 0);
    let outcomes = w.metrics.outcomes.lock().unwrap().clone();
    assert_eq!(outcomes, vec![RenewOutcome::Failed; 3]);
}

#[tokio::test(start_paused = true)]
async fn a_late_batch_answer_counts_only_for_the_runs_whose_deadline_has_not_passed() {
    let w = world();
    let k = keeper(&w, 0.0);
    let start = Instant::now();
    // One batch at 10 s carries deadlines 30 s and 32 s, and answers at
    // 30 s: too late for the first run (its lease may have lapsed at that
    // instant), in time for the second.
    w.batcher.faults().answer_at = Some(start + TTL);
    let early = k.acquire(&sid("early")).await.unwrap();
    pass(&w, Duration::from_secs(2)).await;
    let late = k.acquire(&sid("late")).await.unwrap();
    let guards = [early, late];
    let times = loss_times(&guards);

    sleep_until(start + TTL + Duration::from_secs(1)).await;
    let batches = w.batcher.batches();
    assert_eq!(batches[0].at, start + INTERVAL);
    assert_eq!(batches[0].sessions.len(), 2);
    assert_eq!(batches[0].answers, vec![None, None], "both renewed");
    assert_eq!(times.lock().unwrap()[0], Some(start + TTL));
    assert_eq!(guards[0].loss(), Some(LossReason::Expired));
    assert_eq!(k.held_leases(), 1);
    // Renewed by the batch sent at 10 s: it lives on past its old deadline.
    sleep(Duration::from_secs(20)).await;
    assert_eq!(times.lock().unwrap()[1], None);
    assert!(!guards[1].is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_run_released_while_its_batch_is_in_flight_is_not_renewed_back() {
    let w = world();
    let k = keeper(&w, 0.0);
    let gate = Arc::new(Notify::new());
    w.batcher.faults().hold_answer = Some(Arc::clone(&gate));
    let start = Instant::now();
    let ended = k.acquire(&sid("ended")).await.unwrap();
    let kept = k.acquire(&sid("kept")).await.unwrap();
    let before = ended.lease().unwrap();
    let seen = ended.watch();

    // The batch has renewed both at the backend (to a later expiry) and not
    // answered yet.
    pass(&w, INTERVAL + Duration::from_secs(1)).await;
    assert_eq!(w.batcher.batches().len(), 1);
    let released_at = Instant::now();
    ended.finish().await.unwrap();
    assert_eq!(
        Instant::now(),
        released_at,
        "the release waited for the batch"
    );
    assert_eq!(k.held_leases(), 1);
    // Released at the backend: another owner takes it.
    let theirs = w.backend.acquire(&sid("ended"), &owner("b")).await.unwrap();

    gate.notify_one();
    pass(&w, TTL * 2).await;
    assert_eq!(*seen.borrow(), Some(before), "renewed back into the run");
    assert_eq!(k.held_leases(), 1);
    let batches = w.batcher.batches();
    assert!(batches.len() >= 4);
    assert_eq!(batches[0].at, start + INTERVAL);
    for b in &batches[1..] {
        assert_eq!(b.sessions, vec![sid("kept")], "{b:?}");
    }
    assert!(!kept.is_lost());
    assert_eq!(
        w.backend.renew(&theirs).await.unwrap().token(),
        theirs.token()
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_answering_the_wrong_number_of_results_is_loss_for_every_run_in_it() {
    let w = world();
    let k = keeper(&w, 0.0);
    let guards = [
        k.acquire(&sid("x")).await.unwrap(),
        k.acquire(&sid("y")).await.unwrap(),
    ];
    w.batcher.faults().short_answer = true;
    timeout(TTL, guards[0].lost()).await.expect("loss fires");
    for g in &guards {
        assert_eq!(
            g.loss(),
            Some(LossReason::Rejected {
                kind: LeaseErrorKind::Invalid
            })
        );
    }
}

#[tokio::test(start_paused = true)]
async fn more_runs_than_the_batch_limit_go_out_in_several_calls_at_once() {
    let w = world();
    let k = LeaseKeeper::builder(Arc::new(w.batcher.clone()), owner("a"), TTL)
        .jitter(0.0)
        .renew_batch_limit(4)
        .build()
        .unwrap();
    let start = Instant::now();
    let mut guards = Vec::new();
    for i in 0..10 {
        guards.push(k.acquire(&sid(&format!("s{i}"))).await.unwrap());
    }
    sleep(INTERVAL + Duration::from_secs(1)).await;
    let batches = w.batcher.batches();
    let mut sizes: Vec<usize> = batches.iter().map(|b| b.sessions.len()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![2, 4, 4]);
    assert!(batches.iter().all(|b| b.at == start + INTERVAL));
    assert!(guards.iter().all(|g| !g.is_lost()));

    let zero = LeaseKeeper::builder(Arc::new(w.batcher.clone()), owner("a"), TTL)
        .renew_batch_limit(0)
        .build();
    assert_eq!(
        zero.unwrap_err().kind(),
        lease_keeper::KeeperErrorKind::Invalid
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_batched_runs() {
    let w = world();
    let k = keeper(&w, 0.0);
    let mut guards = Vec::new();
    for i in 0..5 {
        guards.push(k.acquire(&sid(&format!("s{i}"))).await.unwrap());
    }
    pass(&w, INTERVAL * 2).await;
    let report = k.shutdown().await;
    assert_eq!(report.ended_runs, 5);
    assert!(report.complete);
    let sent = w.batcher.batches().len();
    sleep(TTL * 2).await;
    assert_eq!(w.batcher.batches().len(), sent, "renewed after shutdown");
    for i in 0..5 {
        w.backend
            .acquire(&sid(&format!("s{i}")), &owner("b"))
            .await
            .expect("released");
    }
}
