//! One connection to Redis shared by the store and its leases: every
//! request bounded by a deadline, every failure kept as a source.

use std::fmt;
use std::io;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, RedisError, RetryMethod, ScriptInvocation, Value};

use crate::keys::Keys;

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
}

/// Why a connection could not be made.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The URL or the prefix can never work.
    Invalid(String),
    /// Redis could not be reached.
    Unreachable(RequestError),
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
        Ok(Conn {
            manager,
            client,
            timeout: target.request_timeout,
            location: format!("{} prefix {:?}", redacted(&target.url), target.prefix),
            keys,
        })
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
