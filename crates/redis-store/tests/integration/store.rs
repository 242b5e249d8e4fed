//! The Redis store against a real `redis-server`: the fencing rules the
//! JSONL store keeps (same intent as session-store's tests), paging,
//! several "processes" (store instances with their own connections) racing
//! on one session, and what survives a restart or a crash of Redis.

use std::time::Duration;

use lease_port::{AuthorityId, FencingToken, LeaseErrorKind, OwnerId, SessionId, SessionLease};
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

#[tokio::test]
async fn create_append_read_list_delete() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    // Ids a naive key layout would confuse: braces, percent signs, colons.
    let a = sid("a/../b{x}:events");
    let b = sid("a/../b%7Bx%7D:events");
    store.create(&a).await.unwrap();
    store.create(&b).await.unwrap();

    let r = store
        .append(&a, tok(1), &[json!(1), json!({"k": "v"}), json!("three")])
        .await
        .unwrap();
    assert_eq!((r.first_seq, r.last_seq), (1, 3));
    let r = store.append(&a, tok(1), &[json!(4)]).await.unwrap();
    assert_eq!((r.first_seq, r.last_seq), (4, 4));
    store.append(&b, tok(9), &[json!("x")]).await.unwrap();

    assert_eq!(
        all(&store, &a).await,
        vec![
            (1, Some(1), json!(1)),
            (2, Some(1), json!({"k": "v"})),
            (3, Some(1), json!("three")),
            (4, Some(1), json!(4)),
        ]
    );
    assert_eq!(all(&store, &b).await, vec![(1, Some(9), json!("x"))]);
    let page = store.read(&a, 3, 10).await.unwrap();
    assert_eq!(
        page.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4]
    );
    assert_eq!(page.next_seq, None);
    assert!(store.read(&a, 99, 10).await.unwrap().events.is_empty());
    assert_eq!(store.read(&a, 0, 1).await.unwrap().events[0].seq, 1);

    let mut expected = vec![a.clone(), b.clone()];
    expected.sort();
    assert_eq!(store.list().await.unwrap(), expected);
    assert_eq!(
        store.high_water(&a).await.unwrap(),
        Some(FencingToken::new(1))
    );

    // Delete is fenced, keeps the mark, and re-creation never reuses seqs.
    let err = store.delete(&a, tok(0)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Fenced);
    store.delete(&a, tok(2)).await.unwrap();
    assert_eq!(
        store.read(&a, 1, 10).await.unwrap_err().kind(),
        StoreErrorKind::NotFound
    );
    assert_eq!(
        store
            .append(&a, tok(2), &[json!(0)])
            .await
            .unwrap_err()
            .kind(),
        StoreErrorKind::NotFound
    );
    assert_eq!(store.list().await.unwrap(), vec![b.clone()]);
    assert_eq!(
        store.high_water(&a).await.unwrap(),
        Some(FencingToken::new(2))
    );
    store.create(&a).await.unwrap();
    assert!(all(&store, &a).await.is_empty());
    let err = store
        .append(&a, tok(1), &[json!("late")])
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::Fenced { presented, high_water, .. }
            if presented.get() == 1 && high_water.get() == 2
    ));
    let r = store.append(&a, tok(2), &[json!("new")]).await.unwrap();
    assert_eq!(r.first_seq, 5);

    // Another process (its own connection) sees the same state.
    let again = open(&redis).await;
    assert_eq!(all(&again, &a).await, vec![(5, Some(2), json!("new"))]);
    assert_eq!(again.list().await.unwrap(), expected);
    assert!(again.session_lease().is_none());

    // Another prefix in the same database is another store.
    let other = RedisStore::builder(redis.url())
        .prefix("other:")
        .connect()
        .await
        .unwrap();
    assert!(other.list().await.unwrap().is_empty());
    assert_eq!(other.high_water(&a).await.unwrap(), None);
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_writes_nothing() {
    let redis = RedisServer::start().unwrap();
    let store = RedisStore::builder(redis.url())
        .max_event_bytes(64)
        .connect()
        .await
        .unwrap();
    let s = sid("s");
    store.create(&s).await.unwrap();
    store.append(&s, tok(1), &[json!(1)]).await.unwrap();

    let cases: Vec<(StoreErrorKind, Result<_, StoreError>)> = vec![
        (StoreErrorKind::Invalid, store.append(&s, tok(1), &[]).await),
        (
            StoreErrorKind::Invalid,
            store
                .append(&s, tok(1), &[json!(2), json!("x".repeat(100))])
                .await,
        ),
        (
            StoreErrorKind::Fenced,
            store.append(&s, tok(0), &[json!(2)]).await,
        ),
        (
            StoreErrorKind::Unfenced,
            store.append(&s, WriteFence::Unfenced, &[json!(2)]).await,
        ),
        (
            StoreErrorKind::NotFound,
            store.append(&sid("missing"), tok(1), &[json!(2)]).await,
        ),
    ];
    for (kind, result) in cases {
        assert_eq!(result.unwrap_err().kind(), kind);
    }
    assert_eq!(
        store.read(&s, 1, 0).await.unwrap_err().kind(),
        StoreErrorKind::Invalid
    );
    assert_eq!(
        store.create(&s).await.unwrap_err().kind(),
        StoreErrorKind::AlreadyExists
    );
    assert_eq!(
        store
            .delete(&sid("missing"), tok(1))
            .await
            .unwrap_err()
            .kind(),
        StoreErrorKind::NotFound
    );
    assert_eq!(all(&store, &s).await.len(), 1);

    // Options and URLs that can never work are refused before any request.
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

#[tokio::test]
async fn unfenced_writes_only_when_allowed_and_never_after_a_fenced_one() {
    let redis = RedisServer::start().unwrap();
    let s = sid("s");
    let strict = open(&redis).await;
    strict.create(&s).await.unwrap();
    let err = strict
        .append(&s, WriteFence::Unfenced, &[json!(1)])
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::Unfenced {
            high_water: None,
            ..
        }
    ));

    let lax = RedisStore::builder(redis.url())
        .prefix("t:")
        .allow_unfenced(true)
        .connect()
        .await
        .unwrap();
    lax.append(&s, WriteFence::Unfenced, &[json!(1)])
        .await
        .unwrap();
    lax.append(&s, tok(3), &[json!(2)]).await.unwrap();
    let err = lax
        .append(&s, WriteFence::Unfenced, &[json!(3)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unfenced { high_water: Some(h), .. } if h.get() == 3));
    assert_eq!(
        all(&lax, &s).await,
        vec![(1, None, json!(1)), (2, Some(3), json!(2))]
    );
}

