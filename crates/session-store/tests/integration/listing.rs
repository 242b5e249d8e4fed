//! Paged listing of the JSONL store, where it promises more than the
//! trait: pages are full until the last, however many deleted sessions
//! (whose files stay) lie between the live ones, and ids hashed into their
//! file names are read from the files' headers. Pages in id order, cursors
//! surviving concurrent creation and deletion and bad limits are the
//! `storeconformance` suite's (`conformance`).

use lease_port::{FencingToken, OwnerId, SessionId};
use session_store::{
    FsyncPolicy, JsonlOptions, JsonlStore, ListCursor, MAX_LIST_LIMIT, SessionStore, WriteFence,
};

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn fence() -> WriteFence {
    WriteFence::new(FencingToken::new(1), OwnerId::new("lister").unwrap())
}

fn open(dir: &std::path::Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

/// Every page of the listing, `limit` sessions at a time.
async fn walk(store: &dyn SessionStore, limit: usize) -> Vec<Vec<SessionId>> {
    let mut pages = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let page = store.list_page(after.as_ref(), limit).await.unwrap();
        assert!(page.sessions.len() <= limit);
        let done = page.next.is_none();
        if let Some(next) = &page.next {
            assert_eq!(Some(next.last()), page.sessions.last());
            // The cursor travels as text.
            after = Some(ListCursor::decode(&next.encode()).unwrap());
        }
        pages.push(page.sessions);
        if done {
            return pages;
        }
    }
}

#[tokio::test]
async fn pages_are_full_until_the_last_past_deleted_and_hashed_ids() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // Plain names, names needing escapes, and ids long enough to be hashed
    // into their file names (so their ids come from the files' headers).
    let mut ids: Vec<SessionId> = (0..23).map(|i| sid(&format!("s-{i:02}"))).collect();
    ids.push(sid("Upper Case/é"));
    ids.push(sid(&format!("long-{}", "x".repeat(200))));
    ids.push(sid(&format!("a-long-{}", "y".repeat(200))));
    for id in &ids {
        store.create(id).await.unwrap();
    }
    // Deleted sessions keep their files but are not listed.
    for gone in ["s-03", "s-04", "s-05", "s-06", "s-07", "s-08", "s-09"] {
        store.delete(&sid(gone), fence()).await.unwrap();
        ids.retain(|i| i.as_str() != gone);
    }
    ids.sort();
    for limit in [1, 2, 3, 5, 19, ids.len(), ids.len() + 1, MAX_LIST_LIMIT] {
        let pages = walk(&store, limit).await;
        let flat: Vec<SessionId> = pages.concat();
        assert_eq!(flat, ids, "limit {limit}");
        // Full pages until the last; a listing that fits one page says so.
        for page in &pages[..pages.len() - 1] {
            assert_eq!(page.len(), limit);
        }
        assert!(!pages.last().unwrap().is_empty() || ids.is_empty());
    }
}

#[tokio::test]
async fn a_run_of_deleted_sessions_longer_than_a_page_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for i in 0..40 {
        store.create(&sid(&format!("d-{i:02}"))).await.unwrap();
    }
    for i in 0..37 {
        store
            .delete(&sid(&format!("d-{i:02}")), fence())
            .await
            .unwrap();
    }
    let first = store.list_page(None, 2).await.unwrap();
    assert_eq!(first.sessions, vec![sid("d-37"), sid("d-38")]);
    let rest = store.list_page(first.next.as_ref(), 2).await.unwrap();
    assert_eq!(rest.sessions, vec![sid("d-39")]);
    assert!(rest.next.is_none());
}

/// Set in the child process of the test below: the directory it creates
/// sessions in until it is killed.
const CREATOR_DIR: &str = "SESSION_STORE_LISTING_CREATOR_DIR";

/// Every `*.jsonl` file's session in `dir`, sorted: what a listing must
/// show (the files are only ever created here, never deleted).
fn files_in(dir: &std::path::Path) -> Vec<SessionId> {
    let mut out: Vec<SessionId> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let stem = name.strip_suffix(session_store::FILE_SUFFIX)?;
            Some(sid(&session_filename::decode(stem).unwrap()))
        })
        .collect();
    out.sort();
    out
}

