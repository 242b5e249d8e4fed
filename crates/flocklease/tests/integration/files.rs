//! What the backend does with the file system around it: damaged, foreign
//! and non-regular lease files, a replaced directory, a wedged file lock, a
//! second descriptor on a locked file, and the operator listing.

use std::error::Error as _;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flocklease::{FlockLease, LeaseFileError, LeaseState, RECORD_LEN, list_leases};
use lease_port::{
    Clock, FencingToken, Lease, LeaseError, LeaseErrorKind, ManualClock, OwnerId, SessionId,
    SessionLease,
};
use nix::fcntl::{Flock, FlockArg};

const TTL: Duration = Duration::from_secs(30);

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn oid(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn open(dir: &Path) -> FlockLease {
    FlockLease::builder(dir).ttl(TTL).open().unwrap()
}

fn lease_path(dir: &Path, s: &SessionId) -> PathBuf {
    dir.join(format!("{}.lease", session_filename::stem(s)))
}

fn cause(e: &LeaseError) -> &LeaseFileError {
    e.source()
        .and_then(|s| s.downcast_ref::<LeaseFileError>())
        .unwrap_or_else(|| panic!("no LeaseFileError behind {e:?}"))
}

#[track_caller]
fn transient(r: Result<impl std::fmt::Debug, LeaseError>) -> LeaseError {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind(), LeaseErrorKind::Transient, "{e:?}");
    e
}

/// A valid record of `s`, held by `o`, made in a scratch directory.
async fn record_bytes(s: &SessionId, o: &OwnerId) -> Vec<u8> {
    let scratch = tempfile::tempdir().unwrap();
    open(scratch.path()).acquire(s, o).await.unwrap();
    fs::read(lease_path(scratch.path(), s)).unwrap()
}

#[tokio::test]
async fn damaged_and_foreign_files_are_errors_never_free() {
    let s = sid("chat-1");
    let a = oid("a");
    let good = record_bytes(&s, &a).await;
    assert_eq!(good.len(), RECORD_LEN);
    let other = record_bytes(&sid("chat-2"), &a).await;

    let mut flipped = good.clone();
    flipped[20] ^= 0x40;
    let mut newer = good.clone();
    newer[8] = 9;
    let mut longer = good.clone();
    longer.extend_from_slice(b"\n");
    type Case = (&'static str, Vec<u8>, fn(&LeaseFileError) -> bool);
    let cases: Vec<Case> = vec![
        ("foreign text", b"{\"owner\": \"x\"}\n".to_vec(), |e| {
            matches!(e, LeaseFileError::Foreign { .. })
        }),
        ("truncated record", good[..100].to_vec(), |e| {
            matches!(e, LeaseFileError::Truncated { len: 100, .. })
        }),
        ("torn or corrupt record", flipped, |e| {
            matches!(e, LeaseFileError::Checksum { .. })
        }),
        ("newer format", newer, |e| {
            matches!(e, LeaseFileError::Version { found: 9, .. })
        }),
        ("oversized", longer, |e| {
            matches!(e, LeaseFileError::Oversized { .. })
        }),
        ("another session's record", other, |e| {
            matches!(e, LeaseFileError::SessionMismatch { .. })
        }),
    ];
    for (what, bytes, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = lease_path(dir.path(), &s);
        fs::write(&path, &bytes).unwrap();
        let leases = open(dir.path());
        let forged = Lease::new(
            s.clone(),
            a.clone(),
            FencingToken::new(1),
            SystemTime::now(),
        );
        for err in [
            transient(leases.acquire(&s, &oid("b")).await),
            transient(leases.renew(&forged).await),
            transient(leases.release(&forged).await),
        ] {
            assert!(expected(cause(&err)), "{what}: {err:?}");
            assert!(
                err.to_string().contains(path.to_str().unwrap()),
                "{what}: the message names the file: {err}"
            );
        }
        assert_eq!(
            fs::read(&path).unwrap(),
            bytes,
            "{what}: file left as found"
        );
        let listed = list_leases(dir.path(), SystemTime::now()).unwrap();
        assert_eq!(listed.len(), 1);
        assert!(
            listed[0].lease.as_ref().is_err_and(expected),
            "{what}: {listed:?}"
        );
    }
}

#[tokio::test]
async fn empty_and_zeroed_files_are_unused_and_tokens_start_at_one() {
    for bytes in [vec![], vec![0u8; RECORD_LEN]] {
        let dir = tempfile::tempdir().unwrap();
        let s = sid("s");
        fs::write(lease_path(dir.path(), &s), &bytes).unwrap();
        let listed = list_leases(dir.path(), SystemTime::now()).unwrap();
        let info = listed[0].lease.as_ref().unwrap();
        assert_eq!((info.state, info.token), (LeaseState::Free, None));
        assert_eq!(info.session.as_ref(), Some(&s), "plain stems decode");
        let lease = open(dir.path()).acquire(&s, &oid("a")).await.unwrap();
        assert_eq!(lease.token(), FencingToken::new(1));
    }
}

#[tokio::test]
async fn non_regular_files_at_a_lease_name_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path());
    let (a, b, c) = (sid("is-dir"), sid("is-link"), sid("is-fifo"));
    fs::create_dir(lease_path(dir.path(), &a)).unwrap();
    // A symlink to a perfectly good lease file is refused, not followed.
    let target = dir.path().join("elsewhere");
    fs::write(&target, record_bytes(&b, &oid("x")).await).unwrap();
    std::os::unix::fs::symlink(&target, lease_path(dir.path(), &b)).unwrap();
    nix::unistd::mkfifo(
        &lease_path(dir.path(), &c),
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    for (s, what) in [(&a, "a directory"), (&b, "a symbolic link"), (&c, "a FIFO")] {
        let err = transient(leases.acquire(s, &oid("o")).await);
        match cause(&err) {
            LeaseFileError::NotRegular { what: w, .. } => assert_eq!(*w, what),
            other => panic!("{s}: {other:?}"),
        }
    }
    let before = fs::read(&target).unwrap();
    let forged = Lease::new(b.clone(), oid("x"), FencingToken::new(1), SystemTime::now());
    transient(leases.renew(&forged).await);
    assert_eq!(
        fs::read(&target).unwrap(),
        before,
        "symlink target untouched"
    );
    let listed = list_leases(dir.path(), SystemTime::now()).unwrap();
    let errors = listed.iter().filter(|e| e.lease.is_err()).count();
    assert_eq!(
        errors, 4,
        "three odd lease names and one stray file: {listed:?}"
    );
}

