//! Serves: both — every Lease written is validated.
//!
//! The API server's validation of a Lease, with its field paths and wording.

use std::fmt;

use k8s_openapi::api::coordination::v1::Lease;

/// The regex the API server quotes for names it refuses.
const DNS1123_SUBDOMAIN_HINT: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_HINT: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_HINT: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
/// The API server's limit on all annotations of one object together.
const TOTAL_ANNOTATION_BYTES: usize = 256 * 1024;

/// What is wrong with one field, as `field.Error` types it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FieldProblem {
    /// The value breaks a rule; the value is rendered as Go prints it.
    Invalid {
        value: String,
        detail: String,
    },
    Required {
        detail: String,
    },
    Forbidden {
        detail: String,
    },
    TooLong {
        limit: usize,
    },
}

/// One validation failure, named by its field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) field: String,
    pub(crate) problem: FieldProblem,
}

impl FieldError {
    pub(crate) fn invalid(field: &str, value: String, detail: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            problem: FieldProblem::Invalid {
                value,
                detail: detail.into(),
            },
        }
    }

    fn required(field: &str, detail: &str) -> Self {
        Self {
            field: field.to_string(),
            problem: FieldProblem::Required {
                detail: detail.to_string(),
            },
        }
    }

    fn forbidden(field: &str, detail: &str) -> Self {
        Self {
            field: field.to_string(),
            problem: FieldProblem::Forbidden {
                detail: detail.to_string(),
            },
        }
    }

    /// The `reason` of this cause in `Status.details.causes`.
    pub(crate) fn reason(&self) -> &'static str {
        match self.problem {
            FieldProblem::Invalid { .. } => "FieldValueInvalid",
            FieldProblem::Required { .. } => "FieldValueRequired",
            FieldProblem::Forbidden { .. } => "FieldValueForbidden",
            FieldProblem::TooLong { .. } => "FieldValueTooLong",
        }
    }

    /// The message without the field path (a cause's `message`).
    pub(crate) fn body(&self) -> String {
        match &self.problem {
            FieldProblem::Invalid { value, detail } => format!("Invalid value: {value}: {detail}"),
            FieldProblem::Required { detail } if detail.is_empty() => "Required value".into(),
            FieldProblem::Required { detail } => format!("Required value: {detail}"),
            FieldProblem::Forbidden { detail } => format!("Forbidden: {detail}"),
            FieldProblem::TooLong { limit } => {
                format!("Too long: may not be more than {limit} bytes")
            }
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Go's `%q` of a string, which the API server uses to show bad values.
pub(crate) fn quoted(value: &str) -> String {
    serde_json::Value::String(value.to_string()).to_string()
}

/// The messages `IsDNS1123Subdomain` gives for `name` (empty when valid).
pub(crate) fn dns_subdomain_problems(name: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if name.len() > 253 {
        problems.push("must be no more than 253 characters".to_string());
    }
    if !is_dns_subdomain(name) {
        problems.push(DNS1123_SUBDOMAIN_HINT.to_string());
    }
    problems
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty() && name.split('.').all(is_dns_label)
}

fn is_dns_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

fn is_qualified_name_part(part: &str) -> bool {
    let bytes = part.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first)
                && alnum(last)
                && bytes
                    .iter()
                    .all(|b| alnum(b) || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Problems of a label key (`prefix/name` or `name`).
fn label_key_problems(key: &str) -> Vec<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let mut problems = Vec::new();
    if name.contains('/') {
        problems.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
        return problems;
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            problems.push("prefix part must be non-empty".to_string());
        } else {
            for p in dns_subdomain_problems(prefix) {
                problems.push(format!("prefix part {p}"));
            }
        }
    }
    if name.is_empty() {
        problems.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            problems.push("name part must be no more than 63 characters".to_string());
        }
        if !is_qualified_name_part(name) {
            problems.push(QUALIFIED_NAME_HINT.to_string());
        }
    }
    problems
}

fn label_value_problems(value: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if value.len() > 63 {
        problems.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        problems.push(LABEL_VALUE_HINT.to_string());
    }
    problems
}

