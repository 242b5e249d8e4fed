//! Short sequences of arbitrary HTTP requests on the server's own router,
//! called in-process over a JSONL store and file leases: any method, any
//! route with any session id (or any path at all), any query, any body,
//! and the headers the API reads. Two routers share one engine: one knows
//! its callers by a token file, the other authenticates nobody.
//!
//! Whatever the request: no panic and no 5xx (the store is local and
//! healthy, and the server is neither draining nor shutting down); every
//! error body is the API's `{"error": {"code": …}}`. On the token router,
//! a request without a token, with one the server does not know, or with
//! one lacking a role its route needs is refused (401 or 403) and changes
//! nothing: no session created or deleted, no event appended, no fence
//! raised, no cancel recorded. Nor does a request for no route, or for an
//! open one.

#![no_main]

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use futures_util::StreamExt;
use lease_port::{OwnerId, SessionId};
use libfuzzer_sys::fuzz_target;
use mecated::auth::{Role, Roles, TokenFile};
use mecated::engine::{Engine, Exclusivity};
use mecated::http::{Access, Auth, Route};
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};
use tower::ServiceExt;

/// The token file's tokens: name, roles, and what a client sends. The
/// secrets are never part of an input, and the server compares only their
/// hashes, so no mutation of an input can present one by chance.
const TOKENS: [(&str, Roles, &str); 4] = [
    (
        "reader",
        Roles::of(&[Role::Read]),
        "reader-2c1f8e94b07a5d63e1f0",
    ),
    (
        "runner",
        Roles::of(&[Role::Run]),
        "runner-9d4b7a02e6c31f58a7b4",
    ),
    (
        "janitor",
        Roles::of(&[Role::Admin]),
        "janitor-57e0c3a9f1b24d86c0d9",
    ),
    (
        "operator",
        Roles::of(&[Role::Read, Role::Run, Role::Admin]),
        "operator-b3a86f1d0e7c4592f6e2",
    ),
];

/// Small enough that a body of one input reaches 413.
const MAX_BODY_BYTES: usize = 1024;

/// At most this many requests per input: longer sequences add little that
/// a short one reaching the same state does not, and cost every execution.
const MAX_REQUESTS: usize = 8;

/// How long a request may take. An echo run on a local store ends in
/// milliseconds; a refusal is immediate.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// How long a run may take to end once its request was answered or
/// dropped, before the next state is read.
const RUNS_END_WITHIN: Duration = Duration::from_secs(5);

/// Of an event stream, only what comes at once is read: the stream itself
/// is the engine's follow, whose ends other tests cover, and some of them
/// come only at its next quiet check, seconds later.
const STREAM_WITHIN: Duration = Duration::from_millis(25);
const STREAM_FRAMES: usize = 8;
const STREAM_BYTES: usize = 4096;

const METHODS: [Method; 6] = [
    Method::GET,
    Method::POST,
    Method::DELETE,
    Method::PUT,
    Method::HEAD,
    Method::OPTIONS,
];

const HOSTS: [&str; 4] = [
    "127.0.0.1:8080",
    "localhost",
    "attacker.example",
    "[::1]:8080",
];

const ORIGINS: [&str; 3] = ["http://127.0.0.1:8080", "null", "http://attacker.example"];

const SESSION_NAMES: [&str; 3] = ["a", "b", "c"];

struct World {
    runtime: tokio::runtime::Runtime,
    engine: Engine,
    store: Arc<JsonlStore>,
    /// Knows its callers by [`TOKENS`].
    guarded: Router,
    /// Authenticates nobody.
    open: Router,
    routes: Vec<Route>,
    _dir: tempfile::TempDir,
}

