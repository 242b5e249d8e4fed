//! The Redis store against a real `redis-server`, where it differs from
//! any other store: its own leases, prefixes, options and byte-bounded
//! pages, and what survives a restart, a crash, a flush, an older snapshot
//! or an evicting memory policy of Redis, with several "processes" (store
//! instances with their own connections). The rules every store keeps are
//! the `storeconformance` suite's (`store_conformance`).

use std::time::Duration;

use lease_port::{FencingToken, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use redis_session_store::{RedisLease, RedisStore};
use serde_json::{Value, json};
use session_store::{SessionStore, StoreError, StoreErrorKind, WriteFence};
use test_services::{Controls, RedisServer};

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

/// Token `t` of its one holder (each token here has exactly one).
fn tok(t: u64) -> WriteFence {
    WriteFence::new(FencingToken::new(t), owner(&format!("holder-of-{t}")))
}

async fn open(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("t:")
        .connect()
        .await
        .unwrap()
}

async fn all(store: &RedisStore, s: &SessionId) -> Vec<(u64, Option<u64>, Value)> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read(s, from, 2).await.unwrap();
        assert!(page.events.len() <= 2);
        assert!(!page.unfinished_write);
        out.extend(
            page.events
                .into_iter()
                .map(|e| (e.seq, e.token.map(FencingToken::get), e.payload)),
        );
        match page.next_seq {
            Some(n) => from = n,
            None => return out,
        }
    }
}

/// A key prefix is a store of its own: another prefix in the same
/// database sees none of its sessions nor marks. A store built without
/// `leases` offers none.
#[tokio::test]
async fn another_prefix_is_another_store_and_no_leases_unless_asked() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let a = sid("a/../b{x}:events");
    store.create(&a).await.unwrap();
    store.append(&a, tok(2), &[json!("x")]).await.unwrap();
    assert!(store.session_lease().is_none());

    let other = RedisStore::builder(redis.url())
        .prefix("other:")
        .connect()
        .await
        .unwrap();
    assert!(other.list().await.unwrap().is_empty());
    assert_eq!(other.high_water(&a).await.unwrap(), None);
    assert_eq!(
        other.read(&a, 1, 10).await.unwrap_err().kind(),
        StoreErrorKind::NotFound
    );
    assert_eq!(all(&store, &a).await, vec![(1, Some(2), json!("x"))]);
}

/// Options and URLs that can never work are refused before any request.
#[tokio::test]
async fn options_that_can_never_work_are_refused_before_any_request() {
    let redis = RedisServer::start().unwrap();
    for builder in [
        RedisStore::builder(redis.url()).prefix("a{b"),
        RedisStore::builder(redis.url()).request_timeout(Duration::ZERO),
        RedisStore::builder("not a url"),
        RedisStore::builder(redis.url()).leases(Duration::ZERO),
    ] {
        assert_eq!(
            builder.connect().await.unwrap_err().kind(),
            StoreErrorKind::Invalid
        );
    }
    let err = RedisLease::builder(redis.url())
        .prefix("}")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid);
}

/// Pages are bounded by bytes as well as by count: each event below is 45
/// bytes stored, so two fit in 100 and the third starts the next page; an
/// event larger than the budget still comes alone.
#[tokio::test]
async fn pages_are_bounded_by_a_byte_budget() {
    let redis = RedisServer::start().unwrap();
    let store = RedisStore::builder(redis.url())
        .max_page_bytes(100)
        .connect()
        .await
        .unwrap();
    let big = "y".repeat(43);
    let t = sid("bytes");
    store.create(&t).await.unwrap();
    store
        .append(
            &t,
            tok(1),
            &[json!(big), json!(big), json!(big), json!("z".repeat(150))],
        )
        .await
        .unwrap();
    let page = store.read(&t, 1, 10).await.unwrap();
    assert_eq!((page.events.len(), page.next_seq), (2, Some(3)));
    let page = store.read(&t, 3, 10).await.unwrap();
    assert_eq!((page.events.len(), page.next_seq), (1, Some(4)));
    let page = store.read(&t, 4, 10).await.unwrap();
    assert_eq!((page.events.len(), page.next_seq), (1, None));
    // The count limit still applies within the budget.
    let page = store.read(&t, 1, 1).await.unwrap();
    assert_eq!((page.events.len(), page.next_seq), (1, Some(2)));
}

