//! The few etcd v3 calls the lease backend is built on, over tonic.
//!
//! Public so that tests and benchmarks can look at etcd and measure the
//! bare operations the backend is built on through the same connection
//! code; applications use [`EtcdLease`](crate::EtcdLease).
//!
//! Every call has its own deadline. A client knows every member of the
//! cluster and talks to one at a time: a member that fails or does not
//! answer in time makes the next call go to the next member, so a stopped
//! (SIGSTOP) member costs one timed-out call, not every later one.

mod auth;
pub mod messages;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use crate::EtcdError;
use auth::Auth;
pub use auth::Credentials;
use messages::*;

/// An auth token as request metadata.
type Token = tonic::metadata::MetadataValue<tonic::metadata::Ascii>;

/// One gRPC method: its path and the name errors use.
#[derive(Debug, Clone, Copy)]
struct Method {
    name: &'static str,
    path: &'static str,
}

const RANGE: Method = Method {
    name: "Range",
    path: "/etcdserverpb.KV/Range",
};
const TXN: Method = Method {
    name: "Txn",
    path: "/etcdserverpb.KV/Txn",
};
const DELETE_RANGE: Method = Method {
    name: "DeleteRange",
    path: "/etcdserverpb.KV/DeleteRange",
};
const LEASE_GRANT: Method = Method {
    name: "LeaseGrant",
    path: "/etcdserverpb.Lease/LeaseGrant",
};
const LEASE_REVOKE: Method = Method {
    name: "LeaseRevoke",
    path: "/etcdserverpb.Lease/LeaseRevoke",
};
const LEASE_KEEP_ALIVE: Method = Method {
    name: "LeaseKeepAlive",
    path: "/etcdserverpb.Lease/LeaseKeepAlive",
};
const LEASE_TIME_TO_LIVE: Method = Method {
    name: "LeaseTimeToLive",
    path: "/etcdserverpb.Lease/LeaseTimeToLive",
};
const AUTHENTICATE: Method = Method {
    name: "Authenticate",
    path: "/etcdserverpb.Auth/Authenticate",
};
const USER_ADD: Method = Method {
    name: "UserAdd",
    path: "/etcdserverpb.Auth/UserAdd",
};
const ROLE_ADD: Method = Method {
    name: "RoleAdd",
    path: "/etcdserverpb.Auth/RoleAdd",
};
const USER_GRANT_ROLE: Method = Method {
    name: "UserGrantRole",
    path: "/etcdserverpb.Auth/UserGrantRole",
};
const ROLE_GRANT_PERMISSION: Method = Method {
    name: "RoleGrantPermission",
    path: "/etcdserverpb.Auth/RoleGrantPermission",
};
const AUTH_ENABLE: Method = Method {
    name: "AuthEnable",
    path: "/etcdserverpb.Auth/AuthEnable",
};
const LOCK: Method = Method {
    name: "Lock",
    path: "/v3lockpb.Lock/Lock",
};
const UNLOCK: Method = Method {
    name: "Unlock",
    path: "/v3lockpb.Lock/Unlock",
};

struct Member {
    url: Arc<str>,
    channel: Channel,
}

/// A connection to one etcd cluster: every member's endpoint, one in use.
///
/// Cheap to clone; clones share connections and the choice of member.
/// Connections are made on first use, so building one never waits for etcd.
#[derive(Clone)]
pub struct EtcdClient {
    members: Arc<[Member]>,
    current: Arc<AtomicUsize>,
    timeout: Duration,
    auth: Option<Arc<Auth>>,
    seen: Arc<Seen>,
}

/// What every answer so far said of the cluster: its id, and the highest
/// store revision a linearizable answer reported.
#[derive(Debug, Default)]
struct Seen {
    cluster_id: AtomicU64,
    revision: AtomicI64,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.members.iter().map(|m| &*m.url).collect();
        f.debug_struct("EtcdClient")
            .field("endpoints", &urls)
            .field("timeout", &self.timeout)
            .field("user", &self.auth.as_ref().map(|a| &a.credentials.user))
            .finish()
    }
}

impl EtcdClient {
    /// A client of the cluster whose members answer at `endpoints`
    /// (`http://host:port`; `https://` with the `tls` feature), each call
    /// bounded by `timeout`.
    pub fn new<S: AsRef<str>>(endpoints: &[S], timeout: Duration) -> Result<Self, EtcdError> {
        Self::with_tls(endpoints, timeout, &TlsOptions::default())
    }

