//! The store directory's generation: a copy of the directory, or an older
//! state put back into it, is refused at open (`Rewound`) until adopted;
//! a fresh store, an upgraded one and a witness shared by several stores
//! are accepted; damage is `Corrupt`, never a reset.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::json;
use session_store::{
    FsyncPolicy, GENERATION_FILE_NAME, GenerationCheck, JsonlOptions, JsonlStore, SessionStore,
    StoreErrorKind, WITNESS_DIR_NAME, WriteFence, adopt_store_dir,
};

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn tok(t: u64) -> WriteFence {
    WriteFence::new(
        FencingToken::new(t),
        OwnerId::new(format!("holder-of-{t}")).unwrap(),
    )
}

fn opts(check: GenerationCheck) -> JsonlOptions {
    JsonlOptions::default()
        .fsync(FsyncPolicy::Never)
        .generation(check)
}

/// A store directory and a lease directory beside it (the witness).
struct Dirs {
    _root: tempfile::TempDir,
    store: PathBuf,
    leases: PathBuf,
    root: PathBuf,
}

impl Dirs {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        Dirs {
            store: root.path().join("store"),
            leases: root.path().join("leases"),
            root: root.path().to_owned(),
            _root: root,
        }
    }

    fn witnessed(&self) -> JsonlOptions {
        opts(GenerationCheck::witness(&self.leases))
    }

    fn open(&self) -> Result<JsonlStore, session_store::StoreError> {
        JsonlStore::open(&self.store, self.witnessed())
    }

    fn witness_file(&self, store: &JsonlStore) -> PathBuf {
        self.leases
            .join(WITNESS_DIR_NAME)
            .join(store.generation().unwrap().store_id())
    }
}

/// The generation a record file holds.
fn recorded(path: &Path) -> u64 {
    let text = fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    v["generation"].as_u64().unwrap()
}

/// `cp -a`: the same files in a new directory (a new inode).
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every regular file under `dir`, by relative path: a backup.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                walk(root, &entry.path(), out);
            } else {
                let rel = entry.path().strip_prefix(root).unwrap().to_owned();
                out.insert(rel, fs::read(entry.path()).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Puts `backup` back into `dir` itself (`rsync --delete` from an older
/// copy, an older image of the disk): same directory, same inode.
fn restore_in_place(dir: &Path, backup: &BTreeMap<PathBuf, Vec<u8>>) {
    let inode = fs::metadata(dir).unwrap().ino();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            fs::remove_dir_all(&path).unwrap();
        } else {
            fs::remove_file(&path).unwrap();
        }
    }
    for (rel, bytes) in backup {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }
    assert_eq!(fs::metadata(dir).unwrap().ino(), inode, "not in place");
}

async fn write_session(store: &JsonlStore, s: &SessionId, token: u64) {
    if store.create(s).await.is_err() {
        // Exists already.
    }
    store
        .append(s, tok(token), &[json!({"token": token})])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_fresh_store_starts_at_one_and_every_open_advances() {
    let d = Dirs::new();
    let store = d.open().unwrap();
    let first = store.generation().unwrap();
    assert_eq!(first.get(), 1);
    assert_eq!(first.store_id().len(), 32);
    write_session(&store, &sid("a"), 1).await;
    assert_eq!(recorded(&d.store.join(GENERATION_FILE_NAME)), 1);
    assert_eq!(recorded(&d.witness_file(&store)), 1);
    // The record is not a session.
    assert_eq!(store.list().await.unwrap(), [sid("a")]);

    let again = d.open().unwrap();
    assert_eq!(again.generation().unwrap().get(), 2);
    assert_eq!(again.generation().unwrap().store_id(), first.store_id());
    let advanced = store.advance_generation().await.unwrap();
    assert_eq!(advanced.get(), 3, "advances past the other instance's");
    assert_eq!(recorded(&d.witness_file(&store)), 3);

    // The check in the store only: no witness anywhere.
    let alone = tempfile::tempdir().unwrap();
    let s = JsonlStore::open(alone.path(), opts(GenerationCheck::InStore)).unwrap();
    assert_eq!(s.generation().unwrap().get(), 1);

    // Off, the default: nothing read or written.
    let off = tempfile::tempdir().unwrap();
    let s = JsonlStore::open(off.path(), JsonlOptions::default()).unwrap();
    assert_eq!(s.generation(), None);
    assert_eq!(fs::read_dir(off.path()).unwrap().count(), 0);
    let err = s.advance_generation().await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
}

#[tokio::test]
async fn a_copied_store_directory_is_refused_until_adopted() {
    let d = Dirs::new();
    let store = d.open().unwrap();
    write_session(&store, &sid("chat"), 7).await;
    drop(store);
    let copy = d.root.join("copy");
    copy_dir(&d.store, &copy);

    for check in [
        GenerationCheck::InStore,
        GenerationCheck::witness(&d.leases),
    ] {
        let err = JsonlStore::open(&copy, opts(check.clone())).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Rewound, "{check:?}: {err}");
        let text = err.to_string();
        assert!(text.contains("is a copy"), "{text}");
        assert!(text.contains(&copy.display().to_string()), "{text}");
        assert!(text.contains("adopt_store_dir"), "{text}");
    }
    // Refused before anything was written: the copy's record is the
    // original's still.
    assert_eq!(
        fs::read(copy.join(GENERATION_FILE_NAME)).unwrap(),
        fs::read(d.store.join(GENERATION_FILE_NAME)).unwrap()
    );

    let adopted = adopt_store_dir(&copy, Some(&d.leases)).unwrap();
    assert_eq!(adopted.get(), 2, "above the witness's 1");
    let served = JsonlStore::open(&copy, d.witnessed()).unwrap();
    assert_eq!(served.generation().unwrap().get(), 3);
    assert_eq!(served.generation().unwrap().store_id(), adopted.store_id());
    assert_eq!(
        served.read(&sid("chat"), 1, 10).await.unwrap().events.len(),
        1
    );
    // The original now shares its witness with an adopted copy: refused,
    // one of the two only may serve.
    let err = d.open().unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("two copies"), "{err}");
}

