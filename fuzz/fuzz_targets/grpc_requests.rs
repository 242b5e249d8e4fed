//! Arbitrary request bodies on every unary method of real lease servers
//! (over memory leases, on loopback): each is answered with a reply or a
//! status the contract names, never a crash of the connection or an
//! internal error, and the servers keep serving. One server authenticates
//! nobody; the other tells its callers apart by identities, and is called
//! with no token, a wrong one, or client `x`'s: whatever the body, no call
//! for an owner outside `x/` ever reaches its backend.

#![no_main]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use lease_port::{
    AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease,
};
use libfuzzer_sys::fuzz_target;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

const METHODS: [&str; 7] = [
    "/mecatl.lease.v1.LeaseService/Acquire",
    "/mecatl.lease.v1.LeaseService/Renew",
    "/mecatl.lease.v1.LeaseService/Release",
    "/mecatl.lease.v1.LeaseService/Get",
    "/mecatl.lease.v1.LeaseService/BatchRenew",
    "/mecatl.lease.v1.LeaseService/GetAuthority",
    "/mecatl.lease.v1.LeaseService/WhoAmI",
];

/// The credentials a call to the identities server carries.
const CREDENTIALS: [Option<&str>; 3] = [None, Some("not-a-token"), Some("token-x")];

/// Message bodies as they are, so any bytes reach the server.
#[derive(Clone, Copy, Default)]
struct RawCodec;
struct Raw;

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

/// The identities server's backend: memory leases, and a flag raised by
/// any call that reaches it for an owner its only client may not act for.
struct Watched {
    leases: memlease::MemLease,
    crossed: AtomicBool,
}

impl Watched {
    fn see(&self, owner: &OwnerId) {
        if !owner.as_str().starts_with("x/") {
            self.crossed.store(true, Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl SessionLease for Watched {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.see(owner);
        self.leases.acquire(session, owner).await
    }
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        self.see(owner);
        self.leases.acquire_above(session, owner, floor).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.see(lease.owner());
        self.leases.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.see(lease.owner());
        self.leases.release(lease).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.leases.authority().await
    }
    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        self.leases.current(session).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        for lease in leases {
            self.see(lease.owner());
        }
        self.leases.renew_many(leases).await
    }
}

struct World {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    /// The server that tells callers apart, and its backend.
    guarded: Channel,
    guarded_leases: Arc<Watched>,
}

async fn serve(server: grpcdriver::LeaseServer) -> Channel {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.max_batch(16).serve(listener, std::future::pending()));
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the lease server")
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let guarded_leases = Arc::new(Watched {
            leases: memlease::MemLease::new(Duration::from_secs(30)),
            crossed: AtomicBool::new(false),
        });
        let (channel, guarded) = runtime.block_on(async {
            let backend = Arc::new(memlease::MemLease::new(Duration::from_secs(30)));
            let identities = grpcdriver::Identities::parse(&format!(
                "token x x/ {}\n",
                grpcdriver::hash_token("token-x")
            ))
            .expect("identities");
            let guarded = grpcdriver::LeaseServer::new(guarded_leases.clone())
                .identities(grpcdriver::IdentityStore::new(identities));
            (
                serve(grpcdriver::LeaseServer::new(backend)).await,
                serve(guarded).await,
            )
        });
        World {
            runtime,
            channel,
            guarded,
            guarded_leases,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(selector) % METHODS.len()];
    // Half the inputs go to the identities server, with one of its
    // credentials.
    let guarded = selector & 0x80 != 0;
    let credential = CREDENTIALS[usize::from(selector >> 3) % CREDENTIALS.len()];
    let w = world();
    let answer = w.runtime.block_on(async {
        let channel = if guarded { &w.guarded } else { &w.channel };
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.expect("the server is still serving");
        let mut request = tonic::Request::new(Bytes::copy_from_slice(body));
        if let (true, Some(token)) = (guarded, credential) {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII"),
            );
        }
        grpc.unary(
            request,
            tonic::codegen::http::uri::PathAndQuery::from_static(method),
            RawCodec,
        )
        .await
    });
    if let Err(status) = answer {
        let refused_caller = guarded
            && matches!(
                status.code(),
                Code::Unauthenticated | Code::PermissionDenied
            );
        assert!(
            refused_caller
                || matches!(
                    status.code(),
                    Code::InvalidArgument
                        | Code::FailedPrecondition
                        | Code::Aborted
                        | Code::NotFound
                        | Code::ResourceExhausted
                ),
            "{method}: {status:?}"
        );
    }
    assert!(
        !w.guarded_leases.crossed.load(Ordering::SeqCst),
        "{method} with {credential:?} reached the backend for another owner"
    );
});
