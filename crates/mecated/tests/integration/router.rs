//! The router in-process (`Router::oneshot`): every route and every error
//! code the server answers, each response checked against the OpenAPI
//! document generated from the wire types, for its route and status.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use flocklease::FlockLease;
use lease_keeper::LeaseKeeper;
use lease_port::{AuthorityId, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use mecated::agent::{Agent, AgentError, EchoAgent, EventSink, Turn};
use mecated::auth::{Role, TokenFile, hash_token};
use mecated::backend::Unleased;
use mecated::engine::{Engine, Exclusivity};
use mecated::http::{Access, Auth};
use mecated::metrics::Metrics;
use mecated::wire::{CreatedSession, ErrorBody, EventPage, RunResult, SessionInfo};
use nix::fcntl::{Flock, FlockArg};
use serde_json::{Value, json};
use session_store::{
    AppendReceipt, FsyncPolicy, JsonlOptions, JsonlStore, Page, SessionStore, StoreError,
    WriteFence,
};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

// ---------------------------------------------------------------------
// The contract: the generated document, and checking a response against it.

/// The OpenAPI document and what the tests received, route by route.
struct Contract {
    doc: Value,
}

/// What one response was, as far as the document is concerned.
struct Reply {
    status: u16,
    content_type: Option<String>,
    retry_after: Option<String>,
    www_authenticate: Option<String>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn error_code(&self) -> String {
        let body: ErrorBody = serde_json::from_slice(&self.body).expect("an error body");
        serde_json::to_value(body.error.code)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The `(event, data)` pairs of a Server-Sent Events body.
    fn sse(&self) -> Vec<(String, Value)> {
        parse_sse(std::str::from_utf8(&self.body).expect("UTF-8 stream"))
            .expect("well-formed Server-Sent Events")
    }
}

fn parse_sse(text: &str) -> Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data: Option<Value> = None;
        let mut id = None;
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                name = Some(v.to_owned());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str(v).map_err(|e| format!("data {v:?}: {e}"))?);
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_owned());
            } else if !line.starts_with(':') {
                return Err(format!("unexpected line {line:?}"));
            }
        }
        // A stored event's SSE id is its sequence number, so a client whose
        // stream broke resumes with `Last-Event-ID`; nothing else has one.
        match (name.as_deref(), &data, id) {
            (Some("event"), Some(d), Some(id)) if id.parse().ok() == d["seq"].as_u64() => {}
            (Some("event"), Some(d), id) => {
                return Err(format!("event {d} has the SSE id {id:?}, not its seq"));
            }
            (_, _, Some(id)) => return Err(format!("{name:?} has an SSE id {id:?}")),
            _ => {}
        }
        match (name, data) {
            (Some(n), Some(d)) => out.push((n, d)),
            // A keep-alive comment alone.
            (None, None) => {}
            other => return Err(format!("incomplete event {other:?}")),
        }
    }
    Ok(out)
}

impl Contract {
    fn generated() -> Self {
        Self {
            doc: serde_json::to_value(mecated::openapi::document()).unwrap(),
        }
    }

    /// The path template of the document that `path` is an instance of.
    fn template(&self, path: &str) -> Option<String> {
        let segments: Vec<&str> = path.split('/').collect();
        self.doc["paths"].as_object()?.keys().find_map(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            let fits = ts.len() == segments.len()
                && ts.iter().zip(&segments).all(|(t, s)| {
                    (t.starts_with('{') && t.ends_with('}') && !s.is_empty()) || t == s
                });
            fits.then(|| t.clone())
        })
    }

    /// Every `(method, template, status)` the document promises.
    fn documented(&self) -> BTreeSet<Exercised> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for status in op["responses"].as_object().unwrap().keys() {
                    out.insert((method.clone(), path.clone(), status.parse().unwrap()));
                }
            }
        }
        out
    }

    /// Validates `instance` against `schema`, whose `$ref`s point into the
    /// document's components.
    fn validate(&self, schema: &Value, instance: &Value) -> Result<(), String> {
        let mut root = schema
            .as_object()
            .cloned()
            .ok_or("schema is not an object")?;
        root.insert("components".into(), self.doc["components"].clone());
        let validator = jsonschema::draft202012::new(&Value::Object(root))
            .map_err(|e| format!("schema does not compile: {e}"))?;
        validator.validate(instance).map_err(|errors| {
            let errors: Vec<String> = errors
                .map(|e| format!("{e} at {}", e.instance_path))
                .collect();
            format!("{instance} does not validate: {}", errors.join("; "))
        })
    }

    fn component(&self, name: &str) -> Value {
        json!({ "$ref": format!("#/components/schemas/{name}") })
    }

    /// Checks a response to `method path` against the document; the
    /// `(method, template, status)` it exercised.
    fn check(&self, method: &str, path: &str, reply: &Reply) -> Result<Exercised, String> {
        let op = self
            .template(path)
            .and_then(|t| self.doc["paths"][&t].get(method).map(|op| (t, op.clone())));
        let Some((template, op)) = op else {
            // Not a route: the fallback's 404 with the error body.
            if reply.status != 404 {
                return Err(format!(
                    "{method} {path}: {} outside any route",
                    reply.status
                ));
            }
            let body = serde_json::from_slice(&reply.body).map_err(|e| e.to_string())?;
            self.validate(&self.component("ErrorBody"), &body)?;
            return Ok((method.into(), "<fallback>".into(), 404));
        };
        let documented = &op["responses"][reply.status.to_string()];
        if documented.is_null() {
            return Err(format!(
                "{method} {template} answered {}, which the document does not list",
                reply.status
            ));
        }
        let exercised = (method.to_owned(), template.clone(), reply.status);
        let Some(content) = documented.get("content") else {
            return if reply.body.is_empty() {
                Ok(exercised)
            } else {
                Err(format!(
                    "{method} {template} {}: a body where none is documented",
                    reply.status
                ))
            };
        };
        let media = reply
            .content_type
            .as_deref()
            .and_then(|c| c.split(';').next())
            .ok_or_else(|| format!("{method} {template}: no content type"))?
            .trim()
            .to_owned();
        let schema = content
            .get(&media)
            .map(|c| c["schema"].clone())
            .ok_or_else(|| {
                format!(
                    "{method} {template} {}: {media} is not documented",
                    reply.status
                )
            })?;
        match media.as_str() {
            "application/json" => {
                let body = serde_json::from_slice(&reply.body).map_err(|e| e.to_string())?;
                self.validate(&schema, &body)?;
            }
            "text/event-stream" => {
                let text = std::str::from_utf8(&reply.body).map_err(|e| e.to_string())?;
                let events = parse_sse(text)?;
                // A run's stream ends with how the run ended; a follow's,
                // with why the follow did (the run it followed may not be
                // the reason: none was live).
                let end = if template.ends_with("/events") {
                    "FollowEnd"
                } else {
                    "RunEnd"
                };
                for (name, data) in &events {
                    let component = match name.as_str() {
                        "event" => "Event",
                        "end" => end,
                        other => return Err(format!("undocumented event {other:?}")),
                    };
                    self.validate(&self.component(component), data)?;
                }
                if events.last().map(|(n, _)| n.as_str()) != Some("end") {
                    return Err("the stream did not end with `end`".into());
                }
            }
            _ => {
                let text = String::from_utf8(reply.body.clone()).map_err(|e| e.to_string())?;
                self.validate(&schema, &Value::String(text))?;
            }
        }
        Ok(exercised)
    }
}

