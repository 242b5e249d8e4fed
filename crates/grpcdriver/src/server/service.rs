//! The lease service: each call validated, handed to the backend, and its
//! answer put on the wire.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::Stream;
use lease_port::{Clock, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::GetAccess;
use super::auth::{Authenticator, Caller};
use super::stats::{Method, ServerStats};
use crate::convert::{lease_from_ref, lease_to_wire};
use crate::pb::{self, lease_service_server::LeaseService as Service, renew_result::Outcome};
use crate::status::{Call, reason_status, to_failure, to_status};

/// Answers one batch at a time per KeepAlive stream; a client that sends
/// faster than the backend renews waits on this many queued answers.
const KEEPALIVE_QUEUE: usize = 4;

#[derive(Clone)]
pub(crate) struct LeaseService {
    pub(crate) backend: Arc<dyn SessionLease>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_batch: usize,
    pub(crate) stats: Arc<ServerStats>,
    /// Turns true when the server begins to shut down.
    pub(crate) stopping: watch::Receiver<bool>,
    /// The backend's authority, read once when serving starts: it names
    /// every grant this server hands out.
    pub(crate) authority: Arc<str>,
    /// The backend's TTL, when the operator stated it.
    pub(crate) ttl: Option<std::time::Duration>,
    /// The most a batch may take on the backend before its leases are
    /// answered UNAVAILABLE (a hung backend must not pile up work).
    pub(crate) call_timeout: std::time::Duration,
    /// A KeepAlive stream with no batch for this long is closed.
    pub(crate) stream_idle: std::time::Duration,
    /// Who may call, and for which owners.
    pub(crate) auth: Arc<Authenticator>,
    /// Who may read a session's holder.
    pub(crate) get_access: GetAccess,
}

impl LeaseService {
    fn invalid(e: &LeaseError) -> Status {
        reason_status(pb::Reason::Invalid, e.message(), None)
    }

    /// The caller the authentication layer put on the request.
    fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| {
                Status::internal("the lease service was served without its authentication layer")
            })
    }

    /// Refuses a call naming an owner outside the caller's identity, and
    /// counts the caller's call either way.
    fn permit(
        &self,
        caller: &Caller,
        method: Method,
        owner: &OwnerId,
        session: &SessionId,
    ) -> Result<(), Status> {
        if caller.owners().admits(owner) {
            return Ok(());
        }
        self.stats.record_denied(caller.name(), method);
        // Ids are the caller's own text: quoted, so none can forge a field.
        tracing::warn!(
            target: "audit",
            client = ?caller.name(),
            action = method.name(),
            session = ?session.as_str(),
            owner = ?owner.as_str(),
            outcome = "not_permitted",
            "refused: the caller may not act for this owner"
        );
        Err(Self::not_permitted(caller, owner))
    }

    fn not_permitted(caller: &Caller, owner: &OwnerId) -> Status {
        reason_status(
            pb::Reason::NotPermitted,
            &format!(
                "client `{}` may not act for owner `{owner}`: its owner ids begin with `{}`",
                caller.name(),
                caller.owners()
            ),
            None,
        )
    }

    fn check_batch(&self, n: usize) -> Result<(), Status> {
        if n > self.max_batch {
            return Err(reason_status(
                pb::Reason::Invalid,
                &format!("{n} leases in one batch; the limit is {}", self.max_batch),
                None,
            ));
        }
        Ok(())
    }

    /// Renews a batch; one result per lease, in order. Malformed entries
    /// fail alone, as INVALID.
    async fn renew_batch(
        &self,
        caller: &Caller,
        method: Method,
        refs: &[pb::LeaseRef],
    ) -> Vec<pb::RenewResult> {
        let now = self.clock.now();
        // A malformed entry, or one naming an owner the caller may not act
        // for, fails alone and never reaches the backend.
        let mut refused = 0usize;
        let parsed: Vec<Result<Lease, pb::Failure>> = refs
            .iter()
            .map(|r| {
                let lease = lease_from_ref(Some(r), now).map_err(|e| to_failure(&e))?;
                if !caller.owners().admits(lease.owner()) {
                    refused += 1;
                    self.stats.record_denied(caller.name(), method);
                    return Err(pb::Failure {
                        reason: pb::Reason::NotPermitted.into(),
                        message: Self::not_permitted(caller, lease.owner())
                            .message()
                            .to_owned(),
                        holder: String::new(),
                    });
                }
                Ok(lease)
            })
            .collect();
        if refused > 0 {
            // One line a batch, however many of its leases were refused.
            tracing::warn!(
                target: "audit",
                client = ?caller.name(),
                action = method.name(),
                refused,
                of = refs.len(),
                outcome = "not_permitted",
                "refused: renewals of owners the caller may not act for"
            );
        }
        let valid: Vec<Lease> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().cloned())
            .collect();
        let answers = tokio::time::timeout(self.call_timeout, self.backend.renew_many(&valid))
            .await
            .unwrap_or_else(|_| {
                valid
                    .iter()
                    .map(|_| Err(LeaseError::transient("the backend did not renew in time")))
                    .collect()
            });
        let mut answers = answers.into_iter();
        let now = self.clock.now();
        parsed
            .into_iter()
            .map(|p| {
                let outcome = match p {
                    Ok(_) => match answers.next() {
                        Some(Ok(lease)) => {
                            Outcome::Lease(lease_to_wire(&lease, now, &self.authority))
                        }
                        Some(Err(e)) => Outcome::Failure(to_failure(&e)),
                        None => Outcome::Failure(to_failure(&LeaseError::transient(
                            "the backend answered too few renewals",
                        ))),
                    },
                    Err(failure) => Outcome::Failure(failure),
                };
                pb::RenewResult {
                    outcome: Some(outcome),
                }
            })
            .collect()
    }

    /// A whole batch refused alone: every lease answered INVALID under the
    /// batch's own id, so the stream, and every other batch on it, lives.
    fn refuse_batch(n: usize, why: &Status) -> Vec<pb::RenewResult> {
        let failure = to_failure(&LeaseError::invalid(why.message().to_owned()));
        (0..n)
            .map(|_| pb::RenewResult {
                outcome: Some(Outcome::Failure(failure.clone())),
            })
            .collect()
    }

    fn timed<T>(
        &self,
        method: Method,
        started: Instant,
        r: &Result<T, Status>,
        caller: Option<&Caller>,
    ) {
        let code = match r {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.stats.record(method, code, started.elapsed());
        if let Some(caller) = caller {
            self.stats.record_client(caller.name(), method);
        }
    }
}

