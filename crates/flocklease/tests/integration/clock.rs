//! Expiry on one host is judged on the monotonic clock of the current boot:
//! wall-clock steps neither end a live lease early nor keep a dead one alive.

use std::sync::Arc;
use std::time::Duration;

use flocklease::FlockLease;
use lease_port::{Clock, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};

const TTL: Duration = Duration::from_secs(10);

fn two(clock: &ManualClock) -> (tempfile::TempDir, FlockLease, FlockLease) {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        FlockLease::builder(dir.path())
            .ttl(TTL)
            .clock(Arc::new(clock.clone()))
            .open()
            .unwrap()
    };
    let (a, b) = (open(), open());
    (dir, a, b)
}

#[tokio::test]
async fn a_forward_wall_step_does_not_end_a_live_lease() {
    let clock = ManualClock::new();
    let (_dir, a, b) = two(&clock);
    let s = SessionId::new("jump/forward").unwrap();
    let (oa, ob) = (OwnerId::new("a").unwrap(), OwnerId::new("b").unwrap());
    let lease = a.acquire(&s, &oa).await.unwrap();
    // NTP steps the wall clock an hour ahead; no real time passes.
    clock.set_wall(clock.now() + Duration::from_secs(3600));
    let err = b.acquire(&s, &ob).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
    assert_eq!(err.holder(), Some(&oa));
    let renewed = a.renew(&lease).await.unwrap();
    assert_eq!(renewed.token(), lease.token());
    // Once the TTL has really passed since the renewal, it is free.
    clock.advance(TTL);
    let next = b.acquire(&s, &ob).await.unwrap();
    assert!(next.token() > lease.token());
}

#[tokio::test]
async fn a_backward_wall_step_does_not_stretch_a_dead_holders_lease() {
    let clock = ManualClock::new();
    let (_dir, a, b) = two(&clock);
    let s = SessionId::new("jump/backward").unwrap();
    let (oa, ob) = (OwnerId::new("a").unwrap(), OwnerId::new("b").unwrap());
    let lease = a.acquire(&s, &oa).await.unwrap();
    // The wall clock steps an hour back, then the TTL passes: the holder
    // stopped renewing, so its lease is over.
    clock.set_wall(clock.now() - Duration::from_secs(3600));
    clock.advance(TTL - Duration::from_millis(1));
    let err = b.acquire(&s, &ob).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
    clock.advance(Duration::from_millis(1));
    let next = b.acquire(&s, &ob).await.unwrap();
    assert!(next.token() > lease.token());
    // And the old holder lost it.
    let err = a.renew(&lease).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
}