#[tokio::test]
async fn directory_is_created_private_and_files_are_private() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("new/leases");
    let leases = open(&dir);
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let s = sid("s");
    leases.acquire(&s, &oid("a")).await.unwrap();
    let mode = fs::metadata(lease_path(&dir, &s))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "no group or other access: {mode:o}");
}

#[tokio::test]
async fn a_symlinked_or_non_directory_path_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let real = base.path().join("real");
    fs::create_dir(&real).unwrap();
    let link = base.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = transient(FlockLease::open(&link, TTL));
    assert!(
        matches!(cause(&err), LeaseFileError::DirSymlink { .. }),
        "{err:?}"
    );
    let err = list_leases(&link, SystemTime::now()).unwrap_err();
    assert!(
        matches!(cause(&err), LeaseFileError::DirSymlink { .. }),
        "{err:?}"
    );

    let file = base.path().join("file");
    fs::write(&file, b"").unwrap();
    let err = transient(FlockLease::open(&file, TTL));
    assert!(
        matches!(cause(&err), LeaseFileError::NotADirectory { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_directory_replaced_after_opening_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("leases");
    let leases = FlockLease::builder(&dir)
        .ttl(TTL)
        .dir_check_interval(Duration::ZERO)
        .open()
        .unwrap();
    let s = sid("s");
    let a = oid("a");
    let lease = leases.acquire(&s, &a).await.unwrap();

    // Replaced by a symlink to the moved original: new processes would
    // follow the path elsewhere, so this instance refuses to go on.
    let moved = base.path().join("moved");
    fs::rename(&dir, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &dir).unwrap();
    for err in [
        transient(leases.renew(&lease).await),
        transient(leases.acquire(&sid("t"), &a).await),
    ] {
        assert!(
            matches!(cause(&err), LeaseFileError::DirReplaced { .. }),
            "{err:?}"
        );
    }
    let err = transient(FlockLease::open(&dir, TTL));
    assert!(
        matches!(cause(&err), LeaseFileError::DirSymlink { .. }),
        "{err:?}"
    );

    // Replaced by a fresh real directory: refused as well.
    fs::remove_file(&dir).unwrap();
    fs::create_dir(&dir).unwrap();
    let err = transient(leases.renew(&lease).await);
    assert!(
        matches!(cause(&err), LeaseFileError::DirReplaced { .. }),
        "{err:?}"
    );
}

fn wedge(path: &Path) -> Flock<File> {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    Flock::lock(f, FlockArg::LockExclusiveNonblock).unwrap()
}

#[tokio::test]
async fn a_wedged_lock_gives_transient_and_a_second_descriptor_does_not_unlock() {
    let dir = tempfile::tempdir().unwrap();
    let s = sid("s");
    let a = oid("a");
    let leases = FlockLease::builder(dir.path())
        .ttl(TTL)
        .lock_timeout(Duration::from_millis(200))
        .open()
        .unwrap();
    let lease = leases.acquire(&s, &a).await.unwrap();
    let path = lease_path(dir.path(), &s);

    // This process holds the lock through one open file description, as a
    // stopped process would.
    let held = wedge(&path);
    let err = transient(leases.renew(&lease).await);
    assert!(
        matches!(cause(&err), LeaseFileError::LockTimeout { .. }),
        "{err:?}"
    );
    assert_eq!(err.message(), cause(&err).to_string());

    // Another descriptor on the same file, opened and closed in this
    // process — by hand, by another instance, by the listing — must not
    // release that lock (POSIX fcntl locks would be dropped here).
    drop(File::open(&path).unwrap());
    let other = FlockLease::builder(dir.path())
        .ttl(TTL)
        .lock_timeout(Duration::from_millis(100))
        .open()
        .unwrap();
    transient(other.acquire(&s, &oid("b")).await);
    let listed = list_leases(dir.path(), SystemTime::now()).unwrap();
    assert!(matches!(
        listed[0].lease,
        Err(LeaseFileError::LockTimeout { .. })
    ));
    let err = transient(leases.renew(&lease).await);
    assert!(
        matches!(cause(&err), LeaseFileError::LockTimeout { .. }),
        "{err:?}"
    );
    // Other sessions are not affected by one wedged file.
    leases.acquire(&sid("t"), &a).await.unwrap();

    drop(held);
    let renewed = leases.renew(&lease).await.unwrap();
    assert_eq!(renewed.token(), lease.token());
}

#[test]
fn waiting_for_a_lock_never_blocks_a_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    wait_beside_other_work(&rt);
}

#[test]
fn waiting_for_a_lock_never_blocks_a_one_worker_multi_thread_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    wait_beside_other_work(&rt);
}

