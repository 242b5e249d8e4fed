//! Serves: kubectl only — `kubectl apply`, `edit` and `explain` read it; kube-rs never does.
//!
//! The OpenAPI v3 document of `coordination.k8s.io/v1`. kubectl reads it to
//! learn that the server validates fields itself (`fieldValidation`), to
//! compute `kubectl apply` patches and for `kubectl explain`.

use serde_json::{Value, json};

const GROUP_VERSION_PATH: &str = "apis/coordination.k8s.io/v1";
/// Changes whenever the document below changes, so clients' caches do too.
const DOCUMENT_HASH: &str = "k8semu-lease-v1-1";

/// `/openapi/v3`: where each group version's document is.
pub(crate) fn index() -> Value {
    json!({"paths": {
        GROUP_VERSION_PATH: {
            "serverRelativeURL": format!("/openapi/v3/{GROUP_VERSION_PATH}?hash={DOCUMENT_HASH}")
        }
    }})
}

/// Whether `path` (after `/openapi/v3/`) names the document served.
pub(crate) fn serves(path: &str) -> bool {
    path == GROUP_VERSION_PATH
}

fn gvk(kind: &str) -> Value {
    json!([{"group": "coordination.k8s.io", "kind": kind, "version": "v1"}])
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn query(name: &str, description: &str, kind: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": kind, "uniqueItems": true}})
}

fn write_parameters(with_force: bool) -> Value {
    let mut parameters = vec![
        query(
            "dryRun",
            "When present, indicates that modifications should not be persisted. Valid value: All.",
            "string",
        ),
        query(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
            "string",
        ),
        query(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values: Ignore, Warn, Strict.",
            "string",
        ),
    ];
    if with_force {
        parameters.push(query(
            "force",
            "Force is going to \"force\" Apply requests.",
            "boolean",
        ));
    }
    Value::Array(parameters)
}

fn operation(id: &str, action: &str, kind: &str, parameters: Value, body: Option<Value>) -> Value {
    let mut op = json!({
        "operationId": id,
        "tags": ["coordination_v1"],
        "parameters": parameters,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": reference(kind)}}},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"},
    });
    if let Some(body) = body {
        op["requestBody"] = body;
    }
    op
}

fn json_body(name: &str) -> Value {
    json!({"required": true, "content": {"*/*": {"schema": reference(name)}}})
}

fn patch_body() -> Value {
    let patch = json!({"schema": {"type": "object"}});
    json!({"required": true, "content": {
        "application/apply-patch+yaml": patch,
        "application/json-patch+json": patch,
        "application/merge-patch+json": patch,
        "application/strategic-merge-patch+json": patch,
    }})
}

fn path_parameters(named: bool) -> Value {
    let mut parameters = vec![json!({
        "name": "namespace", "in": "path", "required": true,
        "description": "object name and auth scope, such as for teams and projects",
        "schema": {"type": "string", "uniqueItems": true},
    })];
    if named {
        parameters.insert(
            0,
            json!({"name": "name", "in": "path", "required": true,
                   "description": "name of the Lease", "schema": {"type": "string", "uniqueItems": true}}),
        );
    }
    Value::Array(parameters)
}

