//! Many followers of one session in one process: every follower receives
//! every event of the run, in order, and the store is read once per append
//! for all of them together, not once per follower.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use flocklease::FlockLease;
use lease_keeper::LeaseKeeper;
use lease_port::{AuthorityId, FencingToken, OwnerId, SessionId};
use mecated::agent::EchoAgent;
use mecated::engine::{Engine, Exclusivity, FollowEnd, FollowItem};
use mecated::metrics::Metrics;
use serde_json::{Value, json};
use session_store::{
    AppendReceipt, FsyncPolicy, JsonlOptions, JsonlStore, Page, SessionStore, StoreError,
    WriteFence,
};

const FOLLOWERS: u64 = 100;
const STEPS: u32 = 20;

/// A JSONL store counting the reads and waits made of it.
struct CountingStore {
    inner: JsonlStore,
    reads: AtomicU64,
    waits: AtomicU64,
}

#[async_trait]
impl SessionStore for CountingStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        self.inner.create(session).await
    }
    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        self.inner.bind_authority(authority).await
    }
    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.inner.recorded_authority().await
    }
    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        self.inner.append(session, fence, events).await
    }
    async fn read(&self, session: &SessionId, from: u64, limit: usize) -> Result<Page, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(session, from, limit).await
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
    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        // The inner store's reads while waiting are its own, not counted.
        self.inner
            .wait_for_append(session, after_seq, timeout)
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_followers_share_one_reader_and_each_receives_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CountingStore {
        inner: JsonlStore::open(
            dir.path().join("sessions"),
            JsonlOptions::default().fsync(FsyncPolicy::Never),
        )
        .unwrap(),
        reads: AtomicU64::new(0),
        waits: AtomicU64::new(0),
    });
    let ttl = Duration::from_secs(10);
    let backend = Arc::new(FlockLease::open(dir.path().join("leases"), ttl).unwrap());
    let metrics = Arc::new(Metrics::default());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new("fanout").unwrap(), ttl)
        .metrics(metrics.clone())
        .build()
        .unwrap();
    // A progress event every 50 ms: followers wait between events.
    let agent = Arc::new(EchoAgent::new(Duration::from_millis(50) * STEPS, STEPS));
    let engine = Engine::new(
        store.clone() as Arc<dyn SessionStore>,
        keeper,
        agent,
        metrics,
        Exclusivity::Leased,
    );
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
