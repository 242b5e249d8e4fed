//! The Redis-provided lease: a grant key with a server-side expiry per
//! session, and a per-session token counter that only grows.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use redis::Value;
use tokio::sync::OnceCell;

use crate::authority::fresh_authority_id;
use crate::conn::{
    Conn, ConnectError, DEFAULT_POLICY_CHECK_INTERVAL, DEFAULT_REQUEST_TIMEOUT, Refusal,
    RequestError, Target, text,
};
use crate::keys::DEFAULT_PREFIX;
use crate::scripts;

/// How many leases one renewal script handles; a larger batch is split so
/// no single script holds the server for long.
const RENEW_CHUNK: usize = 1000;

/// [`SessionLease`] kept in one Redis database (see the [crate
/// documentation](crate#the-redis-lease) for the layout and for how durable
/// its tokens are).
///
/// Cheap to clone: clones share one connection.
#[derive(Clone)]
pub struct RedisLease {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    ttl: Duration,
    ttl_ms: String,
    authority: OnceCell<AuthorityId>,
    /// The greatest token this client was granted per session: a new grant
    /// at or below it is a token issued twice, so Redis went back (even
    /// when other processes' writes since carried the prefix's counter past
    /// this client's floor).
    granted: Mutex<HashMap<SessionId, FencingToken>>,
}

/// How many sessions' greatest tokens a client keeps; beyond it one is
/// forgotten (that session's check then rests on the prefix's counter).
const MAX_GRANTED: usize = 100_000;

impl fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("redis", &self.inner.conn.location())
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

/// Configures and connects a [`RedisLease`].
#[derive(Debug, Clone)]
pub struct RedisLeaseBuilder {
    target: Target,
    ttl: Duration,
}

impl RedisLeaseBuilder {
    /// The prefix of every key (default [`DEFAULT_PREFIX`]); must match the
    /// store's when the store is fenced by these leases.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.target.prefix = prefix.into();
        self
    }

    /// The deadline of each request (default [`DEFAULT_REQUEST_TIMEOUT`]).
    /// Keep it well under a third of the TTL, so a slow renewal still
    /// leaves time to retry.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.target.request_timeout = timeout;
        self
    }

    /// How often the server's `maxmemory-policy` is read again after
    /// connecting (default [`DEFAULT_POLICY_CHECK_INTERVAL`]); see
    /// [`RedisStoreBuilder::policy_check_interval`](crate::RedisStoreBuilder::policy_check_interval).
    pub fn policy_check_interval(mut self, interval: Duration) -> Self {
        self.target.policy_check_interval = interval;
        self
    }

    /// How long a grant lasts without renewal (default 15 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Connects. A bad URL, prefix, TTL or timeout is
    /// [`Invalid`](lease_port::LeaseErrorKind::Invalid); an unreachable
    /// server is [`Transient`](lease_port::LeaseErrorKind::Transient); a
    /// server that may evict keys (any `maxmemory-policy` but
    /// `noeviction`) is [`Rewound`](lease_port::LeaseErrorKind::Rewound).
    pub async fn connect(self) -> Result<RedisLease, LeaseError> {
        let conn = Conn::connect(&self.target).await.map_err(|e| match e {
            ConnectError::Invalid(m) => LeaseError::invalid(m),
            ConnectError::Unsafe(m) => LeaseError::rewound(m),
            ConnectError::Unreachable(source) => {
                LeaseError::transient("cannot reach Redis").with_source(source)
            }
        })?;
        RedisLease::over(conn, self.ttl)
    }
}

impl RedisLease {
    /// Leases in the Redis at `url` (`redis://[user:password@]host:port/db`,
    /// or `rediss://` with the `tls` feature).
    pub fn builder(url: impl Into<String>) -> RedisLeaseBuilder {
        RedisLeaseBuilder {
            target: Target {
                url: url.into(),
                prefix: DEFAULT_PREFIX.to_owned(),
                request_timeout: DEFAULT_REQUEST_TIMEOUT,
                policy_check_interval: DEFAULT_POLICY_CHECK_INTERVAL,
            },
            ttl: Duration::from_secs(15),
        }
    }

    pub(crate) fn over(conn: Conn, ttl: Duration) -> Result<RedisLease, LeaseError> {
        // Redis refuses an expiry that overflows its clock once the script
        // has raised the token record: a bound well inside it keeps the
        // grant's writes all or nothing.
        const MAX_TTL_MS: u128 = 366 * 24 * 3600 * 1000;
        let ms = ttl.as_nanos().div_ceil(1_000_000);
        if ms == 0 || ms > MAX_TTL_MS {
            return Err(LeaseError::invalid(format!(
                "lease TTL {ttl:?} is not between 1 ms and a year"
            )));
        }
        Ok(RedisLease {
            inner: Arc::new(Inner {
                conn,
                ttl,
                ttl_ms: ms.to_string(),
                authority: OnceCell::new(),
                granted: Mutex::default(),
            }),
        })
    }

    /// The authority, when this client has learned it.
    pub(crate) fn known_authority_now(&self) -> Option<&AuthorityId> {
        self.inner.authority.get()
    }