/// Whether a `MicroTime` string is what the API server's decoder accepts:
/// RFC 3339 with exactly six fractional digits (Go's
/// `2006-01-02T15:04:05.000000Z07:00`).
pub(crate) fn is_micro_time(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        b.get(range.clone())
            .is_some_and(|s| s.len() == range.len() && s.iter().all(u8::is_ascii_digit))
    };
    let shape = b.len() >= 27
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..26);
    if !shape {
        return false;
    }
    let zone = &text[26..];
    let zone_ok = zone == "Z" || {
        let z = zone.as_bytes();
        z.len() == 6
            && matches!(z[0], b'+' | b'-')
            && z[1..3].iter().all(u8::is_ascii_digit)
            && z[3] == b':'
            && z[4..6].iter().all(u8::is_ascii_digit)
    };
    // The shape alone admits month 13 or second 61: the calendar decides.
    zone_ok && text.parse::<jiff::Timestamp>().is_ok()
}

/// `ValidateLease`: metadata and spec of a Lease about to be stored.
pub(crate) fn validate_lease(lease: &Lease) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_metadata(lease, &mut errors);
    validate_spec(lease, &mut errors);
    errors
}

fn validate_metadata(lease: &Lease, errors: &mut Vec<FieldError>) {
    let meta = &lease.metadata;
    match meta.name.as_deref() {
        None | Some("") => errors.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) => {
            for problem in dns_subdomain_problems(name) {
                errors.push(FieldError::invalid("metadata.name", quoted(name), problem));
            }
        }
    }
    if let Some(labels) = &meta.labels {
        for (key, value) in labels {
            for problem in label_key_problems(key) {
                errors.push(FieldError::invalid("metadata.labels", quoted(key), problem));
            }
            for problem in label_value_problems(value) {
                errors.push(FieldError::invalid(
                    "metadata.labels",
                    quoted(value),
                    problem,
                ));
            }
        }
    }
    if let Some(annotations) = &meta.annotations {
        let mut total = 0;
        for (key, value) in annotations {
            total += key.len() + value.len();
            for problem in label_key_problems(&key.to_lowercase()) {
                errors.push(FieldError::invalid(
                    "metadata.annotations",
                    quoted(key),
                    problem,
                ));
            }
        }
        if total > TOTAL_ANNOTATION_BYTES {
            errors.push(FieldError {
                field: "metadata.annotations".into(),
                problem: FieldProblem::TooLong {
                    limit: TOTAL_ANNOTATION_BYTES,
                },
            });
        }
    }
}

fn validate_spec(lease: &Lease, errors: &mut Vec<FieldError>) {
    let Some(spec) = &lease.spec else { return };
    if let Some(seconds) = spec.lease_duration_seconds
        && seconds <= 0
    {
        errors.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            seconds.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(transitions) = spec.lease_transitions
        && transitions < 0
    {
        errors.push(FieldError::invalid(
            "spec.leaseTransitions",
            transitions.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    let has_strategy = spec.strategy.as_deref().is_some_and(|s| !s.is_empty());
    if spec
        .preferred_holder
        .as_deref()
        .is_some_and(|p| !p.is_empty())
        && !has_strategy
    {
        errors.push(FieldError::forbidden(
            "spec.preferredHolder",
            "may only be specified if `strategy` is defined",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_needs_exactly_six_fraction_digits() {
        assert!(is_micro_time("2024-05-01T10:00:00.123456Z"));
        assert!(is_micro_time("2024-05-01T10:00:00.123456+02:00"));
        assert!(!is_micro_time("2024-05-01T10:00:00Z"));
        assert!(!is_micro_time("2024-05-01T10:00:00.123Z"));
        assert!(!is_micro_time("2024-05-01T10:00:00.1234567Z"));
        assert!(!is_micro_time("2024-13-01T10:00:00.123456Z"));
        assert!(!is_micro_time("yesterday"));
    }

    #[test]
    fn names_follow_dns_subdomain_rules() {
        assert!(dns_subdomain_problems("a-b.c1").is_empty());
        assert!(!dns_subdomain_problems("Upper").is_empty());
        assert!(!dns_subdomain_problems("-lead").is_empty());
        assert!(!dns_subdomain_problems("a..b").is_empty());
        assert_eq!(dns_subdomain_problems(&"a".repeat(254)).len(), 1);
        assert!(dns_subdomain_problems(&"a".repeat(253)).is_empty());
    }

    #[test]
    fn label_keys_and_values() {
        assert!(label_key_problems("app.kubernetes.io/name").is_empty());
        assert!(!label_key_problems("/x").is_empty());
        assert!(!label_key_problems("bad key").is_empty());
        assert!(label_value_problems("").is_empty());
        assert!(!label_value_problems("-x").is_empty());
    }
}