// ---------------------------------------------------------------------
// The server in-process.

/// `(method, route template, status)`.
type Exercised = (String, String, u16);

/// What the scenarios exercised, shared among their servers.
type Seen = Arc<Mutex<BTreeSet<Exercised>>>;

/// Every response checked; what was exercised, kept.
#[derive(Clone)]
struct Api {
    router: Router,
    contract: Arc<Contract>,
    seen: Seen,
}

fn header_text(headers: &header::HeaderMap, name: header::HeaderName) -> Option<String> {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

impl Api {
    async fn send(&self, req: Request<Body>) -> Reply {
        let method = req.method().as_str().to_lowercase();
        let path = req.uri().path().to_owned();
        let response = self.router.clone().oneshot(req).await.unwrap();
        let (status, content_type, retry_after, www_authenticate) = (
            response.status().as_u16(),
            header_text(response.headers(), header::CONTENT_TYPE),
            header_text(response.headers(), header::RETRY_AFTER),
            header_text(response.headers(), header::WWW_AUTHENTICATE),
        );
        let body = response.into_body();
        let body = axum::body::to_bytes(body, usize::MAX)
            .await
            .unwrap()
            .to_vec();
        let reply = Reply {
            status,
            content_type,
            retry_after,
            www_authenticate,
            body,
        };
        match self.contract.check(&method, &path, &reply) {
            Ok(exercised) => {
                self.seen.lock().unwrap().insert(exercised);
            }
            Err(e) => panic!(
                "{method} {path} -> {status} breaks the OpenAPI document: {e}\nbody: {}",
                String::from_utf8_lossy(&reply.body)
            ),
        }
        reply
    }

    async fn get(&self, uri: &str) -> Reply {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn delete(&self, uri: &str) -> Reply {
        self.send(Request::delete(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn post_raw(
        &self,
        uri: &str,
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> Reply {
        let mut req = Request::post(uri);
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        self.send(req.body(body.into()).unwrap()).await
    }

    async fn post(&self, uri: &str, body: Value) -> Reply {
        self.post_raw(uri, Some("application/json"), body.to_string())
            .await
    }

    async fn create(&self, id: &str) {
        let r = self.post("/v1/sessions", json!({ "id": id })).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }

    async fn run(&self, id: &str) -> Reply {
        self.post(&format!("/v1/sessions/{id}/runs"), json!({"input": "hi"}))
            .await
    }

    async fn stream(&self, id: &str) -> Reply {
        self.send(
            Request::post(format!("/v1/sessions/{id}/runs"))
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream")
                .body(Body::from(json!({"input": "live"}).to_string()))
                .unwrap(),
        )
        .await
    }
}

/// How a test server takes its leases.
enum Leases {
    /// File leases in `<store>/.session-leases`, as deployed.
    Files,
    /// File leases, with faults on demand.
    Scripted(Arc<Scripted>),
    /// No leases, with this proof of exclusivity.
    Unleased(Exclusivity),
}

struct Setup {
    owner: &'static str,
    leases: Leases,
    agent: Arc<dyn Agent>,
    max_body_bytes: usize,
    faults: Option<Arc<FaultyStore>>,
    auth: Auth,
    max_follows_per_client: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            owner: "router-a",
            leases: Leases::Files,
            agent: Arc::new(EchoAgent::default()),
            max_body_bytes: 1 << 20,
            faults: None,
            auth: Auth::Off,
            max_follows_per_client: mecated::http::DEFAULT_MAX_FOLLOWS_PER_CLIENT,
        }
    }
}

/// Short, so a session locked by the test answers `store_busy` quickly.
const LOCK_TIMEOUT: Duration = Duration::from_millis(100);

fn open_store(dir: &Path, unleased: bool) -> Arc<JsonlStore> {
    Arc::new(
        JsonlStore::open(
            dir,
            JsonlOptions::default()
                .fsync(FsyncPolicy::Never)
                .allow_unfenced(unleased)
                .lock_timeout(LOCK_TIMEOUT),
        )
        .unwrap(),
    )
}

fn lease_dir(store: &Path) -> PathBuf {
    store.join(session_store::DEFAULT_LEASE_DIR_NAME)
}

fn serve(store_dir: &Path, contract: &Arc<Contract>, seen: &Seen, setup: Setup) -> (Api, Engine) {
    let unleased = matches!(setup.leases, Leases::Unleased(_));
    let store: Arc<dyn SessionStore> = match &setup.faults {
        Some(f) => f.clone(),
        None => open_store(store_dir, unleased),
    };
    let ttl = Duration::from_secs(15);
    let files = || Arc::new(FlockLease::open(lease_dir(store_dir), ttl).unwrap());
    let (backend, exclusivity): (Arc<dyn SessionLease>, _) = match setup.leases {
        Leases::Files => (files(), Exclusivity::Leased),
        Leases::Scripted(s) => (s, Exclusivity::Leased),
        Leases::Unleased(proof) => (Arc::new(Unleased), proof),
    };
    let metrics = Arc::new(Metrics::default());
    let keeper = LeaseKeeper::builder(backend, OwnerId::new(setup.owner).unwrap(), ttl)
        .allow_unleased(exclusivity.may_run_unleased())
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let engine = Engine::new(store, keeper, setup.agent, metrics, exclusivity);
    let api = Api {
        router: mecated::http::router_configured(
            engine.clone(),
            setup.auth,
            mecated::http::HttpOptions {
                max_body_bytes: setup.max_body_bytes,
                max_follows_per_client: setup.max_follows_per_client,
                ..Default::default()
            },
        ),
        contract: Arc::clone(contract),
        seen: Arc::clone(seen),
    };
    (api, engine)
}

/// One scenario's world: a store directory and what it exercised.
struct World {
    dir: tempfile::TempDir,
    contract: Arc<Contract>,
    seen: Seen,
}

impl World {
    fn new(seen: &Seen) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            contract: Arc::new(Contract::generated()),
            seen: Arc::clone(seen),
        }
    }

    fn serve(&self, setup: Setup) -> (Api, Engine) {
        serve(self.dir.path(), &self.contract, &self.seen, setup)
    }

    /// Holds `id`'s session file locked, as another process mid-write would.
    fn lock_session(&self, id: &str) -> Flock<std::fs::File> {
        let stem = session_filename::stem(&SessionId::new(id).unwrap());
        let path = self
            .dir
            .path()
            .join(format!("{stem}{}", session_store::FILE_SUFFIX));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap()
    }
}

/// File leases whose acquire fails on demand.
#[derive(Debug)]
struct Scripted {
    inner: FlockLease,
    fault: Mutex<Option<fn() -> LeaseError>>,
}

impl Scripted {
    fn new(store: &Path) -> Arc<Self> {
        Arc::new(Self {
            inner: FlockLease::open(lease_dir(store), Duration::from_secs(15)).unwrap(),
            fault: Mutex::new(None),
        })
    }

    fn fail_with(&self, fault: Option<fn() -> LeaseError>) {
        *self.fault.lock().unwrap() = fault;
    }
}

#[async_trait]
impl SessionLease for Scripted {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        let fault = *self.fault.lock().unwrap();
        match fault {
            Some(f) => Err(f()),
            None => self.inner.acquire(session, owner).await,
        }
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inner.release(lease).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.inner.authority().await
    }
}

/// A store whose every call fails with an I/O error while `failing`.
struct FaultyStore {
    inner: Arc<JsonlStore>,
    failing: Mutex<bool>,
}

impl FaultyStore {
    fn fault(&self) -> Result<(), StoreError> {
        if *self.failing.lock().unwrap() {
            return Err(StoreError::Io {
                op: "reading",
                path: PathBuf::from("/injected"),
                source: std::io::Error::other("injected fault"),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl SessionStore for FaultyStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        self.fault()?;
        self.inner.create(session).await
    }
    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Value],
    ) -> Result<AppendReceipt, StoreError> {
        self.fault()?;
        self.inner.append(session, fence, events).await
    }
    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Value],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        self.fault()?;
        self.inner.append_after(session, fence, after, events).await
    }
    async fn read(&self, session: &SessionId, from: u64, limit: usize) -> Result<Page, StoreError> {
        self.fault()?;
        self.inner.read(session, from, limit).await
    }
    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        self.fault()?;
        self.inner.list().await
    }
    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        self.fault()?;
        self.inner.delete(session, fence).await
    }
    async fn high_water(
        &self,
        session: &SessionId,
    ) -> Result<Option<lease_port::FencingToken>, StoreError> {
        self.fault()?;
        self.inner.high_water(session).await
    }
    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        self.fault()?;
        self.inner.bind_authority(authority).await
    }
    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        self.fault()?;
        self.inner.recorded_authority().await
    }
}

