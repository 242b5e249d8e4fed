//! Token floors and rewound state over the wire, against the real tonic
//! server on loopback: `acquire_above` reaches the backend's own
//! `acquire_above` through `min_token`, a backend's `Rewound` reaches the
//! client as `Rewound` without being retried, and a server that ignores the
//! floor (one older than the field) is caught by the client's own check.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use grpcdriver::pb::{self, lease_service_client::LeaseServiceClient};
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, LeaseErrorKind, ManualClock, OwnerId,
    SessionId, SessionLease, SystemClock,
};
use memlease::MemLease;
use tonic::Code;
use tonic_types::StatusExt;

use crate::support::{Running, owner, session, wire_status};

const TTL: Duration = Duration::from_secs(30);
const FLOOR: FencingToken = FencingToken::new(1000);

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// What the backend behind the server does with a floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// memlease's own `acquire_above`: the token record is raised.
    Forward,
    /// A server older than `min_token`: the floor never reaches the
    /// backend, which grants as a plain acquire does.
    IgnoreFloor,
    /// An authority whose state went back: every acquire and renewal is
    /// answered `Rewound`.
    Rewound,
}

/// memlease behind a switch, counting what the server asked of it.
struct Backend {
    real: MemLease,
    mode: Mode,
    acquires: AtomicUsize,
    acquires_above: AtomicUsize,
    renewals: AtomicUsize,
}

impl Backend {
    fn new(real: MemLease, mode: Mode) -> Arc<Self> {
        Arc::new(Self {
            real,
            mode,
            acquires: AtomicUsize::new(0),
            acquires_above: AtomicUsize::new(0),
            renewals: AtomicUsize::new(0),
        })
    }

    fn rewound() -> LeaseError {
        LeaseError::rewound("the lease record is older than what clients saw")
    }
}

#[async_trait]
impl SessionLease for Backend {
    async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        match self.mode {
            Mode::Rewound => Err(Self::rewound()),
            Mode::Forward | Mode::IgnoreFloor => self.real.acquire(s, o).await,
        }
    }
    async fn acquire_above(
        &self,
        s: &SessionId,
        o: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        self.acquires_above.fetch_add(1, Ordering::SeqCst);
        match self.mode {
            Mode::Rewound => Err(Self::rewound()),
            Mode::IgnoreFloor => self.real.acquire(s, o).await,
            Mode::Forward => self.real.acquire_above(s, o, floor).await,
        }
    }
    async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        match self.mode {
            Mode::Rewound => Err(Self::rewound()),
            Mode::Forward | Mode::IgnoreFloor => self.real.renew(l).await,
        }
    }
    async fn release(&self, l: &Lease) -> Result<(), LeaseError> {
        self.real.release(l).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.real.authority().await
    }
    async fn current(&self, s: &SessionId) -> Result<Option<Lease>, LeaseError> {
        self.real.current(s).await
    }
}

async fn serve(backend: Arc<Backend>, clock: Arc<dyn Clock>) -> Running {
    Running::start(backend, clock, None, |s| s).await
}

#[tokio::test]
async fn acquire_above_through_the_service_exceeds_the_floor_and_later_takeovers_stay_above() {
    let manual = ManualClock::new();
    let shared: Arc<dyn Clock> = Arc::new(manual.clone());
    let real = MemLease::builder()
        .ttl(TTL)
        .clock(Arc::clone(&shared))
        .build();
    let backend = Backend::new(real.clone(), Mode::Forward);
    let server = serve(Arc::clone(&backend), Arc::clone(&shared)).await;
    let client = server.client(Arc::clone(&shared), |b| b);
    let chat = session("chat-floor");

    let before = client.acquire(&chat, &owner("a")).await.unwrap();
    assert!(before.token() < FLOOR, "a fresh table starts low");
    client.release(&before).await.unwrap();

    let raised = client
        .acquire_above(&chat, &owner("a"), FLOOR)
        .await
        .unwrap();
    assert!(raised.token() > FLOOR, "{}", raised.token());
    assert_eq!(backend.acquires_above.load(Ordering::SeqCst), 1);
    let held = real.current(&chat).await.unwrap().expect("granted");
    assert_eq!(held.token(), raised.token(), "the backend's own record");

    // Plain takeovers after it, on release and on expiry, stay above.
    client.release(&raised).await.unwrap();
    let after_release = client.acquire(&chat, &owner("b")).await.unwrap();
    assert!(after_release.token() > raised.token());
    manual.advance(TTL);
    let after_expiry = client.acquire(&chat, &owner("c")).await.unwrap();
    assert!(after_expiry.token() > after_release.token());

    // The live holder whose token a store already passed gets a new one.
    let mark = FencingToken::new(after_expiry.token().get() + 500);
    let renumbered = client
        .acquire_above(&chat, &owner("c"), mark)
        .await
        .unwrap();
    assert!(renumbered.token() > mark);
    let e = client.renew(&after_expiry).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Held, "the old epoch is over: {e}");
    let renewed = client.renew(&renumbered).await.unwrap();
    assert_eq!(renewed.token(), renumbered.token());
}

