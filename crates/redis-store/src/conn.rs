//! One connection to Redis shared by the store and its leases: every
//! request bounded by a deadline, every failure kept as a source.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, RedisError, RetryMethod, Script, ScriptInvocation, Value};

use crate::keys::Keys;

/// How often the memory policy is read again after connecting, when none
/// is configured: an operator (or a managed service's maintenance) can
/// change it on a running server.
pub const DEFAULT_POLICY_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// The deadline of each request when none is configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a request to Redis failed: no answer in time, or an error from the
/// client or the server. Kept as the source of the store's and the lease's
/// errors. When it happens to a write, the write may or may not have been
/// done (the reply may be what was lost).
#[derive(Debug)]
pub enum RequestError {
    /// No reply within the request deadline.
    TimedOut(Duration),
    /// The connection or the server failed the request.
    Redis(RedisError),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::TimedOut(d) => write!(f, "Redis did not answer within {d:?}"),
            RequestError::Redis(e) => write!(f, "Redis request failed: {e}"),
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RequestError::TimedOut(_) => None,
            RequestError::Redis(e) => Some(e),
        }
    }
}

impl RequestError {
    /// As an I/O error, for [`StoreError::Io`](session_store::StoreError::Io)
    /// (whose source must be one); this error stays reachable through
    /// [`io::Error::get_ref`].
    pub(crate) fn into_io(self) -> io::Error {
        let kind = match &self {
            RequestError::TimedOut(_) => io::ErrorKind::TimedOut,
            RequestError::Redis(e) if e.is_timeout() => io::ErrorKind::TimedOut,
            RequestError::Redis(e) if e.is_connection_refusal() => io::ErrorKind::ConnectionRefused,
            RequestError::Redis(e) if e.is_connection_dropped() => io::ErrorKind::ConnectionReset,
            RequestError::Redis(_) if self.refused_before_acting() => io::ErrorKind::ResourceBusy,
            RequestError::Redis(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }

    /// True when Redis certainly did not act on the request: it was never
    /// sent (no connection could be made), or the server refused it before
    /// running it — still loading its data after a restart, busy with a
    /// script, a replica refusing writes, out of memory, without its
    /// master. The same request may succeed later.
    pub(crate) fn refused_before_acting(&self) -> bool {
        let RequestError::Redis(e) = self else {
            return false;
        };
        e.is_connection_refusal()
            || matches!(e.retry_method(), RetryMethod::WaitAndRetry)
            || matches!(
                e.code(),
                Some(
                    "LOADING"
                        | "BUSY"
                        | "READONLY"
                        | "OOM"
                        | "MASTERDOWN"
                        | "TRYAGAIN"
                        | "CLUSTERDOWN"
                        | "NOREPLICAS"
                )
            )
    }

    /// True when a later attempt may succeed: [refused before
    /// acting](Self::refused_before_acting), or no answer (a deadline, a
    /// broken connection) — after which a write may or may not have been
    /// done.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            RequestError::TimedOut(_) => true,
            RequestError::Redis(e) => {
                e.is_timeout() || e.is_connection_dropped() || self.refused_before_acting()
            }
        }
    }
}

/// How to reach Redis.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) request_timeout: Duration,
    pub(crate) policy_check_interval: Duration,
}

/// Why a connection could not be made.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The URL or the prefix can never work.
    Invalid(String),
    /// Redis could not be reached.
    Unreachable(RequestError),
    /// Redis is deployed so that it can drop acknowledged writes.
    Unsafe(String),
}

/// Why a clocked script did not run to an answer.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The request failed (see [`RequestError`]).
    Request(RequestError),
    /// Redis's clock is below what this process saw: its data went back.
    Rewound {
        /// The highest clock this process saw.
        seen: u64,
        /// The clock Redis has now.
        now: u64,
    },
    /// Redis may evict keys (its memory policy), so nothing it keeps can be
    /// trusted to stay: refused before sending.
    Unsafe(String),
}

