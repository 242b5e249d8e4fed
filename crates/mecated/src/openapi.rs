//! The OpenAPI document, derived from the handlers' annotations and the
//! [`wire`](crate::wire) types that serialise every body, so it says what
//! the server does. The committed `openapi.json` is this document; a test
//! fails when they differ.

use std::sync::LazyLock;

use utoipa::openapi::Required;
use utoipa::{Modify, OpenApi};

use crate::auth::Role;
use crate::http::{self, Access};
use crate::wire::{ErrorCode, Event, FollowEnd, RunEnd, RunStatus, SessionIdText};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "mecated",
        description = "A session server whose every run is owned by one process through a fenced lease. \
                       Every error is answered with an `ErrorBody`: `{\"error\": {\"code\", \"message\", \
                       \"retryable\", \"holder\"?, \"role\"?}}` with a stable `code`, a request for a route \
                       that does not exist included (404 `not_found`). Request bodies and query strings with \
                       unknown fields are refused (400 `invalid`). A server started with `--token-file` \
                       authenticates its callers with bearer tokens (`Authorization: Bearer <token>`), each \
                       with roles: `read`, `run` and `admin`, each granting only what it names. Every \
                       operation that needs roles states them (`x-mecated-role`, comma-separated, and its \
                       `security`); starting a run needs both `read` and `run`, since its answer is what \
                       the agent made of the session's transcript. The others \
                       (health, readiness, this document, the operator page's HTML) are open. Without a \
                       token, or with one the server does not know: 401 `unauthenticated` with \
                       `WWW-Authenticate: Bearer`; with a token lacking a role: 403 `forbidden`, whose \
                       `role` names it, and nothing was done. A server without a token file answers only \
                       requests addressed to an IP address, `localhost` or a name it was given \
                       (`--allowed-host`), and takes no write from another origin: 403 `forbidden` \
                       otherwise, on every route."
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
    modifiers(&CreateBodyOptional, &RolesOfRoutes),
    components(schemas(Event, RunEnd, RunStatus, ErrorCode, SessionIdText, FollowEnd, Role)),
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

/// The name of the bearer security scheme in the document.
pub const BEARER_SCHEME: &str = "bearer";

/// Each operation of the route table that needs a role says which
/// (`x-mecated-role`, and the bearer scheme as its `security`), and lists
/// the 401 and 403 its check answers, from the same table the router is
/// built from.
struct RolesOfRoutes;

impl Modify for RolesOfRoutes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::extensions::ExtensionsBuilder;
        use utoipa::openapi::header::Header;
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                BEARER_SCHEME,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "A token of the server's `--token-file`, which holds its SHA-256 \
                             hash, name and roles",
                        ))
                        .build(),
                ),
            );
        let error = || {
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build()
        };
        for route in http::route_table() {
            let Access::Needs(roles) = route.access else {
                continue;
            };
            let Some(op) = operation(doc, &route.method, route.path) else {
                continue;
            };
            op.security = Some(vec![SecurityRequirement::new(
                BEARER_SCHEME,
                Vec::<String>::new(),
            )]);
            op.extensions.get_or_insert_with(Default::default).merge(
                ExtensionsBuilder::new()
                    .add("x-mecated-role", roles.to_string())
                    .build(),
            );
            let unauthenticated = ResponseBuilder::new()
                .description(
                    "`unauthenticated`: the server authenticates its callers, and the request had \
                     no `Authorization: Bearer` token, or one it does not know",
                )
                .header("WWW-Authenticate", Header::default())
                .content("application/json", error())
                .build();
            let spelled: Vec<String> = roles.iter().map(|r| format!("`{r}`")).collect();
            let forbidden = ResponseBuilder::new()
                .description(format!(
                    "`forbidden`: the token lacks the {} role (`role` names the one \
                     missing); nothing was done",
                    spelled.join(" or the ")
                ))
                .content("application/json", error())
                .build();
            let responses = &mut op.responses.responses;
            responses.insert("401".into(), unauthenticated.into());
            responses.insert("403".into(), forbidden.into());
        }
    }
}

/// The operation of `method` on `path` in `doc`.
fn operation<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    method: &axum::http::Method,
    path: &str,
) -> Option<&'a mut utoipa::openapi::path::Operation> {
    use axum::http::Method;
    let item = doc.paths.paths.get_mut(path)?;
    match *method {
        Method::GET => item.get.as_mut(),
        Method::POST => item.post.as_mut(),
        Method::DELETE => item.delete.as_mut(),
        Method::PUT => item.put.as_mut(),
        Method::PATCH => item.patch.as_mut(),
        _ => None,
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

    /// The router serves exactly the document's operations, each with a
    /// role decision from the route table: an open operation carries no
    /// security and no 401, and one that needs a role names it and lists
    /// the 401 and the 403 its check answers.
    #[test]
    fn every_operation_has_a_role_decision_and_states_it() {
        use std::collections::BTreeSet;

        use crate::http::{Access, route_table};

        let doc = serde_json::to_value(super::document()).unwrap();
        let table = route_table();
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let method = method.to_uppercase();
                let route = table
                    .iter()
                    .find(|r| r.method.as_str() == method && r.path == path)
                    .unwrap_or_else(|| panic!("{method} {path} has no role decision"));
                documented.insert((method.clone(), path.clone()));
                let responses = &op["responses"];
                match route.access {
                    Access::Open => {
                        assert!(op.get("security").is_none(), "{method} {path}");
                        assert!(op.get("x-mecated-role").is_none(), "{method} {path}");
                        assert!(responses.get("401").is_none(), "{method} {path}");
                    }
                    Access::Needs(roles) => {
                        assert_eq!(op["x-mecated-role"], roles.to_string(), "{method} {path}");
                        assert_eq!(
                            op["security"],
                            serde_json::json!([{ super::BEARER_SCHEME: [] }]),
                            "{method} {path}"
                        );
                        assert!(responses.get("401").is_some(), "{method} {path}");
                        let forbidden = responses["403"]["description"].as_str().unwrap();
                        for role in roles.iter() {
                            assert!(forbidden.contains(role.name()), "{method} {path}");
                        }
                    }
                }
            }
        }
        let served: BTreeSet<(String, String)> = table
            .iter()
            .map(|r| (r.method.to_string(), r.path.to_owned()))
            .collect();
        assert_eq!(served, documented, "served and documented routes differ");
        let schemes = &doc["components"]["securitySchemes"][super::BEARER_SCHEME];
        assert_eq!(schemes["scheme"], "bearer");
        let codes = doc["components"]["schemas"]["ErrorCode"].to_string();
        for code in ["unauthenticated", "forbidden"] {
            assert!(codes.contains(code), "no {code} in {codes}");
        }
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
