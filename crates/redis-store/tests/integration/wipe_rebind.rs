//! A store fenced by an authority outside Redis (a Kubernetes namespace,
//! an etcd prefix: its tokens survive a Redis wipe) loses its high-water
//! marks when Redis restarts without persistence. The processes that bound
//! the store before the loss must stay refused for good — also after
//! another process binds the same authority again — or a stale owner's
//! write would land after a newer token wrote.

use lease_port::{AuthorityId, FencingToken, OwnerId, SessionId};
use redis_session_store::RedisStore;
use serde_json::json;
use session_store::{SessionStore, StoreErrorKind, WriteFence};
use test_services::RedisServer;

async fn process(redis: &RedisServer) -> RedisStore {
    RedisStore::builder(redis.url())
        .prefix("t:")
        .connect()
        .await
        .unwrap()
}

fn fence(token: u64, owner: &str) -> WriteFence {
    WriteFence::new(FencingToken::new(token), OwnerId::new(owner).unwrap())
}

#[tokio::test]
async fn a_stale_owner_stays_fenced_after_redis_loses_its_data() {
    let mut redis = RedisServer::start().unwrap();
    assert!(!redis.is_persistent());
    // The lease authority is not Redis: its tokens keep growing across a
    // Redis restart.
    let authority = AuthorityId::new("k8s:sessions:0b0e4a9c-review").unwrap();
    let s = SessionId::new("chat").unwrap();

    let old = process(&redis).await; // replica A, lease token 5
    let newer = process(&redis).await; // replica B, took over with token 7
    old.bind_authority(&authority).await.unwrap();
    newer.bind_authority(&authority).await.unwrap();
    old.create(&s).await.unwrap();
    old.append(&s, fence(5, "a"), &[json!("a1")]).await.unwrap();
    newer
        .append(&s, fence(7, "b"), &[json!("b1")])
        .await
        .unwrap();
    assert!(old.append(&s, fence(5, "a"), &[json!("a2")]).await.is_err());

    redis.restart().unwrap();

    // Any replica starting now (a rollout, a rescheduled pod) binds the
    // same authority, as a server does at start-up, and the session is
    // created again by whoever serves it next.
    let started_later = process(&redis).await;
    started_later.bind_authority(&authority).await.unwrap();
    started_later.create(&s).await.unwrap();

    // The stale owner, whose token 5 was overtaken by 7 before the wipe.
    // Its connection broke with the restart: it retries, as a server
    // retries an I/O error.
    let mut stale = old.append(&s, fence(5, "a"), &[json!("a3")]).await;
    for _ in 0..5 {
        match &stale {
            Err(e) if matches!(e.kind(), StoreErrorKind::Io | StoreErrorKind::Unavailable) => {
                stale = old.append(&s, fence(5, "a"), &[json!("a3")]).await;
            }
            _ => break,
        }
    }
    eprintln!("stale append: {stale:?}");
    assert!(
        stale.is_err(),
        "a write under token 5 landed after token 7 had written: {stale:?}"
    );
}
