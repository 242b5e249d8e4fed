//! A session store that went back, or is deployed so that it could: the
//! server refuses with `state_rewound` (never retryable) and `/readyz`
//! fails while it lasts, against a real Redis.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use lease_keeper::LeaseKeeper;
use lease_port::{OwnerId, SessionLease};
use mecated::agent::EchoAgent;
use mecated::engine::{Engine, Exclusivity};
use mecated::metrics::Metrics;
use redis_session_store::RedisStore;
use serde_json::{Value, json};
use session_store::SessionStore;
use tower::ServiceExt;

async fn call(engine: &Engine, request: Request<Body>) -> (StatusCode, String) {
    let response = mecated::http::router(engine.clone(), 1 << 20)
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn run(id: &str) -> Request<Body> {
    Request::post(format!("/v1/sessions/{id}/runs"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"input": "hi"}).to_string()))
        .unwrap()
}

fn readyz() -> Request<Body> {
    Request::get("/readyz").body(Body::empty()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_refused_as_state_rewound_and_fails_readiness() {
    let redis = test_services::RedisServer::start().expect("redis-server is installed");
    let store = RedisStore::builder(redis.url())
        .leases(Duration::from_secs(15))
        .policy_check_interval(Duration::ZERO)
        .connect()
        .await
        .unwrap();
    let backend: Arc<dyn SessionLease> = store.session_lease().unwrap();
    let keeper = LeaseKeeper::builder(
        backend,
        OwnerId::new("pod-1").unwrap(),
        Duration::from_secs(15),
    )
    .build()
    .unwrap();
    let engine = Engine::new(
        Arc::new(store),
        keeper,
        Arc::new(EchoAgent::default()),
        Arc::new(Metrics::default()),
        Exclusivity::Leased,
    );
    let create = Request::post("/v1/sessions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"id": "s"}).to_string()))
        .unwrap();
    assert_eq!(call(&engine, create).await.0, StatusCode::CREATED);
    assert_eq!(call(&engine, run("s")).await.0, StatusCode::OK);
    assert_eq!(
        call(&engine, readyz()).await,
        (StatusCode::OK, "ready".into())
    );

    let set = |p: &str| {
        redis
            .command(&["CONFIG", "SET", "maxmemory-policy", p])
            .unwrap()
    };
    assert_eq!(set("allkeys-lru"), "+OK");
    let (status, body) = call(&engine, run("s")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "state_rewound", "{body}");
    assert_eq!(error["error"]["retryable"], false, "{body}");
    assert!(body.contains("noeviction"), "{body}");
    let (status, body) = call(&engine, readyz()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("allkeys-lru"), "{body}");

    assert_eq!(set("noeviction"), "+OK");
    assert_eq!(call(&engine, run("s")).await.0, StatusCode::OK);
    assert_eq!(
        call(&engine, readyz()).await,
        (StatusCode::OK, "ready".into())
    );
}