fn schemas() -> Value {
    let lease = "io.k8s.api.coordination.v1.Lease";
    let spec = "io.k8s.api.coordination.v1.LeaseSpec";
    let meta = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
    let list_meta = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
    let owner = "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference";
    let managed = "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry";
    let micro = "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime";
    let time = "io.k8s.apimachinery.pkg.apis.meta.v1.Time";
    let string = json!({"type": "string", "default": ""});
    let string_map =
        json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}});
    json!({
        lease: {
            "description": "Lease defines a lease concept.",
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                "metadata": {"description": "More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata", "default": {}, "allOf": [reference(meta)]},
                "spec": {"description": "spec contains the specification of the Lease.", "default": {}, "allOf": [reference(spec)]},
            },
            "x-kubernetes-group-version-kind": gvk("Lease"),
        },
        "io.k8s.api.coordination.v1.LeaseList": {
            "description": "LeaseList is a list of Lease objects.",
            "type": "object",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "items": {"type": "array", "items": {"default": {}, "allOf": [reference(lease)]}},
                "metadata": {"default": {}, "allOf": [reference(list_meta)]},
            },
            "x-kubernetes-group-version-kind": gvk("LeaseList"),
        },
        spec: {
            "description": "LeaseSpec is a specification of a Lease.",
            "type": "object",
            "properties": {
                "acquireTime": {"description": "acquireTime is a time when the current lease was acquired.", "allOf": [reference(micro)]},
                "holderIdentity": {"type": "string", "description": "holderIdentity contains the identity of the holder of a current lease."},
                "leaseDurationSeconds": {"type": "integer", "format": "int32", "description": "leaseDurationSeconds is a duration that candidates for a lease need to wait to force acquire it."},
                "leaseTransitions": {"type": "integer", "format": "int32", "description": "leaseTransitions is the number of transitions of a lease between holders."},
                "preferredHolder": {"type": "string", "description": "PreferredHolder signals to a lease holder that the lease has a more optimal holder and should be given up. This field can only be set if Strategy is also set."},
                "renewTime": {"description": "renewTime is a time when the current holder of a lease has last updated the lease.", "allOf": [reference(micro)]},
                "strategy": {"type": "string", "description": "Strategy indicates the strategy for picking the leader for coordinated leader election."},
            },
        },
        meta: {
            "description": "ObjectMeta is metadata that all persisted resources must have.",
            "type": "object",
            "properties": {
                "annotations": string_map,
                "creationTimestamp": {"allOf": [reference(time)]},
                "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
                "deletionTimestamp": {"allOf": [reference(time)]},
                "finalizers": {"type": "array", "items": string, "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
                "generateName": {"type": "string"},
                "generation": {"type": "integer", "format": "int64"},
                "labels": string_map,
                "managedFields": {"type": "array", "items": {"default": {}, "allOf": [reference(managed)]}, "x-kubernetes-list-type": "atomic"},
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "ownerReferences": {
                    "type": "array",
                    "items": {"default": {}, "allOf": [reference(owner)]},
                    "x-kubernetes-list-map-keys": ["uid"],
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-patch-merge-key": "uid",
                    "x-kubernetes-patch-strategy": "merge",
                },
                "resourceVersion": {"type": "string"},
                "selfLink": {"type": "string"},
                "uid": {"type": "string"},
            },
        },
        list_meta: {
            "type": "object",
            "properties": {
                "continue": {"type": "string"},
                "remainingItemCount": {"type": "integer", "format": "int64"},
                "resourceVersion": {"type": "string"},
                "selfLink": {"type": "string"},
            },
        },
        owner: {
            "type": "object",
            "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {
                "apiVersion": string,
                "blockOwnerDeletion": {"type": "boolean"},
                "controller": {"type": "boolean"},
                "kind": string,
                "name": string,
                "uid": string,
            },
            "x-kubernetes-map-type": "atomic",
        },
        managed: {
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "fieldsType": {"type": "string"},
                "fieldsV1": {"type": "object"},
                "manager": {"type": "string"},
                "operation": {"type": "string"},
                "subresource": {"type": "string"},
                "time": {"allOf": [reference(time)]},
            },
        },
        "io.k8s.apimachinery.pkg.apis.meta.v1.Status": {
            "description": "Status is a return value for calls that don't return other objects.",
            "type": "object",
        },
        micro: {"type": "string", "format": "date-time", "description": "MicroTime is version of Time with microsecond level precision."},
        time: {"type": "string", "format": "date-time", "description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON."},
    })
}

/// The `coordination.k8s.io/v1` document.
pub(crate) fn group_version_document() -> Value {
    let collection = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases";
    let item = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}";
    let lease = "io.k8s.api.coordination.v1.Lease";
    let list = "io.k8s.api.coordination.v1.LeaseList";
    let read = json!([]);
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", crate::discovery::MAJOR, crate::discovery::MINOR)},
        "paths": {
            "/apis/coordination.k8s.io/v1/leases": {
                "get": operation("listCoordinationV1LeaseForAllNamespaces", "list", list, read.clone(), None),
            },
            collection: {
                "parameters": path_parameters(false),
                "get": operation("listCoordinationV1NamespacedLease", "list", list, read.clone(), None),
                "post": operation("createCoordinationV1NamespacedLease", "post", lease, write_parameters(false), Some(json_body(lease))),
                "delete": operation("deleteCoordinationV1CollectionNamespacedLease", "deletecollection", "io.k8s.apimachinery.pkg.apis.meta.v1.Status", read.clone(), None),
            },
            item: {
                "parameters": path_parameters(true),
                "get": operation("readCoordinationV1NamespacedLease", "get", lease, read.clone(), None),
                "put": operation("replaceCoordinationV1NamespacedLease", "put", lease, write_parameters(false), Some(json_body(lease))),
                "patch": operation("patchCoordinationV1NamespacedLease", "patch", lease, write_parameters(true), Some(patch_body())),
                "delete": operation("deleteCoordinationV1NamespacedLease", "delete", "io.k8s.apimachinery.pkg.apis.meta.v1.Status", read, None),
            },
        },
        "components": {"schemas": schemas()},
    })
}
