//! Serves: both — every request: k8slease's get, list, create and update beside kubectl's list and watch.
//!
//! HTTP serving: the accept loop (each connection can be cut mid-request),
//! routing, authentication, authorization, faults and the lease handlers.

use std::{collections::HashMap, convert::Infallible, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::Response,
};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Notify,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::{
    core_v1,
    counters::{ConnectionCounters, RequestCounters},
    decode::{API_VERSION, FieldValidation, decode_lease, parse_json, to_value},
    discovery,
    faults::{DroppedReply, Failure, Faults},
    list, openapi,
    patch::{PATCH_TYPES, PatchType, json_patch, merge_patch, strategic_merge_patch},
    rbac::{Identity, Rbac},
    selector::Selector,
    status::{ApiError, GROUP, json_response},
    store::{Preconditions, Store, UpdateKind},
    table,
    tls::HANDSHAKE_RECORD,
    verb::Verb,
    watch,
};

/// The API server's limit on a request body.
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Everything a request handler reaches.
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) rbac: Rbac,
    pub(crate) faults: Faults,
    pub(crate) counters: RequestCounters,
    pub(crate) connections: ConnectionCounters,
    pub(crate) shutdown: CancellationToken,
    pub(crate) address: SocketAddr,
}

/// Put in each request's extensions: closes its connection unanswered.
#[derive(Clone)]
struct ConnectionKill(Arc<Notify>);

/// Accepts connections until `shutdown`; each is served by hyper directly
/// so a handler can drop the connection without a reply. A connection that
/// opens with a TLS handshake gets TLS, any other plain HTTP.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, tls: TlsAcceptor) {
    let router = Router::new().fallback(dispatch).with_state(shared.clone());
    loop {
        let accepted = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors or a reset before accept: try again soon.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let counted = shared.connections.accepted_one();
        // Small request/reply exchanges: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let shutdown = shared.shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _counted = counted;
            let mut first = [0u8; 1];
            let peeked = tokio::select! {
                () = shutdown.cancelled() => return,
                peeked = stream.peek(&mut first) => peeked,
            };
            match peeked {
                Ok(1) if first[0] == HANDSHAKE_RECORD => {
                    let handshake = tokio::select! {
                        () = shutdown.cancelled() => return,
                        handshake = tls.accept(stream) => handshake,
                    };
                    // A failed handshake is the client's problem to report.
                    if let Ok(stream) = handshake {
                        serve_connection(stream, router, shutdown).await;
                    }
                }
                Ok(_) => serve_connection(stream, router, shutdown).await,
                Err(_) => {}
            }
        });
    }
}

async fn serve_connection<I>(io: I, router: Router, shutdown: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let kill = Arc::new(Notify::new());
    let handle = ConnectionKill(kill.clone());
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(handle.clone());
            let mut router = router.clone();
            async move {
                let response: Result<Response, Infallible> =
                    router.call(request.map(Body::new)).await;
                response
            }
        });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = connection => {}
        () = kill.notified() => {}
        () = shutdown.cancelled() => {}
    }
}

/// The query string as a map (later repeats win), percent-decoded.
pub(crate) fn query_map(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_true(value: Option<&String>) -> bool {
    value.is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Which resource a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `/apis/coordination.k8s.io/v1[/namespaces/{ns}]/leases[/{name}]`
    Leases {
        namespace: Option<String>,
        name: Option<String>,
    },
    /// `/api/v1/namespaces[/{name}]`
    Namespaces { name: Option<String> },
    /// `/api/v1/namespaces/{ns}/events`
    Events { namespace: String },
}

impl Target {
    fn resource(&self) -> &'static str {
        match self {
            Target::Leases { .. } => "leases",
            Target::Namespaces { .. } => "namespaces",
            Target::Events { .. } => "events",
        }
    }

    fn group(&self) -> &'static str {
        match self {
            Target::Leases { .. } => GROUP,
            _ => "",
        }
    }
}

enum Route {
    Document(Value),
    Resource(Target),
    Missing,
}