#[tokio::test]
async fn an_older_copy_put_back_in_place_is_refused_by_its_witness() {
    let d = Dirs::new();
    let store = d.open().unwrap();
    write_session(&store, &sid("chat"), 3).await;
    drop(store);
    let backup = snapshot(&d.store);

    // Served again, with a later owner's writes.
    let store = d.open().unwrap();
    write_session(&store, &sid("chat"), 9).await;
    let witness = d.witness_file(&store);
    drop(store);
    assert_eq!(recorded(&witness), 2);

    restore_in_place(&d.store, &backup);
    let err = d.open().unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    let text = err.to_string();
    assert!(text.contains("older than its witness"), "{text}");
    assert!(
        text.contains(&d.store.join(GENERATION_FILE_NAME).display().to_string()),
        "{text}"
    );
    assert!(text.contains(&witness.display().to_string()), "{text}");
    assert!(text.contains("adopt_store_dir"), "{text}");
    // Refused again: refusing wrote nothing.
    assert_eq!(d.open().unwrap_err().kind(), StoreErrorKind::Rewound);
    assert_eq!(recorded(&d.store.join(GENERATION_FILE_NAME)), 1);
    assert_eq!(recorded(&witness), 2);

    let adopted = adopt_store_dir(&d.store, Some(&d.leases)).unwrap();
    assert_eq!(adopted.get(), 3);
    assert_eq!(recorded(&witness), 3);
    let store = d.open().unwrap();
    assert_eq!(store.generation().unwrap().get(), 4);
    // The adopted state is the older one, as it is.
    assert_eq!(
        store.high_water(&sid("chat")).await.unwrap(),
        Some(FencingToken::new(3))
    );
}

#[tokio::test]
async fn a_backup_taken_before_an_advance_is_refused_once_put_back() {
    let d = Dirs::new();
    let store = d.open().unwrap();
    write_session(&store, &sid("s"), 1).await;
    let backup = snapshot(&d.store); // while the server runs
    write_session(&store, &sid("s"), 2).await;
    assert_eq!(store.advance_generation().await.unwrap().get(), 2); // it stops
    drop(store);

    restore_in_place(&d.store, &backup);
    let err = d.open().unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
}

#[tokio::test]
async fn a_record_going_back_under_an_open_store_is_refused_by_the_next_advance() {
    let d = Dirs::new();
    let store = JsonlStore::open(&d.store, opts(GenerationCheck::InStore)).unwrap();
    let record = d.store.join(GENERATION_FILE_NAME);
    let before = fs::read(&record).unwrap();
    store.advance_generation().await.unwrap();
    fs::write(&record, before).unwrap();
    let err = store.advance_generation().await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
}

#[tokio::test]
async fn a_store_written_before_generations_is_upgraded() {
    let d = Dirs::new();
    let old = JsonlStore::open(&d.store, opts(GenerationCheck::Off)).unwrap();
    write_session(&old, &sid("kept"), 5).await;
    drop(old);
    assert!(!d.store.join(GENERATION_FILE_NAME).exists());

    let store = d.open().unwrap();
    assert_eq!(store.generation().unwrap().get(), 1);
    assert_eq!(store.list().await.unwrap(), [sid("kept")]);
    assert_eq!(recorded(&d.store.join(GENERATION_FILE_NAME)), 1);
    assert_eq!(recorded(&d.witness_file(&store)), 1);
}

