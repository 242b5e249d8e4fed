//! The HTTP edge: routes, request parsing, and the mapping of engine
//! errors to statuses ([`ApiError`]). Described by the OpenAPI document
//! ([`crate::openapi`]), served at `/openapi.json`.

mod error;
mod follow_slots;
mod guard;
mod keep_alive;
mod local_only;
pub(crate) mod operator_page;

use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, get, on};
use axum::{Extension, Json, Router};
use lease_port::SessionId;
use session_store::ListCursor;

pub use self::error::ApiError;
use self::follow_slots::{FollowSlots, Follower};
use self::guard::Guard;
pub use self::guard::{AUDIT_TARGET, Access, Auth, REFUSAL_AUDIT_LINES_PER_SECOND};
use self::keep_alive::KeepAliveTicks;
pub use self::local_only::AllowedHosts;
use crate::auth::{Grant, Role, Roles};
use crate::engine::{
    Engine, EngineError, FollowItem, MAX_RUN_WAIT, RunEnd as EngineRunEnd, StartedRun,
};
use crate::wire::{
    CancelResult, CreateSession, CreatedSession, DEFAULT_PAGE, DEFAULT_SESSION_PAGE, ErrorBody,
    ErrorCode, Event, EventPage, FollowEnd, LeaseStatus, MAX_PAGE, MAX_SEQ, MAX_SESSION_PAGE,
    PageQuery, RunEnd, RunQuery, RunRequest, RunResult, SessionIdText, SessionInfo, SessionList,
    SessionListQuery, SessionRef,
};

/// The router of the whole API, without authentication: every caller is
/// anonymous, with every role ([`router_with`] with [`Auth::Off`]).
pub fn router(engine: Engine, max_body_bytes: usize) -> Router {
    router_with(engine, max_body_bytes, Auth::Off)
}

/// The router of the whole API, its callers known by `auth`: every route
/// of [`route_table`], each behind the check of its [`Access`], with the
/// default [`HttpOptions`] but for the body limit.
pub fn router_with(engine: Engine, max_body_bytes: usize, auth: Auth) -> Router {
    let options = HttpOptions {
        max_body_bytes,
        ..HttpOptions::default()
    };
    router_configured(engine, auth, options)
}

/// The limits and names of the HTTP edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOptions {
    /// The largest request body taken (larger: 413).
    pub max_body_bytes: usize,
    /// The names besides IP addresses and `localhost` a server without
    /// authentication answers under. Without it, a request addressed to
    /// any other name, or a write whose `Origin` is not this server, is
    /// refused (403 `forbidden`): a web page the operator opens could
    /// otherwise drive the API by rebinding its own name to this address.
    pub allowed_hosts: AllowedHosts,
    /// How many follows one token may hold open at once (more: 429
    /// `too_many_follows`); 0 bounds nothing. Callers of a server without
    /// authentication are not told apart, and not bounded.
    pub max_follows_per_client: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 1 << 20,
            allowed_hosts: AllowedHosts::default(),
            max_follows_per_client: DEFAULT_MAX_FOLLOWS_PER_CLIENT,
        }
    }
}

/// The default of [`HttpOptions::max_follows_per_client`]: far more than
/// any one dashboard or agent needs, few enough that one leaked token
/// cannot hold a replica's connections.
pub const DEFAULT_MAX_FOLLOWS_PER_CLIENT: usize = 1000;

/// The router of the whole API, its callers known by `auth`, with
/// `options`.
pub fn router_configured(engine: Engine, auth: Auth, options: HttpOptions) -> Router {
    let unauthenticated = matches!(auth, Auth::Off);
    let mut router = Router::new();
    let refusals = Arc::default();
    for (route, handler) in routes() {
        let guard = Guard {
            auth: auth.clone(),
            access: route.access,
            audited: route.audited.then_some(route.operation),
            refusals: Arc::clone(&refusals),
            local: unauthenticated.then(|| options.allowed_hosts.clone()),
        };
        let handler =
            handler.route_layer(axum::middleware::from_fn_with_state(guard, guard::guard));
        router = router.route(route.path, handler);
    }
    router
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::middleware::map_response(method_not_allowed))
        .layer(DefaultBodyLimit::max(options.max_body_bytes))
        .layer(Extension(KeepAliveTicks::default()))
        .layer(Extension(FollowSlots::new(options.max_follows_per_client)))
        .with_state(engine)
}