/// Emits one progress event, then waits until the test opens the gate.
#[derive(Debug, Default)]
struct GateAgent {
    open: CancellationToken,
}

#[async_trait]
impl Agent for GateAgent {
    async fn run(&self, _: Turn, sink: &mut dyn EventSink) -> Result<(), AgentError> {
        sink.emit(json!({"type": "progress"})).await?;
        self.open.cancelled().await;
        sink.emit(json!({"type": "message"})).await?;
        Ok(())
    }
}

/// Starts a run on `api` that waits at `gate`, and returns once its first
/// event is in the log.
async fn hold_run(api: &Api, id: &str) -> tokio::task::JoinHandle<Reply> {
    let pending = {
        let api = api.clone();
        let id = id.to_owned();
        tokio::spawn(async move { api.run(&id).await })
    };
    for _ in 0..500 {
        let page: EventPage =
            serde_json::from_slice(&api.get(&format!("/v1/sessions/{id}/events")).await.body)
                .unwrap();
        if page.events.iter().any(|e| e.payload["type"] == "progress") {
            return pending;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the held run never started");
}

// ---------------------------------------------------------------------
// Scenarios: each one a test, and all of them together the coverage test.

async fn sessions_are_created_listed_described_and_deleted(seen: &Seen) {
    let world = World::new(seen);
    let (api, _) = world.serve(Setup::default());

    let r = api.post("/v1/sessions", json!({"id": "alpha"})).await;
    assert_eq!(r.status, 201);
    let created: CreatedSession = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((created.id.as_str(), created.events), ("alpha", 0));

    // No body at all: a random id.
    let r = api.post_raw("/v1/sessions", None, "").await;
    assert_eq!(r.status, 201);
    let random: CreatedSession = serde_json::from_slice(&r.body).unwrap();
    assert!(random.id.starts_with("s-"), "{}", random.id);

    let r = api.post("/v1/sessions", json!({"id": "alpha"})).await;
    assert_eq!((r.status, r.error_code().as_str()), (409, "session_exists"));

    let r = api.get("/v1/sessions").await;
    assert_eq!(r.status, 200);
    let ids: Vec<Value> = r.json()["sessions"].as_array().unwrap().clone();
    assert_eq!(ids.len(), 2);
    assert!(r.json()["continue"].is_null());

    // Paged: one at a time, then a cursor this server never issued and a
    // limit out of bounds.
    let r = api.get("/v1/sessions?limit=1").await;
    assert_eq!(r.status, 200);
    let token = r.json()["continue"].as_str().unwrap().to_owned();
    let r = api
        .get(&format!("/v1/sessions?limit=1&continue={token}"))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["sessions"].as_array().unwrap().len(), 1);
    assert!(r.json()["continue"].is_null());
    let r = api.get("/v1/sessions?continue=bogus").await;
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (400, "invalid_continue")
    );
    let r = api.get("/v1/sessions?limit=0").await;
    assert_eq!((r.status, r.error_code().as_str()), (400, "invalid"));

    let r = api.get("/v1/sessions/alpha").await;
    assert_eq!(r.status, 200);
    let info: SessionInfo = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(info.high_water_token, None, "no fenced write yet");

    let r = api.run("alpha").await;
    assert_eq!(r.status, 200);
    let run: RunResult = serde_json::from_slice(&r.body).unwrap();
    let info: SessionInfo =
        serde_json::from_slice(&api.get("/v1/sessions/alpha").await.body).unwrap();
    assert_eq!(
        info.high_water_token, run.token,
        "the run's token is the mark"
    );

    assert_eq!(api.delete("/v1/sessions/alpha").await.status, 204);
    let r = api.get("/v1/sessions/alpha").await;
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
    let r = api.delete("/v1/sessions/alpha").await;
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
    let r = api.get("/v1/sessions/alpha/events").await;
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
    let r = api.run("alpha").await;
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
}