#[tokio::test]
async fn a_request_without_a_floor_takes_the_plain_acquire() {
    let backend = Backend::new(MemLease::new(TTL), Mode::Forward);
    let server = serve(Arc::clone(&backend), clock()).await;
    // As a client older than `min_token` sends it: the field absent, 0.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut raw = LeaseServiceClient::new(channel);
    let answer = raw
        .acquire(pb::AcquireRequest {
            session_id: "chat-old-client".into(),
            owner: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.lease.is_some_and(|l| l.token > 0));
    assert_eq!(backend.acquires.load(Ordering::SeqCst), 1);
    assert_eq!(backend.acquires_above.load(Ordering::SeqCst), 0);

    let answer = raw
        .acquire(pb::AcquireRequest {
            session_id: "chat-new-client".into(),
            owner: "a".into(),
            min_token: FLOOR.get(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.lease.is_some_and(|l| l.token > FLOOR.get()));
    assert_eq!(backend.acquires.load(Ordering::SeqCst), 1);
    assert_eq!(backend.acquires_above.load(Ordering::SeqCst), 1);
}

fn assert_rewound_on_the_wire(e: &LeaseError) {
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e}");
    assert!(!e.is_retryable());
    assert!(e.message().contains("older than what clients saw"), "{e}");
    let status = wire_status(e).expect("the status is kept");
    assert_eq!(status.code(), Code::FailedPrecondition);
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "STATE_REWOUND");
    assert_eq!(info.domain, grpcdriver::ERROR_DOMAIN);
}

#[tokio::test]
async fn a_backend_answering_rewound_reaches_the_client_as_rewound_not_retried() {
    let backend = Backend::new(MemLease::new(TTL), Mode::Rewound);
    let server = serve(Arc::clone(&backend), clock()).await;
    let client = server.client(clock(), |b| b.attempts(5));
    let chat = session("chat-rewound");

    let e = client
        .acquire_above(&chat, &owner("a"), FLOOR)
        .await
        .unwrap_err();
    assert_rewound_on_the_wire(&e);
    assert_eq!(backend.acquires_above.load(Ordering::SeqCst), 1, "retried");

    let e = client.acquire(&chat, &owner("a")).await.unwrap_err();
    assert_rewound_on_the_wire(&e);
    assert_eq!(backend.acquires.load(Ordering::SeqCst), 1, "retried");

    let forged = Lease::new(
        chat.clone(),
        owner("a"),
        FencingToken::new(7),
        clock().now(),
    );
    let e = client.renew(&forged).await.unwrap_err();
    assert_rewound_on_the_wire(&e);
    assert_eq!(backend.renewals.load(Ordering::SeqCst), 1, "retried");

    // Inside a batch answer (KeepAlive) the reason survives too.
    let answers = client.renew_many(std::slice::from_ref(&forged)).await;
    let e = answers.into_iter().next().unwrap().unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e}");
    assert_eq!(backend.renewals.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_server_ignoring_the_floor_is_caught_by_the_client() {
    let real = MemLease::new(TTL);
    let backend = Backend::new(real.clone(), Mode::IgnoreFloor);
    let server = serve(Arc::clone(&backend), clock()).await;
    let client = server.client(clock(), |b| b);
    let chat = session("chat-old-server");

    let e = client
        .acquire_above(&chat, &owner("a"), FLOOR)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e}");
    assert!(e.message().contains("not above 1000"), "{e}");
    assert_eq!(backend.acquires_above.load(Ordering::SeqCst), 1);
    assert_eq!(
        real.current(&chat).await.unwrap(),
        None,
        "the grant below the floor was released"
    );
    // Nothing was left held: another owner takes the session at once.
    client.acquire(&chat, &owner("b")).await.unwrap();
}
