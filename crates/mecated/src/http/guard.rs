//! The check every route passes before its handler: who the caller is
//! (a bearer token of the token file, or anonymous when authentication is
//! off), whether the route's role is among the token's, and, for the
//! routes that destroy or take something, one audit line of the outcome.

use std::sync::Arc;

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{RawPathParams, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::auth::{Caller, Grant, Roles, TokenFile};
use crate::wire::ErrorCode;

/// The `tracing` target of the audit trail: one line per destructive or
/// ownership-changing request, with `who`, `what`, `session`, `status` and
/// `code`.
pub const AUDIT_TARGET: &str = "audit";

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, even when the server authenticates its callers.
    Open,
    /// Callers whose token has every one of these roles.
    Needs(Roles),
}

/// How the server knows its callers.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// It does not: every caller is [`Caller::anonymous`], with every
    /// role. Only on loopback, or with `--allow-unauthenticated`.
    #[default]
    Off,
    /// Bearer tokens of this file.
    Tokens(Arc<TokenFile>),
}

/// What the check of one route needs.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) auth: Auth,
    pub(crate) access: Access,
    /// The route's operation id, when its requests are audited.
    pub(crate) audited: Option<&'static str>,
    /// Shared by every route of a router.
    pub(crate) refusals: Arc<RefusalLines>,
}

/// At most this many audit lines a second for refused requests. A refusal
/// costs its sender nothing, so without a bound anyone who reaches the
/// port could fill the disk with audit lines, or bury the ones that
/// matter. Requests that were let through are always written.
pub const REFUSAL_AUDIT_LINES_PER_SECOND: u32 = 20;

/// The budget of refusal audit lines of the current second, and how many
/// were left out.
#[derive(Debug, Default)]
pub(crate) struct RefusalLines(std::sync::Mutex<RefusalWindow>);

#[derive(Debug, Default)]
struct RefusalWindow {
    second: Option<std::time::Instant>,
    written: u32,
    left_out: u64,
}

impl RefusalLines {
    /// Whether a refusal's line may be written now, and how many were left
    /// out before it (to be said on that line).
    fn admit(&self, now: std::time::Instant) -> Option<u64> {
        let mut w = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let elapsed = w.second.map(|s| now.saturating_duration_since(s));
        if elapsed.is_none_or(|e| e >= std::time::Duration::from_secs(1)) {
            w.second = Some(now);
            w.written = 0;
        }
        if w.written >= REFUSAL_AUDIT_LINES_PER_SECOND {
            w.left_out += 1;
            return None;
        }
        w.written += 1;
        Some(std::mem::take(&mut w.left_out))
    }
}

/// A refused request: the answer, and the token's name when the token was
/// known (refused for its roles).
struct Refusal {
    who: Option<String>,
    error: ApiError,
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Self {
        Self { who: None, error }
    }
}

/// The caller of a request, with its grant when it presented a token, or
/// the answer refusing it.
fn caller(
    auth: &Auth,
    access: Access,
    headers: &HeaderMap,
) -> Result<(Caller, Option<Grant>), Refusal> {
    let tokens = match auth {
        Auth::Off => return Ok((Caller::anonymous(), None)),
        Auth::Tokens(tokens) => tokens,
    };
    let Access::Needs(needed) = access else {
        return Ok((Caller::anonymous(), None));
    };
    let token = bearer_token(headers)?;
    let (caller, grant) = Grant::authenticate(tokens, token).ok_or_else(|| {
        ApiError::unauthenticated(
            "the bearer token is not accepted: it is not in the server's token file (or was \
             removed from it)",
        )
    })?;
    match needed.missing_from(caller.roles()) {
        None => Ok((caller, Some(grant))),
        Some(role) => Err(Refusal {
            who: Some(caller.name().to_owned()),
            error: ApiError::forbidden(caller.name(), role),
        }),
    }
}

/// The token of the one `Authorization: Bearer` header.
fn bearer_token(headers: &HeaderMap) -> Result<&str, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(ApiError::unauthenticated(
            "this request needs one `Authorization: Bearer <token>` header",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty());
    token.ok_or_else(|| {
        ApiError::unauthenticated(
            "the Authorization header is not `Bearer <token>`: this server takes bearer \
             tokens only",
        )
    })
}

/// The middleware of every route: refuses a caller without the route's
/// role before its handler runs (so nothing of the request, its body
/// included, is read), and audits the routes that say so.
pub(crate) async fn guard(
    State(guard): State<Guard>,
    params: Result<RawPathParams, RawPathParamsRejection>,
    mut request: Request,
    next: Next,
) -> Response {
    let checked = caller(&guard.auth, guard.access, request.headers());
    let Some(what) = guard.audited else {
        return match checked {
            Ok((caller, grant)) => {
                request.extensions_mut().insert(caller);
                if let Some(grant) = grant {
                    request.extensions_mut().insert(grant);
                }
                next.run(request).await
            }
            Err(refused) => refused.error.into_response(),
        };
    };
    // The `{id}` as the handler reads it; the raw path when it does not
    // decode.
    let session = params
        .ok()
        .and_then(|p| {
            p.iter()
                .find(|(k, _)| *k == "id")
                .map(|(_, v)| v.to_owned())
        })
        .unwrap_or_else(|| request.uri().path().to_owned());
    match checked {
        Ok((caller, grant)) => {
            let who = caller.name().to_owned();
            request.extensions_mut().insert(caller);
            if let Some(grant) = grant {
                request.extensions_mut().insert(grant);
            }
            // On a task of its own: a client that goes away drops this
            // future, yet what the handler started (a delete, a cancel)
            // goes on, and so must its audit line.
            let handled = tokio::spawn(async move {
                let response = next.run(request).await;
                audit(&who, what, &session, &response);
                response
            });
            handled.await.unwrap_or_else(|e| {
                tracing::error!(error = %e, what, "an audited request's handler failed");
                ApiError::new(ErrorCode::Internal, "the request's handler failed").into_response()
            })
        }
        Err(refused) => {
            let response = refused.error.into_response();
            let who = refused.who.unwrap_or_else(|| "unauthenticated".into());
            if let Some(left_out) = guard.refusals.admit(std::time::Instant::now()) {
                if left_out > 0 {
                    tracing::warn!(
                        target: AUDIT_TARGET,
                        left_out,
                        "audit: refused requests past {REFUSAL_AUDIT_LINES_PER_SECOND} a second were \
                         not written"
                    );
                }
                audit(&who, what, &session, &response);
            }
            response
        }
    }
}

/// One audit line. The `tracing` formatter quotes and escapes string
/// fields, so a session id cannot forge a line of its own.
fn audit(who: &str, what: &str, session: &str, response: &Response) {
    let status = response.status().as_u16();
    let code = response
        .extensions()
        .get::<ErrorCode>()
        .and_then(|c| serde_json::to_value(c).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    tracing::info!(target: AUDIT_TARGET, who, what, session, status, code, "audit");
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn refusal_lines_are_bounded_per_second_and_the_left_out_are_counted() {
        let lines = RefusalLines::default();
        let start = Instant::now();
        for _ in 0..REFUSAL_AUDIT_LINES_PER_SECOND {
            assert_eq!(lines.admit(start), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(lines.admit(start + Duration::from_millis(999)), None);
        }
        assert_eq!(lines.admit(start + Duration::from_secs(1)), Some(5));
        assert_eq!(lines.admit(start + Duration::from_secs(1)), Some(0));
    }
}