    /// As [`new`](Self::new), with the certificates `https://` endpoints
    /// use.
    pub fn with_tls<S: AsRef<str>>(
        endpoints: &[S],
        timeout: Duration,
        tls: &TlsOptions,
    ) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::Endpoint {
                endpoint: String::new(),
                detail: "no endpoint given".into(),
            });
        }
        if timeout.is_zero() {
            return Err(EtcdError::Endpoint {
                endpoint: String::new(),
                detail: "the request timeout is zero".into(),
            });
        }
        let mut members = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let url = url.as_ref();
            members.push(Member {
                url: Arc::from(url),
                channel: channel(url, timeout, tls)?,
            });
        }
        Ok(EtcdClient {
            members: members.into(),
            current: Arc::new(AtomicUsize::new(0)),
            timeout,
            auth: None,
            seen: Arc::default(),
        })
    }

    /// Authenticates as a user of a cluster with authentication enabled:
    /// every request carries a token bought with `credentials`, bought
    /// again when etcd refuses it.
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.auth = Some(Arc::new(Auth::new(credentials)));
        self
    }

    /// The token requests carry, bought first if there is none; `None`
    /// without credentials.
    async fn token(&self) -> Result<Option<Token>, EtcdError> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        if let Some(token) = auth.token() {
            return Ok(Some(token));
        }
        let _one_at_a_time = auth.authenticating.lock().await;
        if let Some(token) = auth.token() {
            return Ok(Some(token));
        }
        let request = AuthenticateRequest {
            name: auth.credentials.user.clone(),
            password: auth.credentials.password.clone(),
        };
        let answer: AuthenticateResponse = self
            .unary_once(AUTHENTICATE, request, None)
            .await
            .map_err(|e| match e {
                EtcdError::Rpc { status, .. } if status.code() == tonic::Code::InvalidArgument => {
                    EtcdError::Auth {
                        user: auth.credentials.user.clone(),
                        status,
                    }
                }
                other => other,
            })?;
        auth.set(&answer.token)?;
        Ok(auth.token())
    }

    /// Forgets `used` after etcd refused it, so the next request buys a
    /// new one.
    fn refused(&self, used: &Token) {
        if let Some(auth) = &self.auth {
            auth.forget(used);
        }
    }

    /// The deadline of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn pick(&self) -> (usize, &Member) {
        let i = self.current.load(Ordering::Relaxed) % self.members.len();
        (i, &self.members[i])
    }

    /// Moves on from member `i` after it failed, unless another call
    /// already did.
    fn fail_over(&self, i: usize) {
        let next = (i + 1) % self.members.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    async fn unary<Req, Resp>(&self, method: Method, request: Req) -> Result<Resp, EtcdError>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Answer + Default + Send + Sync + 'static,
    {
        let token = self.token().await?;
        match self
            .unary_once(method, request.clone(), token.clone())
            .await
        {
            Err(e) if e.is_stale_token() && token.is_some() => {
                if let Some(used) = &token {
                    self.refused(used);
                }
                let token = self.token().await?;
                self.unary_once(method, request, token).await
            }
            other => other,
        }
    }

    /// Fails unless `answer` comes from the cluster every earlier answer
    /// came from, and (for a linearizable answer) shows a store at least as
    /// new as `floor`, the newest revision seen before the request was
    /// sent. Endpoints that reach two clusters, or a cluster whose data was
    /// replaced (wiped, restored from a backup), would hand out tokens of
    /// another authority, or tokens issued before.
    fn check_answer<R: Answer>(
        &self,
        member: &Member,
        answer: &R,
        floor: i64,
    ) -> Result<(), EtcdError> {
        let Some(header) = answer.header() else {
            return Ok(());
        };
        let changed = |detail: String| EtcdError::ClusterChanged {
            endpoint: member.url.to_string(),
            detail,
        };
        if header.cluster_id != 0 {
            match self.seen.cluster_id.compare_exchange(
                0,
                header.cluster_id,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {}
                Err(known) if known == header.cluster_id => {}
                Err(known) => {
                    return Err(changed(format!(
                        "cluster {:016x} answered; this client's cluster is {known:016x}",
                        header.cluster_id
                    )));
                }
            }
        }
        if R::LINEARIZABLE_REVISION && header.revision > 0 {
            if header.revision < floor {
                return Err(EtcdError::Rewound {
                    endpoint: member.url.to_string(),
                    seen: floor,
                    answered: header.revision,
                });
            }
            self.seen
                .revision
                .fetch_max(header.revision, Ordering::AcqRel);
        }
        Ok(())
    }

    async fn unary_once<Req, Resp>(
        &self,
        method: Method,
        request: Req,
        token: Option<Token>,
    ) -> Result<Resp, EtcdError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Answer + Default + Send + Sync + 'static,
    {
        let floor = self.seen.revision.load(Ordering::Acquire);
        let (i, member) = self.pick();
        let call = async {
            let mut grpc = tonic::client::Grpc::new(member.channel.clone());
            grpc.ready().await.map_err(|e| EtcdError::Connect {
                call: method.name,
                endpoint: member.url.to_string(),
                source: Box::new(e),
            })?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            let mut request = tonic::Request::new(request);
            if let Some(token) = token {
                request.metadata_mut().insert("token", token);
            }
            grpc.unary(request, PathAndQuery::from_static(method.path), codec)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| EtcdError::Rpc {
                    call: method.name,
                    endpoint: member.url.to_string(),
                    status: Box::new(status),
                })
        };
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(EtcdError::Timeout {
                call: method.name,
                endpoint: member.url.to_string(),
                after: self.timeout,
            }),
        }
        .and_then(|answer| self.check_answer(member, &answer, floor).map(|()| answer));
        if let Err(e) = &result
            && e.is_member_fault()
        {
            self.fail_over(i);
        }
        result
    }

    /// `KV.Range`: linearizable unless the request says otherwise.
    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.unary(RANGE, request).await
    }

    /// `KV.Txn`: compares, then one branch, atomically.
    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.unary(TXN, request).await
    }

    /// `KV.DeleteRange`.
    pub async fn delete_range(
        &self,
        request: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, EtcdError> {
        self.unary(DELETE_RANGE, request).await
    }

    /// `Lease.LeaseGrant`: a new etcd lease of `ttl` seconds (etcd may raise
    /// it to its minimum; the answer says what was granted).
    pub async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, EtcdError> {
        let answer: LeaseGrantResponse = self
            .unary(LEASE_GRANT, LeaseGrantRequest { ttl, id: 0 })
            .await?;
        if !answer.error.is_empty() || answer.id == 0 || answer.ttl <= 0 {
            return Err(EtcdError::Malformed {
                call: LEASE_GRANT.name,
                detail: format!(
                    "grant refused: id {}, ttl {}, error {:?}",
                    answer.id, answer.ttl, answer.error
                ),
            });
        }
        Ok(answer)
    }

    /// `Lease.LeaseRevoke`: ends the etcd lease and deletes its keys.
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, EtcdError> {
        self.unary(LEASE_REVOKE, LeaseRevokeRequest { id }).await
    }

    /// `Lease.LeaseTimeToLive`: how long etcd lease `id` has left, without
    /// refreshing it. A lease that is gone answers a `ttl` of -1 (or, from
    /// some versions, `NotFound`).
    pub async fn lease_time_to_live(&self, id: i64) -> Result<LeaseTimeToLiveResponse, EtcdError> {
        self.unary(
            LEASE_TIME_TO_LIVE,
            LeaseTimeToLiveRequest { id, keys: false },
        )
        .await
    }

    /// `Auth.UserAdd`: a user with a password.
    pub async fn user_add(&self, name: &str, password: &str) -> Result<(), EtcdError> {
        let request = AuthUserAddRequest {
            name: name.to_owned(),
            password: password.to_owned(),
        };
        self.unary::<_, AuthAdminResponse>(USER_ADD, request)
            .await
            .map(drop)
    }

    /// `Auth.RoleAdd`.
    pub async fn role_add(&self, name: &str) -> Result<(), EtcdError> {
        let request = AuthRoleAddRequest {
            name: name.to_owned(),
        };
        self.unary::<_, AuthAdminResponse>(ROLE_ADD, request)
            .await
            .map(drop)
    }

    /// `Auth.UserGrantRole`.
    pub async fn user_grant_role(&self, user: &str, role: &str) -> Result<(), EtcdError> {
        let request = AuthUserGrantRoleRequest {
            user: user.to_owned(),
            role: role.to_owned(),
        };
        self.unary::<_, AuthAdminResponse>(USER_GRANT_ROLE, request)
            .await
            .map(drop)
    }

    /// `Auth.RoleGrantPermission`: `role` may read and write every key
    /// starting with `prefix`.
    pub async fn role_grant_prefix(&self, role: &str, prefix: &[u8]) -> Result<(), EtcdError> {
        let request = AuthRoleGrantPermissionRequest {
            name: role.to_owned(),
            perm: Some(Permission {
                perm_type: permission_type::READWRITE,
                key: prefix.to_vec(),
                range_end: prefix_end(prefix),
            }),
        };
        self.unary::<_, AuthAdminResponse>(ROLE_GRANT_PERMISSION, request)
            .await
            .map(drop)
    }

    /// `Auth.AuthEnable`: from now on every request needs a token. The
    /// user `root` with the role `root` must exist.
    pub async fn auth_enable(&self) -> Result<(), EtcdError> {
        self.unary::<_, AuthAdminResponse>(AUTH_ENABLE, AuthEnableRequest {})
            .await
            .map(drop)
    }

    /// `v3lockpb.Lock/Lock`: etcd's own lock; waits until `name` is free.
    pub async fn lock(&self, name: Vec<u8>, lease: i64) -> Result<LockResponse, EtcdError> {
        self.unary(LOCK, LockRequest { name, lease }).await
    }

    /// `v3lockpb.Lock/Unlock`.
    pub async fn unlock(&self, key: Vec<u8>) -> Result<UnlockResponse, EtcdError> {
        self.unary(UNLOCK, UnlockRequest { key }).await
    }

    /// A keep-alive stream, opened on first use.
    pub fn keep_alive_stream(&self) -> KeepAliveStream {
        KeepAliveStream {
            client: self.clone(),
            open: None,
        }
    }
}

