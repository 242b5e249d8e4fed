//! Serves: both — k8slease lists the sessions on an owner lease in one reply; kubectl pages.
//!
//! LeaseList pages for list (`kubectl get leases`), with `limit` and
//! `continue` paging and Table replies, and the reply to deletecollection.

use std::collections::HashMap;

use axum::{
    http::{HeaderMap, StatusCode},
    response::Response,
};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};

use crate::{
    decode::{API_VERSION, to_value},
    status::{ApiError, json_response},
    table,
};

/// A LeaseList (or Table) page: `limit` and `continue` page through the
/// items in key order.
pub(crate) fn response(
    items: Vec<Lease>,
    revision: u64,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let start = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => decode_continue(token)?,
        None => None,
    };
    let mut items: Vec<Lease> = match &start {
        Some(after) => items
            .into_iter()
            .filter(|l| {
                let key = (
                    l.metadata.namespace.clone().unwrap_or_default(),
                    l.metadata.name.clone().unwrap_or_default(),
                );
                key > *after
            })
            .collect(),
        None => items,
    };
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if let Some(limit) = limit
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        if let Some(last) = items.last() {
            metadata["continue"] = json!(encode_continue(
                last.metadata.namespace.as_deref().unwrap_or(""),
                last.metadata.name.as_deref().unwrap_or(""),
            ));
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if table::wanted(headers) {
        let mut rendered = table::render(&items, &revision.to_string(), query);
        rendered["metadata"] = metadata;
        return Ok(json_response(StatusCode::OK, &rendered));
    }
    let items: Vec<Value> = items
        .iter()
        .map(|lease| {
            let mut value = to_value(lease);
            // Items of a typed list carry no apiVersion or kind.
            if let Value::Object(map) = &mut value {
                map.remove("apiVersion");
                map.remove("kind");
            }
            value
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": "LeaseList",
            "apiVersion": API_VERSION,
            "metadata": metadata,
            "items": items,
        }),
    ))
}

fn encode_continue(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Result<Option<(String, String)>, ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token}"));
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    let text = String::from_utf8(bytes.ok_or_else(bad)?).map_err(|_| bad())?;
    let (namespace, name) = text.split_once('/').ok_or_else(bad)?;
    Ok(Some((namespace.to_string(), name.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let token = encode_continue("default", "a.b");
        assert_eq!(
            decode_continue(&token).unwrap(),
            Some(("default".into(), "a.b".into()))
        );
        assert!(decode_continue("zz").is_err());
    }
}
