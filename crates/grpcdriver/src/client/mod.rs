//! The client: a [`SessionLease`] whose leases live in a remote lease
//! service.

mod config;
mod keepalive;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease,
};
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

#[cfg(feature = "tls")]
pub use config::ClientTls;
pub use config::{
    DEFAULT_ATTEMPTS, DEFAULT_CALL_TIMEOUT, DEFAULT_CLIENT_BATCH, DEFAULT_CONNECT_TIMEOUT,
    GrpcLeaseBuilder,
};

use crate::convert::{lease_from_wire, lease_ref};
use crate::pb::{self, lease_service_client::LeaseServiceClient, renew_result::Outcome};
use crate::status::{Refusal, from_failure, from_status};
use keepalive::KeepAliveLink;

pub(crate) type Client = LeaseServiceClient<InterceptedService<Channel, Credentials>>;

/// Adds the bearer token to every call, when one is configured.
#[derive(Clone)]
pub(crate) struct Credentials(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// How batches of renewals reach the server; a server that lacks a way is
/// asked the next way from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum BatchWay {
    KeepAlive = 0,
    BatchRenew = 1,
    OneByOne = 2,
}

/// What a lease service says about itself ([`GrpcLease::service_info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// The authority whose tokens it hands out.
    pub authority: AuthorityId,
    /// The TTL it grants, when it states it.
    pub ttl: Option<Duration>,
    /// The most leases it renews in one batch, when it states it.
    pub max_batch: Option<usize>,
}

/// Who a lease service says this client is ([`GrpcLease::who_am_i`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerInfo {
    /// The client's name in the service's identities (`bearer` for a
    /// service that shares one token among all its clients, `anonymous`
    /// for one that authenticates nobody).
    pub client: String,
    /// An owner id this client uses must begin with one of these; an empty
    /// one admits every owner id.
    pub owner_prefixes: Vec<String>,
}

impl CallerInfo {
    /// Whether the service lets this client act for `owner`.
    pub fn admits(&self, owner: &OwnerId) -> bool {
        self.owner_prefixes
            .iter()
            .any(|p| owner.as_str().starts_with(p.as_str()))
    }

    /// This client's owner id for `name` (its host and process, say): the
    /// first prefix the service lists, then `name`. `Invalid` when the
    /// service lists none, or the id would be too long.
    ///
    /// ```
    /// # use grpcdriver::CallerInfo;
    /// let me = CallerInfo { client: "chat-a".into(), owner_prefixes: vec!["chat-a/".into()] };
    /// assert_eq!(me.owner_id("host-1/4242").unwrap().as_str(), "chat-a/host-1/4242");
    /// ```
    pub fn owner_id(&self, name: &str) -> Result<OwnerId, LeaseError> {
        let prefix = self.owner_prefixes.first().ok_or_else(|| {
            LeaseError::invalid(format!(
                "the lease service lets client `{}` act for no owner id",
                self.client
            ))
        })?;
        OwnerId::new(format!("{prefix}{name}"))
    }
}

/// A [`SessionLease`] backed by a remote lease service (`mecatl-leased`,
/// or any server of the `mecatl.lease.v1` contract).
///
/// Cheap to clone; clones share one connection and one KeepAlive stream.
#[derive(Clone)]
pub struct GrpcLease {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// The authority the first grant or GetAuthority named; every later
    /// grant must name the same.
    authority: std::sync::OnceLock<String>,
    /// The server's batch limit, once learned (0: not yet).
    server_batch: std::sync::atomic::AtomicUsize,
    min_grant: Option<Duration>,
    address: String,
    clock: Arc<dyn Clock>,
    call_timeout: Duration,
    attempts: u32,
    max_batch: usize,
    batch_way: AtomicU8,
    keepalive: KeepAliveLink,
}

