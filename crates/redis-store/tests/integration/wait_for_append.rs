//! `wait_for_append` against a real `redis-server`, where the Redis store
//! has more to keep than the `storeconformance` suite checks (a waiter
//! woken by another process's append, a timeout, a missing or deleted
//! session): a wait spans several blocking reads, never holds up the
//! store's other requests, and outlives a restart. However many wait, a
//! store holds one subscription, not a connection per waiter, and each
//! append wakes the waiters of its session only; every append publishes
//! its session on it; and a user whose ACL grants no channels still
//! appends, its waiters still woken (by reading).

use std::time::Duration;

use lease_port::{FencingToken, OwnerId, SessionId};
use redis_session_store::RedisStore;
use serde_json::json;
use session_store::{SessionStore, WriteFence};
use test_services::RedisServer;

/// Longer than any wait below should last: a waiter that is not woken
/// fails its test by outliving it.
const NEVER: Duration = Duration::from_secs(60);

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn fence() -> WriteFence {
    WriteFence::new(FencingToken::new(1), OwnerId::new("writer").unwrap())
}

async fn open(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("w:")
        .connect()
        .await
        .unwrap()
}

/// One connection of the test's own, asking Redis about its clients.
struct Probe(redis::aio::MultiplexedConnection);

impl Probe {
    async fn new(redis: &RedisServer) -> Probe {
        let client = redis::Client::open(redis.url()).unwrap();
        Probe(client.get_multiplexed_async_connection().await.unwrap())
    }

    /// A field of `INFO clients`: `blocked_clients`, `connected_clients`.
    async fn clients(&mut self, field: &str) -> u64 {
        self.info("clients", field).await
    }

    /// A field of `INFO stats`.
    async fn stat(&mut self, field: &str) -> u64 {
        self.info("stats", field).await
    }