/// The router's own 405 for a route asked with a method it does not take,
/// answered with the error body every error has, keeping its `Allow`.
async fn method_not_allowed(response: Response) -> Response {
    if response.status() != StatusCode::METHOD_NOT_ALLOWED
        || response.headers().contains_key(header::CONTENT_TYPE)
    {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let allowed = allow
        .as_ref()
        .and_then(|a| a.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut answer = ApiError::method_not_allowed(&allowed).into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

/// `/metrics` alone, open, for `--metrics-listen`: counts and latencies,
/// no session id and no token.
pub fn metrics_router(engine: Engine) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such route: this listener serves /metrics") })
        .with_state(engine)
}

/// One route of the API: who may call it, and whether its requests leave
/// an audit line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The HTTP method.
    pub method: Method,
    /// The path template, as the OpenAPI document spells it.
    pub path: &'static str,
    /// The OpenAPI operation id; what the audit line says was done.
    pub operation: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Whether each request leaves one line on the `audit` target: the
    /// routes that destroy something or end someone else's run.
    pub audited: bool,
}

/// Every route the router serves, with its role. The router is built from
/// this table and nothing else, so no route can be served without a
/// decision on who may call it.
pub fn route_table() -> Vec<Route> {
    routes().into_iter().map(|(route, _)| route).collect()
}

fn routes() -> Vec<(Route, MethodRouter<Engine>)> {
    use Access::Open;
    use Role::{Admin, Read, Run};
    let needs = |roles: &[Role]| Access::Needs(Roles::of(roles));
    vec![
        route(
            Method::POST,
            "/v1/sessions",
            "createSession",
            needs(&[Run]),
            create_session,
        ),
        route(
            Method::GET,
            "/v1/sessions",
            "listSessions",
            needs(&[Read]),
            list_sessions,
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}",
            "getSession",
            needs(&[Read]),
            get_session,
        ),
        audited(route(
            Method::DELETE,
            "/v1/sessions/{id}",
            "deleteSession",
            needs(&[Admin]),
            delete_session,
        )),
        route(
            Method::GET,
            "/v1/sessions/{id}/events",
            "readEvents",
            needs(&[Read]),
            read_events,
        ),
        route(
            Method::GET,
            "/v1/sessions/{id}/lease",
            "getLease",
            needs(&[Read]),
            get_lease,
        ),
        route(
            Method::POST,
            "/v1/sessions/{id}/runs",
            "startRun",
            // Its answer is what the agent made of the session's
            // transcript: a token that may not read the session may not
            // learn it through the agent either.
            needs(&[Read, Run]),
            start_run,
        ),
        audited(route(
            Method::DELETE,
            "/v1/sessions/{id}/runs/current",
            "cancelRun",
            needs(&[Run]),
            cancel_run,
        )),
        // The page holds no data: it asks for a token, and every request
        // it makes needs `read`.
        route(Method::GET, "/", "operatorPage", Open, operator_page::page),
        route(Method::GET, "/healthz", "healthz", Open, healthz),
        route(Method::GET, "/readyz", "readyz", Open, readyz),
        route(Method::GET, "/metrics", "metrics", needs(&[Read]), metrics),
        route(Method::GET, "/openapi.json", "openapi", Open, openapi),
    ]
}

fn route<H, T>(
    method: Method,
    path: &'static str,
    operation: &'static str,
    access: Access,
    handler: H,
) -> (Route, MethodRouter<Engine>)
where
    H: Handler<T, Engine>,
    T: 'static,
{
    // Only the standard methods are in the table; its test builds it.
    let filter = MethodFilter::try_from(method.clone()).expect("a standard method");
    let route = Route {
        method,
        path,
        operation,
        access,
        audited: false,
    };
    (route, on(filter, handler))
}

fn audited((route, handler): (Route, MethodRouter<Engine>)) -> (Route, MethodRouter<Engine>) {
    (
        Route {
            audited: true,
            ..route
        },
        handler,
    )
}

/// JSON bodies whose rejections are API errors with stable codes.
pub(crate) struct Body<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(JsonRejection::BytesRejection(e)) => Err(body_error(&e)),
            // A missing or wrong content type is bad input like the rest.
            Err(e) => Err(ApiError::invalid(format!(
                "malformed request body: {}",
                e.body_text()
            ))),
        }
    }
}

