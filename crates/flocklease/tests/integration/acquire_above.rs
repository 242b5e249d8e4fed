//! `acquire_above`: a grant whose token is above a store's mark, and a token
//! record raised with it, so that every later takeover — by another owner,
//! through another instance, after the directory is opened again — stays
//! above the floor. (That the raised ceiling is synced before the token is
//! returned is checked by the host-crash simulation, `src/crash_sim.rs`.)
//!
//! The trait's default `acquire_above` answers `Rewound` for a floor above
//! the backend's tokens, so every test here fails unless `FlockLease`
//! overrides it.

use std::path::Path;
use std::time::{Duration, SystemTime};

use flocklease::{FlockLease, list_leases};
use lease_port::{FencingToken, LeaseErrorKind, OwnerId, SessionId, SessionLease};

const TTL: Duration = Duration::from_secs(30);

/// Far above anything the directory issued: what a store that outlived an
/// older copy of the lease directory would report.
const FLOOR: FencingToken = FencingToken::new(1_000_000);

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn oid(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn open(dir: &Path, reservation: u64) -> FlockLease {
    FlockLease::builder(dir)
        .ttl(TTL)
        .token_reservation(reservation)
        .open()
        .unwrap()
}

/// (token, reservation ceiling) recorded for `s` in `dir`.
fn on_disk(dir: &Path, s: &SessionId) -> (u64, u64) {
    let listed = list_leases(dir, SystemTime::now()).unwrap();
    let info = listed
        .iter()
        .filter_map(|e| e.lease.as_ref().ok())
        .find(|i| i.session.as_ref() == Some(s))
        .unwrap_or_else(|| panic!("{s} not in {listed:?}"));
    (info.token.unwrap().get(), info.reserved.unwrap().get())
}

#[tokio::test]
async fn every_takeover_after_a_floor_stays_above_it() {
    for reservation in [1, 3, flocklease::DEFAULT_TOKEN_RESERVATION] {
        let dir = tempfile::tempdir().unwrap();
        let s = sid("chat/floored");
        let leases = open(dir.path(), reservation);
        // Some history below the floor first, as a lagging directory has.
        let early = leases.acquire(&s, &oid("early")).await.unwrap();
        leases.release(&early).await.unwrap();
        assert!(early.token() < FLOOR);

        let lease = leases
            .acquire_above(&s, &oid("a"), FLOOR)
            .await
            .unwrap_or_else(|e| panic!("reservation {reservation}: {e}"));
        assert!(lease.token() > FLOOR, "{lease:?}");
        let (token, ceiling) = on_disk(dir.path(), &s);
        assert_eq!(token, lease.token().get(), "the record holds the grant");
        assert!(ceiling >= token, "ceiling {ceiling} below token {token}");
        leases.release(&lease).await.unwrap();

        // Another owner, through the same instance and through another.
        let b = leases.acquire(&s, &oid("b")).await.unwrap();
        assert!(b.token() > lease.token(), "{b:?} after {lease:?}");
        leases.release(&b).await.unwrap();
        let other = open(dir.path(), reservation);
        let c = other.acquire(&s, &oid("c")).await.unwrap();
        assert!(c.token() > b.token(), "{c:?} after {b:?}");
        other.release(&c).await.unwrap();
        drop((leases, other));

        // The directory opened again, as after a restart.
        let reopened = open(dir.path(), reservation);
        let d = reopened.acquire(&s, &oid("d")).await.unwrap();
        assert!(d.token() > c.token(), "{d:?} after {c:?}");
        assert!(d.token() > FLOOR);
    }
}

#[tokio::test]
async fn a_first_grant_above_a_floor_on_a_session_never_leased_here() {
    let dir = tempfile::tempdir().unwrap();
    let s = sid("new");
    let lease = open(dir.path(), 1)
        .acquire_above(&s, &oid("a"), FLOOR)
        .await
        .unwrap();
    assert_eq!(lease.token().get(), FLOOR.get() + 1);
    let next = open(dir.path(), 1).acquire(&s, &oid("b")).await;
    // Still held by a: refused, with the holder named.
    let err = next.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    assert_eq!(err.holder(), Some(&oid("a")));
}

#[tokio::test]
async fn the_live_holder_under_the_floor_gets_a_new_greater_token() {
    let dir = tempfile::tempdir().unwrap();
    let (s, a) = (sid("held"), oid("a"));
    let leases = open(dir.path(), 8);
    let held = leases.acquire(&s, &a).await.unwrap();
    assert!(held.token() < FLOOR);

    let raised = leases.acquire_above(&s, &a, FLOOR).await.unwrap();
    assert!(raised.token() > FLOOR, "{raised:?}");
    // The old token is superseded: its holder must stop acting on it.
    let err = leases.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    leases.renew(&raised).await.unwrap();

    // A floor the token already exceeds keeps the token.
    let again = leases.acquire_above(&s, &a, FLOOR).await.unwrap();
    assert_eq!(again.token(), raised.token());
    // Another owner is refused while the holder lives, floor or not.
    let err = leases
        .acquire_above(&s, &oid("b"), FLOOR)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    assert_eq!(err.holder(), Some(&a));
    leases.release(&again).await.unwrap();
    let b = open(dir.path(), 8).acquire(&s, &oid("b")).await.unwrap();
    assert!(b.token() > raised.token());
}

#[tokio::test]
async fn a_floor_below_the_record_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = sid("low");
    let leases = open(dir.path(), 4);
    let first = leases.acquire(&s, &oid("a")).await.unwrap();
    leases.release(&first).await.unwrap();
    let before = on_disk(dir.path(), &s);
    // Within the instance's reservation: the next token, no new ceiling.
    let next = leases
        .acquire_above(&s, &oid("b"), first.token())
        .await
        .unwrap();
    assert_eq!(next.token().get(), first.token().get() + 1);
    assert_eq!(on_disk(dir.path(), &s).1, before.1);
}

#[tokio::test]
async fn a_floor_at_the_last_token_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().unwrap();
    let err = open(dir.path(), 1)
        .acquire_above(&sid("max"), &oid("a"), FencingToken::new(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err}");
}
