//! Small helpers the cases share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use lease_port::{Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId};

use crate::LeaseFactory;

/// A session id no other case or run uses, so backends whose store outlives
/// one factory (a shared cluster, a long-running service) stay clean.
pub(crate) fn session(tag: &str) -> SessionId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    SessionId::new(format!("conf-{tag}-{}-{nanos:x}-{n}", std::process::id()))
        .expect("generated session ids are valid")
}

pub(crate) fn owner(name: &str) -> OwnerId {
    OwnerId::new(format!("conformance-{name}")).expect("generated owner ids are valid")
}

/// Unwraps a result the contract says must succeed, naming the step.
#[track_caller]
pub(crate) fn must<T>(step: &str, r: Result<T, LeaseError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{step}: expected success, got {e}"),
    }
}

/// Unwraps a renewal the contract says must succeed; on failure, says
/// whether the lease had expired on the factory's clock, which is what
/// tells a backend bug from a case running late.
#[track_caller]
pub(crate) fn must_renew<F: LeaseFactory>(
    f: &F,
    step: &str,
    lease: &Lease,
    r: Result<Lease, LeaseError>,
) -> Lease {
    match r {
        Ok(v) => v,
        Err(e) => panic!(
            "{step}: expected success, got {e}; {}",
            lease_state(lease, f.now(), f.ttl())
        ),
    }
}

/// The state a case's lease was in at `now`, in words.
pub(crate) fn lease_state(lease: &Lease, now: SystemTime, ttl: Duration) -> String {
    let who = format!(
        "the lease (token {}, owner {}) renewed had",
        lease.token(),
        lease.owner()
    );
    match lease.expiry().duration_since(now) {
        Ok(left) => format!("{who} {left:?} of its {ttl:?} TTL left on the factory's clock"),
        Err(past) => format!(
            "{who} expired {:?} before, on the factory's clock (TTL {ttl:?})",
            past.duration()
        ),
    }
}

/// Asserts `r` failed with `Held`; when the backend names a holder it must be
/// `holder`.
#[track_caller]
pub(crate) fn must_be_held<T: std::fmt::Debug>(
    step: &str,
    r: Result<T, LeaseError>,
    holder: Option<&OwnerId>,
) {
    match r {
        Err(e) if e.kind() == LeaseErrorKind::Held => {
            if let (Some(reported), Some(expected)) = (e.holder(), holder) {
                assert_eq!(
                    reported, expected,
                    "{step}: Held names the wrong holder ({e:?})"
                );
            }
        }
        Ok(v) => panic!("{step}: expected a Held error, but it succeeded ({v:?})"),
        Err(e) => panic!("{step}: expected a Held error, got {e}"),
    }
}

/// Checks a freshly granted or renewed lease against what was asked and
/// against the factory's clock.
#[track_caller]
pub(crate) fn check_grant<F: LeaseFactory>(
    f: &F,
    step: &str,
    lease: &Lease,
    session: &SessionId,
    owner: &OwnerId,
) {
    assert_eq!(lease.session_id(), session, "{step}: wrong session");
    assert_eq!(lease.owner(), owner, "{step}: wrong owner");
    let now = f.now();
    let ttl = f.ttl();
    // Backends may round the expiry (whole seconds on Kubernetes); a grant
    // must still give at least half a TTL and no more than a TTL and a second.
    assert!(
        lease.expiry() >= now + ttl / 2,
        "{step}: expiry {:?} gives less than half a TTL ({ttl:?}) from now {now:?}",
        lease.expiry()
    );
    assert!(
        lease.expiry() <= now + ttl + Duration::from_secs(1),
        "{step}: expiry {:?} is further than one TTL ({ttl:?}) from now {now:?}",
        lease.expiry()
    );
}

/// Time that safely passes the expiry of every lease granted before it.
pub(crate) fn past_expiry<F: LeaseFactory>(f: &F) -> Duration {
    f.ttl() * 3 / 2 + Duration::from_millis(50)
}