impl std::fmt::Debug for GrpcLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcLease")
            .field("address", &self.inner.address)
            .field("call_timeout", &self.inner.call_timeout)
            .field("batch_way", &self.batch_way())
            .finish_non_exhaustive()
    }
}

impl GrpcLease {
    /// Starts configuring a client of the service at `address`
    /// (`host:port`, or a `http://` / `https://` URI).
    pub fn builder(address: impl Into<String>) -> GrpcLeaseBuilder {
        GrpcLeaseBuilder::new(address)
    }

    /// A client of `address` with every default (plain text, no token).
    /// Connects lazily: a server that is down is an error of each call, not
    /// of this constructor.
    pub fn connect(address: impl Into<String>) -> Result<Self, LeaseError> {
        Self::builder(address).build()
    }

    fn batch_way(&self) -> BatchWay {
        match self.inner.batch_way.load(Ordering::Relaxed) {
            0 => BatchWay::KeepAlive,
            1 => BatchWay::BatchRenew,
            _ => BatchWay::OneByOne,
        }
    }

    fn fall_back(&self, from: BatchWay) {
        let to = match from {
            BatchWay::KeepAlive => BatchWay::BatchRenew,
            _ => BatchWay::OneByOne,
        };
        tracing::info!(address = %self.inner.address, ?from, ?to, "the lease service lacks a batch method; falling back");
        self.inner.batch_way.fetch_max(to as u8, Ordering::Relaxed);
    }