    /// How long a grant lasts without renewal.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    async fn known_authority(&self) -> Result<&AuthorityId, LeaseError> {
        let conn = &self.inner.conn;
        self.inner
            .authority
            .get_or_try_init(|| async {
                let key = conn.keys().lease_authority();
                let candidate = fresh_authority_id(conn.location());
                let reply = conn
                    .clocked(conn.prepare(&scripts::GET_OR_SET).key(&key).arg(&candidate))
                    .await
                    .map_err(refused(conn, "reading the lease authority"))?;
                let id = text(&reply).ok_or_else(|| unreadable(&key, &reply))?;
                AuthorityId::new(id).map_err(|_| unreadable(&key, &reply))
            })
            .await
    }

    /// True when this client was granted `lease`'s token (or a greater
    /// one) for its session.
    fn was_granted(&self, lease: &Lease) -> bool {
        self.inner
            .granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(lease.session_id())
            .is_some_and(|t| *t >= lease.token())
    }

    /// Records `token` as granted for `session`; `Err` with the greater
    /// token granted before when a new grant is not above it.
    fn granted(
        &self,
        session: &SessionId,
        token: FencingToken,
        new: bool,
    ) -> Result<(), FencingToken> {
        let mut all = self
            .inner
            .granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(before) = all.get(session).copied() {
            if new && token <= before {
                return Err(before);
            }
        } else if all.len() >= MAX_GRANTED
            && let Some(any) = all.keys().next().cloned()
        {
            all.remove(&any);
        }
        let entry = all.entry(session.clone()).or_insert(token);
        *entry = (*entry).max(token);
        Ok(())
    }

    /// Renews up to [`RENEW_CHUNK`] leases in one script call.
    async fn renew_chunk(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        let conn = &self.inner.conn;
        let mut call = conn.prepare(&scripts::RENEW);
        call.arg(&self.inner.ttl_ms);
        for lease in leases {
            call.key(conn.keys().lease(lease.session_id()))
                .key(conn.keys().lease_tokens(lease.session_id()))
                .arg(grant(lease.token(), lease.owner()));
        }
        let sent = SystemTime::now();
        let answers = match conn.clocked(&call).await {
            Ok(Value::Array(answers)) if answers.len() == leases.len() => answers,
            Ok(other) => {
                let e = unreadable("the renewal reply", &other);
                return leases.iter().map(|_| Err(copy(&e))).collect();
            }
            Err(r @ (Refusal::Rewound { .. } | Refusal::Unsafe(_))) => {
                let e = refused(conn, "renewing in Redis")(r);
                return leases
                    .iter()
                    .map(|_| Err(LeaseError::rewound(e.message().to_owned())))
                    .collect();
            }
            Err(Refusal::Request(e)) => {
                let shared = Arc::new(e);
                return leases
                    .iter()
                    .map(|_| {
                        Err(LeaseError::transient("renewing in Redis")
                            .with_source(Shared(Arc::clone(&shared))))
                    })
                    .collect();
            }
        };
        leases
            .iter()
            .zip(answers)
            .map(|(lease, answer)| match answer {
                Value::Int(1) => Ok(lease.with_expiry(sent + self.inner.ttl)),
                Value::Int(0) => Err(LeaseError::held(None)),
                // A token this client was never granted is simply not held.
                Value::Int(-1) if !self.was_granted(lease) => Err(LeaseError::held(None)),
                Value::Int(-1) => Err(LeaseError::rewound(format!(
                    "Redis at {} no longer records issuing token {} for session {}: it lost \
                     acknowledged writes (an older snapshot, a lagging replica promoted, keys \
                     removed by hand), and could issue the token again. Restore the newer data \
                     if it exists; otherwise restart this process to accept the older state",
                    conn.location(),
                    lease.token(),
                    lease.session_id()
                ))),
                other => match text(&other).and_then(parse_grant) {
                    Some((_, holder)) => Err(LeaseError::held(Some(holder))),
                    None => Err(unreadable("a renewal answer", &other)),
                },
            })
            .collect()
    }
}

