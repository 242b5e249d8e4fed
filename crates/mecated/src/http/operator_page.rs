//! `GET /`: the operator page. One self-contained HTML document (inline
//! script and style, nothing fetched from elsewhere, no build step) that
//! lists the sessions with their lease holder, token and expiry, and shows
//! a chosen session's events live through the follow endpoint.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("operator_page.html");

#[utoipa::path(
    get,
    path = "/",
    operation_id = "operatorPage",
    tag = "operations",
    summary = "The operator page",
    description = "Sessions with their lease holder, token and expiry; a chosen session's events, live. \
                   Open `/#session=ID` to show one session at once.",
    responses((status = 200, description = "The page", body = String, content_type = "text/html"))
)]
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing but the page's own inline script and style, and
            // requests to this server.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        PAGE,
    )
        .into_response()
}
