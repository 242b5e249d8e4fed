//! Serves: both — k8slease lists by one label (`mecatl.dev/owner-lease=NAME`); kubectl's list, watch and deletecollection take any.
//!
//! `labelSelector` and `fieldSelector` as list and watch take them.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl LabelRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(k, v) => labels.get(k) == Some(v),
            // As the API server: a missing key satisfies `!=` and `notin`.
            Self::NotEquals(k, v) => labels.get(k) != Some(v),
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum FieldRequirement {
    Equals(&'static str, String),
    NotEquals(&'static str, String),
}

/// Both selectors of one list or watch request; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    labels: Vec<LabelRequirement>,
    fields: Vec<FieldRequirement>,
}

impl Selector {
    pub(crate) fn parse(label: Option<&str>, field: Option<&str>) -> Result<Self, ApiError> {
        Ok(Self {
            labels: match label {
                Some(text) => parse_labels(text)?,
                None => Vec::new(),
            },
            fields: match field {
                Some(text) => parse_fields(text)?,
                None => Vec::new(),
            },
        })
    }

    pub(crate) fn matches(&self, lease: &Lease) -> bool {
        let empty = BTreeMap::new();
        let labels = lease.metadata.labels.as_ref().unwrap_or(&empty);
        let field_value = |name: &str| match name {
            "metadata.name" => lease.metadata.name.clone().unwrap_or_default(),
            _ => lease.metadata.namespace.clone().unwrap_or_default(),
        };
        self.labels.iter().all(|r| r.matches(labels))
            && self.fields.iter().all(|r| match r {
                FieldRequirement::Equals(f, v) => field_value(f) == *v,
                FieldRequirement::NotEquals(f, v) => field_value(f) != *v,
            })
    }
}

fn parse_fields(text: &str) -> Result<Vec<FieldRequirement>, ApiError> {
    let mut out = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (key, value, negated) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, false)
        } else if let Some((k, v)) = term.split_once('=') {
            (k, v, false)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{text}'; can't understand '{term}'"
            )));
        };
        let key: &'static str = match key.trim() {
            "metadata.name" => "metadata.name",
            "metadata.namespace" => "metadata.namespace",
            other => {
                return Err(ApiError::bad_request(format!(
                    "\"{other}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                )));
            }
        };
        let value = value.trim().to_string();
        out.push(if negated {
            FieldRequirement::NotEquals(key, value)
        } else {
            FieldRequirement::Equals(key, value)
        });
    }
    Ok(out)
}

/// Splits on commas that are not inside a `( … )` value set.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn parse_labels(text: &str) -> Result<Vec<LabelRequirement>, ApiError> {
    let bad = |why: &str| ApiError::bad_request(format!("unable to parse requirement: {why}"));
    let mut out = Vec::new();
    for term in split_terms(text)
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let requirement = if let Some(key) = term.strip_prefix('!') {
            LabelRequirement::DoesNotExist(checked_key(key.trim())?)
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelRequirement::NotEquals(checked_key(k.trim())?, v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==") {
            LabelRequirement::Equals(checked_key(k.trim())?, v.trim().to_string())
        } else if let Some((k, v)) = term.split_once('=') {
            LabelRequirement::Equals(checked_key(k.trim())?, v.trim().to_string())
        } else if let Some((key, rest)) = split_set_operator(term) {
            let (negated, values) = rest;
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| bad(&format!("found '{values}', expected: '('")))?;
            let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
            let key = checked_key(key.trim())?;
            if negated {
                LabelRequirement::NotIn(key, values)
            } else {
                LabelRequirement::In(key, values)
            }
        } else {
            LabelRequirement::Exists(checked_key(term)?)
        };
        out.push(requirement);
    }
    Ok(out)
}

/// `key in (…)` / `key notin (…)`: the key and (negated, value set).
fn split_set_operator(term: &str) -> Option<(&str, (bool, &str))> {
    if let Some((k, v)) = term.split_once(" notin ") {
        return Some((k, (true, v)));
    }
    if let Some((k, v)) = term.split_once(" in ") {
        return Some((k, (false, v)));
    }
    None
}

fn checked_key(key: &str) -> Result<String, ApiError> {
    let fine = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if fine {
        Ok(key.to_string())
    } else {
        Err(ApiError::bad_request(format!(
            "unable to parse requirement: invalid label key \"{key}\""
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn lease(name: &str, labels: &[(&str, &str)]) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    #[test]
    fn equality_and_set_based_labels() {
        let l = lease("a", &[("app", "web"), ("tier", "front")]);
        let sel = |s: &str| Selector::parse(Some(s), None).unwrap();
        assert!(sel("app=web").matches(&l));
        assert!(sel("app==web,tier").matches(&l));
        assert!(!sel("app!=web").matches(&l));
        assert!(sel("app in (web, api),!missing").matches(&l));
        assert!(!sel("tier notin (front)").matches(&l));
        assert!(sel("missing notin (x)").matches(&l));
        assert!(Selector::parse(Some("a in x"), None).is_err());
    }

    #[test]
    fn field_selector_on_name() {
        let l = lease("a", &[]);
        assert!(
            Selector::parse(None, Some("metadata.name=a"))
                .unwrap()
                .matches(&l)
        );
        assert!(
            !Selector::parse(None, Some("metadata.name!=a"))
                .unwrap()
                .matches(&l)
        );
        assert_eq!(
            Selector::parse(None, Some("spec.holderIdentity=x"))
                .unwrap_err()
                .code,
            400
        );
    }
}
