//! Servers that lack the optional methods: the client falls back from
//! KeepAlive to BatchRenew to one Renew per lease, decided once; a server
//! that is not a lease service at all is a misconfiguration (`Invalid`),
//! never a backend that cannot lease (`Unsupported`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::Stream;
use grpcdriver::GrpcLease;
use grpcdriver::pb::{
    self,
    lease_service_client::LeaseServiceClient,
    lease_service_server::{LeaseService, LeaseServiceServer},
};
use lease_port::{Clock, LeaseErrorKind, SessionLease, SystemClock};
use memlease::MemLease;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::{Request, Response, Status, Streaming};

use crate::support::{Running, owner, session};

const TTL: Duration = Duration::from_secs(30);

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

#[derive(Default)]
struct Calls {
    acquire: AtomicUsize,
    renew: AtomicUsize,
    batch_renew: AtomicUsize,
    keep_alive: AtomicUsize,
    get: AtomicUsize,
}

fn n(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

/// A lease service of an older or smaller implementation: the required
/// methods are those of the real server over memlease (forwarded to it),
/// the optional ones it lacks answer a plain UNIMPLEMENTED, as a server
/// generated from an older contract would. Every call is counted.
struct Partial {
    real: LeaseServiceClient<Channel>,
    has_batch_renew: bool,
    calls: Arc<Calls>,
}

fn missing(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not served here"))
}

type Answers = Pin<Box<dyn Stream<Item = Result<pb::KeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl LeaseService for Partial {
    async fn acquire(
        &self,
        r: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        self.calls.acquire.fetch_add(1, Ordering::SeqCst);
        self.real.clone().acquire(r.into_inner()).await
    }

    async fn renew(
        &self,
        r: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        self.calls.renew.fetch_add(1, Ordering::SeqCst);
        self.real.clone().renew(r.into_inner()).await
    }

    async fn release(
        &self,
        r: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        self.real.clone().release(r.into_inner()).await
    }

    async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        self.calls.get.fetch_add(1, Ordering::SeqCst);
        Err(missing("Get"))
    }

    async fn batch_renew(
        &self,
        r: Request<pb::BatchRenewRequest>,
    ) -> Result<Response<pb::BatchRenewResponse>, Status> {
        self.calls.batch_renew.fetch_add(1, Ordering::SeqCst);
        if !self.has_batch_renew {
            return Err(missing("BatchRenew"));
        }
        self.real.clone().batch_renew(r.into_inner()).await
    }

    type KeepAliveStream = Answers;

    async fn keep_alive(
        &self,
        _: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Answers>, Status> {
        self.calls.keep_alive.fetch_add(1, Ordering::SeqCst);
        Err(missing("KeepAlive"))
    }

    async fn get_authority(
        &self,
        r: Request<pb::GetAuthorityRequest>,
    ) -> Result<Response<pb::GetAuthorityResponse>, Status> {
        self.real.clone().get_authority(r.into_inner()).await
    }

    /// A server older than WhoAmI.
    async fn who_am_i(
        &self,
        _: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        Err(missing("WhoAmI"))
    }
}

/// Serves `router` on a fresh loopback port until dropped.
struct Served {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(router: Router) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let task = tokio::spawn(async move {
        router.serve_with_incoming(incoming).await.expect("serve");
    });
    Served { addr, task }
}

struct Setup {
    _real: Running,
    _partial: Served,
    calls: Arc<Calls>,
    client: GrpcLease,
    backend: MemLease,
}

async fn partial_server(has_batch_renew: bool) -> Setup {
    let backend = MemLease::new(TTL);
    let real = Running::start(Arc::new(backend.clone()), clock(), None, |s| s).await;
    let channel = Channel::from_shared(format!("http://{}", real.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let calls = Arc::new(Calls::default());
    let partial = serve(
        tonic::transport::Server::builder().add_service(LeaseServiceServer::new(Partial {
            real: LeaseServiceClient::new(channel),
            has_batch_renew,
            calls: Arc::clone(&calls),
        })),
    )
    .await;
    let client = GrpcLease::connect(partial.addr.to_string()).unwrap();
    Setup {
        _real: real,
        _partial: partial,
        calls,
        client,
        backend,
    }
}

const N: usize = 5;

async fn acquire_n(client: &GrpcLease) -> Vec<lease_port::Lease> {
    let mut leases = Vec::new();
    for i in 0..N {
        leases.push(
            client
                .acquire(&session(&format!("fb-{i}")), &owner("a"))
                .await
                .unwrap(),
        );
    }
    leases
}

fn assert_all_renewed(
    held: &[lease_port::Lease],
    results: Vec<Result<lease_port::Lease, lease_port::LeaseError>>,
) {
    assert_eq!(results.len(), held.len());
    for (r, l) in results.into_iter().zip(held) {
        let renewed = r.unwrap_or_else(|e| panic!("{} not renewed: {e}", l.session_id()));
        assert_eq!(renewed.session_id(), l.session_id());
        assert_eq!(renewed.token(), l.token());
    }
}

#[tokio::test]
async fn without_keepalive_or_batch_renew_each_lease_is_renewed_alone() {
    // Bound whole: the servers it holds must live to the end of the test.
    let setup = partial_server(false).await;
    let Setup {
        calls,
        client,
        backend,
        ..
    } = &setup;
    let held = acquire_n(client).await;
    assert!(client.renews_in_batches());

    assert_all_renewed(&held, client.renew_many(&held).await);
    assert_eq!(n(&calls.keep_alive), 1);
    assert_eq!(n(&calls.batch_renew), 1);
    assert_eq!(n(&calls.renew), N, "one Renew per lease");

    // Decided once: the next renewal goes straight to unary calls.
    assert_all_renewed(&held, client.renew_many(&held).await);
    assert_eq!(n(&calls.keep_alive), 1);
    assert_eq!(n(&calls.batch_renew), 1);
    assert_eq!(n(&calls.renew), 2 * N);
    assert_eq!(backend.live_count(), N);

    // A lease lost meanwhile fails alone, as `Held`.
    backend.release(&held[2]).await.unwrap();
    let results = client.renew_many(&held).await;
    for (i, r) in results.into_iter().enumerate() {
        match (i, r) {
            (2, Err(e)) => assert_eq!(e.kind(), LeaseErrorKind::Held),
            (2, Ok(l)) => panic!("a released lease was renewed: {l:?}"),
            (_, r) => assert_eq!(r.unwrap().token(), held[i].token()),
        }
    }
}

#[tokio::test]
async fn without_keepalive_a_batch_is_one_batch_renew() {
    let setup = partial_server(true).await;
    let Setup { calls, client, .. } = &setup;
    let held = acquire_n(client).await;

    assert_all_renewed(&held, client.renew_many(&held).await);
    assert_eq!(n(&calls.keep_alive), 1);
    assert_eq!(n(&calls.batch_renew), 1, "one call for the batch");
    assert_eq!(n(&calls.renew), 0);

    assert_all_renewed(&held, client.renew_many(&held).await);
    assert_eq!(n(&calls.keep_alive), 1, "KeepAlive is not asked again");
    assert_eq!(n(&calls.batch_renew), 2);
    assert_eq!(n(&calls.renew), 0);
}

#[tokio::test]
async fn without_get_current_is_unsupported() {
    let setup = partial_server(true).await;
    let Setup { calls, client, .. } = &setup;
    let chat = session("fb-current");
    client.acquire(&chat, &owner("a")).await.unwrap();
    let e = client.current(&chat).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Unsupported, "{e}");
    assert_eq!(n(&calls.get), 1);
    // Only the optional report is missing: leasing goes on.
    let again = client.acquire(&chat, &owner("a")).await.unwrap();
    assert_eq!(again.session_id(), &chat);
    assert_eq!(n(&calls.acquire), 2);
}

#[tokio::test]
async fn a_server_older_than_who_am_i_names_no_identity() {
    let setup = partial_server(true).await;
    assert_eq!(setup.client.who_am_i().await.unwrap(), None);
}

#[tokio::test]
async fn another_service_behind_the_address_is_invalid_never_unsupported() {
    // A gRPC server, but not a lease service: only health is routed, so
    // every lease method is a plain UNIMPLEMENTED from the router.
    let (_health, health_service) = tonic_health::server::health_reporter();
    let other = serve(tonic::transport::Server::builder().add_service(health_service)).await;
    let client = GrpcLease::connect(other.addr.to_string()).unwrap();
    let chat = session("elsewhere");

    let e = client.acquire(&chat, &owner("a")).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    assert!(e.message().contains(pb::SERVICE_NAME), "{e}");
    let e = client.authority().await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    let fake = lease_port::Lease::new(
        chat.clone(),
        owner("a"),
        lease_port::FencingToken::new(1),
        std::time::SystemTime::now(),
    );
    let e = client.renew(&fake).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    let e = client.release(&fake).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    // Falling all the way back to unary Renew ends in the same verdict.
    for r in client.renew_many(std::slice::from_ref(&fake)).await {
        assert_eq!(r.unwrap_err().kind(), LeaseErrorKind::Invalid);
    }
}

#[tokio::test]
async fn a_lease_service_answering_plain_unimplemented_to_acquire_is_invalid() {
    /// Every method a plain UNIMPLEMENTED: a stub generated from the
    /// contract and never filled in.
    struct Stub;

    #[tonic::async_trait]
    impl LeaseService for Stub {
        async fn acquire(
            &self,
            _: Request<pb::AcquireRequest>,
        ) -> Result<Response<pb::AcquireResponse>, Status> {
            Err(missing("Acquire"))
        }
        async fn renew(
            &self,
            _: Request<pb::RenewRequest>,
        ) -> Result<Response<pb::RenewResponse>, Status> {
            Err(missing("Renew"))
        }
        async fn release(
            &self,
            _: Request<pb::ReleaseRequest>,
        ) -> Result<Response<pb::ReleaseResponse>, Status> {
            Err(missing("Release"))
        }
        async fn get(
            &self,
            _: Request<pb::GetRequest>,
        ) -> Result<Response<pb::GetResponse>, Status> {
            Err(missing("Get"))
        }
        async fn batch_renew(
            &self,
            _: Request<pb::BatchRenewRequest>,
        ) -> Result<Response<pb::BatchRenewResponse>, Status> {
            Err(missing("BatchRenew"))
        }
        type KeepAliveStream = Answers;
        async fn keep_alive(
            &self,
            _: Request<Streaming<pb::KeepAliveRequest>>,
        ) -> Result<Response<Answers>, Status> {
            Err(missing("KeepAlive"))
        }
        async fn get_authority(
            &self,
            _: Request<pb::GetAuthorityRequest>,
        ) -> Result<Response<pb::GetAuthorityResponse>, Status> {
            Err(missing("GetAuthority"))
        }
        async fn who_am_i(
            &self,
            _: Request<pb::WhoAmIRequest>,
        ) -> Result<Response<pb::WhoAmIResponse>, Status> {
            Err(missing("WhoAmI"))
        }
    }

    let stub =
        serve(tonic::transport::Server::builder().add_service(LeaseServiceServer::new(Stub))).await;
    let client = GrpcLease::connect(stub.addr.to_string()).unwrap();
    let e = client
        .acquire(&session("s"), &owner("a"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
}