/// The scenario with the Redis leases: A pauses past its TTL, B
/// takes over and writes, A resumes and tries to append.
#[tokio::test]
async fn a_resumed_owner_is_fenced_after_a_takeover() {
    let redis = RedisServer::start().unwrap();
    let ttl = Duration::from_millis(300);
    let connect = || async {
        RedisStore::builder(redis.url())
            .prefix("t:")
            .leases(ttl)
            .connect()
            .await
            .unwrap()
    };
    // Two processes: their own store instances and connections.
    let (store_a, store_b) = (connect().await, connect().await);
    let (leases_a, leases_b) = (
        store_a.session_lease().unwrap(),
        store_b.session_lease().unwrap(),
    );
    let authority = leases_a.authority().await.unwrap();
    assert_eq!(leases_b.authority().await.unwrap(), authority);
    store_a.bind_authority(&authority).await.unwrap();
    store_b.bind_authority(&authority).await.unwrap();
    let s = sid("chat");
    store_a.create(&s).await.unwrap();

    let a = leases_a.acquire(&s, &owner("a")).await.unwrap();
    store_a
        .append(&s, (&a).into(), &[json!({"by": "a", "n": 1})])
        .await
        .unwrap();

    // A is paused past its TTL; Redis expires its grant.
    tokio::time::sleep(ttl * 2).await;
    let b = leases_b.acquire(&s, &owner("b")).await.unwrap();
    assert!(b.token() > a.token());
    store_b
        .append(&s, (&b).into(), &[json!({"by": "b", "n": 1})])
        .await
        .unwrap();

    let err = store_a
        .append(&s, (&a).into(), &[json!({"by": "a", "n": 2})])
        .await
        .unwrap_err();
    match err {
        StoreError::Fenced {
            presented,
            high_water,
            ..
        } => assert_eq!((presented, high_water), (a.token(), b.token())),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(
        store_a.delete(&s, (&a).into()).await.unwrap_err().kind(),
        StoreErrorKind::Fenced
    );
    let lost = leases_a.renew(&a).await.unwrap_err();
    assert_eq!(lost.kind(), LeaseErrorKind::Held);
    assert_eq!(lost.holder(), Some(&owner("b")));
    assert_eq!(
        leases_a.current(&s).await.unwrap().map(|l| l.token()),
        Some(b.token())
    );
    store_b
        .append(&s, (&b).into(), &[json!({"by": "b", "n": 2})])
        .await
        .unwrap();
    let events = all(&store_a, &s).await;
    let by: Vec<_> = events.iter().map(|e| e.2["by"].clone()).collect();
    assert_eq!(by, [json!("a"), json!("b"), json!("b")]);
}

/// The lease authority is one per database and prefix, the same for every
/// client and across a restart of Redis, and another for another server
/// or prefix.
#[tokio::test]
async fn lease_authorities_are_stable_and_distinct() {
    let mut redis = RedisServer::start_persistent().unwrap();
    let other = RedisServer::start().unwrap();
    let lease = |url: String, prefix: &'static str| async move {
        RedisLease::builder(url)
            .prefix(prefix)
            .connect()
            .await
            .unwrap()
            .authority()
            .await
            .unwrap()
    };
    let first = lease(redis.url(), "p:").await;
    assert_eq!(lease(redis.url(), "p:").await, first);
    assert_ne!(lease(redis.url(), "q:").await, first);
    assert_ne!(lease(other.url(), "p:").await, first);
    redis.restart().unwrap();
    assert_eq!(lease(redis.url(), "p:").await, first);
}

