//! The fence moved to an effect's destination.
//!
//! A session's store refuses the writes of an owner whose lease a later
//! owner has passed. A run's effects elsewhere (a mail sent, a card
//! charged, a ticket opened) reach services that know nothing of leases: a
//! holder paused past its lease wakes and repeats the effect the next
//! owner also performs. A service that receives such effects keeps an
//! [`EffectFence`]: each request carries the run's session, its fencing
//! token and an idempotency key, and the fence refuses a token below the
//! highest it has seen for the session ([`Admission::Stale`]) and a key it
//! has already admitted ([`Admission::Repeat`]).
//!
//! The fence holds, per session, the highest token seen and the keys
//! admitted under it: keys of older tokens are dropped when a newer token
//! arrives, since their requests are stale from then on. It lives in
//! memory: a service whose effects must stay refused across its own
//! restarts records the token and the key in its own database, in the
//! transaction that performs the effect, by the same rules.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Mutex, PoisonError};

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use serde_json::json;

/// The request header naming the session the effect is for.
pub const SESSION_HEADER: &str = "mecatl-session";
/// The request header carrying the run's fencing token.
pub const TOKEN_HEADER: &str = "mecatl-fencing-token";
/// The request header carrying the effect's idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// What an effect request claims: the session, the run's token and,
/// optionally, the effect's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectClaim {
    /// The session the run belongs to.
    pub session: String,
    /// The run's fencing token.
    pub token: u64,
    /// The effect's idempotency key; without one, only the token is
    /// checked.
    pub key: Option<String>,
}

/// Why a request's headers make no [`EffectClaim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectHeaderError {
    header: &'static str,
    problem: &'static str,
}

impl fmt::Display for EffectHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "header {}: {}", self.header, self.problem)
    }
}

impl std::error::Error for EffectHeaderError {}

impl IntoResponse for EffectHeaderError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "code": "invalid",
            "message": self.to_string(),
            "retryable": false,
        }});
        (StatusCode::BAD_REQUEST, Json(body)).into_response()
    }
}

impl EffectClaim {
    /// The claim of a request: [`SESSION_HEADER`] and [`TOKEN_HEADER`]
    /// are required, [`IDEMPOTENCY_KEY_HEADER`] optional.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, EffectHeaderError> {
        let text = |header: &'static str| -> Result<Option<String>, EffectHeaderError> {
            headers
                .get(header)
                .map(|v| {
                    v.to_str()
                        .map(str::to_owned)
                        .map_err(|_| EffectHeaderError {
                            header,
                            problem: "not visible ASCII",
                        })
                })
                .transpose()
        };
        let session = text(SESSION_HEADER)?
            .filter(|s| !s.is_empty())
            .ok_or(EffectHeaderError {
                header: SESSION_HEADER,
                problem: "missing or empty",
            })?;
        let token = text(TOKEN_HEADER)?
            .ok_or(EffectHeaderError {
                header: TOKEN_HEADER,
                problem: "missing",
            })?
            .parse()
            .map_err(|_| EffectHeaderError {
                header: TOKEN_HEADER,
                problem: "not a whole number",
            })?;
        let key = text(IDEMPOTENCY_KEY_HEADER)?;
        Ok(Self {
            session,
            token,
            key,
        })
    }
}

/// What the fence makes of an effect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Perform the effect: the token is the session's highest so far and
    /// the key is new.
    Admitted,
    /// The key was admitted before under this token: the effect was
    /// performed (or is being performed); do not perform it again.
    Repeat,
    /// A later owner of the session has been seen: this request comes from
    /// an owner that lost the session and must not act for it.
    Stale {
        /// The highest token seen for the session.
        highest: u64,
    },
}

impl Admission {
    /// The refusal to answer for a stale or repeated request; `None` when
    /// admitted. A repeat is refused as a conflict too: a service that
    /// stores the first answer should send that answer instead.
    pub fn refusal(self) -> Option<Response> {
        let (code, message, highest) = match self {
            Admission::Admitted => return None,
            Admission::Repeat => (
                "repeated_effect",
                "this effect key was already admitted".to_owned(),
                None,
            ),
            Admission::Stale { highest } => (
                "stale_fencing_token",
                format!("a later owner of the session (token {highest}) has been seen"),
                Some(highest),
            ),
        };
        let body = json!({"error": {
            "code": code,
            "message": message,
            "highest_token": highest,
            "retryable": false,
        }});
        Some((StatusCode::CONFLICT, Json(body)).into_response())
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
    keys: HashSet<String>,
}

impl EffectFence {
    /// A fence that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Judges `claim`, and records it when admitted: atomic, so of two
    /// requests racing with one key exactly one is admitted.
    pub fn admit(&self, claim: &EffectClaim) -> Admission {
        let mut sessions = self.lock();
        let mark = sessions.entry(claim.session.clone()).or_default();
        if claim.token < mark.highest {
            return Admission::Stale {
                highest: mark.highest,
            };
        }
        if claim.token > mark.highest {
            mark.highest = claim.token;
            mark.keys.clear();
        }
        match &claim.key {
            Some(key) if !mark.keys.insert(key.clone()) => Admission::Repeat,
            _ => Admission::Admitted,
        }
    }

