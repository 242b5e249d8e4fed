//! Serves: both — every POST, PUT and PATCH body (`fieldValidation=Strict` is kubectl's).
//!
//! Turning a request body into a Lease the way the API server's decoder
//! does: API version and kind checks, strict `MicroTime`, unknown fields
//! handled per `fieldValidation`.

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Map, Value};

use crate::{status::ApiError, validation::is_micro_time};

pub(crate) const API_VERSION: &str = "coordination.k8s.io/v1";
pub(crate) const KIND: &str = "Lease";
/// Go's layout for `MicroTime`, quoted in the decoder's errors.
const MICRO_TIME_LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";

const TOP_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec"];
const META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];
const SPEC_FIELDS: &[&str] = &[
    "acquireTime",
    "holderIdentity",
    "leaseDurationSeconds",
    "leaseTransitions",
    "preferredHolder",
    "renewTime",
    "strategy",
];

/// The `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub(crate) fn parse(text: Option<&str>) -> Result<Self, ApiError> {
        match text {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some("Strict") => Ok(Self::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}"
            ))),
        }
    }
}

/// A decoded Lease and the warnings the reply should carry.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) lease: Lease,
    pub(crate) warnings: Vec<String>,
}

/// Parses bytes as JSON, with the decoder's error for malformed input.
pub(crate) fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

/// Checks and converts one JSON object into a Lease.
pub(crate) fn decode_lease(value: Value, validation: FieldValidation) -> Result<Decoded, ApiError> {
    let Value::Object(mut object) = value else {
        return Err(ApiError::undecodable("the body is not a JSON object"));
    };
    match object.get("apiVersion") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(Value::String(v)) if v.is_empty() => {}
        Some(other) => {
            let shown = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_string);
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({shown}) does not match the expected API version ({API_VERSION})"
            )));
        }
    }
    match object.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == KIND || k.is_empty() => {}
        Some(other) => {
            return Err(ApiError::undecodable(format!(
                "no conversion from kind {other} to kind {KIND}"
            )));
        }
    }
    let mut unknown = Vec::new();
    collect_unknown(&object, TOP_FIELDS, "", &mut unknown);
    if let Some(Value::Object(meta)) = object.get("metadata") {
        collect_unknown(meta, META_FIELDS, "metadata.", &mut unknown);
    }
    if let Some(Value::Object(spec)) = object.get("spec") {
        collect_unknown(spec, SPEC_FIELDS, "spec.", &mut unknown);
        for field in ["acquireTime", "renewTime"] {
            if let Some(Value::String(text)) = spec.get(field)
                && !is_micro_time(text)
            {
                return Err(ApiError::undecodable(format!(
                    "parsing time \"{text}\" as \"{MICRO_TIME_LAYOUT}\": cannot parse \"{text}\" as \"{MICRO_TIME_LAYOUT}\""
                )));
            }
        }
    }
    let warnings: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    if validation == FieldValidation::Strict && !warnings.is_empty() {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            warnings.join(", ")
        )));
    }
    object.insert("apiVersion".into(), Value::String(API_VERSION.into()));
    object.insert("kind".into(), Value::String(KIND.into()));
    if object.get("metadata").is_none_or(Value::is_null) {
        object.insert("metadata".into(), Value::Object(Map::new()));
    }
    if object.get("spec").is_some_and(Value::is_null) {
        object.remove("spec");
    }
    let lease: Lease =
        serde_json::from_value(Value::Object(object)).map_err(ApiError::undecodable)?;
    Ok(Decoded {
        lease,
        warnings: if validation == FieldValidation::Warn {
            warnings
        } else {
            Vec::new()
        },
    })
}

fn collect_unknown(
    object: &Map<String, Value>,
    known: &[&str],
    prefix: &str,
    out: &mut Vec<String>,
) {
    for key in object.keys() {
        if !known.contains(&key.as_str()) {
            out.push(format!("{prefix}{key}"));
        }
    }
}

/// A Lease as the API serves it: JSON with `apiVersion` and `kind`.
pub(crate) fn to_value(lease: &Lease) -> Value {
    // Serializing plain data into a Value cannot fail.
    serde_json::to_value(lease).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strict_rejects_unknown_fields_and_warn_reports_them() {
        let body = json!({"metadata": {"name": "a"}, "spec": {"holder": "x"}});
        let err = decode_lease(body.clone(), FieldValidation::Strict).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(
            err.message.contains("unknown field \"spec.holder\""),
            "{}",
            err.message
        );
        let ok = decode_lease(body, FieldValidation::Warn).unwrap();
        assert_eq!(
            ok.warnings,
            vec!["unknown field \"spec.holder\"".to_string()]
        );
    }

    #[test]
    fn micro_time_and_types_are_decoding_errors() {
        let bad_time =
            json!({"metadata": {"name": "a"}, "spec": {"renewTime": "2024-01-01T00:00:00Z"}});
        assert_eq!(
            decode_lease(bad_time, FieldValidation::Warn)
                .unwrap_err()
                .code,
            400
        );
        let bad_type = json!({"metadata": {"name": "a"}, "spec": {"leaseDurationSeconds": "10"}});
        assert_eq!(
            decode_lease(bad_type, FieldValidation::Warn)
                .unwrap_err()
                .code,
            400
        );
        let wrong_group = json!({"apiVersion": "v1", "metadata": {"name": "a"}});
        assert_eq!(
            decode_lease(wrong_group, FieldValidation::Warn)
                .unwrap_err()
                .code,
            400
        );
    }
}
