//! Bad input on the wire: oversized and malformed requests, batches over
//! the limit, invalid ids — each answered INVALID_ARGUMENT by a real
//! server, and read as `Invalid` by the client.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use grpcdriver::pb::{self, lease_service_client::LeaseServiceClient};
use grpcdriver::{ERROR_DOMAIN, GrpcLease};
use lease_port::{
    AuthorityId, Clock, Lease, LeaseError, LeaseErrorKind, MAX_ID_LEN, OwnerId, SessionId,
    SessionLease, SystemClock,
};
use memlease::MemLease;
use prost::bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::support::{Running, owner, session, wire_status};

const TTL: Duration = Duration::from_secs(30);

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

async fn channel(server: &Running) -> Channel {
    Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// The status says INVALID_ARGUMENT; when `ours`, it also carries our
/// ErrorInfo with reason INVALID.
fn assert_invalid(status: &Status, ours: bool) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    if ours {
        let info = status
            .get_details_error_info()
            .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
        assert_eq!(info.reason, "INVALID");
        assert_eq!(info.domain, ERROR_DOMAIN);
    }
}

fn lease_ref(session_id: &str, owner: &str, token: u64) -> pb::LeaseRef {
    pb::LeaseRef {
        session_id: session_id.to_owned(),
        owner: owner.to_owned(),
        token,
    }
}

#[tokio::test]
async fn an_oversized_request_is_invalid_argument() {
    let backend = MemLease::new(TTL);
    let server = Running::start(Arc::new(backend.clone()), clock(), None, |s| {
        s.max_message_bytes(1024)
    })
    .await;
    // Ids within the port's rules; only their number makes the message
    // big: 8 leases of two 200-byte ids are over 3 KiB.
    let long = |i: usize| format!("{i}{}", "s".repeat(199));
    let batch: Vec<pb::LeaseRef> = (0..8).map(|i| lease_ref(&long(i), &long(i), 1)).collect();

    let mut raw = LeaseServiceClient::new(channel(&server).await);
    let status = raw
        .batch_renew(pb::BatchRenewRequest {
            leases: batch.clone(),
        })
        .await
        .unwrap_err();
    assert_invalid(&status, false);

    // The limit is on size, not on the call: a small batch still works.
    let small = raw
        .batch_renew(pb::BatchRenewRequest {
            leases: vec![lease_ref("small", "o", 1)],
        })
        .await
        .expect("a small batch is read")
        .into_inner();
    assert_eq!(small.results.len(), 1);

    // The client reads the refusal as bad input for every lease, whichever
    // way its batch went (KeepAlive first).
    let client = server.client(clock(), |b| b);
    let leases: Vec<Lease> = (0..8)
        .map(|i| {
            Lease::new(
                session(&long(i)),
                owner(&long(i)),
                lease_port::FencingToken::new(1),
                std::time::SystemTime::now(),
            )
        })
        .collect();
    let results = client.renew_many(&leases).await;
    assert_eq!(results.len(), 8);
    for r in results {
        assert_eq!(r.unwrap_err().kind(), LeaseErrorKind::Invalid);
    }
    assert_eq!(backend.live_count(), 0);
}

#[tokio::test]
async fn a_batch_over_the_limit_is_invalid_argument() {
    let backend = MemLease::new(TTL);
    let server = Running::start(Arc::new(backend.clone()), clock(), None, |s| s.max_batch(3)).await;
    let a = server.client(clock(), |b| b);
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(
            a.acquire(&session(&format!("s{i}")), &owner("a"))
                .await
                .unwrap(),
        );
    }
    let refs: Vec<pb::LeaseRef> = held
        .iter()
        .map(|l| lease_ref(l.session_id().as_str(), "a", l.token().get()))
        .collect();

    let mut raw = LeaseServiceClient::new(channel(&server).await);
    let status = raw
        .batch_renew(pb::BatchRenewRequest {
            leases: refs.clone(),
        })
        .await
        .unwrap_err();
    assert_invalid(&status, true);
    let at_limit = raw
        .batch_renew(pb::BatchRenewRequest {
            leases: refs[..3].to_vec(),
        })
        .await
        .expect("a batch at the limit is served")
        .into_inner();
    assert_eq!(at_limit.results.len(), 3);

    // A client configured past the server's limit learns it and splits,
    // so its live leases renew instead of being refused as one batch.
    for (r, l) in a.renew_many(&held).await.into_iter().zip(&held) {
        assert_eq!(r.unwrap().token(), l.token());
    }
    // Within the limit, the same leases renew.
    let within = server.client(clock(), |b| b.max_batch(3));
    for (r, l) in within.renew_many(&held).await.into_iter().zip(&held) {
        assert_eq!(r.unwrap().token(), l.token());
    }
}