    async fn info(&mut self, section: &str, field: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.0)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO {section} reports no {field}: {info}"))
    }

    /// Scripts run so far (every read of the store is one).
    async fn script_calls(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.0)
            .await
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Subscribers of the stores' appends channel under prefix `w:`.
    async fn subscribers(&mut self) -> u64 {
        let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(CHANNEL)
            .query_async(&mut self.0)
            .await
            .unwrap();
        match counts.get(1) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap(),
            other => panic!("PUBSUB NUMSUB answered {other:?}"),
        }
    }

    /// The ids of the subscription connections Redis holds now.
    async fn pubsub_connections(&mut self) -> Vec<u64> {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut self.0)
            .await
            .unwrap();
        let mut ids: Vec<u64> = list
            .lines()
            .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Polls until `field` satisfies `done`; fails the test if it never does.
    async fn until(&mut self, field: &str, what: &str, done: impl Fn(u64) -> bool) {
        let give_up = tokio::time::Instant::now() + NEVER;
        while !done(self.clients(field).await) {
            assert!(tokio::time::Instant::now() < give_up, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Polls until the appends channel has `n` subscribers.
    async fn until_subscribers(&mut self, n: u64) {
        let give_up = tokio::time::Instant::now() + NEVER;
        while self.subscribers().await != n {
            assert!(
                tokio::time::Instant::now() < give_up,
                "the channel never had {n} subscribers"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The channel appends under prefix `w:` are published on.
const CHANNEL: &str = "w:appends";

/// Waits on `store` in a task of its own, returning once the store is
/// subscribed to appends (the first waiter of a store subscribes it).
async fn spawn_waiter(
    probe: &mut Probe,
    store: &RedisStore,
    s: &SessionId,
    after_seq: u64,
    timeout: Duration,
) -> tokio::task::JoinHandle<Result<bool, session_store::StoreError>> {
    let (store, s) = (store.clone(), s.clone());
    let waiter = tokio::spawn(async move { store.wait_for_append(&s, after_seq, timeout).await });
    let give_up = tokio::time::Instant::now() + NEVER;
    while probe.subscribers().await == 0 {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the store never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!waiter.is_finished());
    waiter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_wait_ends_at_its_timeout_with_nothing() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let s = sid("idle");
    store.create(&s).await.unwrap();
    store.append(&s, fence(), &[json!(1)]).await.unwrap();
    // Past the one event there is nothing, over several blocking reads
    // (each at most a second).
    assert!(
        !store
            .wait_for_append(&s, 1, Duration::from_millis(2500))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_holds_up_the_stores_other_requests() {
    let redis = RedisServer::start().unwrap();
    // A short request deadline: a request stuck behind the blocked read
    // would fail with it long before the waiter's timeout.
    let store = RedisStore::builder(redis.url())
        .prefix("w:")
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let mut probe = Probe::new(&redis).await;
    let s = sid("busy");
    store.create(&s).await.unwrap();
    let waiters = [
        spawn_waiter(&mut probe, &store, &s, 0, NEVER).await,
        spawn_waiter(&mut probe, &store, &s, 0, NEVER).await,
    ];
    // The same store (its shared connection) keeps serving while both
    // waiters are blocked in Redis.
    for _ in 0..3 {
        assert!(store.read(&s, 1, 10).await.unwrap().events.is_empty());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    store.append(&s, fence(), &[json!("x")]).await.unwrap();
    for waiter in waiters {
        assert!(waiter.await.unwrap().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_subscription_and_dropped_ones_leave_nothing() {
    let redis = RedisServer::start().unwrap();
    let (store, writer) = (open(&redis).await, open(&redis).await);
    let mut probe = Probe::new(&redis).await;
    let sessions: Vec<SessionId> = (0..5).map(|i| sid(&format!("many-{i}"))).collect();
    for s in &sessions {
        writer.create(s).await.unwrap();
    }
    let connected = probe.clients("connected_clients").await;
    let mut waiters = Vec::new();
    for i in 0..50 {
        let s = &sessions[i % sessions.len()];
        waiters.push(spawn_waiter(&mut probe, &store, s, 0, NEVER).await);
    }
    // Fifty waiters on five sessions: two more connections, the store's
    // subscription and the one its heartbeat is published on, where a
    // blocked read each would hold fifty.
    assert_eq!(probe.subscribers().await, 1);
    probe
        .until("connected_clients", "no heartbeat connection", |n| {
            n == connected + 2
        })
        .await;

    // Each append wakes the waiters of its session and no other.
    writer
        .append(&sessions[0], fence(), &[json!("x")])
        .await
        .unwrap();
    for (i, waiter) in waiters.iter_mut().enumerate() {
        if i % sessions.len() == 0 {
            assert!(woke(waiter).await);
        }
    }
    let rest: Vec<_> = waiters
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % sessions.len() != 0)
        .map(|(_, w)| w)
        .collect();
    assert!(rest.iter().all(|w| !w.is_finished()));
    for w in &rest {
        w.abort();
    }
    for w in rest {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    // Dropped waiters hold nothing; the subscription stays for the next.
    assert_eq!(probe.clients("connected_clients").await, connected + 2);
    assert_eq!(probe.clients("blocked_clients").await, 0);
    drop(store);
    probe.until_subscribers(0).await;
    probe
        .until(
            "connected_clients",
            "the dropped store's subscription stayed open",
            |n| n <= connected,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_append_publishes_its_session_on_the_prefixs_channel() {
    use futures_util::StreamExt;
    let redis = RedisServer::start().unwrap();
    let writer = open(&redis).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(CHANNEL).await.unwrap();
    let mut messages = pubsub.into_on_message();
    let s = sid("pub{lished}%");
    writer.create(&s).await.unwrap();
    writer
        .append(&s, fence(), &[json!(1), json!(2)])
        .await
        .unwrap();
    let msg = tokio::time::timeout(NEVER, messages.next())
        .await
        .expect("no message for the append")
        .unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), s.as_str());
    // One message per append, not per event: the next is the next append's.
    writer.append(&s, fence(), &[json!(3)]).await.unwrap();
    let refused = writer
        .append(
            &s,
            WriteFence::new(FencingToken::new(0), OwnerId::new("stale").unwrap()),
            &[json!(4)],
        )
        .await;
    assert!(refused.is_err());
    writer.append(&s, fence(), &[json!(5)]).await.unwrap();
    for _ in 0..2 {
        let msg = tokio::time::timeout(NEVER, messages.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(msg.get_payload::<String>().unwrap(), s.as_str());
    }
    // A refused append published nothing: two messages for the two that
    // landed, and no third.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), messages.next())
            .await
            .is_err(),
        "a refused append published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_allowed_no_channels_still_appends_and_its_waiters_still_wake() {
    let redis = RedisServer::start().unwrap();
    // Every key and command, no channel (Redis 7's default for new users).
    redis
        .command(&[
            "ACL",
            "SETUSER",
            "nochannels",
            "on",
            ">pw",
            "~*",
            "resetchannels",
            "+@all",
        ])
        .unwrap();
    let url = redis
        .url()
        .replacen("redis://", "redis://nochannels:pw@", 1);
    let open_as = || async {
        RedisStore::builder(url.clone())
            .prefix("w:")
            .connect()
            .await
            .unwrap()
    };
    let (follower, writer) = (open_as().await, open_as().await);
    let mut probe = Probe::new(&redis).await;
    let s = sid("acl");
    writer.create(&s).await.unwrap();
    let (f, s2) = (follower.clone(), s.clone());
    let waiter = tokio::spawn(async move { f.wait_for_append(&s2, 0, NEVER).await });
    // The follower cannot subscribe; its waiter reads instead.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(probe.subscribers().await, 0);
    assert!(!waiter.is_finished());
    // The publish the append cannot make does not fail it.
    let receipt = writer.append(&s, fence(), &[json!("x")]).await.unwrap();
    assert_eq!(receipt.last_seq, 1);
    assert!(woke(waiter).await);
    // Refused a channel, the store does not ask again and again.
    let before = probe.stat("total_connections_received").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(probe.stat("total_connections_received").await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_outlives_a_redis_restart_and_wakes_after_it() {
    let mut redis = RedisServer::start_persistent().unwrap();
    let follower = open(&redis).await;
    let mut probe = Probe::new(&redis).await;
    let s = sid("restarted");
    follower.create(&s).await.unwrap();
    let waiter = spawn_waiter(&mut probe, &follower, &s, 0, NEVER).await;
    // Down for longer than the waiter's fallback read: reads fail meanwhile.
    redis.kill();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!waiter.is_finished(), "the wait ended while Redis was down");
    redis.restart().unwrap();
    let writer = open(&redis).await;
    writer.append(&s, fence(), &[json!("after")]).await.unwrap();
    assert!(woke(waiter).await);
    // The subscription came back too.
    let mut probe = Probe::new(&redis).await;
    probe.until_subscribers(1).await;
}

/// What a waiter answered, failing the test if it never does.
async fn woke(
    waiter: impl std::future::Future<
        Output = Result<Result<bool, session_store::StoreError>, tokio::task::JoinError>,
    >,
) -> bool {
    tokio::time::timeout(NEVER, waiter)
        .await
        .expect("the waiter was never woken")
        .unwrap()
        .unwrap()
}

/// Waiters for cancel requests (one per run a process holds) read once,
/// then rely on the subscription: twenty of them waiting three seconds
/// send Redis a handful of commands, not one read each per second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_waiters_read_once_while_subscribed() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let mut probe = Probe::new(&redis).await;
    const WAITERS: u64 = 20;
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let s = sid(&format!("held-{i}"));
        store.create(&s).await.unwrap();
        let store = store.clone();
        waiters.push(tokio::spawn(async move {
            store.wait_for_cancel_request(&s, 0, NEVER).await
        }));
    }
    probe.until_subscribers(1).await;
    // Every waiter has made its first read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Three seconds on one subscription, read each second, would be 60
    // reads; idle, none. A window may still hold a few first reads, or
    // those of waiters seeing the subscription come up (a loaded machine
    // is slow to make them), or its subscription may have gone deaf and
    // been replaced (its heartbeat not heard for three seconds), after
    // which waiters rightly read each second until it is back: such a
    // window is measured again, up to three times.
    let mut windows = Vec::new();
    while windows.len() < 3 {
        let (before, subscription) = (probe.script_calls().await, probe.pubsub_connections().await);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let reads = probe.script_calls().await - before;
        let same = probe.pubsub_connections().await == subscription;
        if same && reads < WAITERS {
            break;
        }
        windows.push((reads, same));
    }
    assert!(
        windows.len() < 3,
        "(script calls, on one subscription) in each of three 3 s windows \
         from {WAITERS} idle cancel waiters: {windows:?}"
    );
    assert!(waiters.iter().all(|w| !w.is_finished()));

    // A request made while the subscription is down is not published to
    // anyone; the subscription coming back wakes the waiter, which finds it.
    let other = open(&redis).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut probe.0)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the store's one subscription");
    other
        .request_cancel(&sid("held-0"), FencingToken::new(1))
        .await
        .unwrap();
    let found = tokio::time::timeout(NEVER, waiters.remove(0))
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert_eq!(found.map(|r| r.run), Some(FencingToken::new(1)));
    for w in waiters {
        w.abort();
    }
}

/// A subscription that goes deaf without its connection closing (Redis
/// behind a proxy or a NAT that stops forwarding) is found out by its own
/// heartbeat, no longer heard, and dropped: its waiters fall back to
/// reading until it is back, instead of trusting a silent channel. Redis
/// sees the old subscription go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deaf_subscription_is_dropped_when_its_heartbeat_stops() {
    let redis = RedisServer::start().unwrap();
    let proxy = test_services::FaultProxy::start(redis.addr()).unwrap();
    let store = RedisStore::builder(format!("redis://{}", proxy.addr()))
        .prefix("w:")
        .connect()
        .await
        .unwrap();
    let mut probe = Probe::new(&redis).await;
    let s = sid("deaf");
    store.create(&s).await.unwrap();
    let waiter = {
        let (store, s) = (store.clone(), s.clone());
        tokio::spawn(async move { store.wait_for_cancel_request(&s, 0, NEVER).await })
    };
    probe.until_subscribers(1).await;
    // Nothing forwarded either way; every connection stays open.
    proxy.set_mode(test_services::ProxyMode::Blackhole);
    probe.until_subscribers(0).await;
    proxy.set_mode(test_services::ProxyMode::Pass);
    probe.until_subscribers(1).await;
    waiter.abort();
}