async fn operations_routes_answer(seen: &Seen) {
    let world = World::new(seen);
    let (api, engine) = world.serve(Setup::default());
    let r = api.get("/healthz").await;
    assert_eq!((r.status, r.body.as_slice()), (200, b"ok".as_slice()));
    let r = api.get("/readyz").await;
    assert_eq!((r.status, r.body.as_slice()), (200, b"ready".as_slice()));
    let r = api.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(
        String::from_utf8(r.body)
            .unwrap()
            .contains("mecated_runs_total")
    );
    let r = api.get("/").await;
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("<title>mecated</title>"));
    assert_eq!(api.get("/v1/sessions/any/lease").await.status, 200);
    assert_eq!(api.get("/v1/sessions/a%0Ab/lease").await.status, 400);
    // Cancel: a missing session, then one without a live run.
    assert_eq!(
        api.delete("/v1/sessions/none/runs/current").await.status,
        404
    );
    api.create("quiet").await;
    let r = api.delete("/v1/sessions/quiet/runs/current").await;
    assert_eq!((r.status, &r.json()["live"]), (200, &json!(false)));
    let r = api.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        mecated::openapi::json().as_bytes(),
        "serves the generated document"
    );
    let r = api.get("/no/such/route").await;
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));

    assert!(
        engine
            .shutdown(tokio::time::Instant::now() + Duration::from_secs(5))
            .await
    );
    let r = api.get("/readyz").await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (503, b"shutting down".as_slice())
    );
}

async fn bad_input_is_400_invalid_with_the_json_error_body(seen: &Seen) {
    let world = World::new(seen);
    let (api, _) = world.serve(Setup::default());
    api.create("ok").await;
    let invalid = |r: &Reply| (r.status, r.error_code());
    let expect = (400, "invalid".to_owned());

    // Create: malformed, unknown field, wrong type, and each id rule.
    assert_eq!(
        invalid(
            &api.post_raw("/v1/sessions", Some("application/json"), "{not json")
                .await
        ),
        expect
    );
    assert_eq!(
        invalid(
            &api.post("/v1/sessions", json!({"id": "x", "name": "y"}))
                .await
        ),
        expect
    );
    assert_eq!(
        invalid(&api.post("/v1/sessions", json!({"id": 5})).await),
        expect
    );
    assert_eq!(
        invalid(&api.post("/v1/sessions", json!({"id": ""})).await),
        expect
    );
    assert_eq!(
        invalid(&api.post("/v1/sessions", json!({"id": "a\nb"})).await),
        expect
    );
    assert_eq!(
        invalid(&api.post("/v1/sessions", json!({"id": "a\u{85}b"})).await),
        expect
    );
    // 129 characters but 258 bytes: within maxLength, beyond the byte limit.
    assert_eq!(
        invalid(
            &api.post("/v1/sessions", json!({"id": "é".repeat(129)}))
                .await
        ),
        expect
    );

    // Path ids: not UTF-8 once decoded, a control character, too long.
    for id in ["%FF", "a%0Ab", &"x".repeat(257)] {
        for r in [
            api.get(&format!("/v1/sessions/{id}")).await,
            api.get(&format!("/v1/sessions/{id}/events")).await,
            api.delete(&format!("/v1/sessions/{id}")).await,
            api.delete(&format!("/v1/sessions/{id}/runs/current")).await,
            api.run(id).await,
        ] {
            assert_eq!(invalid(&r), expect, "{id}");
            assert_eq!(r.content_type.as_deref(), Some("application/json"), "{id}");
        }
    }

    // Paging: out of range, not a number, unknown parameter.
    for query in ["limit=0", "limit=1001", "after=-1", "limit=many", "from=3"] {
        let r = api.get(&format!("/v1/sessions/ok/events?{query}")).await;
        assert_eq!(invalid(&r), expect, "{query}");
    }

    // Runs: malformed, unknown field, missing input, not JSON.
    let runs = "/v1/sessions/ok/runs";
    assert_eq!(
        invalid(
            &api.post_raw(runs, Some("application/json"), "{not json")
                .await
        ),
        expect
    );
    assert_eq!(invalid(&api.post(runs, json!({"inputs": 1})).await), expect);
    assert_eq!(invalid(&api.post(runs, json!({})).await), expect);
    assert_eq!(
        invalid(&api.post_raw(runs, None, r#"{"input":1}"#).await),
        expect
    );
    assert_eq!(
        invalid(
            &api.post_raw(runs, Some("text/plain"), r#"{"input":1}"#)
                .await
        ),
        expect
    );

    // Nothing of it was written.
    let page: EventPage =
        serde_json::from_slice(&api.get("/v1/sessions/ok/events").await.body).unwrap();
    assert!(page.events.is_empty());
}

async fn bodies_over_the_limit_are_413(seen: &Seen) {
    let world = World::new(seen);
    let (api, _) = world.serve(Setup {
        max_body_bytes: 256,
        ..Setup::default()
    });
    api.create("ok").await;
    let big = json!({"input": "x".repeat(1024)});
    let r = api.post("/v1/sessions/ok/runs", big).await;
    assert_eq!((r.status, r.error_code().as_str()), (413, "invalid"));
    let r = api
        .post("/v1/sessions", json!({"id": "y".repeat(1024)}))
        .await;
    assert_eq!((r.status, r.error_code().as_str()), (413, "invalid"));
}

/// A token holding as many follows as a client may is answered 429
/// `too_many_follows` for one more; its open follow is a response whose
/// body is still unread.
async fn follows_past_a_clients_limit_are_429(seen: &Seen) {
    let world = World::new(seen);
    let auth = tokens_lacking_one_role_each(world.dir.path());
    let (api, _) = world.serve(Setup {
        auth,
        max_follows_per_client: 1,
        ..Setup::default()
    });
    let follow = |token: &str| {
        Request::get("/v1/sessions/f/events")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::ACCEPT, "text/event-stream")
            .body(Body::empty())
            .unwrap()
    };
    let create = Request::post("/v1/sessions")
        .header(header::AUTHORIZATION, "Bearer no-admin")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"id": "f"}).to_string()))
        .unwrap();
    assert_eq!(api.send(create).await.status, 201);
    let open = api.router.clone().oneshot(follow("no-run")).await.unwrap();
    assert_eq!(open.status(), 200);
    let r = api.send(follow("no-run")).await;
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (429, "too_many_follows")
    );
    let r = api.send(follow("no-admin")).await;
    assert_eq!(r.status, 200, "another token is held up");
    drop(open);
    let r = api.send(follow("no-run")).await;
    assert_eq!(r.status, 200, "a dropped follow kept its place");
}

