//! The fence moved to an effect's destination.
//!
//! A session's store refuses the writes of an owner whose lease a later
//! owner has passed. A run's effects elsewhere (a mail sent, a card
//! charged, a ticket opened) reach services that know nothing of leases: a
//! holder paused past its lease wakes and repeats the effect the next
//! owner also performs. A service that receives such effects keeps an
//! [`EffectFence`]. Each request carries the run's session, its fencing
//! token and an idempotency key ([`EffectClaim`], from the request's
//! headers), and the fence refuses:
//!
//! - a token below the highest it has seen for the session
//!   ([`Refusal::Stale`]): the owner that lost the session, once the
//!   service has heard from a later one;
//! - a key whose effect was performed ([`Refusal::Repeat`]), or is being
//!   performed by another request ([`Refusal::InProgress`]): the same
//!   effect of the same run sent twice.
//!
//! What it cannot refuse: a stale owner's request that reaches the service
//! *before* the next owner's first one, since nothing has told the service
//! of the later owner yet. The run's own check of its lease
//! (`lease_check`, or the deadline an `exec` command is given) narrows that
//! window to a pause between the check and the request. A key names one
//! effect of one run (a `mecated` run sends its effect key prefix followed
//! by a step name): a later run that does the same thing again, as a
//! retry by a client, makes a key of its own.
//!
//! An admitted request holds an [`EffectTicket`]: [`done`](EffectTicket::done)
//! once the effect is performed; dropped without it (the effect failed,
//! the handler's future was dropped), the key is let go and a retry is
//! admitted.
//!
//! The fence holds, per session, the highest token seen and the keys
//! admitted under it: keys of older tokens are dropped when a newer token
//! arrives, since their requests are stale from then on. So its memory is
//! one entry per session it has seen, plus the keys of each session's
//! newest owner; nothing is dropped on its own. It lives in memory: a
//! service whose effects must stay refused across its own restarts, or
//! that sees sessions without end, records the token and the key in its
//! own database, in the transaction that performs the effect, by the same
//! rules.
//!
//! ```
//! use std::sync::Arc;
//!
//! use axum::extract::State;
//! use lease_http::{EffectClaim, EffectFence, ErrorCode, HttpError};
//!
//! async fn send_mail(
//!     State(fence): State<Arc<EffectFence>>,
//!     claim: EffectClaim, // 400 `invalid` without valid headers
//! ) -> Result<&'static str, HttpError> {
//!     // 409 for a stale owner, a repeat, or the same key in progress.
//!     let ticket = fence.admit(&claim)?;
//!     if deliver().await.is_err() {
//!         // Not performed: the ticket drops and a retry of the key is
//!         // admitted.
//!         return Err(HttpError::new(ErrorCode::Internal, "mail not sent"));
//!     }
//!     ticket.done();
//!     Ok("sent")
//! }
//! # async fn deliver() -> Result<(), ()> { Ok(()) }
//! let app: axum::Router = axum::Router::new()
//!     .route("/mail", axum::routing::post(send_mail))
//!     .with_state(Arc::new(EffectFence::new()));
//! # drop(app);
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use axum::extract::FromRequestParts;
use http::HeaderMap;
use http::request::Parts;

use lease_port::FencingToken;

use crate::{ErrorCode, HttpError};

/// The request header naming the session the effect is for.
pub const SESSION_HEADER: &str = "mecatl-session";
/// The request header carrying the run's fencing token, in decimal digits.
pub const TOKEN_HEADER: &str = "mecatl-fencing-token";
/// The request header carrying the effect's idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// What an effect request claims: the session, the run's token and,
/// optionally, the effect's key. An axum extractor too: a handler taking
/// an `EffectClaim` answers a request without a valid one with 400
/// `invalid` (an [`HttpError`] naming the header) before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectClaim {
    /// The session the run belongs to ([`SESSION_HEADER`]: its id as UTF-8,
    /// not empty; HTTP drops spaces around a header value, so ids that
    /// differ only in those are one session here).
    pub session: String,
    /// The run's fencing token ([`TOKEN_HEADER`]: decimal digits only, no
    /// sign or spaces, at most [`FencingToken::MAX_FLOOR`]).
    pub token: u64,
    /// The effect's idempotency key ([`IDEMPOTENCY_KEY_HEADER`]: absent,
    /// or not empty). Without one only the token is checked. A `mecated`
    /// run sends its effect key prefix followed by a step name, so a key is
    /// one effect of one run.
    pub key: Option<String>,
}