impl Refusal {
    /// The failed request, or (`Err`) the explanation of a refusal that is
    /// not one, naming what to fix.
    pub(crate) fn request_or_explain(self, location: &str) -> Result<RequestError, String> {
        match self {
            Refusal::Request(e) => Ok(e),
            Refusal::Rewound { seen, now } => Err(format!(
                "Redis at {location} went back: its change counter is {now}, but this process \
                 already saw {seen}. Redis lost acknowledged writes (restarted from an older \
                 snapshot, a crash under `appendfsync everysec`, a failover to a replica that \
                 lagged, or keys removed by hand), and with them tokens and high-water marks it \
                 had confirmed: writing on would reissue tokens and accept writes the fence \
                 refused. Nothing was done. Restore the newer data if it exists; otherwise \
                 restart this process to accept the older state (sessions lose what Redis \
                 lost), and run Redis with `appendonly yes` and `appendfsync always`"
            )),
            Refusal::Unsafe(why) => Err(why),
        }
    }
}

/// The one setting the fence cannot do without: a Redis that evicts keys
/// under memory pressure drops grants, token records and high-water marks
/// as readily as events, and a dropped mark or token record lets a stale
/// owner write. Checked at connect, then at most every interval by the
/// next request that finds the last check old.
struct Deployment {
    interval: Duration,
    /// When the policy was last read; `None`: a reading is due.
    checked: Mutex<Option<Instant>>,
    /// The refusal the last reading gave, if any.
    unsafe_policy: Mutex<Option<String>>,
}

