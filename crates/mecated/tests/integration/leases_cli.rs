//! `mecated leases` against a real lease directory: listing, and repairing
//! a record that cannot be read without ever lowering its token.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use flocklease::FlockLease;
use lease_port::{FencingToken, OwnerId, SessionId, SessionLease};
use serde_json::Value;
use session_store::{Fence, JsonlOptions, JsonlStore, SessionStore, WriteFence};

fn mecated(dir: &Path, args: &[&str]) -> Output {
    mecated_with(&["--session-lease-dir"], dir, args)
}

fn mecated_with(flag: &[&str], dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mecated"))
        .arg("leases")
        .args(flag)
        .arg(dir)
        .args(args)
        .env_remove("MECATED_STORE_DIR")
        .output()
        .expect("run mecated")
}

fn listed_token(dir: &Path, session: &str) -> Option<u64> {
    let out = mecated(dir, &["--json"]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .find(|v| v["session"] == session)
        .and_then(|v| v["token"].as_u64())
}

#[tokio::test]
async fn an_unreadable_record_is_repaired_above_the_given_token_and_never_reset() {
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path(), Duration::from_secs(15)).unwrap();
    // Not yet a directory any server leased from: repair refuses to write.
    let stray = mecated(
        dir.path(),
        &["repair", "--session", "chat-1", "--min-token", "5"],
    );
    assert!(
        !stray.status.success(),
        "repair wrote into a directory without .authority"
    );
    leases.authority().await.unwrap();
    let (session, owner) = (
        SessionId::new("chat-1").unwrap(),
        OwnerId::new("a").unwrap(),
    );
    let lease = leases.acquire(&session, &owner).await.unwrap();
    leases.release(&lease).await.unwrap();
    assert_eq!(
        listed_token(dir.path(), "chat-1"),
        Some(lease.token().get())
    );

    // A power cut under an older format, or a stray write: the sector with
    // the token no longer passes its checksum.
    let file = dir
        .path()
        .join(format!("{}.lease", session_filename::stem(&session)));
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all_at(&[0xA5; 512], 0).unwrap();
    drop(f);
    let err = leases.acquire(&session, &owner).await.unwrap_err();
    assert_eq!(err.kind(), lease_port::LeaseErrorKind::Transient, "{err}");

    // Without a minimum the record is not reset to token 0.
    let refused = mecated(dir.path(), &["repair", "--session", "chat-1"]);
    assert!(
        !refused.status.success(),
        "repair without --min-token reset an unreadable record"
    );
    assert!(leases.acquire(&session, &owner).await.is_err());

    let repaired = mecated(
        dir.path(),
        &["repair", "--session", "chat-1", "--min-token", "41"],
    );
    assert!(repaired.status.success(), "{repaired:?}");
    let next = leases.acquire(&session, &owner).await.unwrap();
    assert!(
        next.token().get() > 41,
        "token {} after repair",
        next.token().get()
    );
}

#[tokio::test]
async fn repair_with_the_store_never_goes_below_its_high_water_token() {
    let store_dir = tempfile::tempdir().unwrap();
    let lease_dir = store_dir.path().join(session_store::DEFAULT_LEASE_DIR_NAME);
    let leases = FlockLease::open(&lease_dir, Duration::from_secs(15)).unwrap();
    leases.authority().await.unwrap();
    let (session, owner) = (
        SessionId::new("chat-2").unwrap(),
        OwnerId::new("a").unwrap(),
    );
    let lease = leases.acquire(&session, &owner).await.unwrap();
    leases.release(&lease).await.unwrap();

    // The store accepted token 5000 (a lease directory restored from an old
    // backup would have issued far less).
    let store = JsonlStore::open(store_dir.path(), JsonlOptions::default()).unwrap();
    store.create(&session).await.unwrap();
    let fence = Fence::new(FencingToken::new(5000), owner.clone());
    store
        .append(
            &session,
            WriteFence::from(fence),
            &[serde_json::json!({"type": "x"})],
        )
        .await
        .unwrap();

    let file = lease_dir.join(format!("{}.lease", session_filename::stem(&session)));
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all_at(&[0xA5; 512], 0).unwrap();
    drop(f);

    let repaired = mecated_with(
        &["--store-dir"],
        store_dir.path(),
        &["repair", "--session", "chat-2", "--min-token", "3"],
    );
    assert!(repaired.status.success(), "{repaired:?}");
    let next = leases.acquire(&session, &owner).await.unwrap();
    assert!(
        next.token().get() > 5000,
        "token {} is below the store's mark",
        next.token().get()
    );
}

#[tokio::test]
async fn a_copied_lease_directory_serves_only_once_adopted() {
    let root = tempfile::tempdir().unwrap();
    let (original, copy) = (root.path().join("leases"), root.path().join("copy"));
    let leases = FlockLease::open(&original, Duration::from_secs(15)).unwrap();
    let authority = leases.authority().await.unwrap();
    std::fs::create_dir(&copy).unwrap();
    std::fs::copy(
        original.join(flocklease::AUTHORITY_FILE),
        copy.join(flocklease::AUTHORITY_FILE),
    )
    .unwrap();
    let err = FlockLease::open(&copy, Duration::from_secs(15)).unwrap_err();
    assert!(err.message().contains("is a copy"), "{err}");

    // Not while a server serves the store (leased servers share its lock).
    let store = root.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let lock_path = store.join(mecated::backend::SINGLE_PROCESS_LOCK);
    let serving = nix::fcntl::Flock::lock(
        std::fs::File::create(&lock_path).unwrap(),
        nix::fcntl::FlockArg::LockSharedNonblock,
    )
    .unwrap();
    let store_arg = store.to_str().unwrap();
    let refused = mecated(&copy, &["adopt", "--store-dir", store_arg]);
    assert!(!refused.status.success(), "adopted while a server ran");
    assert!(FlockLease::open(&copy, Duration::from_secs(15)).is_err());
    drop(serving);

    let adopted = mecated(&copy, &["adopt", "--store-dir", store_arg]);
    assert!(adopted.status.success(), "{adopted:?}");
    let copied = FlockLease::open(&copy, Duration::from_secs(15)).unwrap();
    assert_eq!(copied.authority().await.unwrap(), authority);
}

#[tokio::test]
async fn repair_refuses_a_live_hold_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path(), Duration::from_secs(60)).unwrap();
    leases.authority().await.unwrap();
    let (session, owner) = (SessionId::new("live").unwrap(), OwnerId::new("a").unwrap());
    let held = leases.acquire(&session, &owner).await.unwrap();

    let refused = mecated(
        dir.path(),
        &["repair", "--session", "live", "--min-token", "9"],
    );
    assert!(!refused.status.success(), "repair ended a live hold");
    leases
        .renew(&held)
        .await
        .expect("the holder still holds its lease");

    let forced = mecated(
        dir.path(),
        &["repair", "--session", "live", "--min-token", "9", "--force"],
    );
    assert!(forced.status.success(), "{forced:?}");
    assert!(
        leases.renew(&held).await.is_err(),
        "the forced repair left the hold"
    );
}