/// Sends and receives message bodies as they are, so a test can put bytes
/// on the wire that no generated client would.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

struct RawBytes;

impl Encoder for RawBytes {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawBytes {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> RawBytes {
        RawBytes
    }

    fn decoder(&mut self) -> RawBytes {
        RawBytes
    }
}

async fn raw_acquire(channel: Channel, body: &'static [u8]) -> Result<Bytes, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/mecatl.lease.v1.LeaseService/Acquire",
    );
    grpc.unary(
        tonic::Request::new(Bytes::from_static(body)),
        path,
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn malformed_protobuf_is_invalid_argument() {
    let backend = MemLease::new(TTL);
    let server = Running::start(Arc::new(backend.clone()), clock(), None, |s| s).await;
    let channel = channel(&server).await;

    for (what, body) in [
        // Field 1, length 16, but only one byte follows.
        ("a truncated field", &b"\x0a\x10\x41"[..]),
        // A varint that never ends.
        (
            "an endless varint",
            &b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..],
        ),
        // session_id that is not UTF-8.
        (
            "a string that is not UTF-8",
            &b"\x0a\x02\xc3\x28\x12\x01o"[..],
        ),
        // Wire type 7 does not exist.
        ("an unknown wire type", &b"\x0f"[..]),
    ] {
        let status = raw_acquire(channel.clone(), body).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    }
    assert_eq!(backend.live_count(), 0);

    // The same path answers a well-formed body: the refusals above were
    // about the bytes, not the route.
    let good = raw_acquire(channel, b"\x0a\x02ok\x12\x01o").await.unwrap();
    let answer: pb::AcquireResponse = prost::Message::decode(good).unwrap();
    assert_eq!(answer.lease.unwrap().session_id, "ok");
}

#[tokio::test]
async fn invalid_ids_are_invalid_argument_with_reason_invalid() {
    let backend = MemLease::new(TTL);
    let server = Running::start(Arc::new(backend.clone()), clock(), None, |s| s).await;
    let mut raw = LeaseServiceClient::new(channel(&server).await);
    let too_long = "x".repeat(MAX_ID_LEN + 1);
    for (what, session_id, owner) in [
        ("an empty session", "", "o"),
        ("a control character", "chat\u{7}", "o"),
        ("a newline", "chat\n1", "o"),
        ("an over-long session", too_long.as_str(), "o"),
        ("an empty owner", "chat", ""),
    ] {
        let status = raw
            .acquire(pb::AcquireRequest {
                session_id: session_id.to_owned(),
                owner: owner.to_owned(),
                min_token: 0,
            })
            .await
            .expect_err(what);
        assert_invalid(&status, true);
        let status = raw
            .renew(pb::RenewRequest {
                lease: Some(lease_ref(session_id, owner, 1)),
            })
            .await
            .expect_err(what);
        assert_invalid(&status, true);
    }
    let status = raw
        .renew(pb::RenewRequest { lease: None })
        .await
        .unwrap_err();
    assert_invalid(&status, true);
    assert_eq!(backend.live_count(), 0);
}

/// A backend with stricter rules than the port: it refuses sessions whose
/// id starts with `bad-`, as a backend with its own naming rules would.
struct Picky(MemLease);

#[async_trait]
impl SessionLease for Picky {
    async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
        if s.as_str().starts_with("bad-") {
            return Err(LeaseError::invalid(format!("{s} is not a name I take")));
        }
        self.0.acquire(s, o).await
    }
    async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.0.renew(l).await
    }
    async fn release(&self, l: &Lease) -> Result<(), LeaseError> {
        self.0.release(l).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.0.authority().await
    }
}

#[tokio::test]
async fn a_backend_refusing_input_reaches_the_client_as_invalid() {
    let server = Running::start(Arc::new(Picky(MemLease::new(TTL))), clock(), None, |s| s).await;
    let client: GrpcLease = server.client(clock(), |b| b);
    let e = client
        .acquire(&session("bad-name"), &owner("o"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    assert!(e.message().contains("not a name I take"), "{e}");
    let status = wire_status(&e).expect("the status is kept");
    assert_invalid(status, true);
    client
        .acquire(&session("good-name"), &owner("o"))
        .await
        .expect("other names are taken");
}