/// The memory policy, read with `CONFIG GET`, or from `INFO memory` where
/// `CONFIG` is renamed away or not granted (managed services often do
/// that). `Ok(None)`: neither could be read.
async fn memory_policy(
    manager: &mut ConnectionManager,
    timeout: Duration,
) -> Result<Option<String>, RequestError> {
    let config = within(
        timeout,
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async::<Value>(manager),
    )
    .await;
    match config {
        Ok(Value::Array(parts)) if parts.len() == 2 => {
            if let Some(policy) = text(&parts[1]) {
                return Ok(Some(policy.to_owned()));
            }
        }
        Ok(Value::Map(pairs)) => {
            if let Some((_, v)) = pairs.first()
                && let Some(policy) = text(v)
            {
                return Ok(Some(policy.to_owned()));
            }
        }
        Ok(_) => {}
        // Not granted or renamed away: try INFO. Anything else (no answer,
        // BUSY, too many clients, still loading) is a passing fault the
        // caller reports or waits out; it says nothing of the policy.
        Err(RequestError::Redis(e)) if denied(&e) => {}
        Err(e) => return Err(e),
    }
    let info = within(
        timeout,
        redis::cmd("INFO")
            .arg("memory")
            .query_async::<Value>(manager),
    )
    .await;
    match info {
        Ok(value) => Ok(info_text(&value).and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("maxmemory_policy:"))
                .map(|p| p.trim().to_owned())
        })),
        Err(RequestError::Redis(e)) if denied(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// True when the server refuses the command for good: the user is not
/// granted it (`NOPERM`), or it is renamed away (an unknown command).
fn denied(e: &RedisError) -> bool {
    let unknown = || {
        let text = e.to_string().to_ascii_lowercase();
        text.contains("unknown command") || text.contains("unknown subcommand")
    };
    match e.code() {
        Some("NOPERM") => true,
        Some("ERR") => unknown(),
        _ => false,
    }
}

fn info_text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `None` when `policy` keeps every key; else the refusal, naming the fix.
fn judge_policy(policy: Option<&str>, location: &str) -> Option<String> {
    match policy {
        Some("noeviction") => None,
        Some(other) => Some(format!(
            "Redis at {location} runs with maxmemory-policy {other}: under memory pressure it \
             evicts keys, and with them lease grants, token records and high-water marks, \
             after which a second owner can take a live session and a stale owner's writes \
             are accepted. Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy \
             noeviction, and in redis.conf or the managed service's parameters); a full \
             Redis then refuses writes (OOM) instead of forgetting what it confirmed"
        )),
        None => Some(format!(
            "cannot read the memory policy of Redis at {location}: both `CONFIG GET \
             maxmemory-policy` and `INFO memory` were refused. The fence needs \
             `maxmemory-policy noeviction` and must see it: grant this user `CONFIG GET` or \
             `INFO` (e.g. ACL `+config|get` or `+info`)"
        )),
    }
}

/// A shared, self-reconnecting connection: requests from every task go
/// over one multiplexed connection, which the client re-establishes in the
/// background after a failure (the request that met the failure fails).
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    /// Makes connections of their own (the appends subscription).
    client: redis::Client,
    timeout: Duration,
    location: String,
    keys: Keys,
    /// The highest value of the prefix's change counter (`<prefix>clock`)
    /// this process saw. Every write script advances the counter in Redis
    /// and refuses to run when it is below this: Redis went back.
    clock: Arc<AtomicU64>,
    deployment: Arc<Deployment>,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("location", &self.location)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Conn {
    pub(crate) async fn connect(target: &Target) -> Result<Conn, ConnectError> {
        let keys = Keys::new(&target.prefix).ok_or_else(|| {
            ConnectError::Invalid(format!(
                "key prefix {:?} holds a brace or a control character (a brace would become the keys' hash tag)",
                target.prefix
            ))
        })?;
        if target.request_timeout.is_zero() {
            return Err(ConnectError::Invalid(
                "the request timeout must be longer than zero".into(),
            ));
        }
        #[cfg(feature = "tls")]
        {
            // rustls needs one process-wide cryptography provider; another
            // crate may have installed one already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = redis::Client::open(target.url.as_str()).map_err(|e| {
            ConnectError::Invalid(format!(
                "cannot use Redis URL {}: {e}",
                redacted(&target.url)
            ))
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(target.request_timeout))
            .set_response_timeout(Some(target.request_timeout))
            .set_max_delay(Duration::from_secs(1));
        let manager = tokio::time::timeout(
            target.request_timeout,
            client.get_connection_manager_with_config(config),
        )
        .await
        .map_err(|_| ConnectError::Unreachable(RequestError::TimedOut(target.request_timeout)))?
        .map_err(|e| ConnectError::Unreachable(RequestError::Redis(e)))?;
        let location = format!("{} prefix {:?}", redacted(&target.url), target.prefix);
        let policy = memory_policy(&mut manager.clone(), target.request_timeout)
            .await
            .map_err(ConnectError::Unreachable)?;
        if let Some(refusal) = judge_policy(policy.as_deref(), &location) {
            return Err(ConnectError::Unsafe(refusal));
        }
        Ok(Conn {
            manager,
            client,
            timeout: target.request_timeout,
            location,
            keys,
            clock: Arc::new(AtomicU64::new(0)),
            deployment: Arc::new(Deployment {
                interval: target.policy_check_interval,
                checked: Mutex::new(Some(Instant::now())),
                unsafe_policy: Mutex::new(None),
            }),
        })
    }

    /// `script` prepared for [`clocked`](Self::clocked): the change
    /// counter's key and this process's floor go first, the script's own
    /// keys and arguments after them.
    pub(crate) fn prepare<'a>(&self, script: &'a Script) -> ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        call.key(self.keys.clock())
            .arg(self.clock.load(Ordering::Acquire));
        call
    }

    /// Runs a script made with the `scripts` module's clocked wrappers and
    /// prepared with [`prepare`](Self::prepare): refused before sending
    /// while the memory policy is unsafe, refused by Redis when its counter
    /// is below what this process saw, and the counter Redis answers kept
    /// as the new floor. Answers the script body's own reply.
    pub(crate) async fn clocked(&self, call: &ScriptInvocation<'_>) -> Result<Value, Refusal> {
        self.recheck_policy().await.map_err(Refusal::Request)?;
        if let Some(why) = self
            .deployment
            .unsafe_policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Err(Refusal::Unsafe(why));
        }
        let reply = self.script(call).await.map_err(Refusal::Request)?;
        let Value::Array(mut parts) = reply else {
            return Ok(reply);
        };
        let number = |v: &Value| match v {
            Value::Int(n) => u64::try_from(*n).ok(),
            other => text(other).and_then(|t| t.parse().ok()),
        };
        match (parts.first().and_then(text), parts.get(1).and_then(number)) {
            (Some("clock"), Some(now)) if parts.len() == 3 => {
                self.clock.fetch_max(now, Ordering::AcqRel);
                Ok(parts.swap_remove(2))
            }
            (Some("rewound"), Some(now)) if parts.len() == 3 => {
                let seen = parts.get(2).and_then(number).unwrap_or(0);
                Err(Refusal::Rewound { seen, now })
            }
            _ => Ok(Value::Array(parts)),
        }
    }

    /// Reads the memory policy again when the last reading is older than
    /// the interval; one caller reads while the others go on with the
    /// last verdict. A reading that gets no answer (a broken connection,
    /// BUSY, LOADING) fails the call that made it, as a passing fault, and
    /// leaves the reading due: a call never runs past a due reading that
    /// did not happen, so an evicting policy set meanwhile is never used.
    async fn recheck_policy(&self) -> Result<(), RequestError> {
        let due = {
            let mut checked = self
                .deployment
                .checked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if checked.is_some_and(|at| at.elapsed() < self.deployment.interval) {
                false
            } else {
                *checked = Some(Instant::now());
                true
            }
        };
        if !due {
            return Ok(());
        }
        match memory_policy(&mut self.manager.clone(), self.timeout).await {
            Ok(policy) => {
                *self
                    .deployment
                    .unsafe_policy
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) =
                    judge_policy(policy.as_deref(), &self.location);
                Ok(())
            }
            Err(e) => {
                // Due again at once: the next call reads before it runs.
                *self
                    .deployment
                    .checked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                Err(e)
            }
        }
    }

    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The URL (without credentials) and prefix, for messages.
    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    /// Runs a script (`EVALSHA`, loading it once if the server lacks it).
    pub(crate) async fn script(&self, call: &ScriptInvocation<'_>) -> Result<Value, RequestError> {
        let mut manager = self.manager.clone();
        self.bounded(call.invoke_async(&mut manager)).await
    }

    /// Runs one command.
    pub(crate) async fn command(&self, cmd: &Cmd) -> Result<Value, RequestError> {
        let mut manager = self.manager.clone();
        self.bounded(cmd.query_async(&mut manager)).await
    }

    /// The client, for connections of their own (the appends
    /// subscription).
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The deadline of each request, and of making a connection.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn bounded(
        &self,
        request: impl Future<Output = Result<Value, RedisError>>,
    ) -> Result<Value, RequestError> {
        within(self.timeout, request).await
    }
}

/// `request`, failed with [`RequestError::TimedOut`] unless it answers
/// within `deadline`.
async fn within<T>(
    deadline: Duration,
    request: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RequestError> {
    match tokio::time::timeout(deadline, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(RequestError::Redis(e)),
        Err(_) => Err(RequestError::TimedOut(deadline)),
    }
}

/// The URL with any user name and password replaced, for messages.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<a Redis URL that does not parse>".to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Text of a reply element, when it is one.
pub(crate) fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        Value::Okay => Some("OK"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(
            redacted("redis://user:secret@host:6379/2"),
            "redis://***@host:6379/2"
        );
        assert_eq!(redacted("rediss://:pw@h/0"), "rediss://***@h/0");
        assert_eq!(redacted("redis://h:1/0"), "redis://h:1/0");
        assert!(!redacted("garbage:secret@x").contains("secret"));
    }
}
