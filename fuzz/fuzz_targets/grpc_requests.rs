//! Arbitrary request bodies on every unary method of a real lease server
//! (over memory leases, on loopback): each is answered with a reply or a
//! status the contract names, never a crash of the connection or an
//! internal error, and the server keeps serving.

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use libfuzzer_sys::fuzz_target;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

const METHODS: [&str; 6] = [
    "/mecatl.lease.v1.LeaseService/Acquire",
    "/mecatl.lease.v1.LeaseService/Renew",
    "/mecatl.lease.v1.LeaseService/Release",
    "/mecatl.lease.v1.LeaseService/Get",
    "/mecatl.lease.v1.LeaseService/BatchRenew",
    "/mecatl.lease.v1.LeaseService/GetAuthority",
];

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

struct World {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let channel = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let backend = Arc::new(memlease::MemLease::new(Duration::from_secs(30)));
            tokio::spawn(
                grpcdriver::LeaseServer::new(backend)
                    .max_batch(16)
                    .serve(listener, std::future::pending()),
            );
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .expect("connect to the lease server")
        });
        World { runtime, channel }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(selector) % METHODS.len()];
    let w = world();
    let answer = w.runtime.block_on(async {
        let mut grpc = tonic::client::Grpc::new(w.channel.clone());
        grpc.ready().await.expect("the server is still serving");
        grpc.unary(
            tonic::Request::new(Bytes::copy_from_slice(body)),
            tonic::codegen::http::uri::PathAndQuery::from_static(method),
            RawCodec,
        )
        .await
    });
    if let Err(status) = answer {
        assert!(
            matches!(
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
});
