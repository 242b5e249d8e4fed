//! Limits, identity and authority, against the real tonic server on
//! loopback: each test states what the contract or the server's
//! documentation promises.

use std::sync::Arc;
use std::time::Duration;

use grpcdriver::GrpcLease;
use grpcdriver::pb::{self, lease_service_client::LeaseServiceClient};
use lease_port::{Clock, LeaseErrorKind, OwnerId, SessionId, SessionLease, SystemClock};
use memlease::MemLease;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::support::Running;

const TTL: Duration = Duration::from_secs(30);

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

async fn server(
    configure: impl FnOnce(grpcdriver::LeaseServer) -> grpcdriver::LeaseServer,
) -> Running {
    Running::start(Arc::new(MemLease::new(TTL)), clock(), None, configure).await
}

async fn held(client: &GrpcLease, n: usize, prefix: &str) -> Vec<lease_port::Lease> {
    let owner = OwnerId::new("batch-owner").unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let s = SessionId::new(format!("{prefix}-{i:04}-{}", "x".repeat(200))).unwrap();
        out.push(client.acquire(&s, &owner).await.unwrap());
    }
    out
}

/// A request larger than the server's limit is refused as INVALID over
/// KeepAlive too, never as a passing fault the client would resend until
/// its leases ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_keepalive_batch_is_refused_as_invalid_not_transient() {
    let running = server(|s| s.max_message_bytes(4096)).await;
    let client = running.client(clock(), |b| b);
    let leases = held(&client, 40, "big").await;
    let answers = client.renew_many(&leases).await;
    let kinds: Vec<LeaseErrorKind> = answers
        .iter()
        .map(|a| a.as_ref().map(|_| ()).unwrap_err().kind())
        .collect();
    assert!(
        kinds.iter().all(|k| *k == LeaseErrorKind::Invalid),
        "an oversized KeepAlive batch came back as {:?} (BatchRenew answers Invalid)",
        kinds[0]
    );
}

/// A server with a smaller batch limit than the client's (mecatl-leased
/// --max-batch 2, a mecated with the default client): the client learns
/// the limit and splits, so live leases renew instead of being refused as
/// a whole batch (which the keeper would take as loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_batch_limit_below_the_clients_does_not_lose_live_leases() {
    let running = server(|s| s.max_batch(2)).await;
    let client = running.client(clock(), |b| b);
    let leases = held(&client, 3, "limit").await;
    let answers = client.renew_many(&leases).await;
    for a in &answers {
        assert!(
            a.is_ok(),
            "a live lease was answered {:?} because the batch exceeded the server's limit",
            a.as_ref().unwrap_err()
        );
    }
}

/// A KeepAlive stream that carries nothing is closed, so long-lived streams
/// a client opened and forgot cannot pile up tasks on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keepalive_streams_are_closed() {
    let mut stats = None;
    let running = server(|s| {
        stats = Some(s.stats());
        s.stream_idle(Duration::from_millis(300))
    })
    .await;
    let stats = stats.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", running.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut held_open = Vec::new();
    for _ in 0..8 {
        let mut c = LeaseServiceClient::new(channel.clone());
        let (tx, rx) = mpsc::channel::<pb::KeepAliveRequest>(1);
        let opened = tokio::time::timeout(
            Duration::from_secs(2),
            c.keep_alive(ReceiverStream::new(rx)),
        )
        .await;
        match opened {
            Ok(Ok(resp)) => held_open.push((tx, resp.into_inner())),
            _ => break,
        }
    }
    assert_eq!(held_open.len(), 8, "the streams open");
    // Each idle stream ends with a status the client reads as a passing
    // fault (it reopens on its next renewal).
    for (_tx, stream) in &mut held_open {
        let end = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("an idle stream is closed by the server");
        let status = end.expect_err("closed with a status");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    let start = std::time::Instant::now();
    while stats.open_streams() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "stream tasks never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `LeaseServer::serve` promises to stop taking calls and let those in
/// flight finish when `shutdown` completes. A client's KeepAlive stream
/// never finishes (the client keeps its sending half for the life of the
/// client), so `serve` never returns: an embedder (or the test helpers'
/// `Running::stop`) that awaits it hangs; only mecatl-leased bounds it with
/// its own grace timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_completes_while_a_client_holds_a_keepalive_stream() {
    let mut running = server(|s| s).await;
    let client = running.client(clock(), |b| b);
    let leases = held(&client, 1, "shutdown").await;
    assert!(client.renew_many(&leases).await[0].is_ok());
    let stopped = tokio::time::timeout(Duration::from_secs(10), running.stop()).await;
    assert!(
        stopped.is_ok(),
        "serve() had not returned 10 s after its shutdown future completed, \
         because a client still holds a KeepAlive stream"
    );
    drop(client);
}

/// RFC 6750/7235: the auth scheme is case-insensitive. Other gRPC stacks
/// (and grpcurl users) send `bearer …`; the server refuses it as
/// UNAUTHENTICATED with the right token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let running = server(|s| s.bearer_token("s3cret")).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", running.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = LeaseServiceClient::new(channel);
    let mut req = tonic::Request::new(pb::GetAuthorityRequest {});
    req.metadata_mut()
        .insert("authorization", "bearer s3cret".parse().unwrap());
    let answer = c.get_authority(req).await;
    assert!(answer.is_ok(), "{:?}", answer.unwrap_err());
}

/// A memory-backed service that restarts (same address, new table) names
/// a new authority whose tokens start over. A client that held a lease
/// from the old one finds out on its next renewal (the grant names another
/// authority): it is told its lease is lost instead of being renewed under
/// tokens its store cannot compare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_notices_when_the_service_behind_its_address_changes_authority() {
    let mut first = server(|s| s).await;
    let addr = first.addr;
    let a = first.client(clock(), |b| b);
    let bound = a.authority().await.unwrap();
    let s = SessionId::new("restarted").unwrap();
    let owner = OwnerId::new("host-a/1").unwrap();
    let la = a.acquire(&s, &owner).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), first.stop()).await;
    drop(first);

    let second = Running::start(Arc::new(MemLease::new(TTL)), clock(), Some(addr), |s| s).await;
    // The new table knows nothing of A's lease; its grant of the same
    // session comes from a new authority.
    let renewed = second.client(clock(), |b| b).authority().await.unwrap();
    assert_ne!(
        renewed, bound,
        "a restarted memory table names a new authority"
    );
    let lost = a
        .renew(&la)
        .await
        .expect_err("A's lease is not renewed across authorities");
    assert_eq!(lost.kind(), LeaseErrorKind::Held, "{lost}");
    let refused = a
        .acquire(&s, &owner)
        .await
        .expect_err("A is not handed a token of another authority");
    assert_eq!(refused.kind(), LeaseErrorKind::Invalid, "{refused}");
    assert!(refused.to_string().contains("authority"), "{refused}");
}
