//! A chat backend: `chat DIR [ADDR]`. Run two on one directory and each
//! session is written by one at a time, fenced. Prints its address;
//! `CHAT_TTL_MS` sets the lease TTL (default 30 s).
use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::extract::{Query, State};
use axum::{Json, Router, routing::post};
use flocklease::FlockLease;
use lease_http::{HttpError, Leased, SessionPath, Sessions};
use lease_keeper::LeaseKeeper;
use lease_port::{OwnerId, SessionLease};
use serde_json::{Value, json};
use session_store::{JsonlOptions, JsonlStore, SessionStore};

type App = State<Sessions<JsonlStore>>;
type Answer = Result<Json<Value>, HttpError>;

async fn append(
    State(app): App,
    Query(q): Query<HashMap<String, u64>>,
    Leased(run): Leased,
    text: String,
) -> Answer {
    // The model call, cut short if the lease is lost meanwhile.
    let think = tokio::time::sleep(Duration::from_millis(q.get("think_ms").map_or(0, |&ms| ms)));
    tokio::select! { () = think => {}, () = run.lost() => {} }
    let (store, id) = (app.store, run.session_id().clone());
    let receipt = run
        .spawn_write(move |fence| async move {
            let _ = store.create(&id).await; // made, or existed; else append says why
            store.append(&id, fence, &[json!({ "text": text })]).await
        })?
        .await?;
    // Answered once released; the message is stored whatever the release says.
    run.finish().await.inspect_err(|e| eprintln!("{e}")).ok();
    Ok(Json(json!({ "seq": receipt.first_seq })))
}

async fn transcript(State(app): App, SessionPath(id): SessionPath) -> Answer {
    let page = app.store.read(&id, 1, 1000).await?;
    Ok(Json(page.events.into_iter().map(|e| e.payload).collect()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: chat DIR [ADDR]")?;
    let addr = std::env::args().nth(2).unwrap_or("127.0.0.1:0".into());
    let ttl_ms = std::env::var("CHAT_TTL_MS").map_or(Ok(30_000), |v| v.parse())?;
    let ttl = Duration::from_millis(ttl_ms);
    let store = Arc::new(JsonlStore::open(dir, JsonlOptions::default())?);
    let leases = FlockLease::open(store.lease_dir(), ttl)?;
    store.bind_authority(&leases.authority().await?).await?;
    let owner = OwnerId::new(format!("chat-{}", std::process::id()))?;
    let keeper = LeaseKeeper::new(Arc::new(leases), owner, ttl)?;
    let routes = Router::new().route("/{session}/messages", post(append).get(transcript));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("{}", listener.local_addr()?);
    axum::serve(listener, routes.with_state(Sessions::new(keeper, store))).await?;
    Ok(())
}
