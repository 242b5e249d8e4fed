//! Network faults between a client and a real lease server, injected by a
//! TCP proxy: lost replies after a committed write, a blackhole while a
//! keeper holds the lease, latency around the call deadline, and a server
//! restart. Competitors talk to the server directly, never through the
//! proxy, so they see the truth the faulty client cannot.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use grpcdriver::{GrpcLease, ServerStats};
use lease_keeper::{LeaseKeeper, LossReason};
use lease_port::{Clock, Lease, LeaseErrorKind, SessionLease, SystemClock};
use memlease::MemLease;
use test_services::{FaultProxy, ProxyMode};
use tokio::time::{sleep, timeout};
use tonic::Code;

use crate::support::{Running, owner, session};

const TTL: Duration = Duration::from_secs(30);
/// Bound on waiting for something that must happen; never asserted as a
/// duration, only there so a broken build fails instead of hanging.
const EVENTUALLY: Duration = Duration::from_secs(60);

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

struct Rig {
    backend: MemLease,
    server: Running,
    stats: Arc<ServerStats>,
    proxy: FaultProxy,
}

async fn rig(ttl: Duration) -> Rig {
    let backend = MemLease::new(ttl);
    let mut stats = None;
    let server = Running::start(Arc::new(backend.clone()), clock(), None, |s| {
        stats = Some(s.stats());
        s
    })
    .await;
    let proxy = FaultProxy::start(server.addr).expect("proxy");
    Rig {
        backend,
        server,
        stats: stats.expect("configured"),
        proxy,
    }
}

impl Rig {
    /// A client that reaches the server only through the proxy.
    fn proxied(&self, call_timeout: Duration, clock: Arc<dyn Clock>) -> GrpcLease {
        GrpcLease::builder(self.proxy.addr().to_string())
            .call_timeout(call_timeout)
            .clock(clock)
            .build()
            .expect("client")
    }

    /// A client straight to the server.
    fn direct(&self) -> GrpcLease {
        self.server.client(clock(), |b| b)
    }

