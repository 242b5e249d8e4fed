//! The builder: the configuration of an [`EtcdLease`], checked once, and
//! the client it builds.

use std::sync::Arc;
use std::time::Duration;

use lease_port::LeaseError;

use crate::held_keys::HeldKeys;
use crate::keys::KeySpace;
use crate::lapsed::LapsedHolds;
use crate::shared_lease::SharedLease;
use crate::wire::{Credentials, EtcdClient, TlsOptions};
use crate::{EtcdLease, Inner};

/// The TTL granted when none is configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "/mecatl/leases/";

/// etcd's default limit on operations in one transaction
/// (`--max-txn-ops`).
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// How much longer than the reported TTL etcd keeps a key, when not
/// configured.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);

/// etcd's longest lease TTL, in seconds.
const MAX_ETCD_TTL_SECS: u64 = 9_000_000_000;

/// Configures an [`EtcdLease`].
#[derive(Debug, Clone)]
pub struct EtcdLeaseBuilder {
    endpoints: Vec<String>,
    prefix: String,
    ttl: Duration,
    request_timeout: Option<Duration>,
    max_txn_ops: usize,
    grace: Duration,
    lapsed_hold_wait: Option<Duration>,
    tls: TlsOptions,
    credentials: Option<Credentials>,
}

impl EtcdLeaseBuilder {
    /// The defaults, for the cluster whose members answer at `endpoints`.
    pub(crate) fn new(endpoints: Vec<String>) -> Self {
        EtcdLeaseBuilder {
            endpoints,
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: DEFAULT_TTL,
            request_timeout: None,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            grace: DEFAULT_GRACE,
            lapsed_hold_wait: None,
            tls: TlsOptions::default(),
            credentials: None,
        }
    }

    /// How long an acquire waits out a [lapsed hold](crate#lapsed-holds)
    /// before it answers [`Held`](lease_port::LeaseErrorKind::Held),
    /// naming the previous holder. Default: the whole wait (the TTL plus
    /// the grace), so an acquire succeeds once the session is safe to take.
    /// A server that answers requests rather than making them wait sets
    /// zero: its callers retry, and the wait counts from the first sighting
    /// whichever call made it.
    pub fn lapsed_hold_wait(mut self, wait: Duration) -> Self {
        self.lapsed_hold_wait = Some(wait);
        self
    }

    /// Certificates for `https://` endpoints; needs the `tls` feature
    /// (without it, any TLS setting is an invalid configuration).
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    /// A user of a cluster with authentication enabled. The user needs read
    /// and write permission on every key under the [prefix](Self::prefix);
    /// etcd lease calls need no permission. Combine with TLS: etcd sends
    /// tokens and passwords as plain request metadata.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// The key prefix all sessions live under: non-empty, ending in `/`, at
    /// most [`MAX_PREFIX_LEN`](crate::MAX_PREFIX_LEN) bytes. Tokens of one prefix are one
    /// authority. Default [`DEFAULT_PREFIX`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The TTL of every grant, in whole seconds (etcd's unit), at least one.
    /// Default [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How much longer than the TTL etcd keeps a key after its last
    /// renewal, in whole seconds. Holders count their expiry without it;
    /// another owner can take the session only once it has passed too.
    /// Default [`DEFAULT_GRACE`]; see the crate documentation.
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The deadline of every request to etcd; at most half the TTL, so a
    /// renewal that times out leaves time for another. Default: a quarter
    /// of the TTL, at most 2 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// The most operations put in one transaction: set it to the cluster's
    /// `--max-txn-ops`. Default [`DEFAULT_MAX_TXN_OPS`].
    pub fn max_txn_ops(mut self, n: usize) -> Self {
        self.max_txn_ops = n;
        self
    }

    /// Checks the configuration and builds the client. Connections are made
    /// on first use; call this within a Tokio runtime.
    pub fn build(self) -> Result<EtcdLease, LeaseError> {
        let keys = KeySpace::new(&self.prefix)?;
        let ttl_secs = self.ttl.as_secs();
        if self.ttl.subsec_nanos() != 0 || ttl_secs == 0 {
            return Err(LeaseError::invalid(format!(
                "the TTL must be whole seconds, at least one (etcd's unit); got {:?}",
                self.ttl
            )));
        }
        if self.grace.subsec_nanos() != 0 {
            return Err(LeaseError::invalid(format!(
                "the expiry grace must be whole seconds (etcd's unit); got {:?}",
                self.grace
            )));
        }
        if ttl_secs.saturating_add(self.grace.as_secs()) > MAX_ETCD_TTL_SECS {
            return Err(LeaseError::invalid(
                "the TTL and grace are longer than etcd allows",
            ));
        }
        let timeout = self
            .request_timeout
            .unwrap_or_else(|| (self.ttl / 4).min(Duration::from_secs(2)));
        if timeout.is_zero() || timeout > self.ttl / 2 {
            return Err(LeaseError::invalid(format!(
                "the request timeout {timeout:?} must be above zero and at most half the TTL {:?}",
                self.ttl
            )));
        }
        if self.max_txn_ops == 0 {
            return Err(LeaseError::invalid("max_txn_ops must be at least one"));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LeaseError::invalid(
                "EtcdLease must be built within a Tokio runtime",
            ));
        }
        let mut client = EtcdClient::with_tls(&self.endpoints, timeout, &self.tls)
            .map_err(|e| e.into_lease_error("configure the etcd client"))?;
        if let Some(credentials) = self.credentials {
            client = client.with_credentials(credentials);
        }
        Ok(EtcdLease {
            inner: Arc::new(Inner {
                shared: SharedLease::new(client.clone(), self.ttl, self.grace),
                client,
                keys,
                ttl: self.ttl,
                max_txn_ops: self.max_txn_ops,
                held: HeldKeys::default(),
                lapsed: LapsedHolds::default(),
                lapsed_hold_wait: self.lapsed_hold_wait.unwrap_or(self.ttl + self.grace),
                authority: tokio::sync::OnceCell::new(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use lease_port::LeaseErrorKind;

    use super::*;

    #[tokio::test]
    async fn bad_configuration_is_invalid() {
        let bad = [
            EtcdLease::builder(["http://127.0.0.1:1"]).ttl(Duration::from_millis(1500)),
            EtcdLease::builder(["http://127.0.0.1:1"]).ttl(Duration::ZERO),
            EtcdLease::builder(["http://127.0.0.1:1"])
                .ttl(Duration::from_secs(4))
                .request_timeout(Duration::from_secs(3)),
            EtcdLease::builder(["http://127.0.0.1:1"]).prefix("no-slash"),
            EtcdLease::builder(["127.0.0.1:2379"]),
            EtcdLease::builder(Vec::<String>::new()),
            EtcdLease::builder(["http://127.0.0.1:1"]).max_txn_ops(0),
        ];
        for builder in bad {
            let shown = format!("{builder:?}");
            let err = builder.build().unwrap_err();
            assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{shown}: {err}");
        }
    }

    #[test]
    fn building_outside_a_runtime_is_an_error_not_a_panic() {
        let err = EtcdLease::builder(["http://127.0.0.1:1"])
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
    }
}
