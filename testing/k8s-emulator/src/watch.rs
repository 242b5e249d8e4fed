//! Serves: both — `kubectl get --watch`, and k8slease's watch of the sessions
//! on an owner lease.
//!
//! `?watch=1`: a chunked stream of `{"type", "object"}` lines.

use std::{collections::HashMap, collections::VecDeque, sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    http::{HeaderValue, StatusCode, header},
    response::Response,
};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use crate::{
    decode::{API_VERSION, KIND, to_value},
    selector::Selector,
    server::Shared,
    status::ApiError,
    store::{Event, EventKind, WatchStart},
    table,
};

struct WatchState {
    backlog: VecDeque<Arc<Event>>,
    /// A BOOKMARK closing the initial events (`sendInitialEvents=true`).
    initial_end: Option<u64>,
    /// An ERROR event to send, then end.
    error: Option<ApiError>,
    feed: Option<broadcast::Receiver<Arc<Event>>>,
    namespace: Option<String>,
    selector: Selector,
    deadline: Option<tokio::time::Instant>,
    shutdown: CancellationToken,
    as_table: bool,
    query: HashMap<String, String>,
}

impl WatchState {
    fn in_scope(&self, lease: &Lease) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| lease.metadata.namespace.as_deref() == Some(ns))
            && self.selector.matches(lease)
    }

    /// What a client filtering by namespace and selector sees of an event:
    /// an object that starts matching is ADDED, one that stops is DELETED.
    fn visible(&self, event: &Event) -> Option<EventKind> {
        let now = self.in_scope(&event.object);
        match event.kind {
            EventKind::Added => now.then_some(EventKind::Added),
            EventKind::Deleted => now.then_some(EventKind::Deleted),
            EventKind::Modified => {
                let before = event.previous.as_ref().is_some_and(|p| self.in_scope(p));
                match (before, now) {
                    (true, true) => Some(EventKind::Modified),
                    (false, true) => Some(EventKind::Added),
                    (true, false) => Some(EventKind::Deleted),
                    (false, false) => None,
                }
            }
        }
    }

    fn object(&self, lease: &Lease) -> Value {
        if self.as_table {
            let revision = lease.metadata.resource_version.clone().unwrap_or_default();
            table::render(std::slice::from_ref(lease), &revision, &self.query)
        } else {
            to_value(lease)
        }
    }

    fn render(&self, event: &Event) -> Option<Bytes> {
        let kind = self.visible(event)?;
        Some(line(
            &json!({"type": kind.as_str(), "object": self.object(&event.object)}),
        ))
    }
}

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

async fn next_line(mut state: WatchState) -> Option<(Result<Bytes, std::io::Error>, WatchState)> {
    loop {
        if let Some(error) = state.error.take() {
            state.feed = None;
            let event = json!({"type": "ERROR", "object": error.to_status()});
            return Some((Ok(line(&event)), state));
        }
        if let Some(event) = state.backlog.pop_front() {
            if let Some(bytes) = state.render(&event) {
                return Some((Ok(bytes), state));
            }
            continue;
        }
        if let Some(revision) = state.initial_end.take() {
            let bookmark = json!({
                "type": "BOOKMARK",
                "object": {
                    "kind": KIND,
                    "apiVersion": API_VERSION,
                    "metadata": {
                        "resourceVersion": revision.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                    "spec": {},
                },
            });
            return Some((Ok(line(&bookmark)), state));
        }
        let feed = state.feed.as_mut()?;
        let deadline = state.deadline;
        let expired = async move {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let received = tokio::select! {
            () = state.shutdown.cancelled() => return None,
            () = expired => return None,
            received = feed.recv() => received,
        };
        match received {
            Ok(event) => {
                if let Some(bytes) = state.render(&event) {
                    return Some((Ok(bytes), state));
                }
            }
            // A watcher that fell behind is closed, as the API server
            // does; the client resumes from its last resourceVersion.
            Err(RecvError::Lagged(_) | RecvError::Closed) => return None,
        }
    }
}

/// Starts a watch for leases in `namespace` (all when `None`).
pub(crate) fn respond(
    shared: &Arc<Shared>,
    namespace: Option<String>,
    selector: Selector,
    query: &HashMap<String, String>,
    as_table: bool,
) -> Result<Response, ApiError> {
    let send_initial = query.get("sendInitialEvents").map(String::as_str);
    let version = query
        .get("resourceVersion")
        .map(String::as_str)
        .filter(|v| !v.is_empty());
    let start = match (send_initial, version) {
        (Some("true"), _) | (_, None | Some("0")) => WatchStart::WithCurrentState,
        (_, Some(v)) => WatchStart::After(
            v.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version \"{v}\"")))?,
        ),
    };
    let timeout = match query.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => Some(
            t.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds \"{t}\"")))?,
        ),
        None => None,
    };
    let mut state = WatchState {
        backlog: VecDeque::new(),
        initial_end: None,
        error: None,
        feed: None,
        namespace,
        selector,
        deadline: timeout.map(|t| tokio::time::Instant::now() + Duration::from_secs(t)),
        shutdown: shared.shutdown.clone(),
        as_table,
        query: query.clone(),
    };
    match shared.store.watch(start) {
        Ok(started) => {
            state.backlog = started.backlog.into();
            state.feed = Some(started.feed);
            if send_initial == Some("true") {
                state.initial_end = Some(started.revision);
            }
        }
        // A resourceVersion older than the history kept is reported in the
        // stream, as the API server does, not as the HTTP status.
        Err(error) => state.error = Some(error),
    }
    let body = Body::from_stream(futures_util::stream::unfold(state, next_line));
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
