//! Serves: kubectl only — `kubectl get namespaces` and `kubectl describe` read these.
//!
//! The core `v1` resources kubectl reads beside leases: namespaces and an
//! always-empty event list.

use axum::{http::StatusCode, response::Response};
use serde_json::{Value, json};

use crate::{
    server::Shared,
    status::{ApiError, json_response},
    store::NamespaceRecord,
};

/// `GET /api/v1/namespaces[/{name}]`: the namespaces the emulator serves.
pub(crate) fn namespaces(shared: &Shared, name: Option<&str>) -> Response {
    let render = |name: &str, record: &NamespaceRecord| {
        json!({
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": record.uid,
                "resourceVersion": record.resource_version.to_string(),
                "creationTimestamp": record.created,
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        })
    };
    match name {
        Some(name) => match shared.store.namespace(name) {
            Some(record) => json_response(StatusCode::OK, &render(name, &record)),
            None => ApiError::namespace_not_found(name).into(),
        },
        None => {
            let (all, revision) = shared.store.namespaces();
            let items: Vec<Value> = all.iter().map(|(n, r)| render(n, r)).collect();
            json_response(
                StatusCode::OK,
                &json!({
                    "kind": "NamespaceList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": revision.to_string()},
                    "items": items,
                }),
            )
        }
    }
}

/// `GET /api/v1/namespaces/{ns}/events`: no events, ever.
pub(crate) fn events(shared: &Shared) -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "kind": "EventList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": shared.store.revision().to_string()},
            "items": [],
        }),
    )
}
