//! Many followers and waiters of one session in one process: every
//! follower receives every event of the run, in order, and the store is
//! read once per append for all of them together, not once per follower;
//! runs waiting for the session try the lease when a run ends, not on an
//! interval.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::Stream;

use crate::support::counting_store::CountingStore;
use std::time::Duration;

use async_trait::async_trait;
use flocklease::FlockLease;
use lease_keeper::LeaseKeeper;
use lease_port::{AuthorityId, OwnerId, SessionId};
use mecated::agent::EchoAgent;
use mecated::engine::{Engine, Exclusivity, FOLLOW_QUIET_CHECK, FollowEnd, FollowItem};
use mecated::metrics::Metrics;
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};

const FOLLOWERS: u64 = 100;
const STEPS: u32 = 20;

/// An engine on `store` with file leases in `dir`, running `agent`.
fn leased_engine(dir: &std::path::Path, store: Arc<dyn SessionStore>, agent: EchoAgent) -> Engine {
    let ttl = Duration::from_secs(10);
    let backend = Arc::new(FlockLease::open(dir.join("leases"), ttl).unwrap());
    let metrics = Arc::new(Metrics::default());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new("fanout").unwrap(), ttl)
        .metrics(metrics.clone())
        .build()
        .unwrap();
    Engine::new(store, keeper, Arc::new(agent), metrics, Exclusivity::Leased)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_followers_share_one_reader_and_each_receives_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CountingStore::new(
        JsonlStore::open(
            dir.path().join("sessions"),
            JsonlOptions::default().fsync(FsyncPolicy::Never),
        )
        .unwrap(),
    ));
    // A progress event every 50 ms: followers wait between events.
    let agent = EchoAgent::new(Duration::from_millis(50) * STEPS, STEPS);
    let engine = leased_engine(dir.path(), store.clone(), agent);
    let session = SessionId::new("watched").unwrap();
    store.create(&session).await.unwrap();
    let mut run = engine
        .start_run(session.clone(), json!("hello"))
        .await
        .unwrap();

    let (reads_before, waits_before) = (
        store.reads.load(Ordering::Relaxed),
        store.waits.load(Ordering::Relaxed),
    );
    let mut followers = Vec::new();
    for _ in 0..FOLLOWERS {
        let mut rx = engine.follow(session.clone(), 0).await.unwrap();
        followers.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            loop {
                match rx.recv().await.expect("the follow ends with an End") {
                    FollowItem::Event(e) => seqs.push(e.seq),
                    FollowItem::End(end) => return (seqs, end),
                }
            }
        }));
    }
    while run.events.recv().await.is_some() {}
    let log: Vec<u64> = store
        .read(&session, 1, 1000)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.seq)
        .collect();
    for follower in followers {
        let (seqs, end) = follower.await.unwrap();
        assert_eq!(end, FollowEnd::RunEnded);
        assert_eq!(seqs, log, "a follower missed or repeated events");
    }
    let reads = store.reads.load(Ordering::Relaxed) - reads_before;
    let waits = store.waits.load(Ordering::Relaxed) - waits_before;
    println!(
        "{FOLLOWERS} followers, {} events: {reads} reads, {waits} waits",
        log.len()
    );
    // Each follower reads to catch up and once more when it joins its
    // session's tail; the tail reads each append once. Followers reading
    // on each append would make it FOLLOWERS reads (and waits) per event.
    let events = log.len() as u64;
    assert!(
        reads < 5 * FOLLOWERS + 3 * events,
        "{reads} reads for {FOLLOWERS} followers of {events} events"
    );
    assert!(waits <= 3 * events, "{waits} waits for {events} events");
}