    /// Forgets an admitted key whose effect failed, so a retry of it is
    /// admitted again. The token stays seen.
    pub fn forget(&self, claim: &EffectClaim) {
        if let (Some(key), Some(mark)) = (&claim.key, self.lock().get_mut(&claim.session))
            && mark.highest == claim.token
        {
            mark.keys.remove(key);
        }
    }

    /// The highest token seen for `session`.
    pub fn highest(&self, session: &str) -> Option<u64> {
        self.lock().get(session).map(|m| m.highest)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mark>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(session: &str, token: u64, key: Option<&str>) -> EffectClaim {
        EffectClaim {
            session: session.into(),
            token,
            key: key.map(str::to_owned),
        }
    }

    #[test]
    fn a_lower_token_is_stale_and_a_key_is_admitted_once() {
        let fence = EffectFence::new();
        assert_eq!(fence.admit(&claim("s", 5, Some("k"))), Admission::Admitted);
        assert_eq!(fence.admit(&claim("s", 5, Some("k"))), Admission::Repeat);
        assert_eq!(fence.admit(&claim("s", 5, Some("j"))), Admission::Admitted);
        assert_eq!(fence.admit(&claim("s", 5, None)), Admission::Admitted);
        assert_eq!(
            fence.admit(&claim("s", 4, Some("new"))),
            Admission::Stale { highest: 5 }
        );
        // Another session has marks of its own.
        assert_eq!(fence.admit(&claim("t", 1, Some("k"))), Admission::Admitted);
        // A later owner: older keys go, its own are new.
        assert_eq!(fence.admit(&claim("s", 6, Some("k"))), Admission::Admitted);
        assert_eq!(
            fence.admit(&claim("s", 5, Some("k"))),
            Admission::Stale { highest: 6 }
        );
        assert_eq!(fence.highest("s"), Some(6));
        assert_eq!(fence.sessions.lock().unwrap()["s"].keys.len(), 1);
    }

    #[test]
    fn a_forgotten_key_is_admitted_again() {
        let fence = EffectFence::new();
        let c = claim("s", 2, Some("k"));
        assert_eq!(fence.admit(&c), Admission::Admitted);
        fence.forget(&c);
        assert_eq!(fence.admit(&c), Admission::Admitted);
        assert_eq!(fence.admit(&c), Admission::Repeat);
    }

    #[test]
    fn headers_make_a_claim_or_a_typed_refusal() {
        let mut h = HeaderMap::new();
        assert_eq!(
            EffectClaim::from_headers(&h).unwrap_err().to_string(),
            "header mecatl-session: missing or empty"
        );
        h.insert(SESSION_HEADER, "s".parse().unwrap());
        h.insert(TOKEN_HEADER, "x".parse().unwrap());
        assert!(
            EffectClaim::from_headers(&h)
                .unwrap_err()
                .to_string()
                .contains("whole number")
        );
        h.insert(TOKEN_HEADER, "9".parse().unwrap());
        assert_eq!(EffectClaim::from_headers(&h).unwrap(), claim("s", 9, None));
        h.insert(IDEMPOTENCY_KEY_HEADER, "k".parse().unwrap());
        assert_eq!(
            EffectClaim::from_headers(&h).unwrap(),
            claim("s", 9, Some("k"))
        );
        let bad = EffectClaim::from_headers(&HeaderMap::new()).unwrap_err();
        assert_eq!(bad.into_response().status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn refusals_are_conflicts_and_admission_is_none() {
        assert!(Admission::Admitted.refusal().is_none());
        for a in [Admission::Repeat, Admission::Stale { highest: 3 }] {
            assert_eq!(a.refusal().unwrap().status(), StatusCode::CONFLICT);
        }
    }
}
