//! The listing index across crashes and changes made behind its back: a
//! writer stopped at every step of its update, a file system clock that
//! did not tick, a deleter cut short, a log lost, torn or from another
//! boot, files copied in, a directory put back from a backup.

use std::fs;
use std::path::Path;
use std::time::Duration;

use lease_port::{FencingToken, OwnerId, SessionId};

use super::format::{deletion_line, fence_json, header_line, push_commit};
use super::list_index::{COMPACT_SLACK, FROZEN, INDEX_FILE_NAME, Live};
use super::locking::Wait;
use super::{FsyncPolicy, JsonlOptions, JsonlStore, lock};
use crate::{ListCursor, SessionStore, StoreErrorKind, WriteFence};

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn open(dir: &Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

fn fence(t: u64) -> WriteFence {
    WriteFence::new(FencingToken::new(t), OwnerId::new("o").unwrap())
}

/// A valid session file for `session`, as the store writes it.
fn session_file(session: &SessionId) -> String {
    let mut text = header_line(session, 1, None);
    push_commit(&mut text, 0);
    text
}

/// Every session a walk in pages of 2 lists, in order.
async fn walk(store: &JsonlStore) -> Vec<SessionId> {
    let mut out = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let page = store.list_page(after.as_ref(), 2).await.unwrap();
        out.extend(page.sessions);
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

fn ids(names: &[&str]) -> Vec<SessionId> {
    names.iter().map(|n| sid(n)).collect()
}

/// Makes the directory's change time read as it does now until the guard
/// is dropped, as a file system whose clock does not tick leaves it.
struct Frozen(std::path::PathBuf);

impl Frozen {
    fn at(store: &JsonlStore) -> Self {
        let m = store.core.dir_marker().unwrap();
        lock(&FROZEN).push((store.dir().to_path_buf(), m));
        Frozen(store.dir().to_path_buf())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        lock(&FROZEN).retain(|(d, _)| *d != self.0);
    }
}

/// A writer in another process that stops (is killed) after `steps` of
/// its creation of session `new`: lock, log `?`, link the file, log `+`,
/// log the marker.
fn interrupted_create(dir: &Path, steps: usize) {
    let writer = open(dir);
    let core = &writer.core;
    let new = sid("new");
    let Ok(Some(_lock)) = core.lock_index(true, Wait::Once) else {
        panic!("the index lock is free");
    };
    if steps >= 1 {
        core.log_session_locked(&new, Some(Live::Unsure)).unwrap();
    }
    if steps >= 2 {
        let staged = dir.join(".staged");
        fs::write(&staged, session_file(&new)).unwrap();
        fs::hard_link(&staged, writer.path_of(&new)).unwrap();
        fs::remove_file(&staged).unwrap();
    }
    if steps >= 3 {
        core.log_session_locked(&new, Some(Live::Yes)).unwrap();
    }
    if steps >= 4 {
        let line = core.dir_marker().unwrap().line();
        let mut log = fs::OpenOptions::new()
            .append(true)
            .open(dir.join(INDEX_FILE_NAME))
            .unwrap();
        std::io::Write::write_all(&mut log, line.as_bytes()).unwrap();
    }
}

#[tokio::test]
async fn a_creator_killed_at_any_step_leaves_its_session_listed_once_linked() {
    for same_tick in [false, true] {
        for steps in 0..=4 {
            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path());
            for s in ["a", "b", "c"] {
                store.create(&sid(s)).await.unwrap();
            }
            // Read once, so this instance holds the index in memory.
            assert_eq!(walk(&store).await, ids(&["a", "b", "c"]));
            let frozen = same_tick.then(|| Frozen::at(&store));
            interrupted_create(dir.path(), steps);
            let linked = steps >= 2;
            let want = if linked {
                ids(&["a", "b", "c", "new"])
            } else {
                ids(&["a", "b", "c"])
            };
            let what = format!("{steps} steps, same tick {same_tick}");
            assert_eq!(walk(&store).await, want, "warm instance, {what}");
            assert_eq!(walk(&open(dir.path())).await, want, "new instance, {what}");
            drop(frozen);
            // The next writer is not held up by the one that died.
            let created = store.create(&sid("new")).await;
            match created {
                Ok(()) => assert!(!linked, "{what}"),
                Err(e) => assert_eq!(e.kind(), StoreErrorKind::AlreadyExists, "{what}"),
            }
            store.create(&sid("d")).await.unwrap();
            let all = ids(&["a", "b", "c", "d", "new"]);
            assert_eq!(walk(&store).await, all, "{what}");
            assert_eq!(walk(&open(dir.path())).await, all, "{what}");
        }
    }
}

/// A page lists what the index knows live without reading its file: the
/// file of a listed session, overwritten with something that is no
/// session (the directory does not change), is still listed by an
/// instance that never opened it.
#[tokio::test]
async fn a_page_reads_the_index_not_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create(&sid("a")).await.unwrap();
    // The first listing makes the index; creations afterwards record
    // themselves in it.
    assert_eq!(walk(&store).await, ids(&["a"]));
    for s in ["b", "c"] {
        store.create(&sid(s)).await.unwrap();
    }
    store.delete(&sid("b"), fence(1)).await.unwrap();
    let before = store.core.dir_marker().unwrap();
    fs::write(store.path_of(&sid("c")), "not a session\n").unwrap();
    assert_eq!(store.core.dir_marker().unwrap(), before);
    // The deletion is in the index too: "b" is left out unread.
    assert_eq!(walk(&open(dir.path())).await, ids(&["a", "c"]));
}