/// Tokens, marks and events come back from the append-only file after a
/// restart and after SIGKILL: a takeover after either gets a greater token
/// and the old one stays fenced.
#[tokio::test]
async fn tokens_and_marks_survive_a_restart_and_a_crash() {
    let mut redis = RedisServer::start_persistent().unwrap();
    let ttl = Duration::from_secs(30);
    let connect = |url: String| async move {
        RedisStore::builder(url)
            .prefix("t:")
            .leases(ttl)
            .connect()
            .await
            .unwrap()
    };
    let s = sid("durable");
    let mut last = None;
    for crash in [false, true] {
        let store = connect(redis.url()).await;
        let leases = store.lease().unwrap().clone();
        if last.is_none() {
            store.create(&s).await.unwrap();
        }
        let a = leases.acquire(&s, &owner("a")).await.unwrap();
        if let Some(prev) = last {
            assert!(a.token() > prev, "token {} after {prev}", a.token());
        }
        store
            .append(&s, (&a).into(), &[json!(a.token().get())])
            .await
            .unwrap();
        if crash {
            redis.kill();
        }
        redis.restart().unwrap();

        let store = connect(redis.url()).await;
        let leases = store.lease().unwrap().clone();
        // The grant itself survived, so another owner is still refused.
        let held = leases.acquire(&s, &owner("b")).await.unwrap_err();
        assert_eq!(held.holder(), Some(&owner("a")));
        leases.release(&a).await.unwrap();
        let b = leases.acquire(&s, &owner("b")).await.unwrap();
        assert!(b.token() > a.token());
        store
            .append(&s, (&b).into(), &[json!(b.token().get())])
            .await
            .unwrap();
        assert_eq!(
            store
                .append(&s, (&a).into(), &[json!("late")])
                .await
                .unwrap_err()
                .kind(),
            StoreErrorKind::Fenced
        );
        leases.release(&b).await.unwrap();
        last = Some(b.token());
    }
    let store = connect(redis.url()).await;
    let tokens: Vec<_> = all(&store, &s)
        .await
        .into_iter()
        .map(|e| e.1.unwrap())
        .collect();
    assert_eq!(tokens.len(), 4);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Redis killed while appenders are writing: after the restart every batch
/// is there whole or not at all, the sequence numbers have no gap, and the
/// record agrees with the stream (the next append continues from it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_append_leaves_no_partial_batch() {
    let mut redis = RedisServer::start_persistent().unwrap();
    let store = open(&redis).await;
    let s = sid("crash");
    store.create(&s).await.unwrap();
    const PER_BATCH: usize = 200;
    let mut tasks = Vec::new();
    for writer in 0..2 {
        let store = open(&redis).await;
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = 0usize;
            for batch in 0.. {
                let events: Vec<Value> = (0..PER_BATCH)
                    .map(|j| json!({"w": writer, "b": batch, "j": j, "pad": "x".repeat(64)}))
                    .collect();
                match store.append(&s, tok(1), &events).await {
                    Ok(_) => acked += 1,
                    Err(e) => {
                        // Sent and unanswered (Io), or never sent once the
                        // connection was gone (Unavailable).
                        assert!(
                            matches!(e.kind(), StoreErrorKind::Io | StoreErrorKind::Unavailable),
                            "{e}"
                        );
                        return acked;
                    }
                }
            }
            acked
        }));
    }
    // Let a good number of batches land first.
    let landed = (20 * PER_BATCH) as u64;
    while store.read(&s, landed, 1).await.unwrap().events.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    redis.kill();
    let mut acked = 0;
    for t in tasks {
        acked += t.await.unwrap();
    }
    redis.restart().unwrap();

    let store = open(&redis).await;
    let events = all_raw(&store, &s).await;
    assert_eq!(events.len() % PER_BATCH, 0, "a partial batch survived");
    // Every acknowledged batch is there (appendfsync always); at most the
    // ones in flight at the kill may be there without an acknowledgement.
    assert!(
        events.len() / PER_BATCH >= acked,
        "an acknowledged batch was lost"
    );
    assert!(events.len() / PER_BATCH <= acked + 2);
    for (i, (seq, payload)) in events.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1);
        assert_eq!(payload["j"], json!(i % PER_BATCH), "a batch was split");
    }
    let r = store.append(&s, tok(1), &[json!("after")]).await.unwrap();
    assert_eq!(r.first_seq, events.len() as u64 + 1);
    assert_eq!(
        store.high_water(&s).await.unwrap(),
        Some(FencingToken::new(1))
    );
}

async fn all_raw(store: &RedisStore, s: &SessionId) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read(s, from, 1000).await.unwrap();
        out.extend(page.events.into_iter().map(|e| (e.seq, e.payload)));
        match page.next_seq {
            Some(n) => from = n,
            None => return out,
        }
    }
}

