//! Durable token reservations seen from outside: how tokens and the
//! reservation ceiling move between instances, when a reservation runs out,
//! the builder setting, and files written in record format version 1.
//! (The host-crash simulation, which needs to see every `fdatasync`, is a
//! unit test: `src/crash_sim.rs`.)

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flocklease::{DEFAULT_TOKEN_RESERVATION, FlockLease, LeaseState, RECORD_LEN, list_leases};
use lease_port::{FencingToken, LeaseErrorKind, OwnerId, SessionId, SessionLease};

const TTL: Duration = Duration::from_secs(30);

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn oid(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn lease_path(dir: &Path, s: &SessionId) -> PathBuf {
    dir.join(format!("{}.lease", session_filename::stem(s)))
}

fn open(dir: &Path, reservation: u64) -> FlockLease {
    FlockLease::builder(dir)
        .ttl(TTL)
        .token_reservation(reservation)
        .open()
        .unwrap()
}

/// (token, reservation ceiling) of the only lease file in `dir`.
fn on_disk(dir: &Path) -> (u64, u64) {
    let listed = list_leases(dir, SystemTime::now()).unwrap();
    let info = listed[0].lease.as_ref().unwrap();
    (info.token.unwrap().get(), info.reserved.unwrap().get())
}

/// Acquires and releases; returns the token.
async fn take(leases: &FlockLease, s: &SessionId, o: &OwnerId) -> u64 {
    let l = leases.acquire(s, o).await.unwrap();
    leases.release(&l).await.unwrap();
    l.token().get()
}

#[tokio::test]
async fn a_second_instance_starts_past_the_first_ones_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let (s, o) = (sid("s"), oid("o"));
    let n = DEFAULT_TOKEN_RESERVATION;
    let a = FlockLease::open(dir.path(), TTL).unwrap();
    let b = FlockLease::open(dir.path(), TTL).unwrap();
    assert_eq!(take(&a, &s, &o).await, 1);
    assert_eq!(on_disk(dir.path()), (1, n));
    assert_eq!(take(&a, &s, &o).await, 2, "within a's reservation");
    assert_eq!(on_disk(dir.path()), (2, n));

    // b never reserved this session: it cannot know the record is the
    // latest (it could be what a power loss left), so it jumps past a's
    // ceiling and reserves for itself.
    assert_eq!(take(&b, &s, &o).await, n + 1);
    assert_eq!(on_disk(dir.path()), (n + 1, 2 * n));
    assert_eq!(take(&b, &s, &o).await, n + 2);

    // a's ceiling is no longer the file's: a reserves again.
    assert_eq!(take(&a, &s, &o).await, 2 * n + 1);
    assert_eq!(on_disk(dir.path()), (2 * n + 1, 3 * n));

    // Other sessions have their own reservations.
    let t = sid("t");
    assert_eq!(take(&b, &t, &o).await, 1);
    assert_eq!(take(&b, &s, &o).await, 3 * n + 1);
}

#[tokio::test]
async fn a_used_up_reservation_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let (s, o) = (sid("s"), oid("o"));
    let leases = open(dir.path(), 3);
    let mut seen = Vec::new();
    for _ in 0..7 {
        let t = take(&leases, &s, &o).await;
        seen.push((t, on_disk(dir.path()).1));
    }
    assert_eq!(
        seen,
        [(1, 3), (2, 3), (3, 3), (4, 6), (5, 6), (6, 6), (7, 9)]
    );

    // One token per reservation: every new token reserves (and syncs).
    let dir = tempfile::tempdir().unwrap();
    let leases = open(dir.path(), 1);
    for expected in 1..=4 {
        assert_eq!(take(&leases, &s, &o).await, expected);
        assert_eq!(on_disk(dir.path()), (expected, expected));
    }
}