/// A token file holding, for each role, a token with every role but it
/// (`no-read`, `no-run`, `no-admin`: the token is the name).
fn tokens_lacking_one_role_each(dir: &Path) -> Auth {
    let path = dir.join("tokens");
    let lines: Vec<String> = Role::ALL
        .into_iter()
        .map(|lacking| {
            let roles: Vec<&str> = Role::ALL
                .into_iter()
                .filter(|r| *r != lacking)
                .map(Role::name)
                .collect();
            let name = format!("no-{lacking}");
            format!("{name} {} {}", roles.join(","), hash_token(&name))
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    Auth::Tokens(Arc::new(TokenFile::open(path).unwrap()))
}

/// Every route that needs a role answers 401 without a token and 403 to
/// a token lacking the role, before it reads or changes anything; the
/// open ones answer without a token.
async fn callers_without_the_role_are_refused(seen: &Seen) {
    let world = World::new(seen);
    let auth = tokens_lacking_one_role_each(world.dir.path());
    let (api, _) = world.serve(Setup {
        auth,
        ..Setup::default()
    });
    let request = |method: &axum::http::Method, path: &str, token: Option<&str>| {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path.replace("{id}", "kept"))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        // Bodies that would be accepted: a refusal is the check's alone.
        let body = match (method.as_str(), path) {
            ("POST", "/v1/sessions") => json!({"id": "made"}).to_string(),
            ("POST", _) => json!({"input": "x"}).to_string(),
            _ => String::new(),
        };
        req.body(Body::from(body)).unwrap()
    };
    let create = Request::post("/v1/sessions")
        .header(header::AUTHORIZATION, "Bearer no-read")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"id": "kept"}).to_string()))
        .unwrap();
    assert_eq!(api.send(create).await.status, 201);
    for route in mecated::http::route_table() {
        let (method, path) = (&route.method, route.path);
        let Access::Needs(roles) = route.access else {
            let r = api.send(request(method, path, None)).await;
            assert!(
                r.status < 400,
                "{method} {path} is open, yet answered {}",
                r.status
            );
            continue;
        };
        let r = api.send(request(method, path, None)).await;
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (401, "unauthenticated"),
            "{method} {path}"
        );
        assert_eq!(
            r.www_authenticate.as_deref(),
            Some("Bearer realm=\"mecated\"")
        );
        let r = api.send(request(method, path, Some("not-a-token"))).await;
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (401, "unauthenticated"),
            "{method} {path}"
        );
        for role in roles.iter() {
            let r = api
                .send(request(method, path, Some(&format!("no-{role}"))))
                .await;
            assert_eq!(
                (r.status, r.error_code().as_str()),
                (403, "forbidden"),
                "{method} {path}"
            );
            assert_eq!(r.json()["error"]["role"], role.name(), "{method} {path}");
        }
    }
    // Nothing was done: the one session, no event, no second session.
    let read = |path: &str| {
        Request::get(path)
            .header(header::AUTHORIZATION, "Bearer no-run")
            .body(Body::empty())
            .unwrap()
    };
    let listed = api.send(read("/v1/sessions")).await.json();
    assert_eq!(listed["sessions"], json!([{"id": "kept"}]));
    let events = api.send(read("/v1/sessions/kept/events")).await.json();
    assert_eq!(events["events"], json!([]));
}

async fn streamed_events_are_the_paged_events(seen: &Seen) {
    let world = World::new(seen);
    let (api, _) = world.serve(Setup {
        agent: Arc::new(EchoAgent::new(Duration::from_millis(30), 3)),
        ..Setup::default()
    });
    api.create("s").await;
    let r = api.stream("s").await;
    assert_eq!(r.status, 200);
    let stream = r.sse();
    let (live, end): (Vec<_>, Vec<_>) = stream.into_iter().partition(|(n, _)| n == "event");
    assert_eq!(end.len(), 1);
    let end = &end[0].1;
    assert_eq!(end["status"], "completed");
    assert_eq!(end["lagged"], false);
    let live: Vec<Value> = live.into_iter().map(|(_, d)| d).collect();
    assert_eq!(live.len(), 5, "run_started, three progress, one message");

    // Byte for byte what a paged read returns, time stamps included.
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let r = api
            .get(&format!("/v1/sessions/s/events?after={after}&limit=2"))
            .await;
        assert_eq!(r.status, 200);
        let page = r.json();
        paged.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_u64() {
            Some(n) => after = n,
            None => break,
        }
    }
    // The log also holds the run's end, recorded after the agent's last
    // event; the run's own stream ends with its `end` instead.
    let (run_end, recorded) = paged.split_last().unwrap();
    assert_eq!(run_end["payload"]["type"], "run_ended");
    assert_eq!(live, recorded);
    assert!(live.iter().all(|e| e["time_ms"].as_u64().unwrap() > 0));

    // Waiting for the result gives the same events for that run.
    let r = api.run("s").await;
    assert_eq!(r.status, 200);
    let result: RunResult = serde_json::from_slice(&r.body).unwrap();
    // After the first run's five events and its end; this run's own end
    // follows the events its result holds.
    let all: EventPage =
        serde_json::from_slice(&api.get("/v1/sessions/s/events?after=6").await.body).unwrap();
    let (end, run_events) = all.events.split_last().unwrap();
    assert_eq!(end.payload["type"], "run_ended");
    assert_eq!(result.events, run_events);
}

