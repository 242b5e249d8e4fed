//! At most one live owner per session when a lease service is
//! misconfigured or its host's clock is stepped: the lease keeper, over the
//! gRPC client built as mecated builds it, against a real tonic lease
//! server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use grpcdriver::{GrpcLease, LeaseServer};
use lease_keeper::LeaseKeeper;
use lease_port::{Clock, MonotonicWallClock, OwnerId, SessionId};
use memlease::MemLease;

/// The lease server host's wall clock: the real one, plus any step an NTP
/// correction or an operator applies.
#[derive(Debug, Default)]
struct SteppedWallClock {
    ahead_ms: AtomicU64,
}

impl SteppedWallClock {
    fn step_forward(&self, by: Duration) {
        self.ahead_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for SteppedWallClock {
    fn now(&self) -> SystemTime {
        SystemTime::now() + Duration::from_millis(self.ahead_ms.load(Ordering::SeqCst))
    }
}

struct Service {
    addr: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// A lease service over an in-memory table, built as `mecatl-leased`
/// builds it: the table and the server read a wall clock anchored once on
/// the host's clock and advanced by the monotonic clock, so a later step
/// of the host's clock moves neither.
async fn service(ttl: Duration, host: Arc<SteppedWallClock>) -> Service {
    let clock = Arc::new(MonotonicWallClock::anchored_at(host.now()));
    let backend = MemLease::builder().ttl(ttl).clock(clock.clone()).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        LeaseServer::new(Arc::new(backend))
            .clock(clock)
            .serve(listener, async {
                let _ = stopped.await;
            }),
    );
    Service { addr, _stop: stop }
}

/// A process: its own connection to the service and its own keeper, built
/// the way mecated builds them (call timeout a sixth of the TTL, at most
/// 2 s).
fn process(service: &Service, owner: &str, ttl: Duration) -> LeaseKeeper {
    let client = GrpcLease::builder(service.addr.clone())
        .call_timeout((ttl / 6).min(grpcdriver::DEFAULT_CALL_TIMEOUT))
        .min_grant(ttl)
        .build()
        .unwrap();
    LeaseKeeper::new(Arc::new(client), OwnerId::new(owner).unwrap(), ttl).unwrap()
}

/// An error and all its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// A service granting less than the keeper's TTL (500 ms against the
/// default 15 s): every grant is refused as too short, so no process acts
/// on a lease it would outlive, and nobody holds the session twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_granting_less_than_the_keepers_ttl_never_yields_two_owners() {
    let clock = Arc::new(SteppedWallClock::default());
    let service = service(Duration::from_millis(500), clock).await;
    let ttl = Duration::from_secs(15);
    let (a, b) = (
        process(&service, "host-a/1", ttl),
        process(&service, "host-b/1", ttl),
    );
    let s = SessionId::new("chat").unwrap();

    let refused = a
        .acquire(&s)
        .await
        .expect_err("a grant shorter than the keeper's TTL");
    assert!(chain(&refused).contains("TTL"), "{}", chain(&refused));
    // Not a timing assertion: only lets the service's short grant lapse.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let refused = b.acquire(&s).await.expect_err("B is refused the same way");
    assert!(chain(&refused).contains("TTL"), "{}", chain(&refused));
}

/// A forward step of the service host's clock by more than the TTL must
/// not expire every grant at once while each keeper, rightly timing its
/// lease on its own monotonic clock, still counts its lease as live: the
/// service reads a clock the step does not move, so B is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_wall_clock_step_on_the_service_host_never_yields_two_owners() {
    let clock = Arc::new(SteppedWallClock::default());
    let ttl = Duration::from_secs(15);
    let service = service(ttl, Arc::clone(&clock)).await;
    let (a, b) = (
        process(&service, "host-a/1", ttl),
        process(&service, "host-b/1", ttl),
    );
    let s = SessionId::new("chat").unwrap();

    let run_a = a.acquire(&s).await.expect("A acquires a free session");
    clock.step_forward(Duration::from_secs(20));
    let run_b = b.acquire(&s).await;

    let both = run_b.is_ok() && run_a.is_leased() && !run_a.is_lost();
    assert!(
        !both,
        "two live owners after a wall-clock step on the service host: A token {:?}, B token {:?}",
        run_a.token(),
        run_b.as_ref().ok().and_then(|r| r.token())
    );
}