#[async_trait]
impl SessionLease for RedisLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.acquire_above(session, owner, FencingToken::new(0))
            .await
    }

    /// One script raises the session's token record to `floor` and grants
    /// the next token, so the grant and every later takeover are above it.
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        // (The record is raised with HINCRBY, a signed 64-bit integer:
        // the bound leaves it 2^62 takeovers of room.)
        floor.check_floor()?;
        let authority = self.known_authority().await?;
        let conn = &self.inner.conn;
        let keys = conn.keys();
        let sent = SystemTime::now();
        let reply = conn
            .clocked(
                conn.prepare(&scripts::ACQUIRE)
                    .key(keys.lease(session))
                    .key(keys.lease_tokens(session))
                    .key(keys.lease_authority())
                    .arg(owner.as_str())
                    .arg(&self.inner.ttl_ms)
                    .arg(authority.as_str())
                    .arg(floor.get()),
            )
            .await
            .map_err(refused(conn, "acquiring in Redis"))?;
        let parts = match &reply {
            Value::Array(parts) => parts.as_slice(),
            _ => &[],
        };
        match (parts.first().and_then(text), parts.get(1)) {
            (Some("ok"), Some(token)) => {
                let token = text(token)
                    .and_then(|t| t.parse::<u64>().ok())
                    .map(FencingToken::new)
                    .ok_or_else(|| unreadable("an acquired token", &reply))?;
                let new = parts.get(2).and_then(text) == Some("new");
                let lease =
                    Lease::new(session.clone(), owner.clone(), token, sent + self.inner.ttl);
                if let Err(before) = self.granted(session, token, new) {
                    // Best effort: the grant is Redis's older state's; it
                    // lapses if this does not land.
                    let _ = self.release(&lease).await;
                    return Err(LeaseError::rewound(format!(
                        "Redis at {} granted token {token} for session {session} again: this \
                         client was granted token {before} for it already, so Redis lost \
                         acknowledged writes (an older snapshot, a lagging replica promoted, keys \
                         removed by hand). Restore the newer data if it exists; otherwise \
                         restart this process to accept the older state",
                        conn.location()
                    )));
                }
                Ok(lease)
            }
            (Some("held"), Some(holder)) => Err(LeaseError::held(
                text(holder).and_then(|h| OwnerId::new(h).ok()),
            )),
            (Some("authority"), Some(now)) => Err(LeaseError::transient(format!(
                "the lease authority of {} is {} now, not {authority} as when this process started: \
                 Redis lost its data (a flush, or a restart without persistence), and with it every \
                 token and high-water mark; restart this process to serve under the new authority",
                conn.location(),
                text(now).unwrap_or("missing"),
            ))),
            _ => Err(unreadable("the acquire reply", &reply)),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.renew_chunk(std::slice::from_ref(lease))
            .await
            .pop()
            .unwrap_or_else(|| Err(LeaseError::transient("Redis gave no renewal answer")))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let conn = &self.inner.conn;
        conn.clocked(
            conn.prepare(&scripts::RELEASE)
                .key(conn.keys().lease(lease.session_id()))
                .key(conn.keys().lease_tokens(lease.session_id()))
                .arg(grant(lease.token(), lease.owner())),
        )
        .await
        .map_err(refused(conn, "releasing in Redis"))?;
        Ok(())
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.known_authority().await.cloned()
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let conn = &self.inner.conn;
        let now = SystemTime::now();
        let reply = conn
            .clocked(
                conn.prepare(&scripts::CURRENT)
                    .key(conn.keys().lease(session)),
            )
            .await
            .map_err(refused(conn, "reading a lease in Redis"))?;
        let (held, pttl) = match &reply {
            Value::Nil => return Ok(None),
            Value::Array(parts) => match parts.as_slice() {
                [held, Value::Int(pttl)] => (held, *pttl),
                _ => return Err(unreadable("the lease reply", &reply)),
            },
            _ => return Err(unreadable("the lease reply", &reply)),
        };
        let (token, owner) = text(held)
            .and_then(parse_grant)
            .ok_or_else(|| unreadable("a lease", &reply))?;
        let left = Duration::from_millis(pttl.max(0) as u64);
        Ok(Some(Lease::new(session.clone(), owner, token, now + left)))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(RENEW_CHUNK) {
            out.extend(self.renew_chunk(chunk).await);
        }
        out
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.ttl())
    }
}

/// The grant string a lease key holds.
fn grant(token: FencingToken, owner: &OwnerId) -> String {
    format!("{token} {owner}")
}

fn parse_grant(held: &str) -> Option<(FencingToken, OwnerId)> {
    let (token, owner) = held.split_once(' ')?;
    Some((
        FencingToken::new(token.parse().ok()?),
        OwnerId::new(owner).ok()?,
    ))
}

/// A refused clocked script as the contract's error: Redis went back or
/// may evict (`Rewound`, naming the fix), or a passing fault.
fn refused<'a>(conn: &'a Conn, what: &'static str) -> impl Fn(Refusal) -> LeaseError + 'a {
    move |r| match r.request_or_explain(conn.location()) {
        Ok(e) => LeaseError::transient(what).with_source(e),
        Err(detail) => LeaseError::rewound(format!("{what}: {detail}")),
    }
}

fn unreadable(what: &str, reply: &Value) -> LeaseError {
    LeaseError::transient(format!(
        "unexpected reply from Redis for {what}: {reply:?} (another program writing under this key prefix?)"
    ))
}

fn copy(e: &LeaseError) -> LeaseError {
    LeaseError::transient(e.message().to_owned())
}

/// One request failure reported for every lease of a batch.
#[derive(Debug)]
struct Shared(Arc<RequestError>);

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_round_trip_with_spaces_in_the_owner() {
        let owner = OwnerId::new("host a/42 x").unwrap();
        let g = grant(FencingToken::new(u64::MAX), &owner);
        assert_eq!(parse_grant(&g), Some((FencingToken::new(u64::MAX), owner)));
        assert_eq!(parse_grant("nospace"), None);
        assert_eq!(parse_grant("x y"), None);
    }
}