/// A deleter killed between its `?` line and its outcome line: its
/// deletion reached the file, the index says only `?`, and pages ask the
/// file.
#[tokio::test]
async fn a_deleter_cut_short_leaves_the_file_to_decide() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for s in ["a", "b", "c"] {
        store.create(&sid(s)).await.unwrap();
    }
    assert_eq!(walk(&store).await, ids(&["a", "b", "c"]));
    let b = sid("b");
    {
        let Ok(Some(_shared)) = store.core.lock_index(false, Wait::Once) else {
            panic!("the index lock is free");
        };
        store
            .core
            .log_session_locked(&b, Some(Live::Unsure))
            .unwrap();
    }
    let mut deletion = deletion_line(&fence_json(Some((1, "o"))), 2);
    push_commit(&mut deletion, 0);
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(store.path_of(&b))
        .unwrap();
    std::io::Write::write_all(&mut file, deletion.as_bytes()).unwrap();
    assert_eq!(walk(&store).await, ids(&["a", "c"]), "warm instance");
    assert_eq!(
        walk(&open(dir.path())).await,
        ids(&["a", "c"]),
        "new instance"
    );
    // And the check was recorded: a later page needs no file for it.
    let log = fs::read_to_string(dir.path().join(INDEX_FILE_NAME)).unwrap();
    assert!(
        log.ends_with("-\"b\"\n") || log.contains("-\"b\"\n"),
        "{log}"
    );
}

/// Deletions and creations over a deleted session's file whose process
/// dies right after the change, before its outcome line: listings follow
/// the files.
#[tokio::test]
async fn changes_whose_outcome_was_never_logged_are_listed_as_made() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for s in ["a", "b", "c"] {
        store.create(&sid(s)).await.unwrap();
    }
    assert_eq!(walk(&store).await, ids(&["a", "b", "c"]));
    store.delete(&sid("c"), fence(1)).await.unwrap();
    assert_eq!(walk(&store).await, ids(&["a", "b"]));
    store.core.skip_outcomes.store(true, Ordering::Relaxed);
    store.delete(&sid("b"), fence(1)).await.unwrap();
    store.create(&sid("c")).await.unwrap();
    store.core.skip_outcomes.store(false, Ordering::Relaxed);
    assert_eq!(walk(&store).await, ids(&["a", "c"]), "warm instance");
    assert_eq!(
        walk(&open(dir.path())).await,
        ids(&["a", "c"]),
        "new instance"
    );
}

/// Files copied in by hand (or by a version of the store that kept no
/// index), then sessions created through the store: the copies stay
/// listed, the creations do not mark over them.
#[tokio::test]
async fn a_session_file_put_there_behind_the_index_stays_listed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create(&sid("a")).await.unwrap();
    assert_eq!(walk(&store).await, ids(&["a"]));
    let long = sid(&format!("long-{}", "z".repeat(200)));
    for s in [sid("b"), long.clone()] {
        fs::write(store.path_of(&s), session_file(&s)).unwrap();
    }
    store.create(&sid("c")).await.unwrap();
    let want = vec![sid("a"), sid("b"), sid("c"), long.clone()];
    assert_eq!(walk(&store).await, want);
    assert_eq!(walk(&open(dir.path())).await, want);
    // And one removed behind its back is not.
    fs::remove_file(store.path_of(&sid("b"))).unwrap();
    store.create(&sid("d")).await.unwrap();
    let want = vec![sid("a"), sid("c"), sid("d"), long];
    assert_eq!(walk(&store).await, want);
}

/// A deleted session's file put back from a backup taken before the
/// deletion, with the directory's modification time restored as `tar`
/// or `rsync -a` leave it: the index is not trusted (the change time
/// moved), so the session is listed again.
#[tokio::test]
async fn a_file_restored_with_its_times_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for s in ["a", "b"] {
        store.create(&sid(s)).await.unwrap();
    }
    let b = store.path_of(&sid("b"));
    let backup = fs::read(&b).unwrap();
    store.delete(&sid("b"), fence(1)).await.unwrap();
    assert_eq!(walk(&store).await, ids(&["a"]));
    let mtime = fs::metadata(dir.path()).unwrap().modified().unwrap();
    fs::remove_file(&b).unwrap();
    fs::write(&b, &backup).unwrap();
    fs::File::open(dir.path())
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(fs::metadata(dir.path()).unwrap().modified().unwrap(), mtime);
    assert_eq!(walk(&store).await, ids(&["a", "b"]), "warm instance");
    assert_eq!(
        walk(&open(dir.path())).await,
        ids(&["a", "b"]),
        "new instance"
    );
}