/// Idle followers of a run that goes on cost nothing between events: the
/// quiet periods in which their session's tail asks whether the run is
/// still live wake each of them once at most (the first after they
/// joined, which tells them the tail's word on their run), and none reads
/// the store. The tail itself, its run being this process's own, rests
/// rather than waking every quiet period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_periods_wake_no_idle_follower_of_a_live_run() {
    const IDLE: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CountingStore::new(
        JsonlStore::open(
            dir.path().join("sessions"),
            JsonlOptions::default().fsync(FsyncPolicy::Never),
        )
        .unwrap(),
    ));
    // Its run's start, then nothing for an hour.
    let agent = EchoAgent::new(Duration::from_secs(3600), 1);
    let engine = leased_engine(dir.path(), store.clone(), agent);
    let session = SessionId::new("idle").unwrap();
    store.create(&session).await.unwrap();
    let _run = engine
        .start_run(session.clone(), json!("hold"))
        .await
        .unwrap();
    let (polls, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut followers = Vec::new();
    for _ in 0..IDLE {
        let mut follow = engine.follow(session.clone(), 0).await.unwrap();
        let (polls, received) = (Arc::clone(&polls), Arc::clone(&received));
        followers.push(tokio::spawn(async move {
            // Each poll of an idle follower is a wake-up of its task.
            let next = |cx: &mut std::task::Context<'_>| {
                polls.fetch_add(1, Ordering::Relaxed);
                std::pin::Pin::new(&mut follow).poll_next(cx)
            };
            let mut next = std::future::poll_fn(next);
            while (&mut next).await.is_some() {
                received.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let logged = store.read(&session, 1, 1000).await.unwrap().events.len() as u64;
    while received.load(Ordering::Relaxed) < IDLE * logged {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Each follower has what was logged; a reader's last read, and the
    // quiet period after the joins, are over before what is counted.
    tokio::time::sleep(FOLLOW_QUIET_CHECK + Duration::from_secs(1)).await;
    let before = (
        polls.load(Ordering::Relaxed),
        store.reads.load(Ordering::Relaxed),
        store.waits.load(Ordering::Relaxed),
    );
    tokio::time::sleep(FOLLOW_QUIET_CHECK * 3 + Duration::from_secs(1)).await;
    let polls = polls.load(Ordering::Relaxed) - before.0;
    let reads = store.reads.load(Ordering::Relaxed) - before.1;
    let waits = store.waits.load(Ordering::Relaxed) - before.2;
    println!(
        "{IDLE} idle followers over three quiet periods: {polls} wake-ups, {reads} reads; \
         the tail waited {waits} times"
    );
    assert!(polls <= IDLE, "{polls} wake-ups of {IDLE} idle followers");
    assert_eq!(
        reads, 0,
        "idle followers read the store with nothing appended"
    );
    // The quiet period after the joins, then a rest.
    assert!(
        waits <= 2,
        "the tail waited {waits} times, once per quiet period"
    );
    for follower in &followers {
        assert!(!follower.is_finished(), "a follower of the live run ended");
    }
}

/// A lease backend counting acquire attempts.
#[derive(Debug)]
struct CountingLease {
    inner: FlockLease,
    acquires: AtomicU64,
}

#[async_trait]
impl lease_port::SessionLease for CountingLease {
    async fn acquire(
        &self,
        session: &SessionId,
        owner: &OwnerId,
    ) -> Result<lease_port::Lease, lease_port::LeaseError> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(session, owner).await
    }
    async fn renew(
        &self,
        lease: &lease_port::Lease,
    ) -> Result<lease_port::Lease, lease_port::LeaseError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &lease_port::Lease) -> Result<(), lease_port::LeaseError> {
        self.inner.release(lease).await
    }
    async fn current(
        &self,
        session: &SessionId,
    ) -> Result<Option<lease_port::Lease>, lease_port::LeaseError> {
        self.inner.current(session).await
    }
    async fn authority(&self) -> Result<AuthorityId, lease_port::LeaseError> {
        self.inner.authority().await
    }
    fn granted_ttl(&self) -> Option<Duration> {
        self.inner.granted_ttl()
    }
}

/// Runs waiting for a session another process holds (`?wait`) are woken
/// by the end of the run they wait for, not by trying the lease on an
/// interval: each tries the backend about once before that run ends and
/// once after, and every waiter gets its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_runs_try_the_lease_when_a_run_ends_not_on_an_interval() {
    const WAITERS: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_secs(10);
    let backend = Arc::new(CountingLease {
        inner: FlockLease::open(dir.path().join("leases"), ttl).unwrap(),
        acquires: AtomicU64::new(0),
    });
    // Two processes: their own store instances and keepers, one lease
    // directory. Each run holds the session for about a second.
    let process = |owner: &str| {
        let store = JsonlStore::open(
            dir.path().join("sessions"),
            JsonlOptions::default().fsync(FsyncPolicy::Never),
        )
        .unwrap();
        let metrics = Arc::new(Metrics::default());
        let keeper = LeaseKeeper::builder(backend.clone(), OwnerId::new(owner).unwrap(), ttl)
            .metrics(metrics.clone())
            .build()
            .unwrap();
        let agent = Arc::new(EchoAgent::new(Duration::from_secs(1), 4));
        Engine::new(Arc::new(store), keeper, agent, metrics, Exclusivity::Leased)
    };
    let (holder, waiting) = (process("holder"), process("waiting"));
    let session = SessionId::new("queued").unwrap();
    holder.create_session(&session).await.unwrap();
    let mut first = holder
        .start_run(session.clone(), json!("first"))
        .await
        .unwrap();
    let before = backend.acquires.load(Ordering::Relaxed);
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (engine, session) = (waiting.clone(), session.clone());
            tokio::spawn(async move {
                let input = json!(format!("waiter {i}"));
                let mut run = engine
                    .start_run_waiting(session, input, Duration::from_secs(60))
                    .await
                    .expect("every waiter gets its run");
                while run.events.recv().await.is_some() {}
            })
        })
        .collect();
    while first.events.recv().await.is_some() {}
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let attempts = backend.acquires.load(Ordering::Relaxed) - before;
    println!("{WAITERS} waiters behind a one-second run elsewhere: {attempts} acquire attempts");
    // Once while the other process holds it and once at its end each, a
    // few more while its release lands; after that the runs are this
    // process's own, which it refuses without asking the backend. Trying
    // every 50 ms would be some 20 attempts per waiter.
    assert!(
        attempts <= 3 * WAITERS,
        "{attempts} acquire attempts for {WAITERS} waiters"
    );
}