fn wait_beside_other_work(rt: &tokio::runtime::Runtime) {
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let leases = FlockLease::builder(dir.path())
            .ttl(TTL)
            .lock_timeout(TTL / 4)
            .open()
            .unwrap();
        let (s, a) = (sid("s"), oid("a"));
        let lease = leases.acquire(&s, &a).await.unwrap();
        let held = wedge(&lease_path(dir.path(), &s));
        let waiting = tokio::spawn({
            let leases = leases.clone();
            let lease = lease.clone();
            async move { leases.renew(&lease).await }
        });
        tokio::task::yield_now().await;
        // Other tasks, spawned onto the runtime, run while the renew waits.
        let others = tokio::spawn({
            let leases = leases.clone();
            async move {
                for i in 0..20 {
                    let t = sid(&format!("other-{i}"));
                    let l = leases.acquire(&t, &a).await.unwrap();
                    leases.release(&l).await.unwrap();
                }
            }
        });
        others.await.unwrap();
        assert!(
            !waiting.is_finished(),
            "the renew cannot finish while locked"
        );
        drop(held);
        let renewed = waiting.await.unwrap().unwrap();
        assert_eq!(renewed.token(), lease.token());
    });
}

#[test]
fn works_outside_a_tokio_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path());
    let fut = async {
        let l = leases.acquire(&sid("s"), &oid("a")).await?;
        leases.renew(&l).await?;
        leases.release(&l).await
    };
    // A minimal executor: the futures complete without waking.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r.unwrap(),
        std::task::Poll::Pending => panic!("operations outside a runtime run inline"),
    }
}

