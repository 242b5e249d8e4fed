//! Bearer-token authentication of lease calls.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::pb::Reason;
use crate::status::reason_status;

/// Checks `authorization: Bearer <token>` when a token is configured.
#[derive(Clone)]
pub(crate) struct BearerCheck {
    expected: Option<Arc<str>>,
}

impl BearerCheck {
    pub(crate) fn new(expected: Option<Arc<str>>) -> Self {
        Self { expected }
    }
}

impl tonic::service::Interceptor for BearerCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_credentials);
        match presented {
            Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => Ok(request),
            Some(_) => Err(reason_status(
                Reason::Unauthenticated,
                "the bearer token is not accepted",
                None,
            )),
            None => Err(reason_status(
                Reason::Unauthenticated,
                "lease calls need `authorization: Bearer <token>`",
                None,
            )),
        }
    }
}

/// The token of an `authorization` value whose scheme is `Bearer`, in any
/// letter case (the scheme is case-insensitive; some stacks send `bearer`).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares without an early exit, so the time taken does not tell an
/// attacker how much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_is_case_insensitive_and_nothing_else_is() {
        assert_eq!(bearer_credentials("Bearer abc"), Some("abc"));
        assert_eq!(bearer_credentials("bearer abc"), Some("abc"));
        assert_eq!(bearer_credentials("BEARER  abc "), Some("abc"));
        assert_eq!(bearer_credentials("Basic abc"), None);
        assert_eq!(bearer_credentials("Bearerabc"), None);
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