fn token_file(dir: &Path) -> TokenFile {
    let path = dir.join("tokens");
    let text: String = TOKENS
        .iter()
        .map(|(name, roles, secret)| {
            let roles: Vec<&str> = roles.iter().map(Role::name).collect();
            format!(
                "{name} {} {}\n",
                roles.join(","),
                mecated::auth::hash_token(secret)
            )
        })
        .collect();
    std::fs::write(&path, text).expect("write the token file");
    TokenFile::open(path).expect("a valid token file")
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ttl = Duration::from_secs(15);
        // Nothing here outlives the process, so nothing needs to reach the
        // disk.
        let store = Arc::new(
            JsonlStore::open(
                dir.path().join("store"),
                JsonlOptions::default().fsync(FsyncPolicy::Never),
            )
            .expect("open the store"),
        );
        let auth = Auth::Tokens(Arc::new(token_file(dir.path())));
        let engine = runtime.block_on(async {
            let leases =
                flocklease::FlockLease::open(dir.path().join("leases"), ttl).expect("open leases");
            let metrics = Arc::new(mecated::metrics::Metrics::default());
            let keeper = lease_keeper::LeaseKeeper::builder(
                Arc::new(leases),
                OwnerId::new("fuzz").expect("an owner id"),
                ttl,
            )
            .metrics(metrics.clone())
            .build()
            .expect("a lease keeper");
            Engine::new(
                store.clone(),
                keeper,
                Arc::new(mecated::agent::EchoAgent::default()),
                metrics,
                Exclusivity::Leased,
            )
        });
        World {
            guarded: mecated::http::router_with(engine.clone(), MAX_BODY_BYTES, auth),
            open: mecated::http::router_with(engine.clone(), MAX_BODY_BYTES, Auth::Off),
            routes: mecated::http::route_table(),
            runtime,
            engine,
            store,
            _dir: dir,
        }
    })
}

/// The input, read front to back; past its end every read is empty, so
/// any input decodes.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    /// A length byte, then that many bytes; 255 takes the rest, so a body
    /// can pass the server's limit.
    fn chunk(&mut self) -> &'a [u8] {
        let n = match self.byte() {
            255 => self.0.len(),
            n => usize::from(n).min(self.0.len()),
        };
        let (chunk, rest) = self.0.split_at(n);
        self.0 = rest;
        chunk
    }

    fn text(&mut self) -> String {
        String::from_utf8_lossy(self.chunk()).into_owned()
    }
}

/// What the caller of the token router presented.
#[derive(Debug, Clone, Copy)]
enum Presented {
    /// No `Authorization`, or one that cannot name a token of the file.
    Nobody,
    /// `Bearer` and the secret of [`TOKENS`]`[i]`.
    Token(usize),
}

impl Presented {
    fn name(self) -> &'static str {
        match self {
            Presented::Nobody => "no known token",
            Presented::Token(i) => TOKENS[i].0,
        }
    }

    fn roles(self) -> Option<Roles> {
        match self {
            Presented::Nobody => None,
            Presented::Token(i) => Some(TOKENS[i].1),
        }
    }
}

struct Call {
    guarded: bool,
    request: Request<Body>,
    presented: Presented,
}

