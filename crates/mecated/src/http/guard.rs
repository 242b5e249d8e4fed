//! The check every route passes before its handler: who the caller is
//! (a bearer token of the token file, or anonymous when authentication is
//! off), whether the route's role is among the token's, and, for the
//! routes that destroy or take something, one audit line of the outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

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
    /// Without authentication: the names besides local ones the server
    /// answers under ([`super::local_only`]).
    pub(crate) local: Option<super::AllowedHosts>,
}

/// At most this many audit lines a second for the refused requests of one
/// caller (one token's name, or every caller without a known token). A
/// refusal costs its sender nothing, so without a bound anyone who reaches
/// the port could fill the disk with audit lines, or bury the ones that
/// matter; a budget per caller keeps a flood of anonymous refusals from
/// hiding a known token's. Requests that were let through are always
/// written.
pub const REFUSAL_AUDIT_LINES_PER_SECOND: u32 = 20;

/// The budgets of refusal audit lines, per caller, and how many were left
/// out.
#[derive(Debug, Default)]
pub(crate) struct RefusalLines(Mutex<HashMap<String, RefusalWindow>>);

#[derive(Debug)]
struct RefusalWindow {
    second: Instant,
    written: u32,
    left_out: u64,
    /// A task is to write the count of lines left out.
    counting: bool,
}

/// What to do with one refusal's audit line.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    Write,
    LeftOut,
    /// Left out, the first since the count was last written: write the
    /// count at this instant.
    LeftOutCountAt(Instant),
}

impl RefusalLines {
    fn admit(&self, who: &str, now: Instant) -> Admission {
        let mut windows = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let window = windows
            .entry(who.to_owned())
            .or_insert_with(|| RefusalWindow {
                second: now,
                written: 0,
                left_out: 0,
                counting: false,
            });
        if now.saturating_duration_since(window.second) >= Duration::from_secs(1) {
            window.second = now;
            window.written = 0;
        }
        if window.written < REFUSAL_AUDIT_LINES_PER_SECOND {
            window.written += 1;
            return Admission::Write;
        }
        window.left_out += 1;
        if std::mem::replace(&mut window.counting, true) {
            Admission::LeftOut
        } else {
            Admission::LeftOutCountAt(window.second + Duration::from_secs(1))
        }
    }

    /// The lines left out for `who` since the count was last written.
    fn take_count(&self, who: &str) -> u64 {
        let mut windows = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        windows.get_mut(who).map_or(0, |w| {
            w.counting = false;
            std::mem::take(&mut w.left_out)
        })
    }

    /// Writes the refusal's line, or counts it as left out; the count is
    /// written once its second is over, whatever comes next.
    fn audit(self: &Arc<Self>, who: &str, what: &str, session: &str, response: &Response) {
        match self.admit(who, Instant::now()) {
            Admission::Write => audit(who, what, session, response),
            Admission::LeftOut => {}
            Admission::LeftOutCountAt(at) => {
                let (lines, who) = (Arc::clone(self), who.to_owned());
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    let left_out = lines.take_count(&who);
                    tracing::warn!(
                        target: AUDIT_TARGET,
                        who,
                        left_out,
                        "audit: refused requests past {REFUSAL_AUDIT_LINES_PER_SECOND} a second \
                         of this caller were not written"
                    );
                });
            }
        }
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
    let checked = match &guard.local {
        Some(allowed) => super::local_only::check(allowed, &request)
            .map_err(|error| Refusal {
                who: Some(Caller::ANONYMOUS.to_owned()),
                error,
            })
            .and_then(|()| caller(&guard.auth, guard.access, request.headers())),
        None => caller(&guard.auth, guard.access, request.headers()),
    };
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
            guard.refusals.audit(&who, what, &session, &response);
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
    use super::*;

    #[test]
    fn refusal_lines_are_bounded_per_caller_and_second_and_the_left_out_counted() {
        let lines = RefusalLines::default();
        let start = Instant::now();
        for _ in 0..REFUSAL_AUDIT_LINES_PER_SECOND {
            assert_eq!(lines.admit("unauthenticated", start), Admission::Write);
        }
        let later = start + Duration::from_millis(999);
        assert_eq!(
            lines.admit("unauthenticated", later),
            Admission::LeftOutCountAt(start + Duration::from_secs(1))
        );
        for _ in 0..4 {
            assert_eq!(lines.admit("unauthenticated", later), Admission::LeftOut);
        }
        // Another caller has a budget of its own.
        assert_eq!(lines.admit("reader", later), Admission::Write);
        assert_eq!(lines.take_count("unauthenticated"), 5);
        assert_eq!(lines.take_count("unauthenticated"), 0);
        let next = start + Duration::from_secs(1);
        assert_eq!(lines.admit("unauthenticated", next), Admission::Write);
    }
}