fn ids(session: &str, owner: &str) -> Result<(SessionId, OwnerId), LeaseError> {
    Ok((SessionId::new(session)?, OwnerId::new(owner)?))
}

/// What tonic's codec answers for a message over the size limit or one
/// that does not decode.
fn is_codec_refusal(status: &Status) -> bool {
    match status.code() {
        tonic::Code::OutOfRange => true,
        tonic::Code::Internal => status.message().starts_with("failed to decode"),
        _ => false,
    }
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<pb::KeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Service for LeaseService {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let started = Instant::now();
        let caller = Self::caller(&request);
        let r = async {
            let caller = caller.as_ref().map_err(Status::clone)?;
            let req = request.into_inner();
            let (session, owner) =
                ids(&req.session_id, &req.owner).map_err(|e| Self::invalid(&e))?;
            self.permit(caller, Method::Acquire, &owner, &session)?;
            // 0 is "no floor", and what a client older than the field sends.
            let granted = match req.min_token {
                0 => self.backend.acquire(&session, &owner).await,
                floor => {
                    self.backend
                        .acquire_above(&session, &owner, FencingToken::new(floor))
                        .await
                }
            };
            let lease = granted.map_err(|e| to_status(Call::Acquire, &e))?;
            Ok(Response::new(pb::AcquireResponse {
                lease: Some(lease_to_wire(&lease, self.clock.now(), &self.authority)),
            }))
        }
        .await;
        self.timed(Method::Acquire, started, &r, caller.ok().as_ref());
        r
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let started = Instant::now();
        let caller = Self::caller(&request);
        let r = async {
            let caller = caller.as_ref().map_err(Status::clone)?;
            let req = request.into_inner();
            let lease = lease_from_ref(req.lease.as_ref(), self.clock.now())
                .map_err(|e| Self::invalid(&e))?;
            self.permit(caller, Method::Renew, lease.owner(), lease.session_id())?;
            let renewed = self
                .backend
                .renew(&lease)
                .await
                .map_err(|e| to_status(Call::Renew, &e))?;
            Ok(Response::new(pb::RenewResponse {
                lease: Some(lease_to_wire(&renewed, self.clock.now(), &self.authority)),
            }))
        }
        .await;
        self.timed(Method::Renew, started, &r, caller.ok().as_ref());
        r
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let started = Instant::now();
        let caller = Self::caller(&request);
        let r = async {
            let caller = caller.as_ref().map_err(Status::clone)?;
            let req = request.into_inner();
            let lease = lease_from_ref(req.lease.as_ref(), self.clock.now())
                .map_err(|e| Self::invalid(&e))?;
            self.permit(caller, Method::Release, lease.owner(), lease.session_id())?;
            let released = self.backend.release(&lease).await;
            // A release changes who may own the session: one line for the
            // audit trail, whoever asked and however it ended.
            tracing::info!(
                target: "audit",
                client = ?caller.name(),
                action = "Release",
                session = ?lease.session_id().as_str(),
                owner = ?lease.owner().as_str(),
                token = lease.token().get(),
                outcome = %match &released {
                    Ok(()) => "released".to_owned(),
                    Err(e) => e.kind().to_string(),
                },
            );
            released.map_err(|e| to_status(Call::Release, &e))?;
            Ok(Response::new(pb::ReleaseResponse {}))
        }
        .await;
        self.timed(Method::Release, started, &r, caller.ok().as_ref());
        r
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let started = Instant::now();
        let caller = Self::caller(&request);
        let r = async {
            let caller = caller.as_ref().map_err(Status::clone)?;
            let req = request.into_inner();
            let session = SessionId::new(&req.session_id).map_err(|e| Self::invalid(&e))?;
            let current = self
                .backend
                .current(&session)
                .await
                .map_err(|e| to_status(Call::Get, &e))?;
            if let (GetAccess::OwnOwners, Some(held)) = (self.get_access, &current)
                && !caller.owners().admits(held.owner())
            {
                // Says nothing of the holder: that is what is withheld.
                self.stats.record_denied(caller.name(), Method::Get);
                return Err(reason_status(
                    pb::Reason::NotPermitted,
                    &format!(
                        "client `{}` may not read who holds this session",
                        caller.name()
                    ),
                    None,
                ));
            }
            let now = self.clock.now();
            Ok(Response::new(pb::GetResponse {
                lease: current.map(|l| lease_to_wire(&l, now, &self.authority)),
            }))
        }
        .await;
        self.timed(Method::Get, started, &r, caller.ok().as_ref());
        r
    }

    async fn batch_renew(
        &self,
        request: Request<pb::BatchRenewRequest>,
    ) -> Result<Response<pb::BatchRenewResponse>, Status> {
        let started = Instant::now();
        let caller = Self::caller(&request);
        let r = async {
            let caller = caller.as_ref().map_err(Status::clone)?;
            let req = request.into_inner();
            self.check_batch(req.leases.len())?;
            Ok(Response::new(pb::BatchRenewResponse {
                results: self
                    .renew_batch(caller, Method::BatchRenew, &req.leases)
                    .await,
            }))
        }
        .await;
        self.timed(Method::BatchRenew, started, &r, caller.ok().as_ref());
        r
    }

    type KeepAliveStream = KeepAliveStream;

    async fn keep_alive(
        &self,
        request: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let mut caller = Self::caller(&request)?;
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(KEEPALIVE_QUEUE);
        let this = self.clone();
        let mut stopping = self.stopping.clone();
        self.stats.stream_opened();
        // The stream's work runs on its own task so the handler can answer
        // headers at once; it ends when the client closes its side, the
        // connection breaks, or nobody reads the answers any more.
        tokio::spawn(async move {
            loop {
                // Biased, stopping first: a stream asked to stop stops even
                // while its client keeps sending, and which branch wins when
                // both are ready depends on nothing but this order, so a
                // simulated run replays.
                let next = tokio::select! {
                    biased;
                    // A graceful shutdown waits for every open call, and a
                    // KeepAlive stream stays open as long as its client
                    // lives: end it, or the server never stops. The client
                    // takes this as a passing fault and reopens the stream
                    // on whichever server answers next.
                    _ = stopping.wait_for(|stop| *stop) => {
                        let _ = tx.try_send(Err(reason_status(
                            pb::Reason::Unavailable,
                            "the lease service is shutting down",
                            None,
                        )));
                        break;
                    }
                    next = tokio::time::timeout(this.stream_idle, inbound.next()) => match next {
                        Ok(next) => next,
                        // A stream that carries nothing ties up a task and a
                        // connection slot for nothing; a client that still
                        // holds leases reopens it on its next renewal.
                        Err(_) => {
                            let _ = tx.try_send(Err(reason_status(
                                pb::Reason::Unavailable,
                                "the KeepAlive stream was idle; closed",
                                None,
                            )));
                            break;
                        }
                    },
                };
                let Some(next) = next else { break };
                let started = Instant::now();
                let answer = match next {
                    // The identities may have been replaced since the
                    // stream opened: a revoked credential renews nothing
                    // more, and the stream ends.
                    Ok(batch) => match this.auth.recheck(&mut caller) {
                        Err(refused) => Err(refused),
                        Ok(()) => Ok(pb::KeepAliveResponse {
                            batch_id: batch.batch_id,
                            results: match this.check_batch(batch.leases.len()) {
                                Ok(()) => {
                                    this.renew_batch(&caller, Method::KeepAliveBatch, &batch.leases)
                                        .await
                                }
                                Err(status) => Self::refuse_batch(batch.leases.len(), &status),
                            },
                        }),
                    },
                    // The codec refused a message (too large, undecodable):
                    // bad input, answered as such, as for unary calls,
                    // rather than a silently ended stream the client would
                    // take for a passing fault and send again.
                    Err(status) if is_codec_refusal(&status) => {
                        Err(reason_status(pb::Reason::Invalid, status.message(), None))
                    }
                    // The client's side broke; nothing more will come.
                    Err(_) => break,
                };
                this.timed(Method::KeepAliveBatch, started, &answer, Some(&caller));
                let fatal = answer.is_err();
                if tx.send(answer).await.is_err() || fatal {
                    break;
                }
            }
            this.stats.stream_closed();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_authority(
        &self,
        _request: Request<pb::GetAuthorityRequest>,
    ) -> Result<Response<pb::GetAuthorityResponse>, Status> {
        let started = Instant::now();
        let r: Result<_, Status> = Ok(Response::new(pb::GetAuthorityResponse {
            authority: self.authority.to_string(),
            ttl: self.ttl.map(crate::convert::duration_to_wire),
            max_batch: u32::try_from(self.max_batch).unwrap_or(u32::MAX),
        }));
        self.timed(Method::GetAuthority, started, &r, None);
        r
    }

    async fn who_am_i(
        &self,
        request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let started = Instant::now();
        let caller = Self::caller(&request);
        let r = caller.as_ref().map_err(Status::clone).map(|caller| {
            Response::new(pb::WhoAmIResponse {
                client: caller.name().to_string(),
                owner_prefixes: caller.owners().wire_prefixes(),
            })
        });
        self.timed(Method::WhoAmI, started, &r, caller.ok().as_ref());
        r
    }
}
