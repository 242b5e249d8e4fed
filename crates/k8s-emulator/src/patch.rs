//! The patch formats PATCH accepts: JSON merge patch (RFC 7386), strategic
//! merge patch as kubectl sends it for a Lease, and JSON patch (RFC 6902).

use serde_json::{Map, Value};

use crate::status::ApiError;

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

/// RFC 6902. A malformed patch is 400; one that cannot be applied is 422.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Value::Array(operations) = patch else {
        return Err(ApiError::bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
        ));
    };
    for operation in operations {
        apply_operation(target, operation)?;
    }
    Ok(())
}

fn unprocessable(why: impl std::fmt::Display) -> ApiError {
    ApiError::unprocessable(format!(
        "the server rejected our request due to an error in our request: {why}"
    ))
}

fn apply_operation(target: &mut Value, operation: &Value) -> Result<(), ApiError> {
    let op = operation.get("op").and_then(Value::as_str).unwrap_or("");
    let path = operation
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| unprocessable("missing path"))?;
    let value = || {
        operation
            .get("value")
            .cloned()
            .ok_or_else(|| unprocessable(format!("missing value for {op} at {path}")))
    };
    let from = || {
        operation
            .get("from")
            .and_then(Value::as_str)
            .ok_or_else(|| unprocessable(format!("missing from for {op}")))
    };
    match op {
        "add" => add(target, path, value()?),
        "remove" => remove(target, path).map(drop),
        "replace" => {
            remove(target, path)?;
            add(target, path, value()?)
        }
        "move" => {
            let from = from()?;
            let moved = remove(target, from)?;
            add(target, path, moved)
        }
        "copy" => {
            let copied = target.pointer(from()?).cloned().ok_or_else(|| {
                unprocessable(format!("copy from missing path {}", from().unwrap_or("")))
            })?;
            add(target, path, copied)
        }
        "test" => {
            let expected = value()?;
            if target.pointer(path) == Some(&expected) {
                Ok(())
            } else {
                Err(unprocessable(format!(
                    "testing value {path} failed: test failed"
                )))
            }
        }
        other => Err(unprocessable(format!("Unexpected kind: {other}"))),
    }
}

/// The parent pointer and the unescaped last token of `path`.
fn split_pointer(path: &str) -> Result<(&str, String), ApiError> {
    if path.is_empty() {
        return Err(unprocessable(
            "the root cannot be the target of this operation",
        ));
    }
    let Some(slash) = path.rfind('/') else {
        return Err(unprocessable(format!("invalid path {path}")));
    };
    let token = path[slash + 1..].replace("~1", "/").replace("~0", "~");
    Ok((&path[..slash], token))
}

fn add(target: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, token) = split_pointer(path)?;
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(token, value);
            Ok(())
        }
        Some(Value::Array(list)) => {
            let index = if token == "-" {
                list.len()
            } else {
                token
                    .parse::<usize>()
                    .ok()
                    .filter(|i| *i <= list.len())
                    .ok_or_else(|| {
                        unprocessable(format!("add operation index out of bounds: {path}"))
                    })?
            };
            list.insert(index, value);
            Ok(())
        }
        _ => Err(unprocessable(format!(
            "add operation does not apply: doc is missing path: \"{path}\": missing value"
        ))),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, ApiError> {
    let (parent, token) = split_pointer(path)?;
    let missing = || {
        unprocessable(format!(
            "remove operation does not apply: doc is missing path: \"{path}\": missing value"
        ))
    };
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => map.remove(&token).ok_or_else(missing),
        Some(Value::Array(list)) => {
            let index = token
                .parse::<usize>()
                .ok()
                .filter(|i| *i < list.len())
                .ok_or_else(missing)?;
            Ok(list.remove(index))
        }
        _ => Err(missing()),
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

    #[test]
    fn json_patch_operations() {
        let mut doc = json!({"spec": {"holderIdentity": "a"}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/spec/holderIdentity", "value": "a"},
                {"op": "replace", "path": "/spec/holderIdentity", "value": "b"},
                {"op": "add", "path": "/spec/leaseTransitions", "value": 1},
                {"op": "copy", "from": "/spec/holderIdentity", "path": "/spec/x"},
                {"op": "move", "from": "/spec/x", "path": "/spec/y"},
                {"op": "remove", "path": "/spec/y"},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"spec": {"holderIdentity": "b", "leaseTransitions": 1}})
        );
        let failed = json_patch(
            &mut doc,
            &json!([{"op": "test", "path": "/spec/holderIdentity", "value": "a"}]),
        );
        assert_eq!(failed.unwrap_err().code, 422);
        let missing = json_patch(
            &mut doc,
            &json!([{"op": "remove", "path": "/spec/nothing"}]),
        );
        assert_eq!(missing.unwrap_err().code, 422);
    }
}