#[tokio::test]
async fn renew_and_release_keep_the_ceiling_and_a_live_holder_keeps_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let (s, a) = (sid("s"), oid("a"));
    let leases = open(dir.path(), 10);
    let l = leases.acquire(&s, &a).await.unwrap();
    let l = leases.renew(&l).await.unwrap();
    assert_eq!(on_disk(dir.path()), (1, 10));
    let again = leases.acquire(&s, &a).await.unwrap();
    assert_eq!(again.token(), l.token());
    let other = open(dir.path(), 10);
    let again = other.acquire(&s, &a).await.unwrap();
    assert_eq!(
        again.token(),
        l.token(),
        "same owner through another instance"
    );
    assert_eq!(on_disk(dir.path()), (1, 10));
    leases.release(&again).await.unwrap();
    assert_eq!(on_disk(dir.path()), (1, 10));
    let next = other.acquire(&s, &oid("b")).await.unwrap();
    assert_eq!(next.token(), FencingToken::new(11), "other jumps past 10");
}

#[test]
fn a_reservation_of_zero_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = FlockLease::builder(dir.path())
        .token_reservation(0)
        .open()
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
}

/// A record as the version 1 layout (548 bytes, no ceiling) stores it.
fn v1_record(session: &str, owner: Option<&str>, token: u64, expiry: SystemTime) -> Vec<u8> {
    let mut b = vec![0u8; 548];
    b[..8].copy_from_slice(b"MECLEASE");
    b[8..10].copy_from_slice(&1u16.to_le_bytes());
    b[10] = u8::from(owner.is_some());
    b[12..14].copy_from_slice(&(session.len() as u16).to_le_bytes());
    let owner = owner.unwrap_or("");
    b[14..16].copy_from_slice(&(owner.len() as u16).to_le_bytes());
    b[16..24].copy_from_slice(&token.to_le_bytes());
    let nanos = if owner.is_empty() {
        0
    } else {
        expiry.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
    };
    b[24..32].copy_from_slice(&nanos.to_le_bytes());
    b[32..32 + session.len()].copy_from_slice(session.as_bytes());
    b[288..288 + owner.len()].copy_from_slice(owner.as_bytes());
    let crc = crc32(&b[..544]);
    b[544..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// CRC-32 (IEEE), bit by bit: independent of the crate's own encoder.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::test]
async fn version_1_files_are_read_and_rewritten_in_the_current_format() {
    let dir = tempfile::tempdir().unwrap();
    let (free, held) = (sid("free"), sid("held"));
    let holder = oid("old-build");
    let expiry = SystemTime::now() + TTL;
    fs::write(
        lease_path(dir.path(), &free),
        v1_record("free", None, 41, expiry),
    )
    .unwrap();
    fs::write(
        lease_path(dir.path(), &held),
        v1_record("held", Some("old-build"), 7, expiry),
    )
    .unwrap();

    let listed = list_leases(dir.path(), SystemTime::now()).unwrap();
    let info = |name: &str| {
        listed
            .iter()
            .find(|e| e.file_name.starts_with(name))
            .unwrap()
            .lease
            .as_ref()
            .unwrap()
            .clone()
    };
    let f = info("free");
    assert_eq!(f.state, LeaseState::Free);
    assert_eq!(
        (f.token, f.reserved),
        (Some(FencingToken::new(41)), f.token)
    );
    let h = info("held");
    assert_eq!(h.state, LeaseState::Live);
    assert_eq!(h.owner.as_ref(), Some(&holder));

    // Version 1 synced every token, so its token is its ceiling: the next
    // one follows it directly.
    let leases = FlockLease::open(dir.path(), TTL).unwrap();
    let l = leases.acquire(&free, &oid("new-build")).await.unwrap();
    assert_eq!(l.token(), FencingToken::new(42));
    let bytes = fs::read(lease_path(dir.path(), &free)).unwrap();
    assert_eq!(bytes.len(), RECORD_LEN);
    assert_eq!(&bytes[8..10], &flocklease::FORMAT_VERSION.to_le_bytes());

    // A lease granted by the old build is honoured: held, then renewable
    // by its holder.
    let err = leases.acquire(&held, &oid("new-build")).await.unwrap_err();
    assert_eq!(err.holder(), Some(&holder));
    let again = leases.acquire(&held, &holder).await.unwrap();
    assert_eq!(again.token(), FencingToken::new(7));
    leases.renew(&again).await.unwrap();
    assert_eq!(
        fs::read(lease_path(dir.path(), &held)).unwrap().len(),
        RECORD_LEN
    );
}