fn body_error(e: &BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(e.body_text())
    } else {
        ApiError::invalid(format!("cannot read the request body: {}", e.body_text()))
    }
}

/// The `{id}` of a session route, validated. Every rejection, an id that
/// does not percent-decode to UTF-8 included, is the JSON `invalid` error.
pub(crate) struct Id(SessionId);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e: PathRejection| ApiError::invalid(e.body_text()))?;
        session_id(&raw).map(Id)
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

#[utoipa::path(
    post,
    path = "/v1/sessions",
    operation_id = "createSession",
    tag = "sessions",
    summary = "Create a session",
    description = "The body is optional: none (or only whitespace) creates a session with a random id. \
                   The body is read as JSON whatever its content type.",
    request_body(content = CreateSession, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = CreatedSession),
        (status = 400, description = "`invalid`: malformed body, an unknown field, or an id breaking the id rules", body = ErrorBody),
        (status = 409, description = "`session_exists`: a session with this id exists", body = ErrorBody),
        (status = 413, description = "`invalid`: the body is larger than the server's limit", body = ErrorBody),
        (status = 500, description = "`internal`: a storage fault", body = ErrorBody),
        (status = 503, description = "`store_busy` (another process holds the session's file) or `store_unavailable` (the store \
                                      could not be reached or refused before acting: nothing was done); retry (`Retry-After`)", body = ErrorBody),
    )
)]
pub(crate) async fn create_session(
    State(engine): State<Engine>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| body_error(&e))?;
    let req: CreateSession = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSession::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(format!("malformed request body: {e}")))?
    };
    let id = match req.id {
        Some(SessionIdText(id)) => session_id(&id)?,
        None => session_id(&random_id())?,
    };
    engine.create_session(&id).await?;
    let created = CreatedSession {
        events: 0,
        id: id.as_str().to_owned(),
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/sessions",
    operation_id = "listSessions",
    tag = "sessions",
    summary = "List sessions, paged",
    description = "Sessions in id order, a page at a time: pass the page's `continue` to get the next. \
                   A session that exists for the whole walk is listed exactly once, whatever is created or \
                   deleted meanwhile; one created or deleted during it may or may not be.",
    params(SessionListQuery),
    responses(
        (status = 200, description = "A page of sessions", body = SessionList),
        (status = 400, description = "`invalid` (a bad or unknown query parameter, or `limit` outside 1..=1000) or \
                                      `invalid_continue` (a `continue` this server did not issue, an empty one included)", body = ErrorBody),
        (status = 500, description = "`internal`: a storage fault", body = ErrorBody),
        (status = 503, description = "`store_busy` (the store is locked by another process) or `store_unavailable` (the store \
                                      could not be reached or refused before acting: nothing was done); retry (`Retry-After`)", body = ErrorBody),
    )
)]
pub(crate) async fn list_sessions(
    State(engine): State<Engine>,
    query: Result<Query<SessionListQuery>, QueryRejection>,
) -> Result<Json<SessionList>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(DEFAULT_SESSION_PAGE);
    if !(1..=MAX_SESSION_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be 1..={MAX_SESSION_PAGE}"
        )));
    }
    let after = q.continue_token.as_deref().map(list_cursor).transpose()?;
    let page = engine.list_sessions_page(after.as_ref(), limit).await?;
    let sessions = page
        .sessions
        .iter()
        .map(|id| SessionRef {
            id: id.as_str().to_owned(),
        })
        .collect();
    Ok(Json(SessionList {
        continue_token: page.next.as_ref().map(ListCursor::encode),
        sessions,
    }))
}

