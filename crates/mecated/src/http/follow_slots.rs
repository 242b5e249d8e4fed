//! How many follows one client may hold open at once.
//!
//! A follow is a response that does not end: each costs the server a
//! connection, a task and a subscription for as long as the client keeps
//! it. Without a bound, one token leaked to a script that reconnects in a
//! loop holds them all. The bound is per token name, so one misbehaving
//! client meets it while every other client goes on; a server without
//! authentication cannot tell its callers apart and is not bounded here
//! (it serves loopback, or was told to trust its network).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use futures_util::Stream;

use super::ApiError;
use crate::auth::{Caller, Grant, Role};

/// The follows open per token name, against a bound.
#[derive(Debug, Clone)]
pub(crate) struct FollowSlots {
    limit: usize,
    /// By token (its hash), not by name: a token rotated under its name
    /// is another client, whom the old one's follows must not hold up.
    open: Arc<Mutex<HashMap<[u8; 32], usize>>>,
}

impl FollowSlots {
    /// At most `limit` follows per token at once; 0 bounds nothing.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            open: Arc::default(),
        }
    }

    /// A slot for one more follow of the token of `grant` (whose name is
    /// `caller`'s), or the refusal when it holds its limit. Callers without
    /// a token (a server without authentication) are not bounded. The slot
    /// is given back when dropped.
    pub(crate) fn take(
        &self,
        caller: Option<&Caller>,
        grant: Option<&Grant>,
    ) -> Result<FollowSlot, ApiError> {
        let (Some(caller), Some(grant)) = (caller, grant) else {
            return Ok(FollowSlot(None));
        };
        if self.limit == 0 {
            return Ok(FollowSlot(None));
        }
        let key = grant.key();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open.entry(key).or_default();
        if *held >= self.limit {
            return Err(ApiError::too_many_follows(caller.name(), self.limit));
        }
        *held += 1;
        Ok(FollowSlot(Some((self.clone(), key))))
    }

    /// The follows the token of `grant` holds open now.
    #[cfg(test)]
    fn held(&self, grant: &Grant) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&grant.key()).copied().unwrap_or(0)
    }

    fn give_back(&self, key: &[u8; 32]) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = open.get_mut(key) {
            *held -= 1;
            if *held == 0 {
                // No entry for a token that follows nothing: the map grows
                // with the clients following now, not with every one seen.
                open.remove(key);
            }
        }
    }
}

/// Who asks to follow: the router's bound, the caller and the grant of
/// its token, as the guard left them with the request.
pub(crate) struct Follower {
    slots: Option<FollowSlots>,
    caller: Option<Caller>,
    grant: Option<Grant>,
}

impl<S: Send + Sync> FromRequestParts<S> for Follower {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self {
            slots: parts.extensions.get::<FollowSlots>().cloned(),
            caller: parts.extensions.get::<Caller>().cloned(),
            grant: parts.extensions.get::<Grant>().cloned(),
        })
    }
}

impl Follower {
    /// A place for this follow, or the refusal when its client holds its
    /// limit.
    pub(crate) fn admit(self) -> Result<Admitted, ApiError> {
        let slot = match &self.slots {
            Some(slots) => slots.take(self.caller.as_ref(), self.grant.as_ref())?,
            None => FollowSlot(None),
        };
        Ok(Admitted {
            slot,
            grant: self.grant,
        })
    }
}

/// A follow admitted: its place, and the grant of its token.
#[derive(Debug)]
pub(crate) struct Admitted {
    slot: FollowSlot,
    grant: Option<Grant>,
}

impl Admitted {
    /// `stream`, holding this follow's place until the stream is dropped:
    /// when the follow ends or its client goes away. It also ends at its
    /// first item after the token file in force stopped granting the
    /// follow's token `read`.
    pub(crate) fn holding<S>(self, stream: S) -> Holding<S> {
        Holding {
            stream: Some(stream),
            grant: self.grant,
            _slot: self.slot,
        }
    }
}

/// One follow's place against its client's bound.
#[derive(Debug)]
pub(crate) struct FollowSlot(Option<(FollowSlots, [u8; 32])>);

