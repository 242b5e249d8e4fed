//! Review reproductions: the lease keeper (as mecated builds it) over the
//! gRPC client and a real tonic lease server. Each test asserts the rule
//! "at most one live owner per session"; a failing test is a finding.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use grpcdriver::{GrpcLease, LeaseServer};
use lease_keeper::LeaseKeeper;
use lease_port::{Clock, OwnerId, SessionId};
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

async fn service(ttl: Duration, clock: Arc<SteppedWallClock>) -> Service {
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
        .build()
        .unwrap();
    LeaseKeeper::new(Arc::new(client), OwnerId::new(owner).unwrap(), ttl).unwrap()
}

/// `--session-lease-url` documents that the service's TTL "must be at
/// least --session-lease-ttl", but nothing checks it: the keeper reckons
/// its own TTL from the send and never looks at the remaining time the
/// service granted. With the service granting 500 ms and mecated running
/// the default 15 s, B takes the session over while A's run still holds a
/// live, unlost guard (it renews only after 5 s).
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

    let run_a = a.acquire(&s).await.expect("A acquires a free session");
    // Not a timing assertion: only lets the service's shorter grant lapse.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let run_b = b.acquire(&s).await;

    let both = run_b.is_ok() && run_a.is_leased() && !run_a.is_lost();
    assert!(
        !both,
        "two live owners: A holds token {:?} (not lost), B holds token {:?}",
        run_a.token(),
        run_b.as_ref().ok().and_then(|r| r.token())
    );
}

/// The daemon's memory backend judges expiry on the host's wall clock
/// (`MemLease::new` uses `SystemClock`, and the server turns expiries into
/// remaining time on its wall clock). A forward step of the service host's
/// clock by more than the TTL expires every grant at once, while each
/// keeper, correctly on its monotonic clock, still counts its lease as
/// live: B is granted a session A holds. Same TTL on both sides.
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