async fn conflicts_are_409_with_their_codes(seen: &Seen) {
    let world = World::new(seen);
    let gate = Arc::new(GateAgent::default());
    let (a, _) = world.serve(Setup {
        agent: gate.clone(),
        ..Setup::default()
    });
    let (b, _) = world.serve(Setup {
        owner: "router-b",
        ..Setup::default()
    });
    a.create("held").await;
    let pending = hold_run(&a, "held").await;

    // This process: the run is in progress here.
    let r = a.run("held").await;
    assert_eq!((r.status, r.error_code().as_str()), (409, "session_busy"));
    assert!(r.json()["error"]["retryable"].as_bool().unwrap());
    let r = a.delete("/v1/sessions/held").await;
    assert_eq!((r.status, r.error_code().as_str()), (409, "session_busy"));

    // Another process: leased elsewhere, naming the holder.
    let r = b.run("held").await;
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (409, "session_leased_elsewhere")
    );
    assert_eq!(r.json()["error"]["holder"], "router-a");
    let r = b.delete("/v1/sessions/held").await;
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (409, "session_leased_elsewhere")
    );

    // Cancel where the run is: at once.
    let r = a.delete("/v1/sessions/held/runs/current").await;
    assert_eq!(r.status, 202);
    assert_eq!(r.json()["here"], true);
    let result: RunResult = serde_json::from_slice(&pending.await.unwrap().body).unwrap();
    assert_eq!(serde_json::to_value(result.status).unwrap(), "cancelled");
    gate.open.cancel();

    // Unleased without the single-process proof: no runs, no deletes.
    let (c, _) = world.serve(Setup {
        owner: "router-c",
        leases: Leases::Unleased(Exclusivity::Unproven),
        ..Setup::default()
    });
    for r in [c.run("held").await, c.delete("/v1/sessions/held").await] {
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (409, "unleased_not_exclusive")
        );
    }

    // Unleased with the proof, on a session that has fenced writes.
    let (d, _) = world.serve(Setup {
        owner: "router-d",
        leases: Leases::Unleased(Exclusivity::ProvenSingleProcess),
        ..Setup::default()
    });
    for r in [d.run("held").await, d.delete("/v1/sessions/held").await] {
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (409, "unfenced_write_refused")
        );
    }
}

async fn unavailable_is_503_with_retry_after_when_retryable(seen: &Seen) {
    let world = World::new(seen);
    let scripted = Scripted::new(world.dir.path());
    let (api, engine) = world.serve(Setup {
        leases: Leases::Scripted(scripted.clone()),
        ..Setup::default()
    });
    api.create("s").await;

    scripted.fail_with(Some(|| LeaseError::transient("backend down")));
    for r in [api.run("s").await, api.delete("/v1/sessions/s").await] {
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (503, "lease_unavailable")
        );
    }
    // Not ready while the backend fails, ready again once a call succeeds.
    let r = api.get("/readyz").await;
    assert_eq!(r.status, 503);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(text.starts_with("lease backend failing: "), "{text}");
    assert!(text.contains("backend down"), "{text}");
    // A leased server never turns unleased: a backend that suddenly says
    // it cannot lease fails the run like any fault.
    scripted.fail_with(Some(|| LeaseError::unsupported("leases switched off")));
    let r = api.run("s").await;
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (503, "lease_unavailable")
    );
    scripted.fail_with(None);
    let r = api.run("s").await;
    assert_eq!(r.status, 200);
    assert!(
        r.json()["token"].as_u64().is_some(),
        "the run after the refusal went unleased: {:?}",
        r.json()
    );
    let r = api.get("/readyz").await;
    assert_eq!((r.status, r.body.as_slice()), (200, b"ready".as_slice()));

    // Another holder of the session's file, past the store's wait.
    let lock = world.lock_session("s");
    let busy = [
        api.post("/v1/sessions", json!({"id": "s"})).await,
        api.get("/v1/sessions").await,
        api.get("/v1/sessions/s").await,
        api.get("/v1/sessions/s/events").await,
        api.run("s").await,
        api.delete("/v1/sessions/s").await,
        api.delete("/v1/sessions/s/runs/current").await,
    ];
    for r in busy {
        assert_eq!((r.status, r.error_code().as_str()), (503, "store_busy"));
    }
    drop(lock);

    assert!(
        engine
            .shutdown(tokio::time::Instant::now() + Duration::from_secs(5))
            .await
    );
    for r in [api.run("s").await, api.delete("/v1/sessions/s").await] {
        assert_eq!((r.status, r.error_code().as_str()), (503, "shutting_down"));
        assert_eq!(r.retry_after, None, "not retryable on this process");
    }
}

async fn faults_are_500_internal(seen: &Seen) {
    let world = World::new(seen);
    let scripted = Scripted::new(world.dir.path());
    let faults = Arc::new(FaultyStore {
        inner: open_store(world.dir.path(), false),
        failing: Mutex::new(false),
    });
    let (api, _) = world.serve(Setup {
        leases: Leases::Scripted(scripted.clone()),
        faults: Some(faults.clone()),
        ..Setup::default()
    });
    api.create("s").await;

    // A backend answer that breaks the contract is the server's fault.
    scripted.fail_with(Some(|| LeaseError::invalid("nonsense")));
    for r in [api.run("s").await, api.delete("/v1/sessions/s").await] {
        assert_eq!((r.status, r.error_code().as_str()), (500, "internal"));
    }
    scripted.fail_with(None);

    *faults.failing.lock().unwrap() = true;
    let failed = [
        api.post("/v1/sessions", json!({"id": "t"})).await,
        api.get("/v1/sessions").await,
        api.get("/v1/sessions/s").await,
        api.get("/v1/sessions/s/events").await,
        api.run("s").await,
        api.delete("/v1/sessions/s").await,
        api.delete("/v1/sessions/s/runs/current").await,
    ];
    for r in failed {
        assert_eq!((r.status, r.error_code().as_str()), (500, "internal"));
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("injected fault")
        );
    }
}

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(&Seen::default()).await;
            }
        )*

        /// Every `(method, route, status)` the document lists is one the
        /// scenarios received, and the other way round (checked per call).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_documented_response_is_exercised() {
            let seen = Seen::default();
            $( super::$name(&seen).await; )*
            let seen = seen.lock().unwrap().clone();
            let missing: Vec<_> = Contract::generated()
                .documented()
                .into_iter()
                .filter(|r| !seen.contains(r))
                .collect();
            assert!(missing.is_empty(), "documented but never exercised: {missing:?}");
            assert!(seen.contains(&("get".into(), "<fallback>".into(), 404)));
        }
    };
}

mod scenarios {
    use super::{Contract, Seen};

    scenario_tests!(
        sessions_are_created_listed_described_and_deleted,
        operations_routes_answer,
        bad_input_is_400_invalid_with_the_json_error_body,
        bodies_over_the_limit_are_413,
        streamed_events_are_the_paged_events,
        conflicts_are_409_with_their_codes,
        unavailable_is_503_with_retry_after_when_retryable,
        faults_are_500_internal,
        callers_without_the_role_are_refused,
        follows_past_a_clients_limit_are_429,
    );
}

