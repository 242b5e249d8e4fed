//! The client counts a grant's time from when it sent the request, never
//! from when the answer came: with one manual clock shared by server and
//! client, a backend that lets time pass while it holds the request shows
//! exactly which instant the client counted from.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_port::{
    AuthorityId, Clock, Lease, LeaseError, ManualClock, OwnerId, SessionId, SessionLease,
};
use memlease::MemLease;

use crate::support::{Running, owner, session};

const TTL: Duration = Duration::from_secs(10);
/// Passes while the request waits, before the backend grants.
const BEFORE: Duration = Duration::from_secs(3);
/// Passes after the grant, before the answer leaves the server.
const AFTER: Duration = Duration::from_secs(2);

/// memlease whose every call lets the shared clock run on around the
/// grant, as a slow network and a busy server would.
struct Slow {
    real: MemLease,
    clock: ManualClock,
}

impl Slow {
    async fn around<T>(&self, f: impl Future<Output = T>) -> T {
        self.clock.advance(BEFORE);
        let out = f.await;
        self.clock.advance(AFTER);
        out
    }
}

#[async_trait]
impl SessionLease for Slow {
    async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
        self.around(self.real.acquire(s, o)).await
    }
    async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.around(self.real.renew(l)).await
    }
    async fn release(&self, l: &Lease) -> Result<(), LeaseError> {
        self.real.release(l).await
    }
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.real.authority().await
    }
    async fn current(&self, s: &SessionId) -> Result<Option<Lease>, LeaseError> {
        self.around(self.real.current(s)).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        self.around(self.real.renew_many(leases)).await
    }
    fn renews_in_batches(&self) -> bool {
        true
    }
}

/// Counting from the sending, the grant seen by the client ends `AFTER`
/// before the backend's own expiry; counting from the reply would make it
/// end `BEFORE` after it.
fn expected(sent: std::time::SystemTime) -> std::time::SystemTime {
    sent + TTL - AFTER
}

#[tokio::test]
async fn every_grant_is_counted_from_the_sending() {
    let clock = ManualClock::new();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let real = MemLease::builder()
        .ttl(TTL)
        .clock(Arc::clone(&shared))
        .build();
    let backend = Slow {
        real: real.clone(),
        clock: clock.clone(),
    };
    let server = Running::start(Arc::new(backend), Arc::clone(&shared), None, |s| s).await;
    let client = server.client(Arc::clone(&shared), |b| b);
    let chat = session("chat-sent");

    let sent = clock.now();
    let lease = client.acquire(&chat, &owner("a")).await.unwrap();
    let granted = real.current(&chat).await.unwrap().unwrap();
    assert_eq!(granted.expiry(), sent + BEFORE + TTL, "the backend's view");
    assert_eq!(lease.expiry(), expected(sent));
    assert!(
        lease.expiry() < granted.expiry(),
        "the client never believes in more time than the backend granted"
    );

    let sent = clock.now();
    let renewed = client.renew(&lease).await.unwrap();
    assert_eq!(renewed.token(), lease.token());
    assert_eq!(renewed.expiry(), expected(sent));

    // Batches too, over the KeepAlive stream.
    let sent = clock.now();
    let many = client.renew_many(std::slice::from_ref(&renewed)).await;
    let batch_renewed = many.into_iter().next().unwrap().unwrap();
    assert_eq!(batch_renewed.expiry(), expected(sent));

    // And the holder report.
    let sent = clock.now();
    let current = client.current(&chat).await.unwrap().unwrap();
    assert_eq!(current.token(), lease.token());
    // The backend's expiry was set one renewal ago: sent' + BEFORE + TTL,
    // where sent' = sent - BEFORE - AFTER; the client sees what remained
    // when the server answered, counted from its own sending.
    let remaining_at_answer = TTL - AFTER - BEFORE - AFTER;
    assert_eq!(current.expiry(), sent + remaining_at_answer);
}
