//! `GET /`: the operator page. One self-contained HTML document (inline
//! script and style, nothing fetched from elsewhere, no build step) that
//! lists the sessions with their lease holder, token and expiry, and shows
//! a chosen session's events live through the follow endpoint.
//!
//! The document itself is open: it holds no data. Against a server with a
//! token file it asks for a bearer token (a field, or `#token=…` in the
//! address, which it removes at once), keeps it in the tab's
//! `sessionStorage`, and sends it as `Authorization` on every request; it
//! follows over `fetch` rather than `EventSource`, which cannot send
//! headers, so the token never goes into a URL (and so into access logs).
//! It says when it has no token, an unknown one, or one lacking `read`.

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
                   Open `/#session=ID` to show one session at once. The document is open; against a server \
                   with a token file it asks for a bearer token (or takes `#token=…`), and every request it \
                   makes needs `read`.",
    responses((status = 200, description = "The page", body = String, content_type = "text/html"))
)]
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing but the page's own inline script and style, and
            // requests to this server; and no other site may frame it, so
            // none can overlay it to steer the operator's clicks.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}