/// A listing's `continue`, or why it is not one this server issued.
fn list_cursor(token: &str) -> Result<ListCursor, ApiError> {
    let refused = |why: String| {
        ApiError::new(
            ErrorCode::InvalidContinue,
            format!(
                "{why}: pass the `continue` of the previous page as it came, or leave continue \
                 out to list from the first session"
            ),
        )
    };
    if token.is_empty() {
        return Err(refused(
            "continue is empty, and no page ever has an empty one (the last page's is null)".into(),
        ));
    }
    ListCursor::decode(token).map_err(|e| {
        let detail = match &e {
            session_store::StoreError::Invalid { message } => message.clone(),
            other => other.to_string(),
        };
        refused(format!(
            "continue is not a token this server issued ({detail})"
        ))
    })
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    operation_id = "getSession",
    tag = "sessions",
    summary = "Describe a session",
    params(("id" = SessionIdText, Path, description = "The session's id, percent-encoded")),
    responses(
        (status = 200, description = "The session", body = SessionInfo),
        (status = 400, description = "`invalid`: an id breaking the id rules", body = ErrorBody),
        (status = 404, description = "`not_found`: no such session", body = ErrorBody),
        (status = 500, description = "`internal`: a storage fault", body = ErrorBody),
        (status = 503, description = "`store_busy` (another process holds the session's file) or `store_unavailable` (the store \
                                      could not be reached or refused before acting: nothing was done); retry (`Retry-After`)", body = ErrorBody),
    )
)]
pub(crate) async fn get_session(
    State(engine): State<Engine>,
    Id(id): Id,
) -> Result<Json<SessionInfo>, ApiError> {
    let info = engine.describe(&id).await?;
    Ok(Json(SessionInfo::from(&info)))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    operation_id = "deleteSession",
    tag = "sessions",
    summary = "Delete a session (destructive maintenance)",
    description = "Takes the session's lease first, so a session running elsewhere cannot be deleted \
                   under it. On an unleased deployment this is refused (409 `unleased_not_exclusive`) \
                   unless the process proved it is the only one serving the store.",
    params(("id" = SessionIdText, Path, description = "The session's id, percent-encoded")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "`invalid`: an id breaking the id rules", body = ErrorBody),
        (status = 404, description = "`not_found`: no such session", body = ErrorBody),
        (status = 409, description = "`session_leased_elsewhere` (another process owns the session; `holder` when known), \
                                      `session_busy` (a run of it is in progress in this process), \
                                      `unleased_not_exclusive` (unleased, and another process holds the store's lock) or \
                                      `unfenced_write_refused` (unleased, and the session has fenced writes)", body = ErrorBody),
        (status = 500, description = "`internal`: a storage or lease backend fault", body = ErrorBody),
        (status = 503, description = "`lease_unavailable` (the lease backend failed; retry), `store_busy` (another process \
                                      holds the session's file; retry), `store_unavailable` (the store could not be reached or \
                                      refused before acting: nothing was done; retry) or `shutting_down`", body = ErrorBody),
    )
)]
pub(crate) async fn delete_session(
    State(engine): State<Engine>,
    Id(id): Id,
) -> Result<StatusCode, ApiError> {
    engine.delete_session(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    operation_id = "readEvents",
    tag = "sessions",
    summary = "Read a session's events, paged, or follow them live",
    description = "A page of events after `after`. With `Accept: text/event-stream` the call follows the \
                   session instead, from any replica: the stored events after the position (`Last-Event-ID`, \
                   else `after`, else the start), then each new one as any process appends it, as \
                   `event: event` whose `id:` is the event's `seq` and whose data is an `Event`, ending with \
                   one `event: end` (data: `FollowEnd`, no id) when the run that was live ends (its \
                   `run_ended` event), at once when no run is live. A client whose stream broke resumes on \
                   any replica with `Last-Event-ID`, and misses nothing and repeats nothing; it follows the \
                   run it was following, so if another run took the session since, it gets the rest of its \
                   own run and `run_gone` at the other's start. Idle streams carry keep-alive comments.",
    params(
        ("id" = SessionIdText, Path, description = "The session's id, percent-encoded"),
        ("Last-Event-ID" = Option<u64>, Header, maximum = 9_223_372_036_854_775_807_usize,
            description = "Follow: resume after this `seq` (wins over `after`); a sequence number, at most 2^63 - 1"),
        PageQuery
    ),
    responses(
        (status = 200, description = "A page of events, or the followed events",
            content((EventPage = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "`invalid`: an id breaking the id rules, a bad or unknown query parameter, `limit` outside 1..=1000, an `after` or `Last-Event-ID` that is not a sequence number (0 to 2^63 - 1), or a follow from past the log's end", body = ErrorBody),
        (status = 404, description = "`not_found`: no such session", body = ErrorBody),
        (status = 429, description = "`too_many_follows`: a follow, and the token already holds as many follows open as the \
                                      server allows one client (`--max-follows-per-client`); nothing was done", body = ErrorBody),
        (status = 500, description = "`internal`: a storage fault", body = ErrorBody),
        (status = 503, description = "`store_busy` (another process holds the session's file) or `store_unavailable` (the store \
                                      could not be reached or refused before acting: nothing was done); retry (`Retry-After`)", body = ErrorBody),
    )
)]
pub(crate) async fn read_events(
    State(engine): State<Engine>,
    Extension(keep_alive): Extension<KeepAliveTicks>,
    follower: Follower,
    Id(id): Id,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1..={MAX_PAGE}")));
    }
    if let Some(after) = q.after.filter(|&a| a > MAX_SEQ) {
        return Err(ApiError::invalid(format!(
            "after={after} is beyond the largest sequence number, {MAX_SEQ}: pass the \
             `next_after` of the previous page, or leave after out to read from the first event"
        )));
    }
    if wants_stream(&headers) {
        let last_seen = match headers.get("last-event-id") {
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .filter(|&seq| seq <= MAX_SEQ)
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "Last-Event-ID must be the `seq` of an event, a whole number from 0 to \
                             {MAX_SEQ}, as the stream's `id:` lines give it"
                        ))
                    })?,
            ),
            None => None,
        };
        let from = last_seen.or(q.after).unwrap_or(0);
        // Past the log's end, a follow would wait for events that were
        // never stored, and miss every one before them.
        if from > 0 && engine.read_events(&id, from, 1).await?.events.is_empty() {
            return Err(ApiError::invalid(format!(
                "event {from} is past the end of session {id}'s log"
            )));
        }
        let admitted = follower.admit()?;
        let follow = match last_seen {
            Some(last_seen) => engine.resume(id, last_seen).await?,
            None => engine.follow(id, from).await?,
        };
        // Outside the keep-alive: a quiet follow is asked at each comment
        // too whether its token still reads.
        let events = admitted.holding(keep_alive.around(follow_events(follow)));
        return Ok(Sse::new(events).into_response());
    }
    let from = q.after.unwrap_or(0).saturating_add(1);
    let page = engine.read_events(&id, from, limit).await?;
    Ok(Json(EventPage {
        events: page.events.iter().map(Event::from).collect(),
        next_after: page.next_seq.map(|n| n.saturating_sub(1)),
        torn_tail: page.unfinished_write,
    })
    .into_response())
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// A follow as SSE: each event with its `seq` as `id:`, then `end`.
fn follow_events(
    follow: crate::engine::Follow,
) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> + Unpin {
    use futures_util::StreamExt;
    follow.map(|item| {
        Ok(match item {
            FollowItem::Event(e) => json_event("event", &Event::from(&*e)).id(e.seq.to_string()),
            FollowItem::End(end) => json_event("end", &FollowEnd::from(&end)),
        })
    })
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/lease",
    operation_id = "getLease",
    tag = "sessions",
    summary = "Who holds the session's lease now",
    description = "As the lease backend reports it at the time of the call (`unknown` for backends that do \
                   not report holders, and when the server runs unleased). It does not say whether the session exists.",
    params(("id" = SessionIdText, Path, description = "The session's id, percent-encoded")),
    responses(
        (status = 200, description = "The lease", body = LeaseStatus),
        (status = 400, description = "`invalid`: an id breaking the id rules", body = ErrorBody),
    )
)]
pub(crate) async fn get_lease(State(engine): State<Engine>, Id(id): Id) -> Json<LeaseStatus> {
    Json(LeaseStatus::from(&engine.lease_holder(&id).await))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/runs",
    operation_id = "startRun",
    tag = "runs",
    summary = "Start a run",
    description = "Leases the session, drives the agent with the input, and releases the lease when the run \
                   ends. With `Accept: text/event-stream` the run's events stream back as Server-Sent Events: \
                   `event: event` whose data is an `Event` (the same object a paged read returns) and whose \
                   SSE id is its `seq` (a client whose connection broke follows the session's events from there \
                   with `Last-Event-ID`), then one `event: end` whose data is a `RunEnd`, sent once the run's \
                   lease is released. Otherwise the \
                   call waits and returns a `RunResult`, the run's events read back from the log. The run \
                   belongs to the server, not the connection: a client disconnect does not stop it (use the \
                   cancel endpoint). The body must be sent as `application/json`.",
    params(("id" = SessionIdText, Path, description = "The session's id, percent-encoded"), RunQuery),
    request_body(content = RunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The finished run, or its event stream",
            content((RunResult = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "`invalid`: malformed body, an unknown field, a missing `input`, a content type \
                                      other than JSON, a `wait` that is not a duration, an unknown query parameter, or an \
                                      id breaking the id rules", body = ErrorBody),
        (status = 404, description = "`not_found`: no such session", body = ErrorBody),
        (status = 409, description = "`session_leased_elsewhere` (another process owns the session, and still did at the \
                                      end of `wait`; `holder` when known; `Retry-After`: seconds until the holder's \
                                      lease expires when the backend reports it, else the lease TTL), \
                                      `session_busy` (a run of it is in progress in this process), \
                                      `unleased_not_exclusive` (unleased, and another process holds the store's lock) or \
                                      `unfenced_write_refused` (unleased, and the session has fenced writes)", body = ErrorBody),
        (status = 413, description = "`invalid`: the body is larger than the server's limit", body = ErrorBody),
        (status = 500, description = "`internal`: a storage or lease backend fault", body = ErrorBody),
        (status = 503, description = "`lease_unavailable` (the lease backend failed; retry), `store_busy` (another process \
                                      holds the session's file; retry), `store_unavailable` (the store could not be reached or \
                                      refused before acting: nothing was done; retry), `draining` (this server is draining \
                                      before it shuts down: its runs in progress finish, it starts no new one, and a \
                                      run waiting for its session is answered at once; nothing was done; send it again \
                                      after `Retry-After`, to another replica) or `shutting_down`", body = ErrorBody),
    )
)]
pub(crate) async fn start_run(
    State(engine): State<Engine>,
    grant: Option<Extension<Grant>>,
    Id(id): Id,
    headers: HeaderMap,
    query: Result<Query<RunQuery>, QueryRejection>,
    Body(req): Body<RunRequest>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let wait = match q.wait.as_deref() {
        Some(text) => parse_wait(text).map_err(ApiError::invalid)?,
        None => std::time::Duration::ZERO,
    };
    let wants_stream = wants_stream(&headers);
    let started = if wait.is_zero() {
        engine.start_run(id.clone(), req.input).await.map(Some)
    } else {
        // The token was checked when the request came; while the run
        // waits for its session the token may be removed, and then the run
        // must not start.
        let mut grant = grant.map(|Extension(g)| g);
        let may_start = || {
            grant.as_mut().is_none_or(|g| {
                Roles::of(&[Role::Read, Role::Run])
                    .missing_from(g.roles_now())
                    .is_none()
            })
        };
        engine
            .start_run_waiting_while(id.clone(), req.input, wait, may_start)
            .await
    };
    let run = match started {
        Ok(Some(run)) => run,
        Ok(None) => {
            return Err(ApiError::unauthenticated(
                "the token lost its read or run role, or was removed from the token file, \
                 while the run waited for its session: nothing was done",
            ));
        }
        Err(e) => return Err(refusal(&engine, &id, e).await),
    };
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
    let end = end.await.unwrap_or_else(|_| EngineRunEnd::vanished());
    let last_seq = end.last_seq.unwrap_or(first_seq);
    let mut collected = Vec::new();
    let mut from = first_seq;
    while from <= last_seq {
        let limit = usize::try_from(last_seq - from + 1).map_or(MAX_PAGE, |n| n.min(MAX_PAGE));
        // The run is over and its lease released: whatever the reading
        // met, retrying the request would run the input again.
        let page = engine
            .read_events(&id, from, limit)
            .await
            .map_err(|e| read_back_failed(&id, &end, e))?;
        let Some(last) = page.events.last().map(|e| e.seq) else {
            break;
        };
        collected.extend(
            page.events
                .iter()
                .filter(|e| e.seq <= last_seq)
                .map(Event::from),
        );
        from = last + 1;
    }
    Ok(Json(RunResult::new(RunEnd::from(&end), collected)).into_response())
}

