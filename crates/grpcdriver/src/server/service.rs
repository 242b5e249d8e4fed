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
}

impl LeaseService {
    fn invalid(e: &LeaseError) -> Status {
        reason_status(pb::Reason::Invalid, e.message(), None)
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
    async fn renew_batch(&self, refs: &[pb::LeaseRef]) -> Vec<pb::RenewResult> {
        let now = self.clock.now();
        let parsed: Vec<Result<Lease, LeaseError>> =
            refs.iter().map(|r| lease_from_ref(Some(r), now)).collect();
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
                let answer = match p {
                    Ok(_) => answers.next().unwrap_or_else(|| {
                        Err(LeaseError::transient(
                            "the backend answered too few renewals",
                        ))
                    }),
                    Err(e) => Err(e),
                };
                let outcome = match answer {
                    Ok(lease) => Outcome::Lease(lease_to_wire(&lease, now, &self.authority)),
                    Err(e) => Outcome::Failure(to_failure(&e)),
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

    fn timed<T>(&self, method: Method, started: Instant, r: &Result<T, Status>) {
        let code = match r {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.stats.record(method, code, started.elapsed());
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
        let r = async {
            let req = request.into_inner();
            let (session, owner) =
                ids(&req.session_id, &req.owner).map_err(|e| Self::invalid(&e))?;
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
        self.timed(Method::Acquire, started, &r);
        r
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let started = Instant::now();
        let r = async {
            let req = request.into_inner();
            let lease = lease_from_ref(req.lease.as_ref(), self.clock.now())
                .map_err(|e| Self::invalid(&e))?;
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
        self.timed(Method::Renew, started, &r);
        r
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let started = Instant::now();
        let r = async {
            let req = request.into_inner();
            let lease = lease_from_ref(req.lease.as_ref(), self.clock.now())
                .map_err(|e| Self::invalid(&e))?;
            self.backend
                .release(&lease)
                .await
                .map_err(|e| to_status(Call::Release, &e))?;
            Ok(Response::new(pb::ReleaseResponse {}))
        }
        .await;
        self.timed(Method::Release, started, &r);
        r
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let started = Instant::now();
        let r = async {
            let req = request.into_inner();
            let session = SessionId::new(&req.session_id).map_err(|e| Self::invalid(&e))?;
            let current = self
                .backend
                .current(&session)
                .await
                .map_err(|e| to_status(Call::Get, &e))?;
            let now = self.clock.now();
            Ok(Response::new(pb::GetResponse {
                lease: current.map(|l| lease_to_wire(&l, now, &self.authority)),
            }))
        }
        .await;
        self.timed(Method::Get, started, &r);
        r
    }

    async fn batch_renew(
        &self,
        request: Request<pb::BatchRenewRequest>,
    ) -> Result<Response<pb::BatchRenewResponse>, Status> {
        let started = Instant::now();
        let r = async {
            let req = request.into_inner();
            self.check_batch(req.leases.len())?;
            Ok(Response::new(pb::BatchRenewResponse {
                results: self.renew_batch(&req.leases).await,
            }))
        }
        .await;
        self.timed(Method::BatchRenew, started, &r);
        r
    }

    type KeepAliveStream = KeepAliveStream;

    async fn keep_alive(
        &self,
        request: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
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
                let next = tokio::select! {
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
                };
                let Some(next) = next else { break };
                let started = Instant::now();
                let answer = match next {
                    Ok(batch) => Ok(pb::KeepAliveResponse {
                        batch_id: batch.batch_id,
                        results: match this.check_batch(batch.leases.len()) {
                            Ok(()) => this.renew_batch(&batch.leases).await,
                            Err(status) => Self::refuse_batch(batch.leases.len(), &status),
                        },
                    }),
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
                this.timed(Method::KeepAliveBatch, started, &answer);
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
        self.timed(Method::GetAuthority, started, &r);
        r
    }
}