fn route(path: &str, shared: &Shared) -> Route {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let text = |s: &&str| s.to_string();
    match segments.as_slice() {
        [] => Route::Document(discovery::root_paths()),
        ["version"] => Route::Document(discovery::version()),
        ["api"] => Route::Document(discovery::api_versions(&shared.address.to_string())),
        ["api", "v1"] => Route::Document(discovery::core_resources()),
        ["apis"] => Route::Document(discovery::api_group_list()),
        ["apis", "coordination.k8s.io"] => Route::Document(discovery::api_group()),
        ["apis", "coordination.k8s.io", "v1"] => {
            Route::Document(discovery::coordination_resources())
        }
        ["openapi", "v3"] => Route::Document(openapi::index()),
        ["openapi", "v3", rest @ ..] if openapi::serves(&rest.join("/")) => {
            Route::Document(openapi::group_version_document())
        }
        ["apis", "coordination.k8s.io", "v1", "leases"] => Route::Resource(Target::Leases {
            namespace: None,
            name: None,
        }),
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
        ] => Route::Resource(Target::Leases {
            namespace: Some(text(ns)),
            name: None,
        }),
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
            name,
        ] => Route::Resource(Target::Leases {
            namespace: Some(text(ns)),
            name: Some(text(name)),
        }),
        ["api", "v1", "namespaces"] => Route::Resource(Target::Namespaces { name: None }),
        ["api", "v1", "namespaces", name] => Route::Resource(Target::Namespaces {
            name: Some(text(name)),
        }),
        ["api", "v1", "namespaces", ns, "events"] => Route::Resource(Target::Events {
            namespace: text(ns),
        }),
        _ => Route::Missing,
    }
}

/// The verb of a request, as the API server's request-info resolver
/// derives it from method, path and `watch`.
fn verb_of(method: &Method, target: &Target, query: &HashMap<String, String>) -> Option<Verb> {
    let named = match target {
        Target::Leases { name, .. } | Target::Namespaces { name } => name.is_some(),
        Target::Events { .. } => false,
    };
    let cluster_wide = matches!(
        target,
        Target::Leases {
            namespace: None,
            ..
        }
    );
    let verb = match (method.as_str(), named) {
        ("GET", false) if is_true(query.get("watch")) => Verb::Watch,
        ("GET", false) => Verb::List,
        ("GET", true) => Verb::Get,
        ("POST", false) if !cluster_wide => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) if !cluster_wide => Verb::DeleteCollection,
        _ => return None,
    };
    let allowed = match target {
        Target::Leases { .. } => true,
        Target::Namespaces { .. } => matches!(verb, Verb::Get | Verb::List),
        Target::Events { .. } => verb == Verb::List,
    };
    allowed.then_some(verb)
}

async fn dispatch(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    match route(&path, &shared) {
        Route::Document(document) => {
            shared.counters.record_non_resource();
            if request.method() != Method::GET {
                return ApiError::method_not_allowed().into();
            }
            json_response(StatusCode::OK, &document)
        }
        Route::Missing => {
            shared.counters.record_non_resource();
            ApiError::no_such_resource().into()
        }
        Route::Resource(target) => resource_request(&shared, target, request).await,
    }
}

impl From<ApiError> for Response {
    fn from(error: ApiError) -> Self {
        axum::response::IntoResponse::into_response(error)
    }
}