/// A run's `wait`, as [`RunQuery::wait`] documents it (the pattern
/// [`WAIT_PATTERN`](crate::wire::WAIT_PATTERN)): digits, an optional
/// fraction, an optional unit; cut to [`MAX_RUN_WAIT`], however long.
fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    let refused = |why: String| {
        format!(
            "{why}: give a number, then ms, s, m or h (such as 250ms, 5s or 1.5m; a bare number \
             is seconds), or leave wait out to be answered at once"
        )
    };
    if text.is_empty() {
        return Err(refused("wait is empty".into()));
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let well_formed = match number.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(number),
    };
    // Well-formed digits always parse, to infinity when there are enough.
    let value = match number.parse::<f64>() {
        Ok(value) if well_formed => value,
        _ => return Err(refused(format!("wait={text} is not a duration"))),
    };
    let seconds_per_unit = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(refused(format!(
                "wait={text} ends in {unit}, which is not a unit"
            )));
        }
    };
    let seconds = value * seconds_per_unit;
    Ok(if seconds >= MAX_RUN_WAIT.as_secs_f64() {
        MAX_RUN_WAIT
    } else {
        std::time::Duration::from_secs_f64(seconds)
    })
}

/// The run ended, but its events could not be read back: never
/// retryable, since the request's run is done. Says how it ended and where
/// to read its events.
fn read_back_failed(id: &SessionId, end: &EngineRunEnd, e: EngineError) -> ApiError {
    let cause = ApiError::from(e).message;
    ApiError::new(
        ErrorCode::Internal,
        format!(
            "the run ended ({}) but its events could not be read back: {cause}; \
             read them with GET /v1/sessions/{id}/events — do not run the input again",
            end.status.name()
        ),
    )
}