#[tokio::test]
async fn listing_shows_live_expired_and_free_leases() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let leases = FlockLease::builder(dir.path())
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    let a = oid("replica-a");
    let long = sid(&"L".repeat(200));
    let live = leases.acquire(&sid("live"), &a).await.unwrap();
    let hashed = leases.acquire(&long, &a).await.unwrap();
    let old = leases.acquire(&sid("old"), &a).await.unwrap();
    let freed = leases.acquire(&sid("freed"), &a).await.unwrap();
    leases.release(&freed).await.unwrap();
    clock.advance(TTL / 2);
    leases.renew(&live).await.unwrap();
    leases.renew(&hashed).await.unwrap();
    clock.advance(TTL * 2 / 3);
    let live = leases.renew(&live).await.unwrap();
    fs::write(dir.path().join("notes.txt"), b"hi").unwrap();

    let listed = leases.list().await.unwrap();
    let names: Vec<_> = listed.iter().map(|e| e.file_name.as_str()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    let by_session = |s: &SessionId| {
        listed
            .iter()
            .find_map(|e| {
                e.lease
                    .as_ref()
                    .ok()
                    .filter(|i| i.session.as_ref() == Some(s))
            })
            .unwrap_or_else(|| panic!("{s} missing from {listed:?}"))
    };
    let info = by_session(&sid("live"));
    assert_eq!(info.state, LeaseState::Live);
    assert_eq!(info.owner.as_ref(), Some(&a));
    assert_eq!(info.token, Some(live.token()));
    assert_eq!(info.expiry, Some(live.expiry()));
    assert_eq!(
        by_session(&long).state,
        LeaseState::Live,
        "hashed names list their id"
    );
    assert_eq!(by_session(&sid("old")).state, LeaseState::Expired);
    assert_eq!(by_session(&sid("old")).token, Some(old.token()));
    let free = by_session(&sid("freed"));
    assert_eq!(
        (free.state, free.owner.as_ref(), free.token),
        (LeaseState::Free, None, Some(freed.token()))
    );
    assert!(listed.iter().any(|e| e.file_name == "notes.txt"
        && matches!(e.lease, Err(LeaseFileError::UnexpectedName { .. }))));
    // Judged at another time, by the caller's clock.
    let later = list_leases(dir.path(), clock.now() + TTL * 2).unwrap();
    assert!(
        later
            .iter()
            .filter_map(|e| e.lease.as_ref().ok())
            .all(|i| i.state != LeaseState::Live)
    );
}

#[tokio::test]
async fn tokens_survive_new_instances() {
    let dir = tempfile::tempdir().unwrap();
    let s = sid("s");
    let mut last = 0;
    for round in 0..5 {
        let leases = open(dir.path());
        let l = leases
            .acquire(&s, &oid(&format!("o{round}")))
            .await
            .unwrap();
        assert!(l.token().get() > last);
        last = l.token().get();
        leases.release(&l).await.unwrap();
    }
    // Each new instance starts past the previous one's reservation.
    assert_eq!(last, 4 * flocklease::DEFAULT_TOKEN_RESERVATION + 1);
}

#[test]
fn an_owner_id_is_locked_per_directory_whatever_its_spelling() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("leases");
    let link = tmp.path().join("parent-link");
    std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
    let owner = OwnerId::new("host/one").unwrap();
    let first = FlockLease::open(&dir, Duration::from_secs(30)).unwrap();
    let held = first.lock_owner(&owner).unwrap();
    let mut slash = dir.clone().into_os_string();
    slash.push("/");
    for other in [
        std::path::PathBuf::from(slash),
        link.join("leases"),
        dir.join("../leases"),
    ] {
        let leases = FlockLease::open(&other, Duration::from_secs(30)).unwrap();
        let err = leases.lock_owner(&owner).unwrap_err();
        assert_eq!(
            err.kind(),
            LeaseErrorKind::Held,
            "{}: {err:?}",
            other.display()
        );
        assert!(matches!(cause(&err), LeaseFileError::OwnerInUse { .. }));
        // Another owner id is free.
        leases
            .lock_owner(&OwnerId::new("host/two").unwrap())
            .unwrap();
    }
    drop(held);
    first.lock_owner(&owner).unwrap();
    // The lock files are not lease files: the listing leaves them out.
    assert!(
        list_leases(&dir, std::time::SystemTime::now())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn the_lock_wait_is_bounded_by_a_quarter_of_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(300);
    let leases = FlockLease::builder(dir.path()).ttl(ttl).open().unwrap();
    assert_eq!(leases.lock_timeout(), ttl / 4);
    // Long TTLs keep the two-second ceiling.
    assert_eq!(
        open(dir.path()).lock_timeout(),
        flocklease::DEFAULT_LOCK_TIMEOUT
    );
    let err = FlockLease::builder(dir.path())
        .ttl(ttl)
        .lock_timeout(Duration::from_secs(2))
        .open()
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    let shorter = FlockLease::builder(dir.path())
        .ttl(ttl)
        .lock_timeout(Duration::from_millis(10))
        .open()
        .unwrap();
    assert_eq!(shorter.lock_timeout(), Duration::from_millis(10));
}