fn percent_encoded(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

/// The `{id}` of a session route: a name that sequences share, any bytes
/// percent-encoded (so the id's own decoder sees them), the bytes as they
/// are (so the URI's parser and the router do), or a long id.
fn session_segment(input: &mut Input<'_>) -> Vec<u8> {
    match input.byte() % 6 {
        n @ 0..=2 => SESSION_NAMES[usize::from(n)].as_bytes().to_vec(),
        3 => percent_encoded(input.chunk()).into_bytes(),
        4 => input.chunk().to_vec(),
        _ => "x".repeat(usize::from(input.byte()) * 2).into_bytes(),
    }
}

fn header_value(bytes: &[u8]) -> Option<HeaderValue> {
    HeaderValue::from_bytes(bytes).ok()
}

/// The `Authorization` of a request to the token router, and what it
/// presents; `None` when its bytes make no header value.
fn decode_authorization(input: &mut Input<'_>, headers: &mut HeaderMap) -> Option<Presented> {
    let presented = match input.byte() % 9 {
        0 => Presented::Nobody,
        n @ 1..=4 => {
            let secret = TOKENS[usize::from(n - 1)].2;
            headers.insert(
                header::AUTHORIZATION,
                header_value(format!("Bearer {secret}").as_bytes())?,
            );
            Presented::Token(usize::from(n - 1))
        }
        5 => {
            headers.insert(
                header::AUTHORIZATION,
                HeaderValue::from_static("Bearer not-a-token-of-this-server"),
            );
            Presented::Nobody
        }
        6 => {
            // The operator's secret under another scheme.
            let value = format!("Basic {}", TOKENS[3].2);
            headers.insert(header::AUTHORIZATION, header_value(value.as_bytes())?);
            Presented::Nobody
        }
        7 => {
            // Two tokens: which one acts is ambiguous, so neither does.
            for i in [0, 3] {
                let value = format!("Bearer {}", TOKENS[i].2);
                headers.append(header::AUTHORIZATION, header_value(value.as_bytes())?);
            }
            Presented::Nobody
        }
        _ => {
            headers.insert(header::AUTHORIZATION, header_value(input.chunk())?);
            Presented::Nobody
        }
    };
    Some(presented)
}

/// The other headers the API reads, as `flags` asks for them.
fn decode_headers(input: &mut Input<'_>, flags: u8, headers: &mut HeaderMap) {
    if flags & 0x01 != 0 {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    if flags & 0x02 != 0
        && let Some(v) = header_value(input.chunk())
    {
        headers.append(header::CONTENT_TYPE, v);
    }
    if flags & 0x04 != 0 {
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
    }
    if flags & 0x08 != 0 {
        let pick = usize::from(input.byte());
        let host = match HOSTS.get(pick % (HOSTS.len() + 1)) {
            Some(host) => header_value(host.as_bytes()),
            None => header_value(input.chunk()),
        };
        if let Some(host) = host {
            headers.insert(header::HOST, host);
        }
    }
    if flags & 0x10 != 0 {
        let pick = usize::from(input.byte());
        let origin = match ORIGINS.get(pick % (ORIGINS.len() + 1)) {
            Some(origin) => header_value(origin.as_bytes()),
            None => header_value(input.chunk()),
        };
        if let Some(origin) = origin {
            headers.insert(header::ORIGIN, origin);
        }
    }
    if flags & 0x20 != 0
        && let Some(v) = header_value(input.chunk())
    {
        headers.insert(HeaderName::from_static("last-event-id"), v);
    }
}

/// One request from the input, or `None` when its bytes make no request
/// (a URI that does not parse, say).
fn decode_call(input: &mut Input<'_>, routes: &[Route]) -> Option<Call> {
    let op = input.byte();
    let guarded = op & 0x80 == 0;
    let route = routes.get(usize::from(op & 0x0f));
    let method = match (op >> 4) & 0x07 {
        0 => route.map_or(Method::GET, |r| r.method.clone()),
        7 => Method::from_bytes(input.chunk()).unwrap_or(Method::PATCH),
        n => METHODS[usize::from(n - 1)].clone(),
    };
    let mut uri = match route {
        Some(route) => match route.path.split_once("{id}") {
            Some((before, after)) => {
                let mut path = before.as_bytes().to_vec();
                path.extend(session_segment(input));
                path.extend(after.as_bytes());
                path
            }
            None => route.path.as_bytes().to_vec(),
        },
        None => {
            let mut path = b"/".to_vec();
            path.extend(input.chunk());
            path
        }
    };
    let flags = input.byte();
    if flags & 0x40 != 0 {
        uri.push(b'?');
        uri.extend(input.chunk());
    }
    let uri = Uri::try_from(uri).ok()?;

    let mut headers = HeaderMap::new();
    let presented = decode_authorization(input, &mut headers)?;
    decode_headers(input, flags, &mut headers);

    let body = match input.byte() % 3 {
        0 => input.chunk().to_vec(),
        1 => serde_json::json!({ "id": input.text() })
            .to_string()
            .into_bytes(),
        _ => serde_json::json!({ "input": input.text() })
            .to_string()
            .into_bytes(),
    };
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body))
        .ok()?;
    *request.headers_mut() = headers;
    Some(Call {
        guarded,
        request,
        presented,
    })
}