/// The API error of a refused start; a session leased elsewhere carries
/// when to retry.
async fn refusal(engine: &Engine, id: &SessionId, e: EngineError) -> ApiError {
    let mut error = ApiError::from(e);
    if error.code == ErrorCode::SessionLeasedElsewhere {
        error.retry_after = Some(engine.retry_after(id).await);
    }
    error
}

/// The run's events as SSE `event`s, then one `end` once its lease is
/// released. Each event's SSE id is its sequence number, as on the
/// session's event stream: a client whose connection broke mid-run follows
/// the session from there with `Last-Event-ID`.
fn sse_events(run: StartedRun) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
    use futures_util::StreamExt;
    let events = tokio_stream::wrappers::ReceiverStream::new(run.events)
        .map(|e| Ok(json_event("event", &Event::from(&e)).id(e.seq.to_string())));
    let end = futures_util::stream::once(async move {
        let end = run.end.await.unwrap_or_else(|_| EngineRunEnd::vanished());
        Ok(json_event("end", &RunEnd::from(&end)))
    });
    events.chain(end)
}

fn json_event(name: &str, data: &impl serde::Serialize) -> SseEvent {
    let event = SseEvent::default().event(name);
    // Serialising these plain structs cannot fail; were it to, the client
    // still sees the event's name rather than a dropped stream.
    event
        .json_data(data)
        .unwrap_or_else(|_| SseEvent::default().event(name))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/runs/current",
    operation_id = "cancelRun",
    tag = "runs",
    summary = "Cancel the session's live run, on whichever replica it runs",
    description = "A run in the answering process is cancelled at once. A run on another replica is asked to \
                   stop through the store, naming its lease token; it ends `cancelled` within about a second, \
                   and a later run of the session (a greater token) is never stopped by the request. Idempotent.",
    params(("id" = SessionIdText, Path, description = "The session's id, percent-encoded")),
    responses(
        (status = 202, description = "A run was live (or may be: `live` null) and is asked to stop", body = CancelResult),
        (status = 200, description = "No run was live: nothing to cancel", body = CancelResult),
        (status = 400, description = "`invalid`: an id breaking the id rules", body = ErrorBody),
        (status = 404, description = "`not_found`: no such session", body = ErrorBody),
        (status = 500, description = "`internal`: a storage fault", body = ErrorBody),
        (status = 503, description = "`store_busy` (another process holds the session's file) or `store_unavailable` (the store \
                                      could not be reached or refused before acting: nothing was done); retry (`Retry-After`)", body = ErrorBody),
    )
)]
pub(crate) async fn cancel_run(
    State(engine): State<Engine>,
    Id(id): Id,
) -> Result<Response, ApiError> {
    let outcome = engine.cancel_anywhere(&id).await?;
    let status = if outcome.live == Some(false) {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(CancelResult::from(&outcome))).into_response())
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    summary = "Liveness",
    responses((status = 200, description = "Alive: the text `ok`", body = String, content_type = "text/plain"))
)]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    summary = "Readiness",
    responses(
        (status = 200, description = "Ready: the text `ready`", body = String, content_type = "text/plain"),
        (status = 503, description = "Not ready: the text `shutting down`; `draining` (from the first SIGTERM or SIGINT until the runs in progress have ended or `--drain-timeout` has passed; reads, follows and cancels still work, new runs are refused); `lease backend failing: ` and why, while the lease backend's calls fail (until one succeeds); or `session store state went back: ` and why, while the store refuses as `state_rewound` (until it answers again)", body = String, content_type = "text/plain"),
    )
)]
pub(crate) async fn readyz(State(engine): State<Engine>) -> Response {
    if engine.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else if engine.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else if let Some(fault) = engine.lease_backend_fault() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("lease backend failing: {fault}"),
        )
            .into_response()
    } else if let Some(fault) = engine.store_fault() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("session store state went back: {fault}"),
        )
            .into_response()
    } else {
        "ready".into_response()
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    summary = "Prometheus metrics",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"))
)]
pub(crate) async fn metrics(State(engine): State<Engine>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        engine.metrics().render(),
    )
        .into_response()
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    summary = "This document",
    responses((status = 200, description = "OpenAPI 3.1, generated from the types that serialise every response",
        body = Object, content_type = "application/json"))
)]
pub(crate) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::json(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::wire::WAIT_PATTERN;

    /// The parser takes exactly what the document's pattern permits, and
    /// refuses the rest with a message naming `wait`.
    #[test]
    fn wait_parses_what_its_pattern_permits_and_nothing_else() {
        let pattern = jsonschema::draft202012::new(&json!({"pattern": WAIT_PATTERN})).unwrap();
        let texts = [
            "", "0", "5", "5s", "250ms", "1.5m", "2h", "0.25", "007s", "5x", "s", "ms", ".5", "1.",
            "1..5", "1.2.3s", "-1s", "+1s", " 5s", "5s ", "5 s", "5S", "5sec", "1e3", "٣s", "5ms5",
        ];
        for text in texts {
            let permitted = pattern.is_valid(&json!(text));
            match parse_wait(text) {
                Ok(_) => assert!(permitted, "{text:?} parsed, but the pattern refuses it"),
                Err(message) => {
                    assert!(!permitted, "{text:?} refused, but the pattern permits it");
                    assert!(message.starts_with("wait"), "{message}");
                }
            }
        }
    }

    #[test]
    fn wait_is_cut_to_the_longest_however_long() {
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_wait("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_wait("0.5m"), Ok(Duration::from_secs(30)));
        for long in ["61s", "2h", "99999999999999999999999h", &"9".repeat(400)] {
            assert_eq!(parse_wait(long), Ok(MAX_RUN_WAIT), "{long}");
        }
    }

    /// The role of each route, as the documentation promises it. A route
    /// added to the table fails here until its decision is written down.
    #[test]
    fn every_route_has_the_role_its_documentation_promises() {
        use Access::Open;
        use Role::{Admin, Read, Run};
        let needs = |roles: &[Role]| Access::Needs(Roles::of(roles));
        let table: Vec<(String, &str, Access, bool)> = route_table()
            .into_iter()
            .map(|r| (r.method.to_string(), r.path, r.access, r.audited))
            .collect();
        let expected = [
            ("POST", "/v1/sessions", needs(&[Run]), false),
            ("GET", "/v1/sessions", needs(&[Read]), false),
            ("GET", "/v1/sessions/{id}", needs(&[Read]), false),
            ("DELETE", "/v1/sessions/{id}", needs(&[Admin]), true),
            ("GET", "/v1/sessions/{id}/events", needs(&[Read]), false),
            ("GET", "/v1/sessions/{id}/lease", needs(&[Read]), false),
            ("POST", "/v1/sessions/{id}/runs", needs(&[Read, Run]), false),
            (
                "DELETE",
                "/v1/sessions/{id}/runs/current",
                needs(&[Run]),
                true,
            ),
            ("GET", "/", Open, false),
            ("GET", "/healthz", Open, false),
            ("GET", "/readyz", Open, false),
            ("GET", "/metrics", needs(&[Read]), false),
            ("GET", "/openapi.json", Open, false),
        ]
        .map(|(m, p, a, audited)| (m.to_owned(), p, a, audited));
        assert_eq!(table, expected);
    }

    #[test]
    fn an_empty_or_foreign_continue_is_invalid_continue() {
        for token in ["", "bogus"] {
            let e = list_cursor(token).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidContinue);
            assert!(e.message.starts_with("continue is "), "{}", e.message);
        }
        let issued = ListCursor::after(SessionId::new("a").unwrap()).encode();
        assert!(list_cursor(&issued).is_ok());
    }
}
