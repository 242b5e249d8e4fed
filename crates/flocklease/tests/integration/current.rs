//! `current`: the live holder read from the one session's file, judged as
//! an acquire would judge it, without creating or changing anything.

use std::error::Error as _;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flocklease::{FlockLease, LeaseFileError, RECORD_LEN};
use lease_port::{
    Clock, LeaseError, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease,
};
use nix::fcntl::{Flock, FlockArg};

const TTL: Duration = Duration::from_secs(30);

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn oid(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn open(dir: &Path, clock: &ManualClock) -> FlockLease {
    FlockLease::builder(dir)
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .lock_timeout(Duration::from_millis(200))
        .open()
        .unwrap()
}

fn lease_path(dir: &Path, s: &SessionId) -> PathBuf {
    dir.join(format!("{}.lease", session_filename::stem(s)))
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn cause(e: &LeaseError) -> &LeaseFileError {
    e.source()
        .and_then(|s| s.downcast_ref::<LeaseFileError>())
        .unwrap_or_else(|| panic!("no LeaseFileError behind {e:?}"))
}

fn lock(path: &Path, mode: FlockArg) -> Flock<File> {
    Flock::lock(File::open(path).unwrap(), mode).unwrap()
}

#[tokio::test]
async fn reports_the_live_holder_and_never_writes() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let (a, reader) = (open(dir.path(), &clock), open(dir.path(), &clock));
    let (s, owner) = (sid("chat/1"), oid("a"));

    assert_eq!(reader.current(&s).await.unwrap(), None);
    assert_eq!(
        names(dir.path()),
        Vec::<String>::new(),
        "asking about a session created its file"
    );

    let lease = a.acquire(&s, &owner).await.unwrap();
    let path = lease_path(dir.path(), &s);
    let before = fs::read(&path).unwrap();
    let shown = reader.current(&s).await.unwrap().expect("a live holder");
    assert_eq!(shown, lease, "the report is the grant itself");
    assert_eq!(
        fs::read(&path).unwrap(),
        before,
        "the report wrote the file"
    );

    a.release(&lease).await.unwrap();
    assert_eq!(reader.current(&s).await.unwrap(), None, "released");
    // The holder's own instance judges the same way.
    assert_eq!(a.current(&s).await.unwrap(), None);
    assert_eq!(names(dir.path()).len(), 1);
}

#[tokio::test]
async fn expiry_is_judged_as_acquire_judges_it_whatever_the_wall_clock_does() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let (a, reader) = (open(dir.path(), &clock), open(dir.path(), &clock));
    let (s, owner) = (sid("steps"), oid("a"));
    let lease = a.acquire(&s, &owner).await.unwrap();

    // NTP steps the wall clock an hour ahead; no time passes on the
    // monotonic clock, which judges records of this boot.
    clock.set_wall(clock.now() + Duration::from_secs(3600));
    let shown = reader.current(&s).await.unwrap().expect("still live");
    assert_eq!(shown.token(), lease.token());
    assert_eq!(
        shown.expiry(),
        clock.now() + TTL,
        "the time left is counted on the clock that judged it"
    );

    clock.advance(TTL - Duration::from_millis(1));
    assert!(reader.current(&s).await.unwrap().is_some(), "before expiry");
    clock.advance(Duration::from_millis(1));
    assert_eq!(reader.current(&s).await.unwrap(), None, "at expiry");
    // And acquire agrees: another owner takes it now.
    reader.acquire(&s, &oid("b")).await.unwrap();
}

#[tokio::test]
async fn readers_share_the_lock_and_a_wedged_writer_bounds_the_wait() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path(), &clock);
    let (s, owner) = (sid("locks"), oid("a"));
    let lease = leases.acquire(&s, &owner).await.unwrap();
    let path = lease_path(dir.path(), &s);

    // Another reader (the operator listing, another replica asking) holds
    // a shared lock: the report does not wait for it.
    let reading = lock(&path, FlockArg::LockSharedNonblock);
    assert_eq!(leases.current(&s).await.unwrap(), Some(lease.clone()));
    drop(reading);

    // A writer stopped inside its critical section: the report fails
    // after the lock timeout, as every operation does, and says why.
    let writing = lock(&path, FlockArg::LockExclusiveNonblock);
    let err = leases.current(&s).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(
        matches!(cause(&err), LeaseFileError::LockTimeout { .. }),
        "{err:?}"
    );
    drop(writing);
    assert_eq!(leases.current(&s).await.unwrap(), Some(lease));
}

#[tokio::test]
async fn a_damaged_file_is_an_error_left_as_found() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path(), &clock);
    let s = sid("damaged");
    leases.acquire(&s, &oid("a")).await.unwrap();
    let path = lease_path(dir.path(), &s);
    let mut bytes = fs::read(&path).unwrap();
    assert_eq!(bytes.len(), RECORD_LEN);
    bytes[20] ^= 0x40; // the token, inside the checksummed header
    fs::write(&path, &bytes).unwrap();

    let err = leases.current(&s).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(
        matches!(cause(&err), LeaseFileError::Checksum { .. }),
        "{err:?}"
    );
    assert_eq!(fs::read(&path).unwrap(), bytes, "the file was changed");
}

#[tokio::test]
async fn a_hold_whose_holder_was_torn_away_is_held_not_free() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path(), &clock);
    let s = sid("torn");
    leases.acquire(&s, &oid("a")).await.unwrap();
    let path = lease_path(dir.path(), &s);
    let mut bytes = fs::read(&path).unwrap();
    // A power cut between the two sectors: the owner sector is another
    // write's (here: damaged), the header is whole.
    bytes[600] ^= 0x01;
    fs::write(&path, &bytes).unwrap();

    let err = leases.current(&s).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
    assert_eq!(err.holder(), None);
    // Once its expiry passes it is free, as acquire sees it.
    clock.advance(TTL);
    assert_eq!(leases.current(&s).await.unwrap(), None);
}