/// Whether `path` is an instance of the route template `template`: the
/// router matches the path as sent, segment by segment, and `{id}` is one
/// segment, which may be empty unless it ends the path.
fn instance_of(template: &str, path: &str) -> bool {
    let (mut t, mut p) = (template.split('/').peekable(), path.split('/'));
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some("{id}"), Some(segment)) if !segment.is_empty() || t.peek().is_some() => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// The access of the route serving `method` on `path`; `None` when no
/// route does (404, or 405 for a path served under other methods). A GET
/// route serves HEAD too.
fn access_of(routes: &[Route], method: &Method, path: &str) -> Option<Access> {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    routes
        .iter()
        .find(|r| r.method == method && instance_of(r.path, path))
        .map(|r| r.access)
}

/// What the store holds, every part a request could change.
#[derive(Debug, PartialEq, Eq)]
struct SessionState {
    id: SessionId,
    last_seq: u64,
    high_water: Option<lease_port::FencingToken>,
    cancel: Option<session_store::CancelRequest>,
}

async fn snapshot(store: &JsonlStore) -> Vec<SessionState> {
    let mut states = Vec::new();
    for id in store.list().await.expect("list the sessions") {
        states.push(SessionState {
            last_seq: store.last_seq(&id).await.expect("a session's last event"),
            high_water: store.high_water(&id).await.expect("a session's fence"),
            cancel: store.cancel_request(&id).await.expect("a cancel request"),
            id,
        });
    }
    states
}

