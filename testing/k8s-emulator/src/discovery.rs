//! Serves: kubectl only — kube-rs, as k8slease uses it, asks for no discovery document.
//!
//! The discovery documents clients read before they touch a resource.

use serde_json::{Value, json};

use crate::verb::Verb;

/// The Kubernetes version the emulator claims to be (the API rules it
/// follows are those of this release).
pub(crate) const MAJOR: &str = "1";
pub(crate) const MINOR: &str = "33";

pub(crate) fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": format!("v{MAJOR}.{MINOR}.0"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub(crate) fn root_paths() -> Value {
    json!({"paths": [
        "/api", "/api/v1", "/apis", "/apis/coordination.k8s.io",
        "/apis/coordination.k8s.io/v1", "/version",
    ]})
}

pub(crate) fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    })
}

fn coordination_group() -> Value {
    let version = json!({"groupVersion": "coordination.k8s.io/v1", "version": "v1"});
    json!({
        "name": "coordination.k8s.io",
        "versions": [version.clone()],
        "preferredVersion": version,
    })
}

pub(crate) fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [coordination_group()]})
}

pub(crate) fn api_group() -> Value {
    let mut group = coordination_group();
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    group
}

pub(crate) fn coordination_resources() -> Value {
    let verbs: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "coordination.k8s.io/v1",
        "resources": [{
            "name": "leases",
            "singularName": "lease",
            "namespaced": true,
            "kind": "Lease",
            "verbs": verbs,
            "storageVersionHash": "gqkMMb/YqFM=",
        }],
    })
}

pub(crate) fn core_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "namespaces",
                "singularName": "namespace",
                "namespaced": false,
                "kind": "Namespace",
                "verbs": ["get", "list"],
                "shortNames": ["ns"],
            },
            {
                "name": "events",
                "singularName": "event",
                "namespaced": true,
                "kind": "Event",
                "verbs": ["list"],
                "shortNames": ["ev"],
            },
        ],
    })
}