#[tokio::test]
async fn an_equal_token_from_another_writer_is_fenced() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let s = sid("twins");
    store.create(&s).await.unwrap();
    let (x, y) = (owner("x"), owner("y"));
    let fx = WriteFence::new(FencingToken::new(5), x.clone());
    let fy = WriteFence::new(FencingToken::new(5), y.clone());
    store.append(&s, fx.clone(), &[json!("x1")]).await.unwrap();
    let err = store
        .append(&s, fy.clone(), &[json!("y1")])
        .await
        .unwrap_err();
    match err {
        StoreError::Fenced {
            presented,
            presented_by,
            high_water,
            high_water_owner,
            ..
        } => {
            assert_eq!((presented.get(), high_water.get()), (5, 5));
            assert_eq!(presented_by, y);
            assert_eq!(high_water_owner, Some(x.clone()));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(
        store.delete(&s, fy).await.unwrap_err().kind(),
        StoreErrorKind::Fenced
    );
    // The mark's own writer goes on; a higher token takes the mark over.
    store.append(&s, fx.clone(), &[json!("x2")]).await.unwrap();
    let fz = WriteFence::new(FencingToken::new(6), y.clone());
    store.append(&s, fz, &[json!("y6")]).await.unwrap();
    assert_eq!(
        store
            .append(&s, fx, &[json!("x3")])
            .await
            .unwrap_err()
            .kind(),
        StoreErrorKind::Fenced
    );
    let payloads: Vec<Value> = all(&store, &s).await.into_iter().map(|e| e.2).collect();
    assert_eq!(payloads, [json!("x1"), json!("x2"), json!("y6")]);
}

/// Tokens beyond what a double holds exactly, and beyond i64, still
/// compare as numbers (the scripts never turn them into Lua numbers).
#[tokio::test]
async fn tokens_compare_exactly_across_the_whole_u64_range() {
    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    let s = sid("big");
    store.create(&s).await.unwrap();
    let big = (1u64 << 53) + 1;
    store.append(&s, tok(9), &[json!(0)]).await.unwrap();
    store.append(&s, tok(big), &[json!(1)]).await.unwrap();
    for below in [big - 1, 1u64 << 53, 10, 99_999_999_999_999_999] {
        let err = store.append(&s, tok(below), &[json!(2)]).await;
        let refused = below < big;
        assert_eq!(err.is_err(), refused, "token {below} against mark {big}");
        if refused {
            assert_eq!(err.unwrap_err().kind(), StoreErrorKind::Fenced);
        }
    }
    store.append(&s, tok(u64::MAX), &[json!(3)]).await.unwrap();
    assert_eq!(
        store
            .append(&s, tok(u64::MAX - 1), &[json!(4)])
            .await
            .unwrap_err()
            .kind(),
        StoreErrorKind::Fenced
    );
    assert_eq!(
        store.high_water(&s).await.unwrap(),
        Some(FencingToken::new(u64::MAX))
    );
    let tokens: Vec<_> = all(&store, &s).await.into_iter().map(|e| e.1).collect();
    assert_eq!(
        tokens,
        [
            Some(9),
            Some(big),
            Some(99_999_999_999_999_999),
            Some(u64::MAX)
        ]
    );
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

/// Two writers in two store instances racing batch after batch on one
/// session: once the newer token has written, the older is refused every
/// time, and the stream holds every accepted batch whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_interleave_only_as_the_fence_allows() {
    let redis = RedisServer::start().unwrap();
    let s = sid("race");
    open(&redis).await.create(&s).await.unwrap();
    const BATCHES: usize = 150;
    const PER_BATCH: usize = 3;

    let race = |old: WriteFence, new: WriteFence| {
        let url = redis.url();
        let s = s.clone();
        async move {
            let mut tasks = Vec::new();
            for (name, fence) in [("old", old), ("new", new)] {
                let store = RedisStore::builder(url.clone())
                    .prefix("t:")
                    .connect()
                    .await
                    .unwrap();
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    for i in 0..BATCHES {
                        let batch: Vec<Value> = (0..PER_BATCH)
                            .map(|j| json!({"by": name, "batch": i, "j": j}))
                            .collect();
                        match store.append(&s, fence.clone(), &batch).await {
                            Ok(r) => outcomes.push(Some(r)),
                            Err(e) => {
                                assert_eq!(e.kind(), StoreErrorKind::Fenced, "{e}");
                                outcomes.push(None);
                            }
                        }
                    }
                    outcomes
                }));
            }
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await.unwrap());
            }
            results
        }
    };

    // A lower and a higher token: the higher is never refused; the lower
    // is refused from the higher's first write on.
    let results = race(tok(1), tok(2)).await;
    let (old, new) = (&results[0], &results[1]);
    assert!(
        new.iter().all(Option::is_some),
        "the newer token was refused"
    );
    let store = open(&redis).await;
    let events = all(&store, &s).await;
    let accepted_old = old.iter().flatten().count();
    assert_eq!(events.len(), (accepted_old + BATCHES) * PER_BATCH);
    let first_new = events.iter().position(|e| e.2["by"] == "new").unwrap();
    assert!(
        events[first_new..].iter().all(|e| e.2["by"] == "new"),
        "an old-token event landed after the new token wrote"
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.0, i as u64 + 1, "sequence numbers have a gap");
        assert_eq!(e.1, Some(if e.2["by"] == "new" { 2 } else { 1 }));
        // Batches are whole: every batch's events are adjacent, in order.
        assert_eq!(e.2["j"], json!(i % PER_BATCH), "a batch was split");
    }

    // Equal tokens from two writers on a fresh session: exactly one of
    // them writes, the other is refused every time.
    let s2 = sid("race-equal");
    store.create(&s2).await.unwrap();
    let twins = |o: &str| WriteFence::new(FencingToken::new(7), owner(o));
    let results = {
        let url = redis.url();
        let mut tasks = Vec::new();
        for (name, fence) in [("x", twins("x")), ("y", twins("y"))] {
            let store = RedisStore::builder(url.clone())
                .prefix("t:")
                .connect()
                .await
                .unwrap();
            let s2 = s2.clone();
            tasks.push(tokio::spawn(async move {
                let mut accepted = 0;
                for i in 0..BATCHES {
                    match store
                        .append(&s2, fence.clone(), &[json!({"by": name, "i": i})])
                        .await
                    {
                        Ok(_) => accepted += 1,
                        Err(e) => assert_eq!(e.kind(), StoreErrorKind::Fenced),
                    }
                }
                accepted
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    };
    assert!(
        results == [BATCHES, 0] || results == [0, BATCHES],
        "both equal-token writers wrote: {results:?}"
    );
    assert_eq!(all(&store, &s2).await.len(), BATCHES);
}

#[tokio::test]
async fn pages_follow_sequence_numbers_and_a_byte_budget() {
    let redis = RedisServer::start().unwrap();
    let store = RedisStore::builder(redis.url())
        .max_page_bytes(100)
        .connect()
        .await
        .unwrap();
    let s = sid("pages");
    store.create(&s).await.unwrap();
    for i in 0..10 {
        store.append(&s, tok(1), &[json!(i)]).await.unwrap();
    }
    let page = store.read(&s, 4, 3).await.unwrap();
    assert_eq!(
        page.events
            .iter()
            .map(|e| e.payload.clone())
            .collect::<Vec<_>>(),
        [json!(3), json!(4), json!(5)]
    );
    assert_eq!(page.next_seq, Some(7));
    let last = store.read(&s, 9, 3).await.unwrap();
    assert_eq!(last.events.len(), 2);
    assert_eq!(last.next_seq, None);

    // Each event is 45 bytes stored: two fit in 100, the third starts the
    // next page; an event larger than the budget still comes alone.
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
    assert!(page.events[0].at > std::time::UNIX_EPOCH);
}

#[tokio::test]
async fn a_store_records_the_authority_that_fences_it() {
    let redis = RedisServer::start().unwrap();
    let (one, two) = (open(&redis).await, open(&redis).await);
    let (a, b) = (
        AuthorityId::new("redis:a").unwrap(),
        AuthorityId::new("redis:b").unwrap(),
    );
    assert_eq!(one.recorded_authority().await.unwrap(), None);
    one.bind_authority(&a).await.unwrap();
    one.bind_authority(&a).await.unwrap();
    two.bind_authority(&a).await.unwrap();
    let err = two.bind_authority(&b).await.unwrap_err();
    match err {
        StoreError::AuthorityMismatch {
            recorded, offered, ..
        } => assert_eq!((recorded, offered), (a.clone(), b.clone())),
        other => panic!("expected AuthorityMismatch, got {other:?}"),
    }
    assert_eq!(two.recorded_authority().await.unwrap(), Some(a));

    // Racing first bindings of two authorities record exactly one.
    let fresh = RedisServer::start().unwrap();
    let mut tasks = Vec::new();
    for name in ["redis:x", "redis:y", "redis:z"] {
        let store = open(&fresh).await;
        tasks.push(tokio::spawn(async move {
            store
                .bind_authority(&AuthorityId::new(name).unwrap())
                .await
                .is_ok()
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += usize::from(t.await.unwrap());
    }
    assert_eq!(won, 1);
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

#[tokio::test]
async fn sessions_are_listed_in_pages_that_survive_concurrent_changes() {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use session_store::{ListCursor, MAX_LIST_LIMIT};

    let redis = RedisServer::start().unwrap();
    let store = open(&redis).await;
    async fn walk(store: &RedisStore, limit: usize) -> Vec<SessionId> {
        let mut out = Vec::new();
        let mut after: Option<ListCursor> = None;
        loop {
            let page = store.list_page(after.as_ref(), limit).await.unwrap();
            assert!(page.sessions.len() <= limit);
            out.extend(page.sessions);
            match page.next {
                Some(next) => after = Some(ListCursor::decode(&next.encode()).unwrap()),
                None => return out,
            }
        }
    }
    // Ids whose bytes sort differently from naive expectations.
    let mut ids: Vec<SessionId> = ["b", "a", "a{x}", "A", "é", "a b", "a-", "zz", "a%7B"]
        .into_iter()
        .map(sid)
        .collect();
    for id in &ids {
        store.create(id).await.unwrap();
    }
    store.delete(&sid("zz"), tok(1)).await.unwrap();
    ids.retain(|i| i.as_str() != "zz");
    ids.sort();
    for limit in [1, 2, 3, ids.len(), MAX_LIST_LIMIT] {
        assert_eq!(walk(&store, limit).await, ids, "limit {limit}");
    }
    assert_eq!(store.list().await.unwrap(), ids);
    for limit in [0, MAX_LIST_LIMIT + 1] {
        let e = store.list_page(None, limit).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Invalid);
    }

    // Stable sessions every third id; another client creates and deletes
    // the ids between while pages are read.
    let stable: BTreeSet<SessionId> = (0..150)
        .step_by(3)
        .map(|i| sid(&format!("k-{i:03}")))
        .collect();
    for id in &stable {
        store.create(id).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let other = open(&redis).await;
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in (0u64..150).filter(|i| !i.is_multiple_of(3)) {
                    let id = sid(&format!("k-{i:03}"));
                    if (i + round).is_multiple_of(2) {
                        let _ = other.create(&id).await;
                    } else {
                        let _ = other.delete(&id, tok(round + 10)).await;
                    }
                }
                round += 1;
            }
            round
        })
    };
    for limit in [1, 4, 7] {
        let flat = walk(&store, limit).await;
        assert!(flat.windows(2).all(|w| w[0] < w[1]), "limit {limit}");
        let seen: BTreeSet<SessionId> = flat.into_iter().collect();
        assert!(
            stable.is_subset(&seen),
            "limit {limit}: a stable session missing"
        );
    }
    stop.store(true, Ordering::Relaxed);
    assert!(churn.await.unwrap() > 0);
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
