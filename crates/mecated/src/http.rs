//! The HTTP API (see `openapi.json`, served at `/openapi.json`).

use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use lease_port::SessionId;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::{App, StartedRun, event_json};
use crate::error::ApiError;

/// The API description served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Largest page of events one read returns.
pub const MAX_PAGE: usize = 1000;

/// The router of the whole API.
pub fn router(app: App, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{id}/events", get(read_events))
        .route("/v1/sessions/{id}/runs", post(start_run))
        .route("/v1/sessions/{id}/runs/current", delete(cancel_run))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(app)
}

/// JSON bodies whose rejections are API errors with stable codes.
struct Body<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(JsonRejection::BytesRejection(e)) => Err(body_error(e.status(), e.body_text())),
            Err(e) => Err(ApiError::invalid(format!(
                "malformed request body: {}",
                e.body_text()
            ))),
        }
    }
}

fn body_error(status: StatusCode, detail: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            status,
            "invalid",
            format!("request body too large: {detail}"),
        )
    } else {
        ApiError::invalid(format!("cannot read the request body: {detail}"))
    }
}

fn session_id(raw: &str) -> Result<SessionId, ApiError> {
    SessionId::new(raw).map_err(|e| ApiError::invalid(e.to_string()))
}

fn random_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS per process; mixing in a counter
    // makes ids unique within the process as well.
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let a = RandomState::new().hash_one((n, std::process::id()));
    let b = RandomState::new().hash_one(a);
    format!("s-{a:016x}{b:08x}").chars().take(26).collect()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    id: Option<String>,
}

async fn create_session(
    State(app): State<App>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| body_error(e.status(), e.body_text()))?;
    // The body is optional: no body, no id asked for.
    let req: CreateSession = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSession::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(format!("malformed request body: {e}")))?
    };
    let id = session_id(&req.id.unwrap_or_else(random_id))?;
    app.store().create(&id).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id.as_str(), "events": 0})),
    )
        .into_response())
}

async fn list_sessions(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    let ids = app.store().list().await?;
    let sessions: Vec<_> = ids.iter().map(|id| json!({"id": id.as_str()})).collect();
    Ok(Json(json!({ "sessions": sessions })))
}

async fn get_session(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = session_id(&id)?;
    app.store().read(&id, 1, 1).await?;
    let high_water = app.store().high_water(&id).await?;
    Ok(Json(json!({
        "id": id.as_str(),
        "high_water_token": high_water.map(|t| t.get()),
    })))
}

async fn delete_session(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = session_id(&id)?;
    app.delete_session(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

async fn read_events(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let id = session_id(&id)?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1..={MAX_PAGE}")));
    }
    let from = q.after.unwrap_or(0).saturating_add(1);
    let page = app.store().read(&id, from, limit).await?;
    let events: Vec<_> = page.events.iter().map(event_json).collect();
    let next_after = page.next_seq.map(|n| n.saturating_sub(1));
    Ok(Json(json!({
        "events": events,
        "next_after": next_after,
        "torn_tail": page.torn_tail,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    input: Value,
}

async fn start_run(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(req): Body<RunRequest>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let run = app.start_run(id.clone(), req.input).await?;
    if wants_stream {
        return Ok(Sse::new(sse_events(run))
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let StartedRun {
        first_seq,
        events,
        end,
        ..
    } = run;
    // Waiting for the result: the log is the record, so read the run's
    // events back from it rather than buffer them as they happen.
    drop(events);
    let mut result = end
        .await
        .unwrap_or_else(|_| json!({"status": "failed", "error": "the run ended without a result"}));
    let last_seq = result["last_seq"].as_u64().unwrap_or(first_seq);
    let mut collected = Vec::new();
    let mut from = first_seq;
    while from <= last_seq {
        let limit = usize::try_from(last_seq - from + 1).map_or(MAX_PAGE, |n| n.min(MAX_PAGE));
        let page = app.store().read(&id, from, limit).await?;
        let Some(last) = page.events.last().map(|e| e.seq) else {
            break;
        };
        collected.extend(
            page.events
                .iter()
                .filter(|e| e.seq <= last_seq)
                .map(event_json),
        );
        from = last + 1;
    }
    result["events"] = Value::Array(collected);
    Ok(Json(result).into_response())
}

/// The run's events as SSE `event`s, then one `end` once its lease is
/// released.
fn sse_events(run: StartedRun) -> impl futures_util::Stream<Item = Result<Event, Infallible>> {
    use futures_util::StreamExt;
    let events = tokio_stream::wrappers::ReceiverStream::new(run.events)
        .map(|v| Ok(Event::default().event("event").data(v.to_string())));
    let end = futures_util::stream::once(async move {
        let message = run.end.await.unwrap_or_else(
            |_| json!({"status": "failed", "error": "the run ended without a result"}),
        );
        Ok(Event::default().event("end").data(message.to_string()))
    });
    events.chain(end)
}

async fn cancel_run(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = session_id(&id)?;
    if app.cancel_run(&id) {
        Ok(StatusCode::ACCEPTED)
    } else {
        Err(ApiError::not_found(format!(
            "no run of session {id} in this process"
        )))
    }
}

async fn readyz(State(app): State<App>) -> Response {
    if app.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else {
        "ready".into_response()
    }
}

async fn metrics(State(app): State<App>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics().render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