async fn resource_request(shared: &Arc<Shared>, target: Target, request: Request) -> Response {
    let query = query_map(request.uri().query());
    let Some(verb) = verb_of(request.method(), &target, &query) else {
        shared.counters.record_non_resource();
        return ApiError::method_not_allowed().into();
    };
    shared.counters.record(verb, target.resource());

    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = match shared.rbac.identify(authorization) {
        Identity::User(user) => user,
        Identity::Unknown => return ApiError::unauthorized().into(),
    };

    let latency = shared.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(failure) = shared.faults.take_failure(verb) {
        return match failure {
            Failure::InternalError => ApiError::internal("injected fault"),
            Failure::ServiceUnavailable => ApiError::service_unavailable(),
            Failure::GatewayTimeout => ApiError::timeout(),
        }
        .into();
    }

    let (namespace, name) = match &target {
        Target::Leases { namespace, name } => (namespace.clone(), name.clone()),
        Target::Namespaces { name } => (None, name.clone()),
        Target::Events { namespace } => (Some(namespace.clone()), None),
    };
    if !shared.rbac.permits(&user, verb, target.resource()) {
        return ApiError::forbidden(
            &user,
            verb.as_str(),
            target.resource(),
            target.group(),
            name.as_deref(),
            namespace.as_deref(),
        )
        .into();
    }
    if !accepts_json(request.headers()) {
        return ApiError::not_acceptable().into();
    }

    let kill = request.extensions().get::<ConnectionKill>().cloned();
    let outcome = match target {
        Target::Leases { namespace, name } => {
            leases(shared, verb, namespace, name, &query, request).await
        }
        Target::Namespaces { name } => Ok(core_v1::namespaces(shared, name.as_deref())),
        Target::Events { .. } => Ok(core_v1::events(shared)),
    };
    let response = match outcome {
        Ok(response) => response,
        Err(error) => return error.into(),
    };
    if verb != Verb::Watch
        && response.status().is_success()
        && let Some(dropped) = shared.faults.take_drop(verb)
    {
        match dropped {
            DroppedReply::Timeout => return ApiError::timeout().into(),
            DroppedReply::CloseConnection => {
                if let Some(ConnectionKill(kill)) = kill {
                    kill.notify_one();
                    // The connection task drops this future with the
                    // connection; no reply is ever written.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    response
}

/// JSON unless the client accepts only other types (protobuf, CBOR).
fn accepts_json(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    accept.split(',').any(|part| {
        let media = part.split(';').next().unwrap_or("").trim();
        matches!(media, "application/json" | "application/*" | "*/*" | "")
    })
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

async fn read_body(request: Request) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            ApiError::bad_request(format!(
                "Request entity too large: limit is {MAX_BODY_BYTES}"
            ))
        })
}

/// Bodies of POST and PUT: JSON only (what kubectl and kube-rs send).
fn require_json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let media = content_type(headers);
    let media = media.split(';').next().unwrap_or("").trim().to_string();
    if media.is_empty() || media == "application/json" {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(&["application/json"]))
    }
}

fn lease_response(code: StatusCode, lease: &Lease, warnings: &[String]) -> Response {
    let mut response = json_response(code, &to_value(lease));
    for warning in warnings {
        let text = format!("299 - {}", serde_json::Value::String(warning.clone()));
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

fn dry_run(query: &HashMap<String, String>) -> Result<bool, ApiError> {
    match query.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
        ))),
    }
}