/// When Redis loses its data, every process that knew it is refused
/// rather than writing against wiped marks: its store's writes and reads
/// and its leases' calls fail as `Rewound`, saying why and what to do.
#[tokio::test]
async fn a_flushed_redis_refuses_the_processes_that_knew_it() {
    let redis = RedisServer::start().unwrap();
    let store = RedisStore::builder(redis.url())
        .prefix("t:")
        .leases(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let leases = store.lease().unwrap().clone();
    let authority = leases.authority().await.unwrap();
    store.bind_authority(&authority).await.unwrap();
    let s = sid("flushed");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("a")).await.unwrap();
    store.append(&s, (&a).into(), &[json!(1)]).await.unwrap();

    assert_eq!(redis.command(&["FLUSHALL"]).unwrap(), "+OK");
    let rewound = |e: StoreError| {
        assert_eq!(e.kind(), StoreErrorKind::Rewound, "{e}");
        assert!(e.to_string().contains("went back"), "{e}");
    };
    rewound(store.create(&s).await.unwrap_err());
    rewound(
        store
            .append(&s, (&a).into(), &[json!(2)])
            .await
            .unwrap_err(),
    );
    rewound(store.read(&s, 1, 10).await.unwrap_err());
    rewound(store.high_water(&s).await.unwrap_err());
    let err = leases.acquire(&s, &owner("a")).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");
    assert!(err.message().contains("restart this process"), "{err}");
    let err = leases.renew(&a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");

    // A restarted process accepts what Redis has now and binds afresh;
    // the old one stays refused.
    let restarted = RedisStore::builder(redis.url())
        .prefix("t:")
        .leases(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let new_authority = restarted.lease().unwrap().authority().await.unwrap();
    assert_ne!(new_authority, authority);
    restarted.bind_authority(&new_authority).await.unwrap();
    restarted.create(&s).await.unwrap();
    rewound(
        store
            .append(&s, (&a).into(), &[json!(3)])
            .await
            .unwrap_err(),
    );
}

/// A server that stops answering (SIGSTOP) or goes away: every call ends
/// by its deadline with an I/O error (store) or a transient one (lease),
/// each keeping its cause; the same clients work again once it is back.
#[tokio::test]
async fn an_unanswering_or_absent_server_is_a_bounded_retryable_error() {
    let mut redis = RedisServer::start_persistent().unwrap();
    let store = RedisStore::builder(redis.url())
        .prefix("t:")
        .leases(Duration::from_secs(30))
        .request_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let leases = store.lease().unwrap().clone();
    let s = sid("faults");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("a")).await.unwrap();

    redis.pause().unwrap();
    let err = store
        .append(&s, (&a).into(), &[json!(1)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Io);
    let StoreError::Io { source, .. } = &err else {
        unreachable!()
    };
    assert_eq!(source.kind(), std::io::ErrorKind::TimedOut);
    assert!(source.get_ref().is_some_and(|e| {
        e.downcast_ref::<redis_session_store::RequestError>()
            .is_some()
    }));
    let err = leases.renew(&a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient);
    assert!(std::error::Error::source(&err).is_some());
    let batch = leases.renew_many(&[a.clone(), a.clone()]).await;
    assert!(batch.iter().all(|r| r.as_ref().unwrap_err().is_retryable()));
    redis.resume().unwrap();

    redis.kill();
    let err = leases.acquire(&s, &owner("b")).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient);
    // A read changes nothing: out of reach, it is safe to retry.
    assert_eq!(
        store.list().await.unwrap_err().kind(),
        StoreErrorKind::Unavailable
    );
    redis.restart().unwrap();

    // Back: the clients reconnect by themselves.
    let mut renewed = None;
    for _ in 0..50 {
        match leases.renew(&a).await {
            Ok(l) => {
                renewed = Some(l);
                break;
            }
            Err(e) => assert_eq!(e.kind(), LeaseErrorKind::Transient),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(renewed.unwrap().token(), a.token());
    let ids: Vec<_> = store.list().await.unwrap();
    assert_eq!(ids, vec![s.clone()]);
}

/// A stream that does not end where the session's record says (something
/// else wrote under the prefix): the append is refused as corrupt and
/// writes nothing, rather than writing part of its batch.
#[tokio::test]
async fn a_foreign_stream_entry_refuses_the_append_whole() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let s = sid("foreign");
    store.create(&s).await.unwrap();
    store.append(&s, tok(1), &[json!(1)]).await.unwrap();
    let added = redis
        .command(&["XADD", "t:{foreign}:events", "2-0", "x", "y"])
        .unwrap();
    assert!(added.ends_with("2-0"), "{added}");
    let err = store
        .append(&s, tok(1), &[json!(2), json!(3)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert_eq!(
        redis.command(&["XLEN", "t:{foreign}:events"]).unwrap(),
        ":2"
    );
    assert_eq!(
        redis
            .command(&["HGET", "t:{foreign}:record", "seq"])
            .unwrap(),
        "$1\r\n1"
    );
}

/// Cancel requests: any instance records one, every instance reads it; the
/// token only rises (compared exactly, above 2^53 too), and every request
/// for the recorded token or a later one is counted.
#[tokio::test]
async fn cancel_requests_rise_exactly_and_are_counted() {
    let redis = RedisServer::start().unwrap();
    let (holder, other) = (open(&redis).await, open(&redis).await);
    let s = sid("cancelled");
    holder.create(&s).await.unwrap();
    assert_eq!(holder.cancel_request(&s).await.unwrap(), None);
    let big = (1u64 << 53) + 1;
    let seen = |run, serial| {
        Some(session_store::CancelRequest {
            run: FencingToken::new(run),
            serial,
        })
    };
    for (run, expected) in [
        (big, seen(big, 1)),
        (big, seen(big, 2)),
        // 2^53 and 2^53 + 1 are one double: compared as numbers, the lower
        // would pass for equal.
        (big - 1, seen(big, 2)),
        (7, seen(big, 2)),
        (u64::MAX, seen(u64::MAX, 3)),
    ] {
        other
            .request_cancel(&s, FencingToken::new(run))
            .await
            .unwrap();
        assert_eq!(
            holder.cancel_request(&s).await.unwrap(),
            expected,
            "after {run}"
        );
    }
    let err = other
        .request_cancel(&sid("missing"), FencingToken::new(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::NotFound);
}

/// Redis refusing a request before acting on it — out of memory, or a
/// replica refusing writes — is `Unavailable` (nothing was done; retry),
/// never `Corrupt` nor a write of unknown outcome, and the session is
/// whole once Redis accepts writes again.
#[tokio::test]
async fn refusals_before_acting_are_unavailable_and_leave_the_session_whole() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let s = sid("refused");
    store.create(&s).await.unwrap();
    store.append(&s, tok(1), &[json!(1)]).await.unwrap();

    redis.command(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let err = store
        .append(&s, tok(1), &[json!(2), json!(3)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    redis.command(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();

    // A replica (of a master that is not there) refuses writes.
    redis.command(&["REPLICAOF", "127.0.0.1", "1"]).unwrap();
    let err = store.append(&s, tok(1), &[json!(2)]).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    redis.command(&["REPLICAOF", "NO", "ONE"]).unwrap();

    let receipt = store.append(&s, tok(1), &[json!(2)]).await.unwrap();
    assert_eq!((receipt.first_seq, receipt.last_seq), (2, 2));
    let page = store.read(&s, 1, 10).await.unwrap();
    let payloads: Vec<Value> = page.events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, [json!(1), json!(2)]);
}

/// A Redis that may evict keys is refused: at connect, and once a later
/// reading of its policy shows eviction, by every call until the policy is
/// set back. Eviction takes grants, token records and marks first.
#[tokio::test]
async fn an_evicting_memory_policy_is_refused() {
    let redis = RedisServer::start().unwrap();
    for policy in [
        "volatile-lru",
        "allkeys-lru",
        "allkeys-random",
        "volatile-ttl",
    ] {
        let set = redis.command(&["CONFIG", "SET", "maxmemory-policy", policy]);
        assert_eq!(set.unwrap(), "+OK");
        let err = RedisStore::builder(redis.url())
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
        let text = err.to_string();
        assert!(
            text.contains(policy) && text.contains("noeviction"),
            "{text}"
        );
        let err = RedisLease::builder(redis.url())
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");
    }

    let set = |p: &str| {
        redis
            .command(&["CONFIG", "SET", "maxmemory-policy", p])
            .unwrap()
    };
    assert_eq!(set("noeviction"), "+OK");
    let store = RedisStore::builder(redis.url())
        .prefix("t:")
        .leases(Duration::from_secs(30))
        .policy_check_interval(Duration::ZERO)
        .connect()
        .await
        .unwrap();
    let leases = store.lease().unwrap().clone();
    let s = sid("evicting");
    store.create(&s).await.unwrap();
    let a = leases.acquire(&s, &owner("a")).await.unwrap();
    store.append(&s, (&a).into(), &[json!(1)]).await.unwrap();

    assert_eq!(set("volatile-lru"), "+OK");
    let err = store
        .append(&s, (&a).into(), &[json!(2)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("volatile-lru"), "{err}");
    let err = leases.renew(&a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");
    let err = leases
        .acquire(&sid("other"), &owner("b"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");

    assert_eq!(set("noeviction"), "+OK");
    let a = leases.renew(&a).await.unwrap();
    store.append(&s, (&a).into(), &[json!(2)]).await.unwrap();
}

/// Where `CONFIG` is not granted (managed services often rename or deny
/// it), the policy is read from `INFO memory`; a user who may read neither
/// is refused, told what to grant.
#[tokio::test]
async fn the_policy_is_read_from_info_where_config_is_denied() {
    let redis = RedisServer::start().unwrap();
    let acl = |rules: &[&str]| {
        let mut args = vec!["ACL", "SETUSER"];
        args.extend_from_slice(rules);
        assert_eq!(redis.command(&args).unwrap(), "+OK");
    };
    acl(&["noconfig", "on", ">pw", "~*", "&*", "+@all", "-config"]);
    acl(&[
        "blind", "on", ">pw", "~*", "&*", "+@all", "-config", "-info",
    ]);
    let url = |user: &str| {
        redis
            .url()
            .replace("redis://", &format!("redis://{user}:pw@"))
    };
    let connect = |user: &str| RedisStore::builder(url(user)).prefix("t:").connect();

    let store = connect("noconfig").await.unwrap();
    store.create(&sid("x")).await.unwrap();
    let set = |p: &str| {
        redis
            .command(&["CONFIG", "SET", "maxmemory-policy", p])
            .unwrap()
    };
    assert_eq!(set("allkeys-lfu"), "+OK");
    let err = connect("noconfig").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("allkeys-lfu"), "{err}");

    assert_eq!(set("noeviction"), "+OK");
    let err = connect("blind").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("+info"), "{err}");
}

/// Redis brought back from an older snapshot while its clients run (an
/// RDB restart, a crash under `appendfsync everysec`, a lagging replica
/// promoted): every process that saw the newer state is refused, so no
/// token is issued twice and no write lands under a mark Redis forgot. A
/// process started afterwards accepts the state Redis has.
#[tokio::test]
async fn redis_back_from_an_older_snapshot_is_refused() {
    let mut redis = RedisServer::start().unwrap();
    let server = |redis: &RedisServer| {
        RedisStore::builder(redis.url())
            .prefix("t:")
            .leases(Duration::from_secs(30))
            .connect()
    };
    let (one, two) = (server(&redis).await.unwrap(), server(&redis).await.unwrap());
    let leases = |s: &RedisStore| s.lease().unwrap().clone();
    let authority = leases(&one).authority().await.unwrap();
    one.bind_authority(&authority).await.unwrap();
    two.bind_authority(&authority).await.unwrap();
    let s = sid("snapshot");
    one.create(&s).await.unwrap();
    let t1 = leases(&one).acquire(&s, &owner("one")).await.unwrap();
    one.append(&s, (&t1).into(), &[json!(1)]).await.unwrap();
    leases(&one).release(&t1).await.unwrap();
    assert_eq!(redis.command(&["SAVE"]).unwrap(), "+OK");

    // Tokens 2 and 3 and their writes, then Redis back at token 1.
    let t2 = leases(&two).acquire(&s, &owner("two")).await.unwrap();
    two.append(&s, (&t2).into(), &[json!(2)]).await.unwrap();
    leases(&two).release(&t2).await.unwrap();
    let t3 = leases(&one).acquire(&s, &owner("one")).await.unwrap();
    assert_eq!(t3.token(), FencingToken::new(3));
    one.append(&s, (&t3).into(), &[json!(3)]).await.unwrap();
    redis.restart().unwrap();

    // A process started after the loss writes on until the prefix's
    // counter is past what `one` and `two` saw: their sessions' records,
    // still older than what they saw of them, refuse them all the same.
    let busy = retry_unavailable(|| server(&redis)).await.unwrap();
    busy.bind_authority(&authority).await.unwrap();
    let elsewhere = sid("elsewhere");
    busy.create(&elsewhere).await.unwrap();
    let busy_lease = leases(&busy)
        .acquire(&elsewhere, &owner("busy"))
        .await
        .unwrap();
    for i in 0..30 {
        busy.append(&elsewhere, (&busy_lease).into(), &[json!(i)])
            .await
            .unwrap();
    }

    for store in [&one, &two] {
        let e = retry_unavailable(|| store.read(&s, 1, 10))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Rewound, "{e}");
        let e = store
            .append(&s, (&t3).into(), &[json!(4)])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Rewound, "{e}");
    }
    // The leases' takeovers are refused too: a token at or below one this
    // client was granted for the session would be issued twice.
    let e = leases(&two).acquire(&s, &owner("two")).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e}");
    assert!(e.message().contains("again"), "{e}");
    let e = leases(&one).acquire(&s, &owner("one")).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e}");

    // A process started now serves the older state: the snapshot's one
    // event, and tokens above the snapshot's (the refused acquires above
    // took the next ones and gave them back).
    let fresh = server(&redis).await.unwrap();
    fresh.bind_authority(&authority).await.unwrap();
    let events: Vec<_> = fresh.read(&s, 1, 10).await.unwrap().events;
    assert_eq!(events.len(), 1);
    let next = leases(&fresh).acquire(&s, &owner("fresh")).await.unwrap();
    assert!(next.token() > FencingToken::new(1), "{next:?}");
    fresh
        .append(&s, (&next).into(), &[json!("after")])
        .await
        .unwrap();
}

/// Retries `op` while Redis is still coming back (refused connections,
/// `LOADING`), at most fifty times.
async fn retry_unavailable<T, F>(op: impl Fn() -> F) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    for _ in 0..50 {
        match op().await {
            Err(e) if e.kind() == StoreErrorKind::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
    op().await
}

/// A floor raises the token record: the grant is above it, and so is every
/// later takeover's, from any client.
#[tokio::test]
async fn an_acquire_above_a_floor_raises_the_token_record() {
    let redis = RedisServer::start().unwrap();
    let a = RedisLease::builder(redis.url()).connect().await.unwrap();
    let b = RedisLease::builder(redis.url()).connect().await.unwrap();
    let s = sid("floor");
    let first = a.acquire(&s, &owner("a")).await.unwrap();
    assert_eq!(first.token(), FencingToken::new(1));
    // The live holder under a token not above the floor gets a new one.
    let raised = a
        .acquire_above(&s, &owner("a"), FencingToken::new(41))
        .await
        .unwrap();
    assert_eq!(raised.token(), FencingToken::new(42));
    let err = b.acquire(&s, &owner("b")).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    a.release(&raised).await.unwrap();
    let next = b.acquire(&s, &owner("b")).await.unwrap();
    assert_eq!(next.token(), FencingToken::new(43));
    // A floor below the live token keeps it.
    let kept = b
        .acquire_above(&s, &owner("b"), FencingToken::new(5))
        .await
        .unwrap();
    assert_eq!(kept.token(), next.token());
    let err = b
        .acquire_above(&s, &owner("b"), FencingToken::new(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err}");
}

/// A Redis busy with a long script while the policy is read again answers
/// BUSY: a passing fault, never taken for an unreadable policy (which
/// would refuse everything as `Rewound` until the next reading).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_redis_during_the_policy_check_is_a_passing_fault() {
    let redis = RedisServer::start().unwrap();
    let set = redis.command(&["CONFIG", "SET", "busy-reply-threshold", "100"]);
    assert_eq!(set.unwrap(), "+OK");
    let store = RedisStore::builder(redis.url())
        .prefix("t:")
        .policy_check_interval(Duration::ZERO)
        .connect()
        .await
        .unwrap();
    let s = sid("busy");
    store.create(&s).await.unwrap();
    let addr = redis.addr();
    let busy = std::thread::spawn(move || {
        // A script that keeps the server busy for a few seconds.
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        let script = "local i = 0 while i < 100000000 do i = i + 1 end return 1";
        let request = format!(
            "*3\r\n$4\r\nEVAL\r\n${}\r\n{script}\r\n$1\r\n0\r\n",
            script.len()
        );
        std::io::Write::write_all(&mut conn, request.as_bytes()).unwrap();
        let mut reply = [0u8; 16];
        let _ = std::io::Read::read(&mut conn, &mut reply);
    });
    let mut saw_busy = false;
    while !busy.is_finished() {
        match store.read(&s, 1, 1).await {
            Err(e) => {
                assert_ne!(e.kind(), StoreErrorKind::Rewound, "{e}");
                saw_busy = true;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    busy.join().unwrap();
    assert!(saw_busy, "the script never kept Redis busy");
    store.read(&s, 1, 1).await.unwrap();
}

/// A token granted just before Redis went back, whose holder has not
/// written yet: other processes' writes carry the change counter past the
/// holder's floor, so only the token record can tell. The holder's renewal
/// and its first write are refused (its token is above what Redis records
/// issuing), before another process can be granted the same token and the
/// two act under one.
#[tokio::test]
async fn a_token_redis_forgot_issuing_is_refused_to_its_holder() {
    let mut redis = RedisServer::start().unwrap();
    let server = |redis: &RedisServer| {
        RedisStore::builder(redis.url())
            .prefix("t:")
            .leases(Duration::from_secs(30))
            .connect()
    };
    let b = server(&redis).await.unwrap();
    let b_leases = b.lease().unwrap().clone();
    let authority = b_leases.authority().await.unwrap();
    b.bind_authority(&authority).await.unwrap();
    let s = sid("forgotten");
    b.create(&s).await.unwrap();
    let t1 = b_leases.acquire(&s, &owner("b")).await.unwrap();
    b.append(&s, (&t1).into(), &[json!(1)]).await.unwrap();
    b_leases.release(&t1).await.unwrap();
    assert_eq!(redis.command(&["SAVE"]).unwrap(), "+OK");
    let t2 = b_leases.acquire(&s, &owner("b")).await.unwrap();
    assert_eq!(t2.token(), FencingToken::new(2));
    redis.restart().unwrap();

    let busy = retry_unavailable(|| server(&redis)).await.unwrap();
    busy.bind_authority(&authority).await.unwrap();
    let elsewhere = sid("elsewhere");
    busy.create(&elsewhere).await.unwrap();
    let lease = busy
        .lease()
        .unwrap()
        .acquire(&elsewhere, &owner("busy"))
        .await
        .unwrap();
    for i in 0..20 {
        busy.append(&elsewhere, (&lease).into(), &[json!(i)])
            .await
            .unwrap();
    }

    // (b's connection met the restart: its first request may fail.)
    let mut renewed = b_leases.renew(&t2).await;
    for _ in 0..50 {
        match &renewed {
            Err(e) if e.kind() == LeaseErrorKind::Transient => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                renewed = b_leases.renew(&t2).await;
            }
            _ => break,
        }
    }
    let e = renewed.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e}");
    let e = b.append(&s, (&t2).into(), &[json!(2)]).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Rewound, "{e}");
    assert!(e.to_string().contains("never issued"), "{e}");
}

/// A reading of the policy that gets no answer (the connection broke in a
/// restart) fails the call that made it and stays due: no call runs on a
/// Redis whose policy was made evicting meanwhile, however the connection
/// comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_runs_past_a_policy_reading_that_got_no_answer() {
    let mut redis = RedisServer::start_persistent().unwrap();
    let store = RedisStore::builder(redis.url())
        .prefix("t:")
        .policy_check_interval(Duration::ZERO)
        .allow_unfenced(true)
        .connect()
        .await
        .unwrap();
    let s = sid("reading");
    store.create(&s).await.unwrap();
    redis.restart().unwrap();
    let set = redis.command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    assert_eq!(set.unwrap(), "+OK");
    let mut refused = false;
    for _ in 0..50 {
        match store.append(&s, WriteFence::Unfenced, &[json!(1)]).await {
            Ok(r) => panic!("appended {r:?} under an evicting policy"),
            Err(e) if e.kind() == StoreErrorKind::Rewound => {
                refused = true;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(refused, "the evicting policy was never read");
    let set = redis.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    assert_eq!(set.unwrap(), "+OK");
    assert_eq!(all(&store, &s).await, vec![]);
}