/// A reader slower than its follow: far more events than the follow
/// queues ahead of it, appended while it follows and taken a few at a
/// time with pauses between. The follow waits for the reader each time its
/// queue is full, and the reader still receives every event once, in
/// order, then the run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_receives_every_event_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        JsonlStore::open(
            dir.path().join("sessions"),
            JsonlOptions::default().fsync(FsyncPolicy::Never),
        )
        .unwrap(),
    );
    let agent = EchoAgent::new(Duration::from_secs(1), 500);
    let engine = leased_engine(dir.path(), store.clone(), agent);
    let session = SessionId::new("long").unwrap();
    store.create(&session).await.unwrap();
    let mut run = engine
        .start_run(session.clone(), json!("go"))
        .await
        .unwrap();
    // Joined with a backlog of more than the follow queues ahead.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut follow = engine.follow(session.clone(), 0).await.unwrap();
    let mut seqs = Vec::new();
    let end = loop {
        match follow.recv().await.expect("the follow ends with an End") {
            FollowItem::Event(e) => seqs.push(e.seq),
            FollowItem::End(end) => break end,
        }
        if seqs.len() % 37 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    assert!(follow.recv().await.is_none(), "an item after the end");
    while run.events.recv().await.is_some() {}
    let log: Vec<u64> = store
        .read(&session, 1, 1000)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.seq)
        .collect();
    assert!(log.len() > 500, "{} events", log.len());
    assert_eq!(seqs, log, "the slow reader missed or repeated events");
    assert_eq!(end, FollowEnd::RunEnded);
}