// ---------------------------------------------------------------------
// The checker itself can fail.

#[test]
fn the_contract_check_refuses_bodies_the_document_does_not_allow() {
    let contract = Contract::generated();
    let reply = |status, content_type: &str, body: Value| Reply {
        status,
        content_type: Some(content_type.into()),
        retry_after: None,
        www_authenticate: None,
        body: body.to_string().into_bytes(),
    };
    let good = reply(201, "application/json", json!({"events": 0, "id": "a"}));
    assert!(contract.check("post", "/v1/sessions", &good).is_ok());

    let wrong = [
        // An undocumented field.
        (201, json!({"events": 0, "id": "a", "extra": 1})),
        // A missing field.
        (201, json!({"id": "a"})),
        // An id breaking the id rules.
        (201, json!({"events": 0, "id": ""})),
        (201, json!({"events": 0, "id": "a\u{1}b"})),
        (201, json!({"events": 0, "id": "x".repeat(257)})),
        // An error code the document does not know.
        (
            409,
            json!({"error": {"code": "nope", "message": "m", "retryable": false}}),
        ),
        // An undocumented status.
        (
            418,
            json!({"error": {"code": "invalid", "message": "m", "retryable": false}}),
        ),
    ];
    for (status, body) in wrong {
        let r = reply(status, "application/json", body.clone());
        assert!(
            contract.check("post", "/v1/sessions", &r).is_err(),
            "{status} {body} accepted"
        );
    }

    // The old wire shapes the document now rules out.
    let old_info = reply(200, "application/json", json!({"id": "a", "events": 3}));
    assert!(contract.check("get", "/v1/sessions/a", &old_info).is_err());
    let event_without_time = format!(
        "event: event\ndata: {}\n\nevent: end\ndata: {}\n\n",
        json!({"payload": {}, "seq": 1, "token": 1}),
        json!({"lagged": false, "last_seq": null, "status": "completed", "token": 1}),
    );
    let sse = Reply {
        status: 200,
        content_type: Some("text/event-stream".into()),
        retry_after: None,
        www_authenticate: None,
        body: event_without_time.into_bytes(),
    };
    assert!(contract.check("post", "/v1/sessions/a/runs", &sse).is_err());
    let text_error = Reply {
        status: 400,
        content_type: Some("text/plain; charset=utf-8".into()),
        retry_after: None,
        www_authenticate: None,
        body: b"Invalid URL".to_vec(),
    };
    assert!(
        contract
            .check("get", "/v1/sessions/a", &text_error)
            .is_err()
    );
}

// ---------------------------------------------------------------------
// Cancel requests name the run they were made for.

/// A cancel request recorded in the store before a run began, even one
/// naming a token at or above the run's (a holder that re-acquired its own
/// live lease keeps its token), never stops that run; one recorded while it
/// runs does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_recorded_before_a_run_began_never_stops_it() {
    let seen = Seen::default();
    let world = World::new(&seen);
    let gate = Arc::new(GateAgent::default());
    let (api, _) = world.serve(Setup {
        agent: gate.clone(),
        ..Setup::default()
    });
    api.create("stale-cancel").await;
    let session = SessionId::new("stale-cancel").unwrap();
    let other_process = open_store(world.dir.path(), false);
    other_process
        .request_cancel(&session, lease_port::FencingToken::new(u64::MAX))
        .await
        .unwrap();

    let pending = hold_run(&api, "stale-cancel").await;
    // The holder's watch reads the requests at once and wakes on each
    // change: had it taken the earlier request for one aimed at this run,
    // the run would have stopped by now. Several of the polling default's
    // readings pass too.
    tokio::time::sleep(session_store::CANCEL_POLL_INTERVAL * 4).await;
    assert!(!pending.is_finished(), "an earlier request stopped the run");

    other_process
        .request_cancel(&session, lease_port::FencingToken::new(u64::MAX))
        .await
        .unwrap();
    let result: RunResult = serde_json::from_slice(&pending.await.unwrap().body).unwrap();
    assert_eq!(serde_json::to_value(result.status).unwrap(), "cancelled");
    gate.open.cancel();
}

// ---------------------------------------------------------------------
// The edges of what requests may say: a value the document permits is
// accepted, one it forbids is refused with 400 and a message that names
// what to change. Each test asks the document first, then the server.

/// Where a parameter travels.
#[derive(Clone, Copy)]
enum In {
    Query,
    Header,
}

impl Contract {
    /// The parameter `name` of `method template`, as the document has it.
    fn parameter(&self, method: &str, template: &str, place: In, name: &str) -> Value {
        let place = match place {
            In::Query => "query",
            In::Header => "header",
        };
        self.doc["paths"][template][method]["parameters"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {template} has no parameters"))
            .iter()
            .find(|p| p["in"] == place && p["name"] == name)
            .unwrap_or_else(|| panic!("{method} {template} documents no {place} {name}"))
            .clone()
    }

    /// Whether the document lets the parameter `name` carry `raw`.
    fn permits(&self, method: &str, template: &str, place: In, name: &str, raw: &str) -> bool {
        let schema = self.parameter(method, template, place, name)["schema"].clone();
        let instance = parameter_instance(&schema, raw);
        self.validate(&schema, &instance).is_ok() && within_format(&schema, &instance)
    }

    /// Whether the document lets `method template` go without `name`.
    fn permits_absent(&self, method: &str, template: &str, place: In, name: &str) -> bool {
        self.parameter(method, template, place, name)["required"] != true
    }

    /// Whether the document lets `body` be the JSON request body of
    /// `method template`.
    fn permits_body(&self, method: &str, template: &str, body: &Value) -> bool {
        let schema = self.doc["paths"][template][method]["requestBody"]["content"]
            ["application/json"]["schema"]
            .clone();
        assert!(
            !schema.is_null(),
            "{method} {template} documents no JSON body"
        );
        self.validate(&schema, body).is_ok()
    }
}

/// A parameter's text as the JSON instance its schema is checked against:
/// for an integer parameter, the integer its digits spell (one beyond
/// 64 bits too), else the text itself, which an integer schema refuses.
fn parameter_instance(schema: &Value, raw: &str) -> Value {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    let integer = schema["type"] == "integer"
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !(digits.len() > 1 && digits.starts_with('0'));
    if integer {
        serde_json::from_str(raw).unwrap()
    } else {
        Value::String(raw.to_owned())
    }
}

/// OpenAPI's integer formats are ranges (`int64`: a signed 64-bit
/// integer), which JSON Schema validators take as an annotation only.
fn within_format(schema: &Value, instance: &Value) -> bool {
    match (schema["format"].as_str(), instance) {
        (Some("int64"), Value::Number(n)) => n.as_i64().is_some(),
        (Some("int32"), Value::Number(n)) => n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
        _ => true,
    }
}

/// `reply` is what the document promises for the edge `what`: `success`
/// when `permitted`, else 400 with a message that names `name` and reads
/// as a sentence, not as Rust.
fn assert_answered_as_documented(
    reply: &Reply,
    permitted: bool,
    success: u16,
    name: &str,
    what: &str,
) {
    let body = String::from_utf8_lossy(&reply.body);
    if permitted {
        assert_eq!(
            reply.status, success,
            "the document permits {what}, the server refused it: {body}"
        );
        return;
    }
    assert_eq!(
        reply.status, 400,
        "the document forbids {what}, the server answered: {body}"
    );
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(name),
        "the refusal of {what} does not name {name}: {message}"
    );
    for debug in ["Some(", "None", "{ ", "\\\""] {
        assert!(
            !message.contains(debug),
            "the refusal of {what} reads as Rust ({debug}): {message}"
        );
    }
}