/// The end of the key range of every key starting with `prefix`: the
/// prefix with its last byte below 0xff raised by one (etcd's convention).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// Certificates for `https://` endpoints (feature `tls`), in PEM.
///
/// Without a CA certificate, the server's certificate is checked against
/// no roots at all, so an etcd with a private CA needs
/// [`ca_certificate_pem`](Self::ca_certificate_pem); a client certificate
/// authenticates this client to an etcd started with
/// `--client-cert-auth`.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    ca_pem: Option<Vec<u8>>,
    identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsOptions {
    /// The CA that signed etcd's server certificates.
    pub fn ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// This client's certificate and private key.
    pub fn client_identity_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.identity_pem = Some((certificate.into(), key.into()));
        self
    }

    #[cfg_attr(feature = "tls", allow(dead_code))]
    fn is_empty(&self) -> bool {
        self.ca_pem.is_none() && self.identity_pem.is_none()
    }
}

fn channel(url: &str, timeout: Duration, tls: &TlsOptions) -> Result<Channel, EtcdError> {
    let bad = |detail: String| EtcdError::Endpoint {
        endpoint: url.to_owned(),
        detail,
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(bad("an endpoint starts with http:// or https://".into()));
    }
    #[cfg(not(feature = "tls"))]
    if url.starts_with("https://") || !tls.is_empty() {
        return Err(bad("https:// needs the `tls` feature of etcdlease".into()));
    }
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        // A member that vanishes without closing the connection is noticed
        // by HTTP/2 pings, not only by the next call's deadline.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true);
    #[cfg(feature = "tls")]
    let endpoint = if url.starts_with("https://") {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new().with_enabled_roots();
        if let Some(ca) = &tls.ca_pem {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &tls.identity_pem {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint
            .tls_config(config)
            .map_err(|e| bad(e.to_string()))?
    } else {
        endpoint
    };
    Ok(endpoint.connect_lazy())
}

struct OpenStream {
    member: usize,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: tonic::Streaming<LeaseKeepAliveResponse>,
}

/// One `Lease.LeaseKeepAlive` stream, used one request at a time.
///
/// etcd answers a stream's keep-alives in order, so a caller that sends one
/// and reads one needs no matching. A failed or timed-out exchange closes
/// the stream (a late answer would otherwise be read as the next one's) and
/// the next exchange opens a new one, on the next member.
pub struct KeepAliveStream {
    client: EtcdClient,
    open: Option<OpenStream>,
}

impl std::fmt::Debug for KeepAliveStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAliveStream")
            .field("open", &self.open.is_some())
            .finish()
    }
}

