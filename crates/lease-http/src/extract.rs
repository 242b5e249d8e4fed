//! Extractors: the session a route names, and its lease for the handler.

use std::collections::HashMap;

use axum::extract::{FromRef, FromRequestParts, Path};
use http::request::Parts;
use lease_keeper::{LeaseGuard, LeaseKeeper};
use lease_port::SessionId;

use crate::{ErrorCode, HttpError};

/// The name of the path parameter both extractors read: routes spell it
/// `{session}`, as in `/{session}/messages`. Other parameters may sit
/// beside it.
pub const SESSION_PARAM: &str = "session";

/// The route's `{session}`, validated as a [`SessionId`]; no lease taken.
/// For the routes that read.
///
/// Rejected with 400 `invalid` when the id breaks the id rules (empty,
/// over [`MAX_ID_LEN`](lease_port::MAX_ID_LEN) bytes, a control
/// character) or does not percent-decode to UTF-8, and with 500
/// `internal` when the route has no `{session}`: a fault of the router,
/// not of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPath(pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                let code = if e.status().is_server_error() {
                    ErrorCode::Internal
                } else {
                    ErrorCode::Invalid
                };
                HttpError::new(code, e.body_text())
            })?;
        let raw = params.get(SESSION_PARAM).ok_or_else(|| {
            HttpError::new(
                ErrorCode::Internal,
                format!("the route has no {{{SESSION_PARAM}}} parameter"),
            )
        })?;
        SessionId::new(raw).map(SessionPath).map_err(|e| {
            HttpError::new(
                ErrorCode::Invalid,
                format!("bad session id in the path: {}", e.message()),
            )
        })
    }
}

/// The lease of the route's `{session}`, held for the handler: the run's
/// [`LeaseGuard`].
///
/// The state gives the [`LeaseKeeper`] through [`FromRef`] (a state that
/// *is* a keeper does already). Extracting reads `{session}` as
/// [`SessionPath`] does (400 `invalid` on a bad id) and acquires the
/// session's lease with [`LeaseKeeper::acquire`]; a refusal is answered as
/// [`HttpError`] from the [`KeeperError`](lease_keeper::KeeperError): 409
/// `session_leased_elsewhere` with the holder and `Retry-After` when
/// another process holds it, 409 `session_busy` when this process serves
/// another request for it, 503 `lease_unavailable` or `shutting_down`.
///
/// Write with [`LeaseGuard::spawn_write`], which hands the write the run's
/// fence and refuses it (`lease_lost`) once the lease is lost; the store
/// refuses it (`write_fenced`) once a later owner wrote. Both convert with
/// `?`.
///
/// **When the lease is released.** When the handler calls
/// [`LeaseGuard::finish`] or drops the guard, after every write the run
/// started has ended. Prefer `finish` at the end of the handler: the
/// answer then follows the release, so the client's next request finds the
/// session free. A dropped guard releases on a task spawned for it; a
/// request for the session reaching this process meanwhile waits for that
/// release rather than being refused. Do not answer with `finish`'s error: the writes are made by
/// then, and an answer saying otherwise would have the client send them
/// again; log it.
///
/// **When the client disconnects**, the server drops the handler's future
/// wherever it is. A write already started by `spawn_write` runs to its
/// end on its own task (its outcome is lost with the answer). The guard is
/// dropped with the future, so the release runs detached — a disconnect
/// cannot cancel it — and only after that write has ended, so the write
/// cannot land inside the session's next run in this process. A
/// disconnect during the acquisition leaves at worst a lease nobody holds,
/// which lapses after its TTL.
///
/// The lease does not create the session: a write to a session never
/// created is answered 404 `not_found` by the store (`examples/chat.rs`
/// creates it in the write).
///
/// Extractors run in argument order and the body's last, so the lease is
/// taken before the body is read: put `Leased` after the other
/// parts-extractors, so that a request refused for its query or headers
/// never takes the lease.
#[derive(Debug)]
pub struct Leased(pub LeaseGuard);

impl Leased {
    /// The guard.
    pub fn into_inner(self) -> LeaseGuard {
        self.0
    }
}

impl<S> FromRequestParts<S> for Leased
where
    LeaseKeeper: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let SessionPath(session) = SessionPath::from_request_parts(parts, state).await?;
        let keeper = LeaseKeeper::from_ref(state);
        Ok(Leased(keeper.acquire(&session).await?))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use http::{Request, StatusCode};
    use lease_port::OwnerId;
    use memlease::MemLease;
    use tower::ServiceExt;

    use super::*;
    use crate::ErrorBody;

    fn app() -> Router {
        let ttl = Duration::from_secs(30);
        let keeper = LeaseKeeper::new(
            Arc::new(MemLease::new(ttl)),
            OwnerId::new("a").unwrap(),
            ttl,
        )
        .unwrap();
        Router::new()
            .route(
                "/{session}/leased",
                get(|Leased(run): Leased| async move { run.session_id().to_string() }),
            )
            .route(
                "/{session}/read",
                get(|SessionPath(id): SessionPath| async move { id.to_string() }),
            )
            .route(
                "/nameless/{id}",
                get(|SessionPath(id): SessionPath| async move { id.to_string() }),
            )
            .with_state(keeper)
    }

    async fn get_code(uri: &str) -> (StatusCode, Option<ErrorCode>, String) {
        let answer = app()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = answer.status();
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) => (status, Some(e.error.code), e.error.message),
            Err(_) => (status, None, String::from_utf8_lossy(&body).into_owned()),
        }
    }

    #[tokio::test]
    async fn a_bad_session_id_is_400_invalid() {
        let too_long = "x".repeat(lease_port::MAX_ID_LEN + 1);
        for bad in ["%07", "%FF", too_long.as_str()] {
            for route in ["leased", "read"] {
                let (status, code, message) = get_code(&format!("/{bad}/{route}")).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{bad} {route}: {message}");
                assert_eq!(code, Some(ErrorCode::Invalid), "{bad} {route}: {message}");
            }
        }
    }

    #[tokio::test]
    async fn a_good_one_is_handed_over_leased_or_not() {
        for route in ["leased", "read"] {
            let (status, code, body) = get_code(&format!("/chat%2F7/{route}")).await;
            assert_eq!((status, code), (StatusCode::OK, None), "{body}");
            assert_eq!(body, "chat/7");
        }
    }

    #[tokio::test]
    async fn a_route_without_the_parameter_is_the_servers_fault() {
        let (status, code, message) = get_code("/nameless/chat-7").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{message}");
        assert_eq!(code, Some(ErrorCode::Internal));
        assert!(message.contains("{session}"), "{message}");
    }
}