/// `continue=` with nothing after it. The server never issues an empty
/// token (the last page's `continue` is null), so an empty one is a client
/// that turned that null into text: refused, as the document says, rather
/// than read as "from the start", which would loop such a client forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_continue_is_answered_as_the_document_says() {
    let seen = Seen::default();
    let world = World::new(&seen);
    let (api, _) = world.serve(Setup::default());
    api.create("a").await;
    let contract = Contract::generated();
    let (get, list) = ("get", "/v1/sessions");
    assert!(contract.permits_absent(get, list, In::Query, "continue"));
    assert_eq!(api.get("/v1/sessions").await.status, 200);

    let permitted = contract.permits(get, list, In::Query, "continue", "");
    let r = api.get("/v1/sessions?continue=").await;
    assert_answered_as_documented(&r, permitted, 200, "continue", "an empty continue");
    assert_eq!(r.error_code(), "invalid_continue", "the code is unchanged");
}

/// `wait` on a run: optional (a run without it answers at once), and a
/// duration in the documented form, which an empty value is not; a wait
/// beyond the 60 s the server waits at most is cut to it, however long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_wait_is_answered_as_the_document_says() {
    let seen = Seen::default();
    let world = World::new(&seen);
    let (api, _) = world.serve(Setup::default());
    api.create("s").await;
    let contract = Contract::generated();
    let (post, runs) = ("post", "/v1/sessions/{id}/runs");
    let input = json!({"input": "hi"});

    let r = api.post("/v1/sessions/s/runs", input.clone()).await;
    assert_eq!(
        (
            contract.permits_absent(post, runs, In::Query, "wait"),
            r.status
        ),
        (true, 200),
        "a run without wait: the document and the server disagree"
    );

    let edges = [
        "",
        "0",
        "5",
        "250ms",
        "5s",
        "1.5m",
        "2h",
        // Far beyond any duration: cut to 60 s like any long wait.
        "99999999999999999999999h",
        "5x",
        "s",
        "-1s",
        "1.",
        " 5s",
    ];
    for raw in edges {
        let permitted = contract.permits(post, runs, In::Query, "wait", raw);
        let uri = format!("/v1/sessions/s/runs?wait={}", raw.replace(' ', "%20"));
        let r = api.post(&uri, input.clone()).await;
        assert_answered_as_documented(&r, permitted, 200, "wait", &format!("wait={raw:?}"));
    }
    assert!(
        !contract.permits(post, runs, In::Query, "wait", ""),
        "an empty wait"
    );
}

/// `after` (and `Last-Event-ID`, its twin on a follow) is a sequence
/// number, an `int64`: 2^63 - 1 is the last one, and anything beyond it
/// is refused, as the document says, not read as "past the end".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_beyond_int64_is_answered_as_the_document_says() {
    let seen = Seen::default();
    let world = World::new(&seen);
    let (api, _) = world.serve(Setup::default());
    api.create("s").await;
    assert_eq!(api.run("s").await.status, 200);
    let contract = Contract::generated();
    let (get, events) = ("get", "/v1/sessions/{id}/events");

    let edges = [
        "0",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
    ];
    for raw in edges {
        let permitted = contract.permits(get, events, In::Query, "after", raw);
        let r = api.get(&format!("/v1/sessions/s/events?after={raw}")).await;
        assert_answered_as_documented(&r, permitted, 200, "after", &format!("after={raw}"));
        if permitted && raw != "0" {
            assert_eq!(r.json()["events"], json!([]), "after={raw}");
        }
    }
    assert!(!contract.permits(get, events, In::Query, "after", "9223372036854775808"));

    // A follow from beyond the last sequence number.
    for raw in ["9223372036854775808", "18446744073709551615"] {
        assert!(!contract.permits(get, events, In::Header, "Last-Event-ID", raw));
        let r = api
            .send(
                Request::get("/v1/sessions/s/events")
                    .header(header::ACCEPT, "text/event-stream")
                    .header("last-event-id", raw)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        let what = format!("Last-Event-ID: {raw}");
        assert_answered_as_documented(&r, false, 200, "Last-Event-ID", &what);
    }
}

/// `input` may be any JSON value, `null` included, and is handed to the
/// agent as it is; leaving it out is what the document refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_input_is_answered_as_the_document_says() {
    let seen = Seen::default();
    let world = World::new(&seen);
    let (api, _) = world.serve(Setup::default());
    api.create("s").await;
    let contract = Contract::generated();
    let (post, runs) = ("post", "/v1/sessions/{id}/runs");

    let null = json!({"input": null});
    let permitted = contract.permits_body(post, runs, &null);
    let r = api.post("/v1/sessions/s/runs", null).await;
    assert_answered_as_documented(&r, permitted, 200, "input", "input: null");
    assert!(permitted, "the document refuses a null input");
    let result: RunResult = serde_json::from_slice(&r.body).unwrap();
    let echoed = result.events.last().expect("the echo").payload.clone();
    assert_eq!(
        (&echoed["type"], &echoed["content"]),
        (&json!("message"), &Value::Null),
        "the agent got another input than null: {echoed}"
    );

    let missing = json!({});
    let permitted = contract.permits_body(post, runs, &missing);
    let r = api.post("/v1/sessions/s/runs", missing).await;
    assert_answered_as_documented(&r, permitted, 200, "input", "no input");
}