    /// Calls `f` until it answers, is refused with anything but
    /// UNAVAILABLE, the attempts run out, or the call's deadline passes.
    /// Every call this client makes is idempotent under the contract (see
    /// the crate docs on retries), so every one may be retried.
    async fn call<T, F, Fut>(&self, optional: bool, mut f: F) -> Result<T, Refusal>
    where
        F: FnMut(Client, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.inner.call_timeout;
        let mut backoff = Duration::from_millis(20);
        let mut attempt = 1;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Refusal::Lease(LeaseError::transient(format!(
                    "the lease service at {} did not answer within {:?}",
                    self.inner.address, self.inner.call_timeout
                ))));
            }
            let answer = tokio::time::timeout(left, f(self.inner.client.clone(), left)).await;
            let status = match answer {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded("the call's deadline passed"),
            };
            let pause = jittered(backoff, self.inner.clock.random());
            let retry = (status.code() == Code::Unavailable || broke_in_transport(&status))
                && attempt < self.inner.attempts
                && Instant::now() + pause < deadline;
            if !retry {
                return Err(from_status(&status, optional));
            }
            tracing::debug!(attempt, code = ?status.code(), "lease call unavailable; retrying");
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
            attempt += 1;
        }
    }

    /// What the service says about itself: its authority, the TTL it
    /// grants and its batch limit (when it states them).
    pub async fn service_info(&self) -> Result<ServiceInfo, LeaseError> {
        let answer = self
            .call(false, |mut c, left| {
                let mut req = Request::new(pb::GetAuthorityRequest {});
                req.set_timeout(left);
                async move { c.get_authority(req).await }
            })
            .await
            .map_err(|r| refusal(r, "GetAuthority"))?;
        let authority = AuthorityId::new(&answer.authority)?;
        let _ = self.inner.authority.set(answer.authority.clone());
        let ttl = answer
            .ttl
            .as_ref()
            .map(crate::convert::duration_from_wire)
            .transpose()?;
        let max_batch = usize::try_from(answer.max_batch).ok().filter(|n| *n > 0);
        if let Some(n) = max_batch {
            self.inner.server_batch.store(n, Ordering::Relaxed);
        }
        Ok(ServiceInfo {
            authority,
            ttl,
            max_batch,
        })
    }

    /// Who the service takes this client for, and which owner ids it may
    /// act for: a client builds its owner id from the answer
    /// ([`CallerInfo::owner_id`]). `Ok(None)` from a service older than the
    /// question, which lets every caller act for any owner.
    pub async fn who_am_i(&self) -> Result<Option<CallerInfo>, LeaseError> {
        let answer = self
            .call(true, |mut c, left| {
                let mut req = Request::new(pb::WhoAmIRequest {});
                req.set_timeout(left);
                async move { c.who_am_i(req).await }
            })
            .await;
        match answer {
            Ok(me) => Ok(Some(CallerInfo {
                client: me.client,
                owner_prefixes: me.owner_prefixes,
            })),
            Err(Refusal::MethodMissing) => Ok(None),
            Err(Refusal::Lease(e)) => Err(e),
        }
    }

    /// Refuses a grant from an authority other than the one this client
    /// first saw: its tokens are not comparable with those already held.
    fn check_authority(&self, wire: Option<&pb::Lease>) -> Result<(), LeaseError> {
        let Some(named) = wire.map(|w| w.authority.as_str()).filter(|a| !a.is_empty()) else {
            return Ok(());
        };
        let pinned = self.inner.authority.get_or_init(|| named.to_owned());
        if pinned != named {
            return Err(LeaseError::invalid(format!(
                "the lease service at {} now speaks for authority {named}, not {pinned}: \
                 its tokens are not comparable with those held (was it restarted without \
                 durable state?)",
                self.inner.address
            )));
        }
        Ok(())
    }

    /// Refuses a grant that lives less than the configured minimum from
    /// when its request was sent (`sent_at` on the monotonic clock).
    fn check_grant(
        &self,
        lease: &Lease,
        sent: SystemTime,
        sent_at: Instant,
    ) -> Result<(), LeaseError> {
        let Some(min) = self.inner.min_grant else {
            return Ok(());
        };
        // The grant lives `remaining` from the server's answer, which came
        // after the sending: remaining plus the call's time is a lower
        // bound of what the server granted.
        let remaining = lease.expiry().duration_since(sent).unwrap_or_default();
        if remaining + sent_at.elapsed() < min {
            return Err(LeaseError::invalid(format!(
                "the lease service granted {remaining:?}, less than the {min:?} this process \
                 counts on: give the service a TTL of at least {min:?}"
            )));
        }
        Ok(())
    }

    fn renewed(
        &self,
        lease: &Lease,
        wire: Option<&pb::Lease>,
        sent: SystemTime,
    ) -> Result<Lease, LeaseError> {
        if let Err(e) = self.check_authority(wire) {
            // Not ours to renew any more: whoever holds the session now
            // holds it under another authority.
            return Err(LeaseError::held(None).with_source(e));
        }
        let renewed = lease_from_wire(wire, lease.session_id(), lease.owner(), sent)?;
        if renewed.token() != lease.token() {
            return Err(LeaseError::invalid(format!(
                "the lease service changed the token of {} on renewal ({} to {})",
                lease.session_id(),
                lease.token(),
                renewed.token()
            )));
        }
        Ok(renewed)
    }

    fn batch_results(
        &self,
        leases: &[Lease],
        results: Vec<pb::RenewResult>,
        sent: SystemTime,
        sent_at: Instant,
    ) -> Vec<Result<Lease, LeaseError>> {
        let mut results = results.into_iter();
        leases
            .iter()
            .map(|lease| match results.next().and_then(|r| r.outcome) {
                Some(Outcome::Lease(wire)) => self
                    .renewed(lease, Some(&wire), sent)
                    .and_then(|l| self.check_grant(&l, sent, sent_at).map(|()| l)),
                Some(Outcome::Failure(f)) => Err(from_failure(&f)),
                None => Err(LeaseError::transient(
                    "the lease service answered too few renewals",
                )),
            })
            .collect()
    }

    async fn renew_chunk(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        loop {
            let way = self.batch_way();
            let sent = self.inner.clock.now();
            let sent_at = Instant::now();
            let refs: Vec<pb::LeaseRef> = leases.iter().map(lease_ref).collect();
            let answer = match way {
                BatchWay::KeepAlive => {
                    self.inner
                        .keepalive
                        .renew(&self.inner.client, refs, self.inner.call_timeout)
                        .await
                }
                BatchWay::BatchRenew => self
                    .call(true, |mut c, left| {
                        let mut req = Request::new(pb::BatchRenewRequest {
                            leases: refs.clone(),
                        });
                        req.set_timeout(left);
                        async move { c.batch_renew(req).await }
                    })
                    .await
                    .map(|r| r.results),
                BatchWay::OneByOne => {
                    let all = leases.iter().map(|l| self.renew(l));
                    return futures_util::future::join_all(all).await;
                }
            };
            match answer {
                Ok(results) => return self.batch_results(leases, results, sent, sent_at),
                Err(Refusal::MethodMissing) => self.fall_back(way),
                Err(Refusal::Lease(e)) => {
                    let message = e.to_string();
                    return leases
                        .iter()
                        .map(|_| Err(LeaseError::new(e.kind(), message.clone())))
                        .collect();
                }
            }
        }
    }
}

