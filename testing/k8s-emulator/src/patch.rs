//! Serves: both — JSON merge patch (k8slease's tests send it); the other patch types are kubectl's.
//!
//! The patch formats PATCH accepts: JSON merge patch (RFC 7386) here,
//! strategic merge patch as kubectl sends it for a Lease (`strategic`), and
//! JSON patch (RFC 6902, `json`).

use serde_json::{Map, Value};

mod json;
mod strategic;

pub(crate) use json::json_patch;
pub(crate) use strategic::strategic_merge_patch;

/// The content types PATCH accepts, in the order the API server lists them.
pub(crate) const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// Which patch a PATCH request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Json,
    Merge,
    StrategicMerge,
    Apply,
}

impl PatchType {
    /// From the Content-Type header, parameters (`; charset=…`) ignored.
    pub(crate) fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::StrategicMerge),
            "application/apply-patch+yaml" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// RFC 7386: objects merge recursively, `null` removes, anything else
/// replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_with_null() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge_patch(&mut doc, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(doc, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }
}
