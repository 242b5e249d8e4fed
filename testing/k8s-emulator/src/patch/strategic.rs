//! Serves: kubectl only — `kubectl apply` (client-side) and `kubectl edit` send it.
//!
//! The strategic merge patch. k8slease never patches; its tests patch with a
//! JSON merge patch (`super::merge_patch`).

use serde_json::{Map, Value};

use crate::status::ApiError;

/// How a list field of a Lease merges under a strategic merge patch.
fn list_merge_key(path: &str) -> Option<ListMerge> {
    match path {
        "metadata.finalizers" => Some(ListMerge::Set),
        "metadata.ownerReferences" => Some(ListMerge::ByKey("uid")),
        _ => None,
    }
}

enum ListMerge {
    /// A list of scalars merged as a set.
    Set,
    /// A list of objects merged on one key.
    ByKey(&'static str),
}

/// A strategic merge patch over a Lease. Its only merging lists are
/// `metadata.finalizers` and `metadata.ownerReferences`; every other field
/// behaves as in a merge patch. Directives kubectl emits (`$patch`,
/// `$retainKeys`, `$setElementOrder/…`, `$deleteFromPrimitiveList/…`) are
/// honoured.
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    strategic_merge_at(target, patch, "")
}

fn strategic_merge_at(target: &mut Value, patch: &Value, path: &str) -> Result<(), ApiError> {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other} in map"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        return Ok(());
    };
    for (key, value) in patch {
        let child = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        if key.starts_with("$setElementOrder/") || key == "$retainKeys" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let remove: Vec<Value> = value.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = map.get_mut(field) {
                list.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        match (list_merge_key(&child), value) {
            (Some(rule), Value::Array(items)) => {
                let slot = map.entry(key.clone()).or_insert(Value::Array(Vec::new()));
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                if let Value::Array(current) = slot {
                    merge_list(current, items, &rule)?;
                }
            }
            (_, Value::Object(_)) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                strategic_merge_at(slot, value, &child)?;
                if slot.is_null() {
                    map.remove(key);
                }
            }
            _ => {
                map.insert(key.clone(), value.clone());
            }
        }
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        map.retain(|k, _| keep.iter().any(|v| v.as_str() == Some(k)));
    }
    Ok(())
}

fn merge_list(current: &mut Vec<Value>, items: &[Value], rule: &ListMerge) -> Result<(), ApiError> {
    match rule {
        ListMerge::Set => {
            for item in items {
                if !current.contains(item) {
                    current.push(item.clone());
                }
            }
        }
        ListMerge::ByKey(merge_key) => {
            for item in items {
                let Some(key) = item.get(*merge_key).cloned() else {
                    return Err(ApiError::bad_request(format!(
                        "map: {item} does not contain declared merge key: {merge_key}"
                    )));
                };
                let position = current.iter().position(|c| c.get(*merge_key) == Some(&key));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (position, delete) {
                    (Some(i), true) => {
                        current.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => strategic_merge_at(&mut current[i], item, "")?,
                    (None, false) => current.push(item.clone()),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_finalizers_and_owner_refs() {
        let mut doc = json!({"metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "x"}]}});
        strategic_merge_patch(
            &mut doc,
            &json!({"metadata": {
                "finalizers": ["b"],
                "$setElementOrder/finalizers": ["a", "b"],
                "ownerReferences": [{"uid": "1", "name": "y"}, {"uid": "2", "name": "z"}],
            }}),
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(doc["metadata"]["ownerReferences"][0]["name"], "y");
        strategic_merge_patch(
            &mut doc,
            &json!({"metadata": {
                "$deleteFromPrimitiveList/finalizers": ["a"],
                "ownerReferences": [{"uid": "2", "$patch": "delete"}],
            }}),
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(
            doc["metadata"]["ownerReferences"].as_array().unwrap().len(),
            1
        );
    }
}