/// Waits until no run is in progress: a run outlives the request that
/// started it, and its events would be taken for the next request's.
async fn runs_ended(engine: &Engine) {
    let deadline = tokio::time::Instant::now() + RUNS_END_WITHIN;
    while engine.runs_in_progress() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a run has not ended {RUNS_END_WITHIN:?} after its request"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Every input starts without sessions, so that what one input created
/// does not shape the next (only sequence numbers and fences, which the
/// store keeps past a deletion, carry on).
async fn empty_store(w: &World) {
    runs_ended(&w.engine).await;
    for id in w.store.list().await.expect("list the sessions") {
        if let Err(e) = w.engine.delete_session(&id).await {
            panic!("cannot delete {id} between inputs: {e}");
        }
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// The answer to `request`, its body whole or, for an event stream, its
/// first frames; `None` when it did not come within [`ANSWER_WITHIN`].
async fn exchange(router: &Router, request: Request<Body>) -> Option<Answer> {
    let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
    let response = tokio::time::timeout_at(deadline, router.clone().oneshot(request))
        .await
        .ok()?
        .unwrap_or_else(|never| match never {});
    let (parts, body) = response.into_parts();
    let streamed = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let body = if streamed {
        let stream_deadline = tokio::time::Instant::now() + STREAM_WITHIN;
        let mut frames = body.into_data_stream();
        let mut read = Vec::new();
        for _ in 0..STREAM_FRAMES {
            match tokio::time::timeout_at(stream_deadline, frames.next()).await {
                Ok(Some(Ok(frame))) => read.extend_from_slice(&frame),
                _ => break,
            }
            if read.len() >= STREAM_BYTES {
                break;
            }
        }
        read
    } else {
        tokio::time::timeout_at(deadline, axum::body::to_bytes(body, usize::MAX))
            .await
            .ok()?
            .expect("the body of an in-process response")
            .to_vec()
    };
    Some(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// What the checks read of an error body.
#[derive(Debug)]
struct ErrorAnswer {
    code: String,
    role: Option<String>,
}

/// The error of a body that is an `ErrorBody` as the API document
/// describes it (a code, a message, whether to retry); `None` when it is
/// not one.
fn error_answer(body: &[u8]) -> Option<ErrorAnswer> {
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = body.get("error")?;
    error.get("message")?.as_str()?;
    error.get("retryable")?.as_bool()?;
    Some(ErrorAnswer {
        code: error.get("code")?.as_str()?.to_owned(),
        role: match error.get("role") {
            None | Some(serde_json::Value::Null) => None,
            Some(role) => Some(role.as_str()?.to_owned()),
        },
    })
}

/// What the token router must answer a caller it does not let through.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// No route serves the request.
    NoRoute,
    /// The route is open: served, but it changes nothing.
    Open,
    /// 401 `unauthenticated`.
    Unauthenticated,
    /// 403 `forbidden`, naming one of the roles the caller lacks.
    Forbidden { needed: Roles, held: Roles },
}

fn refusal(access: Option<Access>, presented: Presented) -> Option<Refusal> {
    match (access, presented.roles()) {
        (None, _) => Some(Refusal::NoRoute),
        (Some(Access::Open), _) => Some(Refusal::Open),
        (Some(Access::Needs(_)), None) => Some(Refusal::Unauthenticated),
        (Some(Access::Needs(needed)), Some(held)) => needed
            .missing_from(held)
            .map(|_| Refusal::Forbidden { needed, held }),
    }
}

async fn check(w: &World, call: Call) {
    let what = format!(
        "{} {} as {} ({})",
        call.request.method(),
        call.request.uri(),
        call.presented.name(),
        if call.guarded {
            "token router"
        } else {
            "open router"
        },
    );
    // A HEAD answer has its headers and no body.
    let is_head = call.request.method() == Method::HEAD;
    let refused = if call.guarded {
        let access = access_of(&w.routes, call.request.method(), call.request.uri().path());
        refusal(access, call.presented)
    } else {
        None
    };
    let before = match refused {
        Some(_) => {
            runs_ended(&w.engine).await;
            Some(snapshot(&w.store).await)
        }
        None => None,
    };
    let router = if call.guarded { &w.guarded } else { &w.open };
    let answer = exchange(router, call.request).await;
    let Some(answer) = answer else {
        // A run may be long, a stream longer; a refusal never is.
        assert!(
            refused.is_none(),
            "{what}: no answer within {ANSWER_WITHIN:?}"
        );
        return;
    };
    let status = answer.status;
    let body = String::from_utf8_lossy(&answer.body);
    assert!(
        !status.is_server_error(),
        "{what}: {status} on a healthy local store: {body}"
    );
    let error = error_answer(&answer.body);
    if status.is_client_error() && !is_head {
        assert!(
            error.is_some(),
            "{what}: {status} without an API error body: {body:?}"
        );
    }
    let Some(refused) = refused else {
        return;
    };
    match refused {
        Refusal::NoRoute => assert!(
            status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED,
            "{what}: {status} for no route: {body}"
        ),
        Refusal::Open => assert!(
            status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
            "{what}: an open route refused its caller: {status} {body}"
        ),
        Refusal::Unauthenticated => {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
            assert!(
                answer
                    .headers
                    .get(header::WWW_AUTHENTICATE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"Bearer")),
                "{what}: 401 without `WWW-Authenticate: Bearer`"
            );
            if let (false, Some(error)) = (is_head, &error) {
                assert_eq!(error.code, "unauthenticated", "{what}: {body}");
            }
        }
        Refusal::Forbidden { needed, held } => {
            assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body}");
            if let (false, Some(error)) = (is_head, &error) {
                assert_eq!(error.code, "forbidden", "{what}: {body}");
                let lacked = needed
                    .iter()
                    .find(|r| !held.contains(*r) && error.role.as_deref() == Some(r.name()));
                assert!(
                    lacked.is_some(),
                    "{what}: 403 naming {:?}, which is not a role the route needs and the \
                     token lacks",
                    error.role
                );
            }
        }
    }
    runs_ended(&w.engine).await;
    let after = snapshot(&w.store).await;
    assert_eq!(
        before.as_ref(),
        Some(&after),
        "{what} ({refused:?}, answered {status}) changed the store"
    );
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut input = Input(data);
    let mut calls = Vec::new();
    while !input.0.is_empty() && calls.len() < MAX_REQUESTS {
        if let Some(call) = decode_call(&mut input, &w.routes) {
            calls.push(call);
        }
    }
    w.runtime.block_on(async {
        empty_store(w).await;
        for call in calls {
            check(w, call).await;
        }
    });
});
