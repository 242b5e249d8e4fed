//! What went wrong talking to etcd: the source kept inside every
//! [`LeaseError`] this crate returns.

use std::time::Duration;

use lease_port::LeaseError;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failed exchange with etcd, or a configuration etcd cannot be reached
/// with. Reached through [`std::error::Error::source`] of a
/// [`LeaseError`]; match on the variant to tell a timeout from a refusal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// An endpoint that cannot be used (bad URL, TLS without the feature).
    #[error("etcd endpoint {endpoint:?}: {detail}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        detail: String,
    },
    /// No connection to the member.
    #[error("etcd {call}: cannot connect to {endpoint}")]
    Connect {
        /// The etcd method called.
        call: &'static str,
        /// The member's endpoint.
        endpoint: String,
        /// The transport's error.
        #[source]
        source: BoxError,
    },
    /// etcd (or the connection) answered with a gRPC error.
    #[error("etcd {call} at {endpoint}: {status}")]
    Rpc {
        /// The etcd method called.
        call: &'static str,
        /// The member's endpoint.
        endpoint: String,
        /// The status etcd answered.
        #[source]
        status: Box<tonic::Status>,
    },
    /// No answer within the request timeout. The request may still take
    /// effect.
    #[error("etcd {call} at {endpoint}: no answer within {after:?}")]
    Timeout {
        /// The etcd method called.
        call: &'static str,
        /// The member's endpoint.
        endpoint: String,
        /// The timeout.
        after: Duration,
    },
    /// The keep-alive stream ended.
    #[error("etcd keep-alive stream to {endpoint} closed")]
    StreamClosed {
        /// The member's endpoint.
        endpoint: String,
    },
    /// An answer from another cluster than every earlier one: the
    /// endpoints no longer reach the authority this client's tokens belong
    /// to. A configuration to fix, not a passing fault.
    #[error("etcd at {endpoint}: {detail}")]
    ClusterChanged {
        /// The member that answered.
        endpoint: String,
        /// What changed.
        detail: String,
    },
    /// A linearizable answer from a store older than one this client has
    /// already seen: its revision went back, so the cluster's data was
    /// replaced by older data (restored from a snapshot or backup under
    /// running clients, or wiped and written again). Revisions it hands out
    /// now may repeat tokens issued before. Never a passing fault, so
    /// never worth a retry: restore the newer data, or restart the clients
    /// to go on with the older (the stores it fences then refuse tokens
    /// at or below their marks). Reported as
    /// [`Rewound`](lease_port::LeaseErrorKind::Rewound).
    #[error(
        "etcd at {endpoint}: the store's revision went back from {seen} to {answered}: \
         its data was replaced by older data (restored from a snapshot or backup, or \
         wiped), so its tokens may repeat earlier ones; restore the newer data, or \
         restart the clients to go on with the older"
    )]
    Rewound {
        /// The member that answered.
        endpoint: String,
        /// The highest revision this client saw before the request.
        seen: i64,
        /// The revision the answer came from.
        answered: i64,
    },
    /// etcd refused the configured user's name or password.
    #[error("etcd refused to authenticate user {user:?}: {status}")]
    Auth {
        /// The user.
        user: String,
        /// What etcd answered.
        #[source]
        status: Box<tonic::Status>,
    },
    /// The session's previous hold lapsed without a release and may still
    /// be counted on by its holder: it may be taken over once this client
    /// has seen it lapsed long enough (see the crate documentation).
    #[error("the previous hold lapsed without a release; it may be taken over in {free_in:?}")]
    LapsedHold {
        /// How much longer this client must see it lapsed.
        free_in: Duration,
    },
    /// An answer this crate cannot read (a key under the prefix written by
    /// something else, a refused grant).
    #[error("etcd {call}: {detail}")]
    Malformed {
        /// The etcd method called.
        call: &'static str,
        /// What was wrong.
        detail: String,
    },
}

impl EtcdError {
    /// True when the member may be at fault (unreachable, not answering,
    /// without a leader), so the next call should try another member.
    pub(crate) fn is_member_fault(&self) -> bool {
        match self {
            EtcdError::Connect { .. }
            | EtcdError::Timeout { .. }
            | EtcdError::StreamClosed { .. } => true,
            EtcdError::Rpc { status, .. } => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::Cancelled
            ),
            // The next member may be of the right cluster, or the one
            // that still has the newer data.
            EtcdError::ClusterChanged { .. } | EtcdError::Rewound { .. } => true,
            EtcdError::Endpoint { .. }
            | EtcdError::Malformed { .. }
            | EtcdError::Auth { .. }
            | EtcdError::LapsedHold { .. } => false,
        }
    }

    /// True when etcd said the etcd lease named in the request does not
    /// exist (it expired or was revoked).
    pub(crate) fn is_lease_not_found(&self) -> bool {
        matches!(self, EtcdError::Rpc { status, .. }
            if status.code() == tonic::Code::NotFound
                && status.message().contains("lease not found"))
    }

    /// True when etcd refused the request's auth token as no longer valid
    /// (lapsed, issued before a restart, or older than the last change of
    /// users and roles): a new token may succeed.
    pub(crate) fn is_stale_token(&self) -> bool {
        matches!(self, EtcdError::Rpc { status, .. }
            if (status.code() == tonic::Code::Unauthenticated
                && status.message().contains("invalid auth token"))
                || status.message().contains("revision in header is old"))
    }

    /// The contract's view: a configuration error (an unusable endpoint,
    /// credentials or permissions etcd refuses, another cluster) is bad
    /// input, a store whose revision went back is
    /// [`Rewound`](lease_port::LeaseErrorKind::Rewound), anything else a
    /// passing fault.
    pub(crate) fn into_lease_error(self, doing: &'static str) -> LeaseError {
        if matches!(self, EtcdError::Rewound { .. }) {
            // Said in the message too: the remedy is an operator's, and
            // many report only the message.
            return LeaseError::rewound(format!("{doing}: {self}")).with_source(self);
        }
        let misconfigured = match &self {
            EtcdError::Endpoint { .. }
            | EtcdError::Auth { .. }
            | EtcdError::ClusterChanged { .. } => true,
            EtcdError::Rpc { status, .. } => {
                matches!(
                    status.code(),
                    tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
                ) || status.message().contains("user name is empty")
            }
            _ => false,
        };
        if misconfigured {
            LeaseError::invalid(doing).with_source(self)
        } else {
            LeaseError::transient(doing).with_source(self)
        }
    }
}
