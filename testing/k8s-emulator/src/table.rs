//! Serves: kubectl only — `kubectl get` asks for Tables; kube-rs asks for plain JSON.
//!
//! `meta.k8s.io/v1` Table replies, which `kubectl get` asks for: the
//! columns the API server prints for leases (Name, Holder, Age).

use std::collections::HashMap;

use axum::http::{HeaderMap, header};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};

/// Whether the client asked for a `meta.k8s.io` Table (kubectl get does).
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|accept| accept.split(',').next())
        .is_some_and(|first| first.contains("as=Table") && first.contains("g=meta.k8s.io"))
}

fn columns() -> Value {
    json!([
        {"name": "Name", "type": "string", "format": "name", "priority": 0,
         "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated."},
        {"name": "Holder", "type": "string", "format": "", "priority": 0,
         "description": "holderIdentity contains the identity of the holder of a current lease."},
        {"name": "Age", "type": "string", "format": "", "priority": 0,
         "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
    ])
}

/// A Table of `leases`, each row carrying the object as `includeObject`
/// asks (`Metadata` unless told otherwise).
pub(crate) fn render(leases: &[Lease], revision: &str, query: &HashMap<String, String>) -> Value {
    let include = query
        .get("includeObject")
        .map_or("Metadata", String::as_str);
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = leases
        .iter()
        .map(|lease| {
            let age = lease.metadata.creation_timestamp.as_ref().map_or_else(
                || "<unknown>".to_string(),
                |t| human_duration(now.as_second() - t.0.as_second()),
            );
            let mut row = json!({
                "cells": [
                    lease.metadata.name.clone().unwrap_or_default(),
                    lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default(),
                    age,
                ],
            });
            match include {
                "None" => {}
                "Object" => row["object"] = crate::decode::to_value(lease),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": lease.metadata,
                    });
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": revision},
        "columnDefinitions": columns(),
        "rows": rows,
    })
}

/// The age kubectl shows, by apimachinery's `HumanDuration` rules.
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        let years = hours / 24 / 365;
        return if days == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{days}d")
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(50 * 3600), "2d2h");
    }
}