impl KeepAliveStream {
    /// Refreshes etcd lease `id`: the answer's `ttl` is what etcd granted
    /// from the moment it served the request, 0 when the lease is gone.
    pub async fn keep_alive(&mut self, id: i64) -> Result<LeaseKeepAliveResponse, EtcdError> {
        let timeout = self.client.timeout;
        // The stream is out of `self` while in use: an exchange dropped half
        // way (a cancelled renewal) or timed out drops it, so an answer it
        // never read cannot be taken for a later request's.
        let open = self.open.take();
        let member = open
            .as_ref()
            .map_or_else(|| self.client.pick().0, |o| o.member);
        let client = &self.client;
        let attempt = async {
            // A token is checked when a stream opens.
            let token = match open {
                Some(_) => None,
                None => client.token().await?,
            };
            match exchange(client, open, member, id, token.clone()).await {
                Err(e) if e.is_stale_token() && token.is_some() => {
                    if let Some(used) = &token {
                        client.refused(used);
                    }
                    let token = client.token().await?;
                    exchange(client, None, member, id, token).await
                }
                other => other,
            }
        };
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok((answer, open))) => {
                match client.check_answer(&client.members[member], &answer, 0) {
                    Ok(()) => {
                        self.open = Some(open);
                        Ok(answer)
                    }
                    Err(e) => Err(e),
                }
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EtcdError::Timeout {
                call: LEASE_KEEP_ALIVE.name,
                endpoint: self.client.members[member].url.to_string(),
                after: timeout,
            }),
        };
        if let Err(e) = &result
            && e.is_member_fault()
        {
            self.client.fail_over(member);
        }
        result
    }
}