/// A process creating sessions is killed at arbitrary points of its
/// updates to the listing index, again and again: afterwards a walk lists
/// every session file exactly once, from an instance that had read the
/// index before and from a new one, and creating goes on.
#[tokio::test]
async fn a_creator_killed_mid_update_leaves_every_session_listed() {
    if let Ok(dir) = std::env::var(CREATOR_DIR) {
        // The child: create until killed.
        let store = open(std::path::Path::new(&dir));
        for i in 0.. {
            let _ = store
                .create(&sid(&format!("{}-{i:07}", std::process::id())))
                .await;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let warm = open(dir.path());
    warm.create(&sid("first")).await.unwrap();
    assert_eq!(walk(&warm, 7).await.concat(), vec![sid("first")]);
    for round in 0..6u64 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "listing::a_creator_killed_mid_update_leaves_every_session_listed",
                "--exact",
            ])
            .env(CREATOR_DIR, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait until it is creating, then a little more each round, so
        // the kill lands in different places.
        let before = files_in(dir.path()).len();
        while files_in(dir.path()).len() < before + 20 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(round * 3)).await;
        child.kill().unwrap();
        child.wait().unwrap();
        let want = files_in(dir.path());
        assert_eq!(walk(&warm, 7).await.concat(), want, "round {round}, warm");
        assert_eq!(
            walk(&open(dir.path()), 7).await.concat(),
            want,
            "round {round}, new"
        );
        let next = sid(&format!("after-{round}"));
        warm.create(&next).await.unwrap();
        assert!(walk(&warm, 7).await.concat().contains(&next));
    }
}

/// Set in the child process of the test below: the read-only store
/// directory it lists, and the sessions it must find there.
const READER_DIR: &str = "SESSION_STORE_LISTING_READ_ONLY_DIR";
const READER_WANT: &str = "SESSION_STORE_LISTING_READ_ONLY_WANT";

/// The child: checks that it cannot write the directory, then lists it
/// twice (the second walk from what the first built).
async fn list_read_only(dir: &str) {
    let dir = std::path::Path::new(dir);
    let probe = dir.join(".probe");
    assert!(
        std::fs::write(&probe, "").is_err(),
        "the reader can write the directory"
    );
    let want: Vec<SessionId> = std::env::var(READER_WANT)
        .unwrap()
        .split(',')
        .map(sid)
        .collect();
    let store = open(dir);
    assert_eq!(walk(&store, 2).await.concat(), want, "first walk");
    assert_eq!(walk(&store, 2).await.concat(), want, "second walk");
}

/// Lists a store directory nobody may write, in a process of its own:
/// one that never had an index, one whose index went stale (a file copied
/// in), one whose index was current. Where permission bits do not stop
/// this process from writing (root), the reader runs as the unprivileged
/// user 65534 and the store's files are given to it.
#[tokio::test]
async fn a_read_only_directory_is_listed() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if let Ok(dir) = std::env::var(READER_DIR) {
        return list_read_only(&dir).await;
    }
    for case in ["no index", "stale index", "current index"] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("store");
        let store = open(&dir);
        for s in ["a", "b", "c"] {
            store.create(&sid(s)).await.unwrap();
        }
        store.delete(&sid("b"), fence()).await.unwrap();
        match case {
            "no index" => store.create(&sid("d")).await.unwrap(),
            "stale index" => {
                assert_eq!(walk(&store, 2).await.concat(), [sid("a"), sid("c")]);
                // A copy of a session file, put there behind the index.
                let other = tempfile::tempdir().unwrap();
                let twin = open(other.path());
                twin.create(&sid("d")).await.unwrap();
                std::fs::copy(twin.path_of(&sid("d")), store.path_of(&sid("d"))).unwrap();
            }
            _ => {
                assert_eq!(walk(&store, 2).await.concat(), [sid("a"), sid("c")]);
                store.create(&sid("d")).await.unwrap();
            }
        }
        drop(store);
        let has_index = dir.join(".session-index").exists();
        assert_eq!(has_index, case != "no index", "{case}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        let privileged = std::fs::write(dir.join(".probe"), "").is_ok();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args(["listing::a_read_only_directory_is_listed", "--exact"])
            .env(READER_DIR, &dir)
            .env(READER_WANT, "a,c,d");
        if privileged {
            std::fs::remove_file(dir.join(".probe")).unwrap();
            let nobody = 65534;
            std::os::unix::fs::chown(&dir, Some(nobody), Some(nobody)).unwrap();
            for entry in std::fs::read_dir(&dir).unwrap() {
                std::os::unix::fs::chown(entry.unwrap().path(), Some(nobody), Some(nobody))
                    .unwrap();
            }
            std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            child.uid(nobody).gid(nobody);
        }
        let out = child.output().unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(
            out.status.success(),
            "{case}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ran = String::from_utf8_lossy(&out.stdout);
        assert!(ran.contains("1 passed"), "{case}: {ran}");
    }
}
