//! Serves: kubectl only — `kubectl patch --type json`; k8slease and its tests send none.
//!
//! JSON patch (RFC 6902). Besides kubectl only the emulator's own HTTP tests
//! send one.

use serde_json::Value;

use crate::status::ApiError;

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