async fn leases(
    shared: &Arc<Shared>,
    verb: Verb,
    namespace: Option<String>,
    name: Option<String>,
    query: &HashMap<String, String>,
    request: Request,
) -> Result<Response, ApiError> {
    let ns = namespace.clone().unwrap_or_default();
    let name = name.unwrap_or_default();
    let selector = || {
        Selector::parse(
            query.get("labelSelector").map(String::as_str),
            query.get("fieldSelector").map(String::as_str),
        )
    };
    match verb {
        Verb::Get => {
            let lease = shared
                .store
                .get(&ns, &name)
                .ok_or_else(|| ApiError::lease_not_found(&name))?;
            if table::wanted(request.headers()) {
                let revision = lease.metadata.resource_version.clone().unwrap_or_default();
                return Ok(json_response(
                    StatusCode::OK,
                    &table::render(&[lease], &revision, query),
                ));
            }
            Ok(lease_response(StatusCode::OK, &lease, &[]))
        }
        Verb::List => {
            let selector = selector()?;
            let (items, revision) = shared.store.list(namespace.as_deref(), &selector);
            list::response(items, revision, query, request.headers())
        }
        Verb::Watch => {
            let selector = selector()?;
            watch::respond(
                shared,
                namespace,
                selector,
                query,
                table::wanted(request.headers()),
            )
        }
        Verb::Create => {
            require_json_body(request.headers())?;
            let validation =
                FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?;
            let dry = dry_run(query)?;
            let body = read_body(request).await?;
            let decoded = decode_lease(parse_json(&body)?, validation)?;
            let mut lease = decoded.lease;
            match lease.metadata.namespace.as_deref() {
                None | Some("") => lease.metadata.namespace = Some(ns.clone()),
                Some(given) if given == ns => {}
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
            let created = shared.store.create(&ns, lease, dry)?;
            Ok(lease_response(
                StatusCode::CREATED,
                &created,
                &decoded.warnings,
            ))
        }
        Verb::Update => {
            require_json_body(request.headers())?;
            let validation =
                FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?;
            let dry = dry_run(query)?;
            let body = read_body(request).await?;
            let decoded = decode_lease(parse_json(&body)?, validation)?;
            let (stored, created) =
                shared
                    .store
                    .update(&ns, &name, UpdateKind::Replace, dry, |_| Ok(decoded.lease))?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(lease_response(code, &stored, &decoded.warnings))
        }
        Verb::Patch => {
            let media = content_type(request.headers());
            let patch_type = PatchType::from_content_type(&media)
                .ok_or_else(|| ApiError::unsupported_media_type(PATCH_TYPES))?;
            let validation =
                FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?;
            let dry = dry_run(query)?;
            let body = read_body(request).await?;
            patch(
                shared, &ns, &name, patch_type, &body, validation, dry, query,
            )
        }
        Verb::Delete => {
            let dry = dry_run(query)?;
            let body = read_body(request).await?;
            let preconditions = delete_preconditions(&body)?;
            let (lease, gone) = shared.store.delete(&ns, &name, &preconditions, dry)?;
            if !gone {
                return Ok(lease_response(StatusCode::OK, &lease, &[]));
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {
                        "name": name,
                        "group": GROUP,
                        "kind": "leases",
                        "uid": lease.metadata.uid,
                    },
                }),
            ))
        }
        Verb::DeleteCollection => {
            let selector = selector()?;
            let dry = dry_run(query)?;
            let deleted = shared.store.delete_collection(&ns, &selector, dry);
            let revision = shared.store.revision();
            list::response(deleted, revision, &HashMap::new(), &HeaderMap::new())
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn patch(
    shared: &Shared,
    namespace: &str,
    name: &str,
    patch_type: PatchType,
    body: &[u8],
    validation: FieldValidation,
    dry: bool,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let patch = serde_json::from_slice::<Value>(body).map_err(|e| match patch_type {
        // The emulator reads apply configurations as JSON, which kubectl
        // sends; YAML-only syntax is refused plainly.
        PatchType::Apply => ApiError::bad_request(format!(
            "error decoding YAML: this server reads apply configurations as JSON: {e}"
        )),
        _ => ApiError::bad_request(format!("error decoding patch: {e}")),
    })?;
    let kind = if patch_type == PatchType::Apply {
        if query.get("fieldManager").is_none_or(String::is_empty) {
            return Err(ApiError::unprocessable(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        let typed = patch.get("apiVersion").and_then(Value::as_str) == Some(API_VERSION)
            && patch.get("kind").and_then(Value::as_str) == Some("Lease");
        if !typed {
            return Err(ApiError::bad_request(
                "invalid object type: apply configurations need apiVersion coordination.k8s.io/v1 and kind Lease",
            ));
        }
        UpdateKind::Apply
    } else {
        UpdateKind::Patch
    };
    let mut warnings = Vec::new();
    let (stored, created) = shared
        .store
        .update(namespace, name, kind, dry, |existing| {
            let mut document = match existing {
                Some(lease) => to_value(lease),
                None => json!({}),
            };
            match patch_type {
                PatchType::Json => json_patch(&mut document, &patch)?,
                PatchType::Merge | PatchType::Apply => merge_patch(&mut document, &patch),
                PatchType::StrategicMerge => strategic_merge_patch(&mut document, &patch)?,
            }
            let decoded = decode_lease(document, validation)?;
            warnings = decoded.warnings;
            Ok(decoded.lease)
        })?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(lease_response(code, &stored, &warnings))
}

/// `DeleteOptions.preconditions` from a DELETE body (which may be empty).
fn delete_preconditions(body: &[u8]) -> Result<Preconditions, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Preconditions::default());
    }
    let options: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
    let field = |key: &str| -> Result<Option<String>, ApiError> {
        match options.get("preconditions").and_then(|p| p.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ApiError::bad_request(format!(
                "error decoding DeleteOptions: preconditions.{key} must be a string, got {other}"
            ))),
        }
    };
    Ok(Preconditions {
        uid: field("uid")?,
        resource_version: field("resourceVersion")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        let q = query_map(Some("labelSelector=app%3Dweb%2Ctier&watch=1&x"));
        assert_eq!(q["labelSelector"], "app=web,tier");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