/// Rewrites the log in place with `text`, its `{m}` a marker matching the
/// directory as it is afterwards: a log that would be trusted were it not
/// for what `text` says.
fn forge_log(store: &JsonlStore, text: &str) {
    let path = store.dir().join(INDEX_FILE_NAME);
    fs::write(&path, "").unwrap();
    let m = store.core.dir_marker().unwrap();
    fs::write(&path, text.replace("{m}", &m.line())).unwrap();
    assert_eq!(store.core.dir_marker().unwrap(), m);
}

#[tokio::test]
async fn a_log_lost_torn_or_of_another_boot_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for s in ["a", "b", "c"] {
        store.create(&sid(s)).await.unwrap();
    }
    assert_eq!(walk(&store).await, ids(&["a", "b", "c"]));
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot = boot.trim();
    // Each log lacks "b" and would be trusted but for its flaw.
    let flawed = [
        // Written before a reboot that lost its last lines.
        format!(
            "session-index 2 {}\n+\"a\"\n+\"c\"\n{{m}}",
            "0".repeat(boot.len())
        ),
        // Torn: a line that was never finished, glued to the next.
        format!("session-index 2 {boot}\n+\"a\"\n+\"b+\"c\"\n{{m}}"),
        // Not a log.
        format!("session-index 2 {boot}\n+\"a\"\n?\n+\"c\"\n{{m}}"),
        // Nothing at all.
        String::new(),
    ];
    for text in flawed {
        forge_log(&store, &text);
        assert_eq!(
            walk(&open(dir.path())).await,
            ids(&["a", "b", "c"]),
            "{text}"
        );
    }
    // The same log without a flaw is trusted: what the cases above test
    // is the flaw.
    forge_log(
        &store,
        &format!("session-index 2 {boot}\n+\"a\"\n+\"c\"\n{{m}}"),
    );
    assert_eq!(walk(&open(dir.path())).await, ids(&["a", "c"]));

    fs::remove_file(dir.path().join(INDEX_FILE_NAME)).unwrap();
    assert_eq!(walk(&open(dir.path())).await, ids(&["a", "b", "c"]));
    assert!(dir.path().join(INDEX_FILE_NAME).exists());
}

#[tokio::test]
async fn reclaimed_sessions_leave_the_index_and_a_long_log_is_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create(&sid("keep")).await.unwrap();
    // Enough churn to pass the compaction threshold.
    let n = COMPACT_SLACK as usize;
    for round in 0..3 {
        for i in 0..n {
            let s = sid(&format!("gone-{round}-{i:04}"));
            store.create(&s).await.unwrap();
            store.delete(&s, fence(1)).await.unwrap();
        }
        let report = store.reclaim_deleted(Duration::ZERO).await.unwrap();
        assert_eq!(report.reclaimed.len(), n);
        assert_eq!(walk(&store).await, ids(&["keep"]));
    }
    // 3 × 64 ids created, deleted and removed: over 1,000 lines uncompacted.
    let log = fs::read_to_string(dir.path().join(INDEX_FILE_NAME)).unwrap();
    let lines = log.lines().count() as u64;
    assert!(lines <= 3 * COMPACT_SLACK, "{lines} lines");
    assert_eq!(walk(&open(dir.path())).await, ids(&["keep"]));
    // Still trusted after compacting: "keep" is listed unread.
    fs::write(store.path_of(&sid("keep")), "not a session\n").unwrap();
    assert_eq!(walk(&open(dir.path())).await, ids(&["keep"]));
}

#[tokio::test]
async fn advancing_the_generation_keeps_the_index_trusted() {
    use std::os::unix::fs::MetadataExt as _;
    let root = tempfile::tempdir().unwrap();
    let (dir, leases) = (root.path().join("store"), root.path().join("leases"));
    let opts = JsonlOptions::default()
        .fsync(FsyncPolicy::Never)
        .generation(super::GenerationCheck::witness(&leases));
    let store = JsonlStore::open(&dir, opts).unwrap();
    store.create(&sid("a")).await.unwrap();
    assert_eq!(walk(&store).await, ids(&["a"]));
    let inode = || fs::metadata(dir.join(INDEX_FILE_NAME)).unwrap().ino();
    let before = inode();
    store.advance_generation().await.unwrap();
    assert_eq!(walk(&store).await, ids(&["a"]));
    // Not rebuilt: a rebuild puts a new file in place.
    assert_eq!(inode(), before);
}