/// One keep-alive request and its answer, on `open` or on a new stream to
/// member `i`.
async fn exchange(
    client: &EtcdClient,
    open: Option<OpenStream>,
    i: usize,
    id: i64,
    token: Option<Token>,
) -> Result<(LeaseKeepAliveResponse, OpenStream), EtcdError> {
    let request = LeaseKeepAliveRequest { id };
    let member = &client.members[i];
    let closed = || EtcdError::StreamClosed {
        endpoint: member.url.to_string(),
    };
    let mut open = match open {
        Some(open) => {
            open.requests.send(request).await.map_err(|_| closed())?;
            open
        }
        None => {
            // The request is queued before the call: etcd sends the stream's
            // response headers with its first answer, so waiting for them
            // with nothing sent would wait for ever.
            let (requests, rx) = mpsc::channel(4);
            requests.send(request).await.map_err(|_| closed())?;
            let mut grpc = tonic::client::Grpc::new(member.channel.clone());
            grpc.ready().await.map_err(|e| EtcdError::Connect {
                call: LEASE_KEEP_ALIVE.name,
                endpoint: member.url.to_string(),
                source: Box::new(e),
            })?;
            let codec =
                tonic_prost::ProstCodec::<LeaseKeepAliveRequest, LeaseKeepAliveResponse>::default();
            let mut call = tonic::Request::new(ReceiverStream::new(rx));
            if let Some(token) = token {
                call.metadata_mut().insert("token", token);
            }
            let answers = grpc
                .streaming(
                    call,
                    PathAndQuery::from_static(LEASE_KEEP_ALIVE.path),
                    codec,
                )
                .await
                .map_err(|status| EtcdError::Rpc {
                    call: LEASE_KEEP_ALIVE.name,
                    endpoint: member.url.to_string(),
                    status: Box::new(status),
                })?
                .into_inner();
            OpenStream {
                member: i,
                requests,
                answers,
            }
        }
    };
    match open.answers.message().await {
        Ok(Some(answer)) if answer.id == id => Ok((answer, open)),
        Ok(Some(answer)) => Err(EtcdError::Malformed {
            call: LEASE_KEEP_ALIVE.name,
            detail: format!("asked for lease {id}, answered for {}", answer.id),
        }),
        Ok(None) => Err(closed()),
        Err(status) => Err(EtcdError::Rpc {
            call: LEASE_KEEP_ALIVE.name,
            endpoint: member.url.to_string(),
            status: Box::new(status),
        }),
    }
}