/// A caller's deadline (the keeper's renew deadline) fires while the lock
/// is waited for, and the abandoned operation never writes afterwards.
fn an_abandoned_wait_stops(rt: tokio::runtime::Runtime, inline: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (s, a, b) = (sid("s"), oid("a"), oid("b"));
    // A long TTL and lock timeout: only the caller's deadline can end the wait.
    let builder = || {
        FlockLease::builder(dir.path())
            .ttl(Duration::from_secs(3600))
            .lock_timeout(Duration::from_secs(600))
            .inline_fast_path(inline)
    };
    let leases = builder().open().unwrap();
    let first = rt.block_on(leases.acquire(&s, &b)).unwrap();
    rt.block_on(leases.release(&first)).unwrap();
    let held = wedge(&lease_path(dir.path(), &s));
    let waited = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(20), leases.acquire(&s, &a)).await
    });
    assert!(waited.is_err(), "the deadline did not fire: {waited:?}");
    // The lock comes free; dropping the runtime waits for any blocking work
    // still running. The abandoned acquire must not take the session.
    drop(held);
    drop(rt);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = rt.block_on(builder().open().unwrap().acquire(&s, &b));
    assert!(
        other.is_ok(),
        "the abandoned acquire took the session: {other:?}"
    );
}

#[test]
fn an_abandoned_wait_stops_on_a_one_worker_multi_thread_runtime() {
    for inline in [true, false] {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        an_abandoned_wait_stops(rt, inline);
    }
}

#[test]
fn an_abandoned_wait_stops_on_a_current_thread_runtime() {
    for inline in [true, false] {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        an_abandoned_wait_stops(rt, inline);
    }
}

#[test]
fn a_directory_on_tmpfs_is_reported_volatile_and_may_be_refused() {
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let on_disk = open(disk.path());
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("no /dev/shm here: only the disk case is checked");
        assert!(!on_disk.is_volatile());
        return;
    };
    assert!(!on_disk.is_volatile(), "{}", disk.path().display());
    let volatile = open(shm.path());
    assert!(volatile.is_volatile());
    let err = FlockLease::builder(shm.path())
        .refuse_volatile(true)
        .open()
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert!(matches!(cause(&err), LeaseFileError::Volatile { .. }));
    FlockLease::builder(disk.path())
        .refuse_volatile(true)
        .open()
        .unwrap();
}

#[tokio::test]
async fn repair_restores_an_unreadable_record_above_a_minimum_token() {
    let dir = tempfile::tempdir().unwrap();
    let (s, a) = (sid("s"), oid("a"));
    let leases = open(dir.path());
    let lease = leases.acquire(&s, &a).await.unwrap();
    let path = lease_path(dir.path(), &s);
    let mut bytes = fs::read(&path).unwrap();
    bytes[20] ^= 0xff; // the token's bytes: the header checksum fails
    fs::write(&path, &bytes).unwrap();
    let err = transient(leases.acquire(&s, &oid("b")).await);
    assert!(err.to_string().contains("repair"), "{err}");
    // Without a minimum the unreadable record is never reset.
    let err = flocklease::repair(dir.path(), &s, 0).unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    // Nor set past the highest floor: the token range must stay open.
    let past = lease_port::FencingToken::MAX_FLOOR.get() + 1;
    let err = flocklease::repair(dir.path(), &s, past).unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert_eq!(
        flocklease::repair(dir.path(), &s, 5000).unwrap().get(),
        5000
    );
    let next = leases.acquire(&s, &oid("b")).await.unwrap();
    assert!(next.token().get() > 5000, "{next:?}");
    // A readable record is never lowered.
    assert!(flocklease::repair(dir.path(), &s, 1).unwrap().get() >= next.token().get());
    assert!(lease.token().get() < 5000);
}

/// A store fenced by the directory keeps its generation witness here
/// (session-store's `.store-generations`): not a lease, not listed.
#[tokio::test]
async fn the_listing_leaves_out_a_stores_generation_witness() {
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path());
    leases.acquire(&sid("one"), &oid("a")).await.unwrap();
    let witnesses = dir.path().join(".store-generations");
    fs::create_dir(&witnesses).unwrap();
    fs::write(witnesses.join("0123456789abcdef0123456789abcdef"), "{}\n").unwrap();
    let listed = list_leases(dir.path(), SystemTime::now()).unwrap();
    let names: Vec<_> = listed.iter().map(|e| e.file_name.as_str()).collect();
    assert_eq!(
        names,
        [format!("{}.lease", session_filename::stem(&sid("one")))]
    );
    assert!(listed[0].lease.is_ok(), "{listed:?}");
}