    async fn wait_for_calls(&self, method: &str, n: u64) {
        timeout(EVENTUALLY, async {
            while self.stats.calls(method, Code::Ok) < n {
                sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server never answered {n} {method} calls"));
    }
}

async fn assert_held_by(client: &GrpcLease, session_name: &str, holder: &str) {
    let e = client
        .acquire(&session(session_name), &owner("competitor"))
        .await
        .expect_err("the session is held");
    assert_eq!(e.kind(), LeaseErrorKind::Held, "{e}");
    assert_eq!(e.holder(), Some(&owner(holder)));
}

#[tokio::test]
async fn a_renewal_whose_reply_is_lost_after_it_committed_corrupts_nothing() {
    let rig = rig(TTL).await;
    let a = rig.proxied(Duration::from_secs(1), clock());
    let competitor = rig.direct();
    let chat = session("chat-lost-reply");
    let lease = a.acquire(&chat, &owner("a")).await.unwrap();
    let before = rig.backend.current(&chat).await.unwrap().unwrap();

    rig.proxy.set_mode(ProxyMode::DropReplies);
    let e = a.renew(&lease).await.expect_err("no reply can come");
    assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e}");
    rig.wait_for_calls("Renew", 1).await;
    assert!(rig.proxy.counters().discarded_from_upstream > 0);
    // The renewal did happen: same grant, later expiry.
    let after = rig.backend.current(&chat).await.unwrap().unwrap();
    assert_eq!(after.token(), lease.token());
    assert_eq!(after.owner(), lease.owner());
    assert!(after.expiry() > before.expiry());
    assert_held_by(&competitor, "chat-lost-reply", "a").await;

    rig.proxy.set_mode(ProxyMode::Pass);
    let renewed = a.renew(&lease).await.expect("renews once replies flow");
    assert_eq!(renewed.token(), lease.token());
    assert_held_by(&competitor, "chat-lost-reply", "a").await;
    assert_eq!(rig.stats.calls("Renew", Code::Ok), 2);

    a.release(&renewed).await.unwrap();
    let taken = competitor.acquire(&chat, &owner("b")).await.unwrap();
    assert!(taken.token() > lease.token());
}

#[tokio::test]
async fn an_acquire_whose_reply_is_lost_is_recovered_by_asking_again() {
    let rig = rig(TTL).await;
    let a = rig.proxied(Duration::from_secs(1), clock());
    let competitor = rig.direct();
    let chat = session("chat-lost-grant");
    // Connect first, so the lost reply is the grant's, not the handshake's.
    a.authority().await.unwrap();

    rig.proxy.set_mode(ProxyMode::DropReplies);
    let e = a.acquire(&chat, &owner("a")).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e}");
    rig.wait_for_calls("Acquire", 1).await;
    // The grant exists though its owner never heard of it: nobody else
    // gets the session meanwhile.
    let granted = rig.backend.current(&chat).await.unwrap().unwrap();
    assert_eq!(granted.owner(), &owner("a"));
    assert_held_by(&competitor, "chat-lost-grant", "a").await;

    rig.proxy.set_mode(ProxyMode::Pass);
    let lease = a.acquire(&chat, &owner("a")).await.unwrap();
    assert!(lease.token() >= granted.token());
    assert_eq!(
        rig.backend.current(&chat).await.unwrap().unwrap().token(),
        lease.token()
    );
    assert_held_by(&competitor, "chat-lost-grant", "a").await;
}

#[tokio::test]
async fn a_blackholed_keeper_loses_its_lease_at_expiry_and_a_competitor_takes_over() {
    // Real time: the backend expires the lease on the system clock, the
    // keeper gives it up on its own monotonic clock.
    let ttl = Duration::from_secs(2);
    let rig = rig(ttl).await;
    let call_timeout = Duration::from_millis(300);
    let a = rig.proxied(call_timeout, clock());
    let keeper = LeaseKeeper::builder(Arc::new(a.clone()), owner("a"), ttl)
        .build()
        .unwrap();
    let chat = session("chat-blackhole");
    let run = keeper.acquire(&chat).await.unwrap();
    let first = run.token().expect("leased");

    rig.proxy.set_mode(ProxyMode::Blackhole);
    // The client gives up within its deadline, as a passing fault.
    let e = a.renew(&run.lease().unwrap()).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e}");

    let competitor = rig.direct();
    let taken = timeout(EVENTUALLY, async {
        loop {
            match competitor.acquire(&chat, &owner("b")).await {
                Ok(l) => return l,
                Err(e) if e.kind() == LeaseErrorKind::Held => {
                    assert_eq!(e.holder(), Some(&owner("a")));
                    sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("competitor: {e}"),
            }
        }
    })
    .await
    .expect("the competitor gets the session once the lease expired");
    assert!(taken.token() > first, "a takeover raises the token");

    timeout(EVENTUALLY, run.lost())
        .await
        .expect("the keeper noticed the loss");
    assert_eq!(
        run.loss(),
        Some(LossReason::Expired),
        "it never heard a refusal, only silence"
    );
    assert!(run.begin_write().is_err(), "no write after the loss");

    // When the network heals, the old owner finds the session taken.
    rig.proxy.set_mode(ProxyMode::Pass);
    let e = a.renew(&run.lease().unwrap()).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Held, "{e}");
    drop(run);
    keeper.shutdown().await;
    assert_eq!(
        rig.backend.current(&chat).await.unwrap().unwrap().token(),
        taken.token(),
        "the old owner's shutdown left the new grant alone"
    );
}

#[tokio::test]
async fn latency_beyond_the_deadline_is_transient() {
    let rig = rig(TTL).await;
    let a = rig.proxied(Duration::from_millis(300), clock());
    a.authority().await.unwrap();
    let chat = session("chat-slow");

    rig.proxy
        .set_mode(ProxyMode::delay(Duration::from_millis(600)));
    let e = a.acquire(&chat, &owner("a")).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e}");

    // The late request is still granted on the server; the owner asking
    // again once the network is fast gets that grant. (On a connection of
    // its own: the late reply still in flight on the old one would hold
    // the new answer back past this client's short deadline.)
    rig.wait_for_calls("Acquire", 1).await;
    rig.proxy.set_mode(ProxyMode::Pass);
    let a_again = rig.proxied(Duration::from_secs(10), clock());
    let lease = a_again.acquire(&chat, &owner("a")).await.unwrap();
    assert_held_by(&rig.direct(), "chat-slow", "a").await;
    assert_eq!(
        rig.backend.current(&chat).await.unwrap().unwrap().token(),
        lease.token()
    );
}