fn invalid(header: &str, problem: &str) -> HttpError {
    HttpError::new(ErrorCode::Invalid, format!("header {header}: {problem}"))
}

impl EffectClaim {
    /// The claim of a request's headers; 400 `invalid`, naming the header,
    /// when one is missing, empty, not UTF-8, or (the token) not a decimal
    /// number within the range. A run without a lease has no token, so its
    /// effects cannot be fenced here.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, HttpError> {
        let text = |header: &str| -> Result<Option<String>, HttpError> {
            match headers.get(header) {
                None => Ok(None),
                Some(v) => match std::str::from_utf8(v.as_bytes()) {
                    Ok("") => Err(invalid(header, "empty")),
                    Ok(v) => Ok(Some(v.to_owned())),
                    Err(_) => Err(invalid(header, "not UTF-8")),
                },
            }
        };
        let session = text(SESSION_HEADER)?.ok_or_else(|| invalid(SESSION_HEADER, "missing"))?;
        let digits = text(TOKEN_HEADER)?.ok_or_else(|| invalid(TOKEN_HEADER, "missing"))?;
        let token = digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse::<u64>().ok())
            .flatten()
            // Not above the floor a store accepts: one request naming the
            // largest number would otherwise shut every owner out.
            .filter(|&t| t <= FencingToken::MAX_FLOOR.get())
            .ok_or_else(|| {
                invalid(
                    TOKEN_HEADER,
                    "not a decimal number from 0 to 4611686018427387904 (2^62)",
                )
            })?;
        let key = text(IDEMPOTENCY_KEY_HEADER)?;
        Ok(Self {
            session,
            token,
            key,
        })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for EffectClaim {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        Self::from_headers(&parts.headers)
    }
}

/// Why the fence refused an effect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A later owner of the session has been seen: this request comes from
    /// an owner that lost the session and must not act for it.
    Stale {
        /// The highest token seen for the session.
        highest: u64,
    },
    /// The key's effect was performed ([`EffectTicket::done`]); do not
    /// perform it again.
    Repeat,
    /// The key's effect is being performed by another request right now:
    /// ask again shortly, to learn whether it was done or may be tried.
    InProgress,
}

impl From<Refusal> for HttpError {
    /// 409 [`StaleFencingToken`](ErrorCode::StaleFencingToken) (its message
    /// names the highest token seen) or 409
    /// [`RepeatedEffect`](ErrorCode::RepeatedEffect), neither retryable; or
    /// 409 [`EffectInProgress`](ErrorCode::EffectInProgress), retryable,
    /// with `Retry-After: 1`. The body is the usual
    /// [`ErrorBody`](crate::ErrorBody). A service that keeps the first
    /// answer of each key may send that instead on a repeat.
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Stale { highest } => HttpError::new(
                ErrorCode::StaleFencingToken,
                format!(
                    "a later owner of the session (token {highest}) has been seen: this \
                     request's owner lost the session, and the effect was not performed"
                ),
            ),
            Refusal::Repeat => HttpError::new(
                ErrorCode::RepeatedEffect,
                "this effect key's effect was performed already: not performed again",
            ),
            Refusal::InProgress => HttpError::new(
                ErrorCode::EffectInProgress,
                "this effect key's effect is being performed by another request: ask again",
            )
            .with_retry_after(1),
        }
    }
}

/// Per session, the highest token seen and the keys admitted under it;
/// share one (behind an `Arc`) among a service's handlers.
#[derive(Debug, Default)]
pub struct EffectFence {
    sessions: Mutex<HashMap<String, Mark>>,
}