/// Whether the call failed because its connection did (tonic reports a
/// request written to a connection that had just closed as UNKNOWN, not
/// UNAVAILABLE). The request may or may not have reached the server, so
/// this is the same case as UNAVAILABLE for an idempotent call: without
/// the retry, the first call after a server restart or a reset connection
/// would fail although a fresh connection is one attempt away.
fn broke_in_transport(status: &Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// A pause between `d/2` and `d`, so many clients retrying after one fault
/// do not all come back at once.
fn jittered(d: Duration, r: u64) -> Duration {
    let fraction = 0.5 + (r % 1000) as f64 / 2000.0;
    d.mul_f64(fraction)
}

impl GrpcLeaseBuilder {
    /// The client. Connects lazily.
    pub fn build(self) -> Result<GrpcLease, LeaseError> {
        #[cfg(feature = "tls")]
        let encrypted = self.tls.is_some() || self.address.starts_with("https://");
        #[cfg(not(feature = "tls"))]
        let encrypted = false;
        if self.bearer.is_some() && !encrypted && !self.is_loopback() && !self.plaintext_token {
            return Err(LeaseError::invalid(format!(
                "refusing to send the bearer token to {} in plain text: configure TLS, or allow \
                 plain text explicitly",
                self.address
            )));
        }
        let channel = self.channel()?;
        let credentials =
            match &self.bearer {
                Some(token) => Some(format!("Bearer {token}").parse().map_err(|_| {
                    LeaseError::invalid("the bearer token is not valid header text")
                })?),
                None => None,
            };
        let client = LeaseServiceClient::with_interceptor(channel, Credentials(credentials));
        Ok(GrpcLease {
            inner: Arc::new(Inner {
                client,
                address: self.address.clone(),
                clock: self.clock,
                call_timeout: self.call_timeout,
                attempts: self.attempts,
                max_batch: self.max_batch,
                batch_way: AtomicU8::new(BatchWay::KeepAlive as u8),
                authority: std::sync::OnceLock::new(),
                server_batch: std::sync::atomic::AtomicUsize::new(0),
                min_grant: self.min_grant,
                keepalive: KeepAliveLink::default(),
            }),
        })
    }
}

impl GrpcLease {
    /// Acquire, with `floor` as the request's `min_token` (0: none).
    async fn acquire_with(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        let sent = self.inner.clock.now();
        let sent_at = Instant::now();
        let answer = self
            .call(false, |mut c, left| {
                let mut req = Request::new(pb::AcquireRequest {
                    session_id: session.as_str().to_owned(),
                    owner: owner.as_str().to_owned(),
                    min_token: floor.get(),
                });
                req.set_timeout(left);
                async move { c.acquire(req).await }
            })
            .await
            .map_err(|r| refusal(r, "Acquire"))?;
        self.check_authority(answer.lease.as_ref())?;
        let lease = lease_from_wire(answer.lease.as_ref(), session, owner, sent)?;
        self.check_grant(&lease, sent, sent_at)?;
        Ok(lease)
    }
}

fn refusal(r: Refusal, method: &str) -> LeaseError {
    match r {
        Refusal::Lease(e) => e,
        Refusal::MethodMissing => LeaseError::invalid(format!(
            "the server does not serve {method} of {}",
            pb::SERVICE_NAME
        )),
    }
}

#[async_trait]
impl SessionLease for GrpcLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.acquire_with(session, owner, FencingToken::new(0))
            .await
    }

    /// Sends `floor` as the request's `min_token`: the service raises its
    /// backend's tokens above it, or answers `Rewound` when the backend
    /// cannot. A service older than the field ignores it and grants a
    /// token of its own choosing, so the answer is checked here too: a
    /// token not above `floor` is released and answered
    /// [`Rewound`](lease_port::LeaseErrorKind::Rewound).
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        let lease = self.acquire_with(session, owner, floor).await?;
        if lease.token() > floor {
            return Ok(lease);
        }
        // Best effort: a release that fails leaves a grant that lapses.
        let _ = self.release(&lease).await;
        Err(LeaseError::rewound(format!(
            "the lease service at {} granted token {} for session {session}, not above {floor}, \
             which a store already accepted: the service ignored the floor (a version older \
             than min_token?) or its token record is older than the store's; restore the \
             service's newer state or upgrade it",
            self.inner.address,
            lease.token()
        )))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let sent = self.inner.clock.now();
        let sent_at = Instant::now();
        let answer = self
            .call(false, |mut c, left| {
                let mut req = Request::new(pb::RenewRequest {
                    lease: Some(lease_ref(lease)),
                });
                req.set_timeout(left);
                async move { c.renew(req).await }
            })
            .await
            .map_err(|r| refusal(r, "Renew"))?;
        let renewed = self.renewed(lease, answer.lease.as_ref(), sent)?;
        self.check_grant(&renewed, sent, sent_at)?;
        Ok(renewed)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.call(false, |mut c, left| {
            let mut req = Request::new(pb::ReleaseRequest {
                lease: Some(lease_ref(lease)),
            });
            req.set_timeout(left);
            async move { c.release(req).await }
        })
        .await
        .map(|_| ())
        .map_err(|r| refusal(r, "Release"))
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.service_info().await.map(|info| info.authority)
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let sent = self.inner.clock.now();
        let answer = self
            .call(true, |mut c, left| {
                let mut req = Request::new(pb::GetRequest {
                    session_id: session.as_str().to_owned(),
                });
                req.set_timeout(left);
                async move { c.get(req).await }
            })
            .await
            .map_err(|r| match r {
                Refusal::Lease(e) => e,
                Refusal::MethodMissing => {
                    LeaseError::unsupported("the lease service does not report current holders")
                }
            })?;
        let Some(wire) = answer.lease else {
            return Ok(None);
        };
        let owner = OwnerId::new(&wire.owner)?;
        lease_from_wire(Some(&wire), session, &owner, sent).map(Some)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        if self.inner.server_batch.load(Ordering::Relaxed) == 0 && !leases.is_empty() {
            // Learn the server's limit once, so no batch is refused whole
            // for its size; a server that does not say keeps the default.
            let _ = self.service_info().await;
        }
        let limit = match self.inner.server_batch.load(Ordering::Relaxed) {
            0 => self.inner.max_batch,
            n => n.min(self.inner.max_batch),
        };
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(limit) {
            out.extend(self.renew_chunk(chunk).await);
        }
        out
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    /// The [`min_grant`](crate::GrpcLeaseBuilder::min_grant) this client
    /// holds every grant to, when set: the service's own TTL is known only
    /// from its answers, and a grant shorter than the minimum is refused.
    fn granted_ttl(&self) -> Option<Duration> {
        self.inner.min_grant
    }
}