impl Drop for FollowSlot {
    fn drop(&mut self) {
        if let Some((slots, key)) = self.0.take() {
            slots.give_back(&key);
        }
    }
}

/// A stream that holds a [`FollowSlot`] for as long as it lives, and
/// ends once its token is revoked.
pub(crate) struct Holding<S> {
    /// `None` once ended for a revoked token: the follow, and what it
    /// holds of the session, goes at once.
    stream: Option<S>,
    grant: Option<Grant>,
    _slot: FollowSlot,
}

impl<S: Stream + Unpin> Stream for Holding<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let item = std::task::ready!(Pin::new(stream).poll_next(cx));
        let revoked = item.is_some()
            && this
                .grant
                .as_mut()
                .is_some_and(|grant| !grant.still_grants(Role::Read));
        if revoked {
            tracing::info!("a follow ended: the token that opened it no longer has the read role");
            this.stream = None;
            return Poll::Ready(None);
        }
        Poll::Ready(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Roles, TokenFile};

    /// The caller and grant of a token named `name` whose secret is
    /// `secret`, from a file of its own.
    fn token(dir: &std::path::Path, name: &str, secret: &str) -> (Caller, Grant) {
        let path = dir.join(format!("{name}-{secret}.tokens"));
        let hash = crate::auth::hash_token(secret);
        std::fs::write(&path, format!("{name} read {hash}\n")).unwrap();
        let file = Arc::new(TokenFile::open(path).unwrap());
        let (caller, grant) = Grant::authenticate(&file, secret).unwrap();
        assert_eq!(caller.roles(), Roles::of(&[Role::Read]));
        (caller, grant)
    }

    #[test]
    fn a_client_holds_at_most_its_limit_and_a_closed_follow_frees_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_grant) = token(dir.path(), "a", "a-secret");
        let (b, b_grant) = token(dir.path(), "b", "b-secret");
        let slots = FollowSlots::new(2);
        let first = slots.take(Some(&a), Some(&a_grant)).unwrap();
        let _second = slots.take(Some(&a), Some(&a_grant)).unwrap();
        let refused = slots.take(Some(&a), Some(&a_grant)).unwrap_err();
        assert_eq!(refused.code, crate::wire::ErrorCode::TooManyFollows);
        assert!(refused.message.contains("\"a\""), "{}", refused.message);
        let _other = slots
            .take(Some(&b), Some(&b_grant))
            .expect("another client is not held up");
        drop(first);
        let _third = slots
            .take(Some(&a), Some(&a_grant))
            .expect("a closed follow frees its slot");
        assert_eq!(slots.held(&a_grant), 2);
    }

    #[test]
    fn a_token_rotated_under_its_name_is_another_client() {
        let dir = tempfile::tempdir().unwrap();
        let (old, old_grant) = token(dir.path(), "bot", "leaked");
        let (new, new_grant) = token(dir.path(), "bot", "rotated");
        let slots = FollowSlots::new(1);
        let _held = slots.take(Some(&old), Some(&old_grant)).unwrap();
        let _ok = slots
            .take(Some(&new), Some(&new_grant))
            .expect("the old token's follows hold up the new one");
    }

    #[test]
    fn callers_without_a_token_and_a_zero_limit_are_not_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (a, grant) = token(dir.path(), "a", "a-secret");
        let slots = FollowSlots::new(1);
        let anonymous = Caller::anonymous();
        let held: Vec<_> = (0..3)
            .map(|_| slots.take(Some(&anonymous), None).unwrap())
            .collect();
        assert_eq!(held.len(), 3);
        let unbounded = FollowSlots::new(0);
        let held: Vec<_> = (0..3)
            .map(|_| unbounded.take(Some(&a), Some(&grant)).unwrap())
            .collect();
        assert_eq!(held.len(), 3);
        assert_eq!(unbounded.held(&grant), 0);
    }

    #[test]
    fn the_map_forgets_a_client_that_follows_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (a, grant) = token(dir.path(), "a", "a-secret");
        let slots = FollowSlots::new(4);
        drop(slots.take(Some(&a), Some(&grant)).unwrap());
        assert!(slots.open.lock().unwrap().is_empty());
    }
}
