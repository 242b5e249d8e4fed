//! Serves: both — every failure reply (410 `Expired` reaches only kubectl's watches).
//!
//! Failure replies shaped as the API server's `meta.k8s.io/v1` `Status`.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::validation::FieldError;

/// The group every error about leases names in its details.
pub(crate) const GROUP: &str = "coordination.k8s.io";
/// The resource as the API server qualifies it in messages.
pub(crate) const QUALIFIED_RESOURCE: &str = "leases.coordination.k8s.io";

/// The conflict message the API server gives for a stale resourceVersion.
pub(crate) const OPTIMISTIC_LOCK_MESSAGE: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// One failure, rendered as a `Status` body with the matching HTTP code.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(crate) fn lease_not_found(name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{QUALIFIED_RESOURCE} \"{name}\" not found"),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": "leases"}))
    }

    pub(crate) fn namespace_not_found(namespace: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("namespaces \"{namespace}\" not found"),
        )
        .with_details(json!({"name": namespace, "kind": "namespaces"}))
    }

    /// A path the server does not serve at all.
    pub(crate) fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub(crate) fn already_exists(name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{QUALIFIED_RESOURCE} \"{name}\" already exists"),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": "leases"}))
    }

    pub(crate) fn conflict(name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {QUALIFIED_RESOURCE} \"{name}\": {why}"),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": "leases"}))
    }

    /// 422 for a Lease that fails validation. `kind` is `Lease` for object
    /// validation and `leases` for the store's own checks (the API server
    /// names the resource there, not the kind).
    pub(crate) fn invalid(kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let listed = if errors.len() == 1 {
            errors[0].to_string()
        } else {
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{kind}.{GROUP} \"{name}\" is invalid: {listed}"),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": kind, "causes": causes}))
    }

    /// 422 with no object to name, as a JSON patch that cannot be applied.
    pub(crate) fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// The decoder's wording for a body that is not a Lease.
    pub(crate) fn undecodable(why: impl std::fmt::Display) -> Self {
        Self::bad_request(format!(
            "Lease in version \"v1\" cannot be handled as a Lease: {why}"
        ))
    }

    /// 403 with the authorizer's wording: who, which verb, which resource,
    /// where.
    pub(crate) fn forbidden(
        user: &str,
        verb: &str,
        resource: &str,
        group: &str,
        name: Option<&str>,
        namespace: Option<&str>,
    ) -> Self {
        let qualified = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let subject = match name {
            Some(n) if !n.is_empty() => format!("{qualified} \"{n}\""),
            _ => qualified,
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let mut details = json!({"group": group, "kind": resource});
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            details["name"] = json!(n);
        }
        Self::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
            ),
        )
        .with_details(details)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub(crate) fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub(crate) fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json",
        )
    }

    pub(crate) fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(json!({"causes": [{"message": message.to_string()}]}))
    }

    /// A storage-level refusal the API server passes through without a
    /// reason (it renders as reason-less 500).
    pub(crate) fn unknown_internal(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub(crate) fn service_unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    pub(crate) fn timeout() -> Self {
        Self::new(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        )
        .with_details(json!({}))
    }

    /// 410 for a watch that starts before the history kept.
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` object itself, as a watch `ERROR` event carries it.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_status())
    }
}

/// A JSON body with the API server's content type.
pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    let mut response = (code, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