#[derive(Debug, Default)]
struct Mark {
    highest: u64,
    /// Each key admitted under `highest`: true once its effect was done.
    keys: HashMap<String, bool>,
}

/// An admitted effect: perform it, then call [`done`](Self::done). Dropped
/// without `done` (the effect failed, the handler returned early or its
/// future was dropped), the key is let go, so a retry of it is admitted.
#[must_use = "an admitted effect's key is let go when its ticket drops; call done() once performed"]
#[derive(Debug)]
pub struct EffectTicket<'a> {
    fence: &'a EffectFence,
    session: String,
    token: u64,
    key: Option<String>,
}

impl EffectTicket<'_> {
    /// The effect was performed: its key is refused from now on
    /// ([`Refusal::Repeat`]).
    pub fn done(mut self) {
        if let Some(key) = self.key.take() {
            self.fence.settle(&self.session, self.token, &key, true);
        }
    }
}

impl Drop for EffectTicket<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.fence.settle(&self.session, self.token, &key, false);
        }
    }
}

impl EffectFence {
    /// A fence that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Judges `claim` and, when it may go ahead, records its token and
    /// holds its key until the ticket is done or dropped. Atomic: of two
    /// requests racing with one key, one is admitted and the other is told
    /// [`Refusal::InProgress`].
    pub fn admit(&self, claim: &EffectClaim) -> Result<EffectTicket<'_>, Refusal> {
        let mut sessions = self.lock();
        let mark = sessions.entry(claim.session.clone()).or_default();
        if claim.token < mark.highest {
            return Err(Refusal::Stale {
                highest: mark.highest,
            });
        }
        if claim.token > mark.highest {
            mark.highest = claim.token;
            mark.keys.clear();
        }
        if let Some(key) = &claim.key {
            match mark.keys.get(key) {
                Some(true) => return Err(Refusal::Repeat),
                Some(false) => return Err(Refusal::InProgress),
                None => {
                    mark.keys.insert(key.clone(), false);
                }
            }
        }
        Ok(EffectTicket {
            fence: self,
            session: claim.session.clone(),
            token: claim.token,
            key: claim.key.clone(),
        })
    }

    /// The highest token seen for `session`.
    pub fn highest(&self, session: &str) -> Option<u64> {
        self.lock().get(session).map(|m| m.highest)
    }

    /// A ticket's end: its key done, or let go. Nothing when a later owner
    /// has been seen meanwhile (its keys were dropped with the old token).
    fn settle(&self, session: &str, token: u64, key: &str, done: bool) {
        let mut sessions = self.lock();
        let Some(mark) = sessions.get_mut(session).filter(|m| m.highest == token) else {
            return;
        };
        if done {
            mark.keys.insert(key.to_owned(), true);
        } else {
            mark.keys.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mark>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn claim(session: &str, token: u64, key: Option<&str>) -> EffectClaim {
        EffectClaim {
            session: session.into(),
            token,
            key: key.map(str::to_owned),
        }
    }

    #[test]
    fn a_lower_token_is_stale_and_a_done_key_is_a_repeat() {
        let fence = EffectFence::new();
        fence.admit(&claim("s", 5, Some("k"))).unwrap().done();
        assert_eq!(
            fence.admit(&claim("s", 5, Some("k"))).unwrap_err(),
            Refusal::Repeat
        );
        fence.admit(&claim("s", 5, Some("j"))).unwrap().done();
        fence.admit(&claim("s", 5, None)).unwrap().done();
        assert_eq!(
            fence.admit(&claim("s", 4, Some("new"))).unwrap_err(),
            Refusal::Stale { highest: 5 }
        );
        // Another session has marks of its own.
        fence.admit(&claim("t", 1, Some("k"))).unwrap().done();
        // A later owner: older keys go, its own are new.
        fence.admit(&claim("s", 6, Some("k"))).unwrap().done();
        assert_eq!(
            fence.admit(&claim("s", 5, Some("k"))).unwrap_err(),
            Refusal::Stale { highest: 6 }
        );
        assert_eq!(fence.highest("s"), Some(6));
        assert_eq!(fence.sessions.lock().unwrap()["s"].keys.len(), 1);
    }

    #[test]
    fn a_key_in_progress_is_refused_for_now_and_let_go_when_its_ticket_drops() {
        let fence = EffectFence::new();
        let c = claim("s", 2, Some("k"));
        let first = fence.admit(&c).unwrap();
        assert_eq!(fence.admit(&c).unwrap_err(), Refusal::InProgress);
        // The effect failed: the ticket drops, and a retry is admitted.
        drop(first);
        let retry = fence.admit(&c).unwrap();
        retry.done();
        assert_eq!(fence.admit(&c).unwrap_err(), Refusal::Repeat);
        // A ticket settling after a later owner was seen changes nothing.
        let old = fence.admit(&claim("s", 2, Some("late"))).unwrap();
        fence.admit(&claim("s", 3, Some("k"))).unwrap().done();
        old.done();
        assert_eq!(
            fence.admit(&claim("s", 2, Some("late"))).unwrap_err(),
            Refusal::Stale { highest: 3 }
        );
        assert!(
            !fence.sessions.lock().unwrap()["s"]
                .keys
                .contains_key("late")
        );
    }

    #[test]
    fn headers_make_a_claim_or_a_400_naming_the_header() {
        let refused = |h: &HeaderMap| {
            let e = EffectClaim::from_headers(h).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            assert_eq!(e.code(), ErrorCode::Invalid);
            e.message().to_owned()
        };
        let mut h = HeaderMap::new();
        assert!(refused(&h).contains(SESSION_HEADER));
        h.insert(SESSION_HEADER, "s".parse().unwrap());
        assert!(refused(&h).contains(TOKEN_HEADER));
        for bad in [
            "x",
            "+8",
            " 7",
            "-1",
            "1.0",
            "4611686018427387905",
            "18446744073709551615",
            "",
        ] {
            h.insert(TOKEN_HEADER, bad.parse().unwrap());
            assert!(refused(&h).contains(TOKEN_HEADER), "{bad:?}");
        }
        h.insert(TOKEN_HEADER, "4611686018427387904".parse().unwrap());
        assert_eq!(EffectClaim::from_headers(&h).unwrap().token, 1 << 62);
        h.insert(TOKEN_HEADER, "9".parse().unwrap());
        assert_eq!(EffectClaim::from_headers(&h).unwrap(), claim("s", 9, None));
        h.insert(IDEMPOTENCY_KEY_HEADER, "".parse().unwrap());
        assert!(refused(&h).contains(IDEMPOTENCY_KEY_HEADER));
        h.insert(IDEMPOTENCY_KEY_HEADER, "k".parse().unwrap());
        assert_eq!(
            EffectClaim::from_headers(&h).unwrap(),
            claim("s", 9, Some("k"))
        );
        h.insert(
            SESSION_HEADER,
            http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert_eq!(EffectClaim::from_headers(&h).unwrap().session, "café");
        h.insert(
            SESSION_HEADER,
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        assert!(refused(&h).contains("UTF-8"));
    }

    #[test]
    fn refusals_are_conflicts_and_only_one_in_progress_is_retried() {
        let stale = HttpError::from(Refusal::Stale { highest: 3 });
        assert_eq!(stale.code(), ErrorCode::StaleFencingToken);
        assert!(stale.message().contains("token 3"));
        let repeat = HttpError::from(Refusal::Repeat);
        assert_eq!(repeat.code(), ErrorCode::RepeatedEffect);
        for e in [&stale, &repeat] {
            assert_eq!(e.status(), StatusCode::CONFLICT);
            assert!(!e.code().is_retryable());
        }
        let busy = HttpError::from(Refusal::InProgress);
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        assert!(busy.code().is_retryable());
        assert_eq!(busy.retry_after(), Some(1));
    }
}
