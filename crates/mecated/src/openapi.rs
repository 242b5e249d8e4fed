//! The OpenAPI document, derived from the handlers' annotations and the
//! [`wire`](crate::wire) types that serialise every body, so it says what
//! the server does. The committed `openapi.json` is this document; a test
//! fails when they differ.

use std::sync::LazyLock;

use utoipa::openapi::Required;
use utoipa::{Modify, OpenApi};

use crate::http;
use crate::wire::{ErrorCode, Event, FollowEnd, RunEnd, RunStatus, SessionIdText};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "mecated",
        description = "A session server whose every run is owned by one process through a fenced lease. \
                       Every error is answered with an `ErrorBody`: `{\"error\": {\"code\", \"message\", \
                       \"retryable\", \"holder\"?}}` with a stable `code`, a request for a route that does \
                       not exist included (404 `not_found`). Request bodies and query strings with unknown \
                       fields are refused (400 `invalid`)."
    ),
    paths(
        http::create_session,
        http::list_sessions,
        http::get_session,
        http::delete_session,
        http::read_events,
        http::get_lease,
        http::start_run,
        http::cancel_run,
        http::healthz,
        http::readyz,
        http::metrics,
        http::openapi,
        http::operator_page::page,
    ),
    // Named here because no JSON body refers to them: `Event` and `RunEnd`
    // are the data of the Server-Sent Events.
    modifiers(&CreateBodyOptional),
    components(schemas(Event, RunEnd, RunStatus, ErrorCode, SessionIdText, FollowEnd)),
    tags(
        (name = "sessions", description = "Sessions and their event logs"),
        (name = "runs", description = "Leased runs of a session's agent"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    )
)]
struct ApiDoc;

/// `POST /v1/sessions` takes no body at all as "pick an id for me". An
/// `Option<CreateSession>` body would instead allow a JSON `null`, which the
/// server refuses, so the body is marked optional here.
struct CreateBodyOptional;

impl Modify for CreateBodyOptional {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let body = doc
            .paths
            .paths
            .get_mut("/v1/sessions")
            .and_then(|item| item.post.as_mut())
            .and_then(|op| op.request_body.as_mut());
        if let Some(body) = body {
            body.required = Some(Required::False);
        }
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as served at `/openapi.json` and committed as
/// `openapi.json`: pretty JSON with a final newline.
pub fn json() -> &'static str {
    static JSON: LazyLock<String> = LazyLock::new(|| {
        // Plain structs and string-keyed maps always serialise.
        let mut text = document()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot serialise the document: {e}\"}}"));
        text.push('\n');
        text
    });
    &JSON
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Set to rewrite the committed document from the types.
    const BLESS: &str = "MECATED_BLESS_OPENAPI";

    #[test]
    fn committed_openapi_json_is_the_generated_document() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
        if std::env::var_os(BLESS).is_some() {
            std::fs::write(&path, super::json()).expect("write openapi.json");
        }
        let committed = std::fs::read_to_string(&path).expect("read openapi.json");
        assert!(
            committed == super::json(),
            "{} differs from the document generated from the types; \
             rerun with {BLESS}=1 and commit the result",
            path.display()
        );
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_route() {
        let doc = serde_json::to_value(super::document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        let mut listed: Vec<&str> = paths.keys().map(String::as_str).collect();
        listed.sort_unstable();
        assert_eq!(
            listed,
            [
                "/",
                "/healthz",
                "/metrics",
                "/openapi.json",
                "/readyz",
                "/v1/sessions",
                "/v1/sessions/{id}",
                "/v1/sessions/{id}/events",
                "/v1/sessions/{id}/lease",
                "/v1/sessions/{id}/runs",
                "/v1/sessions/{id}/runs/current",
            ]
        );
    }

    #[test]
    fn request_schemas_refuse_unknown_fields_and_state_the_id_rules() {
        let doc = serde_json::to_value(super::document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        for name in ["CreateSession", "RunRequest"] {
            assert_eq!(
                schemas[name]["additionalProperties"], false,
                "{name} allows unknown fields"
            );
        }
        let id = &schemas["SessionId"];
        assert_eq!(id["minLength"], 1);
        assert_eq!(id["maxLength"], lease_port::MAX_ID_LEN);
        assert_eq!(id["pattern"], crate::wire::NO_CONTROL_CHARS);
        assert!(id["description"].as_str().unwrap().contains("bytes"));
        let create = &doc["paths"]["/v1/sessions"]["post"]["requestBody"];
        assert_eq!(create["required"], false, "the create body is optional");
    }

    /// The query parameters' schemas state the bounds the handlers
    /// enforce, so the two cannot drift apart unnoticed.
    #[test]
    fn query_parameters_state_the_bounds_the_server_enforces() {
        let doc = serde_json::to_value(super::document()).unwrap();
        let param = |path: &str, method: &str, name: &str| {
            doc["paths"][path][method]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{method} {path}: no {name}"))
                .clone()
        };
        let wait = param("/v1/sessions/{id}/runs", "post", "wait");
        assert_eq!(wait["required"], false, "a run needs no wait");
        assert_eq!(wait["schema"]["pattern"], crate::wire::WAIT_PATTERN);
        let events = "/v1/sessions/{id}/events";
        for name in ["after", "Last-Event-ID"] {
            let p = param(events, "get", name);
            assert_eq!(p["schema"]["format"], "int64", "{name}");
            assert_eq!(p["schema"]["maximum"], crate::wire::MAX_SEQ, "{name}");
        }
        let list = param("/v1/sessions", "get", "continue");
        assert_eq!(list["schema"]["minLength"], 1, "an empty continue");
    }
}
