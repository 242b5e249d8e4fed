//! Review reproductions against the real tonic server on loopback. Each
//! test asserts the behaviour the contract or the server's documentation
//! promises; a failing test is a finding.

mod support;

use std::sync::Arc;
use std::time::Duration;

use grpcdriver::GrpcLease;
use grpcdriver::pb::{self, lease_service_client::LeaseServiceClient};
use lease_port::{Clock, LeaseErrorKind, OwnerId, SessionId, SessionLease, SystemClock};
use memlease::MemLease;
use support::Running;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

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
    let owner = OwnerId::new("review-owner").unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let s = SessionId::new(format!("{prefix}-{i:04}-{}", "x".repeat(200))).unwrap();
        out.push(client.acquire(&s, &owner).await.unwrap());
    }
    out
}

/// The server documents that a request larger than its limit is refused
/// with INVALID_ARGUMENT, and BatchRenew does so. Over KeepAlive the
/// server's task swallows the decode error and ends the stream with OK, so
/// the client reads a clean close as UNAVAILABLE and retries the same
/// oversized batch for ever: its leases run out as "transient" faults.
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

/// A server configured with a smaller batch limit than the client's
/// (mecatl-leased --max-batch 2, a mecated with the default client) refuses
/// the whole KeepAlive batch as INVALID; the keeper reads Invalid on a
/// renewal as loss and cancels every run in the batch. The client neither
/// learns the server's limit nor splits: leases that are live and held are
/// reported as not renewable.
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

/// `concurrency_per_connection` and `call_timeout` are documented as the
/// server's limits, but both end when a handler returns its response
/// headers: a KeepAlive stream holds neither a concurrency permit nor a
/// timeout. One authenticated connection opens any number of idle streams
/// (tonic leaves HTTP/2 max_concurrent_streams unset), each with a spawned
/// task on the server, and keeps them for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keepalive_streams_are_bounded_per_connection() {
    let mut stats = None;
    let running = server(|s| {
        stats = Some(s.stats());
        s.concurrency_per_connection(2)
            .call_timeout(Duration::from_millis(200))
    })
    .await;
    let stats = stats.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", running.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut held_open = Vec::new();
    for _ in 0..64 {
        let mut c = LeaseServiceClient::new(channel.clone());
        let (tx, rx) = mpsc::channel::<pb::KeepAliveRequest>(1);
        let opened = tokio::time::timeout(
            Duration::from_secs(10),
            c.keep_alive(ReceiverStream::new(rx)),
        )
        .await;
        match opened {
            Ok(Ok(resp)) => held_open.push((tx, resp.into_inner())),
            _ => break,
        }
    }
    // Well past the server's call timeout: nothing closes them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open = stats.open_streams();
    assert!(
        open <= 2,
        "{open} idle KeepAlive streams stay open on one connection limited to 2 calls \
         with a 200 ms call timeout"
    );
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

/// Two processes given one owner id (a fixed --owner on two hosts, a
/// restarted pod whose predecessor is only paused) both "acquire" and get
/// the same token: over the service nothing plays the role of the lease
/// directory's owner lock, and the store accepts an equal token from the
/// same owner. Here, two independent clients (two connections) stand for
/// the two processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_under_one_owner_id_never_both_hold() {
    let running = server(|s| s).await;
    let a = running.client(clock(), |b| b);
    let b = running.client(clock(), |b| b);
    let owner = OwnerId::new("pod-0").unwrap();
    let s = SessionId::new("shared").unwrap();
    let la = a.acquire(&s, &owner).await.unwrap();
    let lb = b.acquire(&s, &owner).await;
    assert!(
        lb.is_err(),
        "two processes both hold {s} under token {} (A) and {:?} (B)",
        la.token(),
        lb.as_ref().map(|l| l.token())
    );
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

/// A memory-backed service that restarts (same address, new table) names a
/// new authority, and mecated checks the authority only at start-up. A
/// running client carries on against the new service without noticing:
/// B is granted a session whose lease A obtained from the old service and
/// still counts as live, and its token comes from an authority the store
/// was never bound to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_notices_when_the_service_behind_its_address_changes_authority() {
    let mut first = server(|s| s).await;
    let addr = first.addr;
    let a = first.client(clock(), |b| b);
    let bound = a.authority().await.unwrap();
    let s = SessionId::new("restarted").unwrap();
    let la = a
        .acquire(&s, &OwnerId::new("host-a/1").unwrap())
        .await
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), first.stop()).await;
    drop(first);

    let second = Running::start(Arc::new(MemLease::new(TTL)), clock(), Some(addr), |s| s).await;
    let b = second.client(clock(), |b| b);
    let lb = b.acquire(&s, &OwnerId::new("host-b/1").unwrap()).await;
    let now = a.authority().await.unwrap();
    assert!(
        now == bound || lb.is_err(),
        "A still counts token {} (from authority {bound}) as live while B was granted {:?} \
         by authority {now}; nothing in the client compared the two",
        la.token(),
        lb.map(|l| l.token())
    );
}