/// The system clock, remembering every reading the client takes.
#[derive(Debug, Default)]
struct Recording {
    reads: Mutex<Vec<SystemTime>>,
}

impl Recording {
    fn first_read_since(&self, mark: usize) -> SystemTime {
        self.reads.lock().unwrap_or_else(PoisonError::into_inner)[mark]
    }

    fn mark(&self) -> usize {
        self.reads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Clock for Recording {
    fn now(&self) -> SystemTime {
        let t = SystemTime::now();
        self.reads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(t);
        t
    }
}

#[tokio::test]
async fn a_slow_answer_never_lengthens_the_lease() {
    let rig = rig(TTL).await;
    let recording = Arc::new(Recording::default());
    // Slow both ways, yet answered within the deadline.
    let a = rig.proxied(Duration::from_secs(10), recording.clone());
    a.authority().await.unwrap();
    rig.proxy
        .set_mode(ProxyMode::delay(Duration::from_millis(250)));
    let chat = session("chat-latency");

    let check = |lease: &Lease, sent: SystemTime, granted: &Lease| {
        assert!(
            lease.expiry() <= sent + TTL,
            "expiry {:?} after sending {:?} + TTL",
            lease.expiry(),
            sent
        );
        assert!(
            lease.expiry() <= granted.expiry(),
            "the client believes in more time than the backend granted"
        );
        // The client read its clock before the backend granted: it
        // counted from the sending, not from anything later.
        assert!(sent + TTL <= granted.expiry());
    };

    let mark = recording.mark();
    let lease = a.acquire(&chat, &owner("a")).await.unwrap();
    let granted = rig.backend.current(&chat).await.unwrap().unwrap();
    check(&lease, recording.first_read_since(mark), &granted);

    let mark = recording.mark();
    let renewed = a.renew(&lease).await.unwrap();
    let granted = rig.backend.current(&chat).await.unwrap().unwrap();
    check(&renewed, recording.first_read_since(mark), &granted);

    let mark = recording.mark();
    let batch = a.renew_many(std::slice::from_ref(&renewed)).await;
    let renewed = batch.into_iter().next().unwrap().unwrap();
    let granted = rig.backend.current(&chat).await.unwrap().unwrap();
    check(&renewed, recording.first_read_since(mark), &granted);
}

#[tokio::test]
async fn a_client_keeps_working_across_a_server_restart() {
    let backend = MemLease::new(TTL);
    let mut server = Running::start(Arc::new(backend.clone()), clock(), None, |s| s).await;
    let addr = server.addr;
    let a = server.client(clock(), |b| b);
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(
            a.acquire(&session(&format!("chat-restart-{i}")), &owner("a"))
                .await
                .unwrap(),
        );
    }
    // Opens the KeepAlive stream the restart will break.
    for r in a.renew_many(&held).await {
        r.unwrap();
    }

    timeout(EVENTUALLY, server.stop())
        .await
        .expect("the server stops with a KeepAlive stream open")
        .expect("stops cleanly");
    let _server = Running::start(Arc::new(backend.clone()), clock(), Some(addr), |s| s).await;

    // Unary calls reconnect by themselves (a dead connection is retried
    // as UNAVAILABLE).
    let renewed = a.renew(&held[0]).await.expect("renews after the restart");
    assert_eq!(renewed.token(), held[0].token());

    // The stream broke with the old server: the first batch may fail as a
    // passing fault, never as a loss; the next one is answered.
    let first = a.renew_many(&held).await;
    for r in &first {
        if let Err(e) = r {
            assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e}");
        }
    }
    let second = a.renew_many(&held).await;
    for (r, l) in second.into_iter().zip(&held) {
        assert_eq!(r.expect("the stream recovered").token(), l.token());
    }
}
