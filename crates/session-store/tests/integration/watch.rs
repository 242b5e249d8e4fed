//! The store's directory watch: one inotify instance per store instance,
//! whatever the number of waiters, waking waiters on what another
//! instance (another process's files and locks) writes, and closed with
//! the store.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::json;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

fn open(dir: &Path) -> JsonlStore {
    JsonlStore::open(dir, JsonlOptions::default().fsync(FsyncPolicy::Never)).unwrap()
}

fn fence(t: u64) -> WriteFence {
    WriteFence::new(FencingToken::new(t), OwnerId::new("writer").unwrap())
}

/// How many inotify instances of this process watch `dir` or a file in
/// it (by inode, so stores of other tests in this process do not count).
fn instances_watching(dir: &Path) -> usize {
    let mut inodes = vec![std::fs::metadata(dir).unwrap().ino()];
    inodes.extend(
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| Some(e.ok()?.metadata().ok()?.ino())),
    );
    let watched: Vec<String> = inodes.iter().map(|i| format!("ino:{i:x} ")).collect();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify")
        })
        .filter(|fd| {
            std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(fd.file_name()))
                .is_ok_and(|info| info.lines().any(|l| watched.iter().any(|w| l.contains(w))))
        })
        .count()
}

/// More waiters than the kernel's default 128 inotify instances per user:
/// with a watch per waiter, most would have fallen back to reading on an
/// interval (and starved every other process of the user of watches).
#[tokio::test]
async fn one_watch_serves_every_waiter_past_the_kernels_instance_limit() {
    const WAITERS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let (follower, writer) = (open(dir.path()), open(dir.path()));
    let sessions: Vec<SessionId> = (0..WAITERS)
        .map(|i| SessionId::new(format!("followed-{i}")).unwrap())
        .collect();
    for s in &sessions {
        writer.create(s).await.unwrap();
    }
    let waiters: Vec<_> = sessions
        .iter()
        .map(|s| {
            let (follower, s) = (follower.clone(), s.clone());
            tokio::spawn(async move {
                follower
                    .wait_for_append(&s, 0, Duration::from_secs(120))
                    .await
            })
        })
        .collect();
    // Every waiter is registered once it has read its session empty; give
    // them the chance, then count.
    while waiters.iter().any(|w| !w.is_finished()) && !all_waiting(&follower, &sessions).await {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        instances_watching(dir.path()),
        1,
        "one instance for {WAITERS} waiters"
    );
    for s in &sessions {
        writer.append(s, fence(1), &[json!("hello")]).await.unwrap();
    }
    for w in waiters {
        assert!(w.await.unwrap().unwrap(), "a waiter missed its append");
    }
}

/// Whether every session still reads empty: the waiters, spawned before,
/// have then had the chance to subscribe and make their first read.
async fn all_waiting(store: &JsonlStore, sessions: &[SessionId]) -> bool {
    tokio::time::sleep(Duration::from_millis(50)).await;
    for s in sessions {
        if !store.read(s, 1, 1).await.unwrap().events.is_empty() {
            return false;
        }
    }
    true
}

#[tokio::test]
async fn dropping_the_store_closes_its_watch() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = SessionId::new("once-followed").unwrap();
    store.create(&s).await.unwrap();
    assert!(
        !store
            .wait_for_append(&s, 0, Duration::from_millis(10))
            .await
            .unwrap()
    );
    assert_eq!(instances_watching(dir.path()), 1);
    drop(store);
    // The watch's thread ends at the event its removal queues.
    let mut waited = Duration::ZERO;
    while instances_watching(dir.path()) > 0 {
        assert!(
            waited < Duration::from_secs(60),
            "the watch outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
}

#[cfg(feature = "cancel-requests")]
mod cancels {
    use super::*;

    /// The holder waits from before any request existed (no requests'
    /// directory yet); another instance's request wakes it, and a wait
    /// from that request's count waits for the next.
    #[tokio::test]
    async fn a_request_from_another_instance_wakes_the_holders_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (holder, other) = (open(dir.path()), open(dir.path()));
        let s = SessionId::new("cancelled").unwrap();
        holder.create(&s).await.unwrap();
        let waiting = {
            let (holder, s) = (holder.clone(), s.clone());
            tokio::spawn(async move {
                holder
                    .wait_for_cancel_request(&s, 0, Duration::from_secs(120))
                    .await
            })
        };
        other
            .request_cancel(&s, FencingToken::new(4))
            .await
            .unwrap();
        let request = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("woken by the request");
        assert_eq!((request.run, request.serial), (FencingToken::new(4), 1));

        let none = holder
            .wait_for_cancel_request(&s, 1, Duration::from_millis(50))
            .await
            .unwrap();
        assert_eq!(none, None, "no request after the first");
        let next = {
            let (holder, s) = (holder.clone(), s.clone());
            tokio::spawn(async move {
                holder
                    .wait_for_cancel_request(&s, 1, Duration::from_secs(120))
                    .await
            })
        };
        other
            .request_cancel(&s, FencingToken::new(4))
            .await
            .unwrap();
        let request = next.await.unwrap().unwrap().expect("woken by the second");
        assert_eq!(request.serial, 2);
        assert_eq!(instances_watching(dir.path()), 1);
    }
}

/// The store's directory put back from a copy (the old one renamed away,
/// another in its place): the watch on the old one ends, waiters read on
/// an interval meanwhile, and a new watch is then taken on the directory
/// now at the path. (What the instance reads there is the store's own
/// affair: its generation check is what notices a directory put back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_put_back_is_watched_again() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    let store = open(&dir);
    let s = SessionId::new("moved").unwrap();
    store.create(&s).await.unwrap();
    assert!(
        !store
            .wait_for_append(&s, 0, Duration::from_millis(10))
            .await
            .unwrap()
    );
    assert_eq!(instances_watching(&dir), 1);

    let copy = parent.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
        }
    }
    std::fs::rename(&dir, parent.path().join("old")).unwrap();
    std::fs::rename(&copy, &dir).unwrap();

    let patience = std::time::Instant::now() + Duration::from_secs(60);
    while instances_watching(&dir) == 0 {
        assert!(
            std::time::Instant::now() < patience,
            "the directory put back is never watched"
        );
        let _ = store
            .wait_for_append(&s, 0, Duration::from_millis(100))
            .await;
    }
}