#[tokio::test]
async fn a_store_that_lost_its_record_is_refused_by_the_witness_remembering_it() {
    let d = Dirs::new();
    let first = d.open().unwrap().generation().unwrap();
    drop(d.open().unwrap());
    // Put back from before the record existed, or the record removed.
    fs::remove_file(d.store.join(GENERATION_FILE_NAME)).unwrap();
    let err = d.open().unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("no generation record"), "{err}");

    let adopted = adopt_store_dir(&d.store, Some(&d.leases)).unwrap();
    assert_eq!(adopted.store_id(), first.store_id(), "its id is remembered");
    assert_eq!(adopted.get(), 3);
    assert_eq!(d.open().unwrap().generation().unwrap().get(), 4);
}

#[tokio::test]
async fn damaged_records_are_corrupt_never_reset() {
    let d = Dirs::new();
    let store = d.open().unwrap();
    let witness = d.witness_file(&store);
    drop(store);
    let record = d.store.join(GENERATION_FILE_NAME);
    let good = fs::read(&record).unwrap();

    let text = String::from_utf8(good.clone()).unwrap();
    let digit_changed = text.replace("\"generation\":1", "\"generation\":7");
    assert_ne!(digit_changed, text);
    for damage in [
        good[..good.len() / 2].to_vec(), // torn
        Vec::new(),
        digit_changed.into_bytes(), // checksum no longer matches
        b"hello\n".to_vec(),
    ] {
        fs::write(&record, &damage).unwrap();
        let err = d.open().unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
        assert_eq!(fs::read(&record).unwrap(), damage, "rewritten");
    }
    fs::write(&record, &good).unwrap();
    let witness_good = fs::read(&witness).unwrap();
    fs::write(&witness, &witness_good[..10]).unwrap();
    let err = d.open().unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains(&witness.display().to_string()));
    fs::write(&witness, &witness_good).unwrap();
    assert_eq!(d.open().unwrap().generation().unwrap().get(), 2);

    // Adopting accepts the directory as it is, a damaged record included.
    fs::write(&record, b"torn").unwrap();
    let adopted = adopt_store_dir(&d.store, Some(&d.leases)).unwrap();
    assert_eq!(adopted.get(), 3);
    assert_eq!(d.open().unwrap().generation().unwrap().get(), 4);
}

#[test]
fn writers_opening_at_once_advance_one_at_a_time() {
    let d = Dirs::new();
    drop(d.open().unwrap());
    let n = 6;
    let barrier = Arc::new(Barrier::new(n));
    let generations: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (barrier, d) = (Arc::clone(&barrier), &d);
                s.spawn(move || {
                    barrier.wait();
                    d.open().unwrap().generation().unwrap().get()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = generations.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (2..2 + n as u64).collect::<Vec<_>>(),
        "{generations:?}"
    );
    let last = d.open().unwrap();
    assert_eq!(last.generation().unwrap().get(), 2 + n as u64);
    assert_eq!(recorded(&d.witness_file(&last)), 2 + n as u64);
    // Nothing temporary left behind: the record, and the listing index's
    // lock (the record is written under it).
    let mut names: Vec<_> = fs::read_dir(&d.store)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".session-index.lock", GENERATION_FILE_NAME]);
}

#[tokio::test]
async fn stores_sharing_a_witness_directory_keep_apart() {
    let d = Dirs::new();
    let other = d.root.join("other");
    let a = d.open().unwrap();
    let b = JsonlStore::open(&other, d.witnessed()).unwrap();
    assert_ne!(
        a.generation().unwrap().store_id(),
        b.generation().unwrap().store_id()
    );
    drop(d.open().unwrap());
    assert_eq!(
        JsonlStore::open(&other, d.witnessed())
            .unwrap()
            .generation()
            .unwrap()
            .get(),
        2
    );
    assert_eq!(
        fs::read_dir(d.leases.join(WITNESS_DIR_NAME))
            .unwrap()
            .count(),
        2
    );
}

/// A directory put back from an older copy under a running store: the next
/// advance finds it, and from then on the store refuses every call — a
/// holder below the real mark must not write into the older state.
#[tokio::test]
async fn a_directory_put_back_under_a_running_store_is_refused_from_then_on() {
    let d = Dirs::new();
    let store = d.open().unwrap();
    let (a, b) = (sid("a"), sid("b"));
    write_session(&store, &a, 5).await;
    write_session(&store, &b, 5).await;
    store.advance_generation().await.unwrap();
    let backup = snapshot(&d.store);
    store.advance_generation().await.unwrap();
    write_session(&store, &a, 10).await;
    write_session(&store, &b, 10).await;

    restore_in_place(&d.store, &backup);
    let err = store.advance_generation().await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    let err = store.append(&b, tok(7), &[json!(7)]).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    let err = store.high_water(&b).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    let err = store.read(&a, 1, 10).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert_eq!(d.open().unwrap_err().kind(), StoreErrorKind::Rewound);
}
