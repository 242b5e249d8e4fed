//! The JSONL store on a temporary directory, where it differs from any
//! other store: file safety, crash safety (torn, truncated and damaged
//! files, format 1), marks written before writers were recorded, locks
//! held by other processes, the authority record on disk, reclaiming
//! deleted sessions, and a model check of owners pausing and resuming
//! through store instances of their own (each with its own caches and
//! open file descriptions, as another process has). The rules every store
//! keeps are the `storeconformance` suite's (`conformance`).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lease_port::{AuthorityId, FencingToken, ManualClock, OwnerId, SessionId, SessionLease};
use memlease::MemLease;
use serde_json::{Value, json};
use session_store::{
    DEFAULT_LEASE_DIR_NAME, FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, StoreError,
    StoreErrorKind, WriteFence,
};

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

/// Token `t` of its one holder (each token here has exactly one).
fn tok(t: u64) -> WriteFence {
    WriteFence::new(
        FencingToken::new(t),
        OwnerId::new(format!("holder-of-{t}")).unwrap(),
    )
}

fn opts() -> JsonlOptions {
    JsonlOptions::default().fsync(FsyncPolicy::Never)
}

fn open(dir: &Path) -> JsonlStore {
    JsonlStore::open(dir, opts()).unwrap()
}

async fn all(store: &JsonlStore, s: &SessionId) -> Vec<(u64, Option<u64>, Value)> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read(s, from, 2).await.unwrap();
        out.extend(
            page.events
                .into_iter()
                .map(|e| (e.seq, e.token.map(FencingToken::get), e.payload)),
        );
        match page.next_seq {
            Some(n) => from = n,
            None => return out,
        }
    }
}

/// The JSONL store brings no leases of its own: a server keeps
/// `flocklease` files in the directory it names.
#[tokio::test]
async fn the_store_offers_no_leases_and_names_its_lease_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert!(store.session_lease().is_none());
    assert_eq!(store.lease_dir(), dir.path().join(DEFAULT_LEASE_DIR_NAME));
}

#[tokio::test]
async fn files_are_private_and_links_are_not_followed() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("store");
    let store = open(&dir);
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let s = sid("s");
    store.create(&s).await.unwrap();
    let path = store.path_of(&s);
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A symbolic link where a session file should be: refused, not followed.
    let target = base.path().join("elsewhere");
    fs::write(&target, "").unwrap();
    let linked = sid("linked");
    std::os::unix::fs::symlink(&target, store.path_of(&linked)).unwrap();
    let err = store
        .append(&linked, tok(1), &[json!(1)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert_eq!(fs::read(&target).unwrap(), b"");
    assert_eq!(store.list().await.unwrap(), vec![s]);

    // A store directory that is a link or a file is refused.
    let link_dir = base.path().join("link");
    std::os::unix::fs::symlink(&dir, &link_dir).unwrap();
    let err = JsonlStore::open(&link_dir, opts()).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid);
    let err = JsonlStore::open(&target, opts()).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid);
}

#[tokio::test]
async fn a_torn_final_line_is_reported_ignored_and_cut_by_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = sid("s");
    store.create(&s).await.unwrap();
    store
        .append(&s, tok(1), &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let path = store.path_of(&s);
    let good = fs::read(&path).unwrap();
    // A crash in the middle of the next write.
    OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(br#"{"t":"e","seq":4,"token":7,"ts":1,"payl"#)
        .unwrap();

    // Both the store that wrote (cached) and a restarted one see it.
    for reader in [&store, &open(dir.path())] {
        let page = reader.read(&s, 1, 10).await.unwrap();
        assert_eq!(page.events.len(), 3);
        assert!(page.unfinished_write);
        // The torn line's token does not count.
        assert_eq!(
            reader.high_water(&s).await.unwrap(),
            Some(FencingToken::new(1))
        );
    }

    let fresh = open(dir.path());
    let r = fresh.append(&s, tok(1), &[json!(4)]).await.unwrap();
    assert_eq!(r.first_seq, 4);
    let bytes = fs::read(&path).unwrap();
    assert!(bytes.starts_with(&good));
    assert!(bytes.ends_with(b"\n"));
    for reader in [&store, &fresh] {
        let page = reader.read(&s, 1, 10).await.unwrap();
        assert!(!page.unfinished_write);
        assert_eq!(
            page.events
                .iter()
                .map(|e| e.payload.clone())
                .collect::<Vec<_>>(),
            vec![json!(1), json!(2), json!(3), json!(4)]
        );
    }
}

#[tokio::test]
async fn a_truncated_file_ends_earlier_and_a_headless_one_can_be_recreated() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = sid("s");
    store.create(&s).await.unwrap();
    store
        .append(&s, tok(1), &[json!(1), json!(2)])
        .await
        .unwrap();
    store.append(&s, tok(2), &[json!(3)]).await.unwrap();
    let path = store.path_of(&s);
    let len = fs::metadata(&path).unwrap().len();

    // Cut inside the last line: the file shrank under the cached store.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let page = store.read(&s, 1, 10).await.unwrap();
    assert_eq!(page.events.len(), 2);
    assert!(page.unfinished_write);
    assert_eq!(
        store.high_water(&s).await.unwrap(),
        Some(FencingToken::new(1))
    );
    let r = store.append(&s, tok(1), &[json!("3b")]).await.unwrap();
    assert_eq!(r.first_seq, 3);

    // Cut inside the header: the session is gone; create starts it again.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(7)
        .unwrap();
    for reader in [&store, &open(dir.path())] {
        assert_eq!(
            reader.read(&s, 1, 10).await.unwrap_err().kind(),
            StoreErrorKind::NotFound
        );
        assert!(reader.list().await.unwrap().is_empty());
    }
    store.create(&s).await.unwrap();
    store.append(&s, tok(1), &[json!("again")]).await.unwrap();
    assert_eq!(
        all(&open(dir.path()), &s).await,
        vec![(1, Some(1), json!("again"))]
    );
}

#[tokio::test]
async fn a_damaged_line_before_the_last_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = sid("s");
    store.create(&s).await.unwrap();
    for event in ["one", "two", "three"] {
        store.append(&s, tok(1), &[json!(event)]).await.unwrap();
    }
    // Lines: header, commit, then each event and its commit.
    let path = store.path_of(&s);
    let text = fs::read_to_string(&path).unwrap();
    let damage = |text: &str, from: &str| text.replacen(from, "\"tw\u{0}\"", 1);
    fs::write(&path, damage(&text, "\"two\"")).unwrap();
    let err = open(dir.path()).read(&s, 1, 10).await.unwrap_err();
    match err {
        StoreError::Corrupt { line, .. } => assert_eq!(line, Some(5)),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Damage confined to the last write cannot be told from a write torn by
    // a crash: it is a torn tail, and the earlier events stay readable.
    fs::write(&path, damage(&text, "\"three\"")).unwrap();
    let page = open(dir.path()).read(&s, 1, 10).await.unwrap();
    assert!(page.unfinished_write);
    assert_eq!(page.events.len(), 2);
    fs::write(&path, &text).unwrap();

    // A file whose header names another session (a hashed-name collision,
    // or a file copied under the wrong name) is refused too.
    let other = sid("other");
    fs::copy(store.path_of(&sid("s")), store.path_of(&other)).unwrap();
    fs::write(
        store.path_of(&sid("s")),
        "{\"t\":\"h\",\"v\":1,\"id\":\"s\",\"ts\":1}\n",
    )
    .unwrap();
    let err = open(dir.path())
        .append(&other, tok(1), &[json!(1)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
}

mod model {
    //! Random interleavings of two owners acquiring, appending, pausing
    //! (time passing without renewals) and resuming (writing with whatever
    //! lease value they last had), each through its own store instance.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(usize),
        Renew(usize),
        Append(usize),
        Pause(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0..2usize).prop_map(Op::Acquire),
            1 => (0..2usize).prop_map(Op::Renew),
            3 => (0..2usize).prop_map(Op::Append),
            1 => (1..25u64).prop_map(Op::Pause),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn the_store_never_accepts_a_token_below_one_it_accepted(ops in proptest::collection::vec(op(), 1..60)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let clock = ManualClock::new();
                let leases = MemLease::builder()
                    .ttl(Duration::from_secs(10))
                    .clock(Arc::new(clock.clone()))
                    .build();
                let owners = [OwnerId::new("a").unwrap(), OwnerId::new("b").unwrap()];
                let stores = [open(dir.path()), open(dir.path())];
                let s = sid("s");
                stores[0].create(&s).await.unwrap();
                let mut held = [None, None];
                let mut max_accepted: Option<u64> = None;
                let mut accepted = Vec::new();
                for op in ops {
                    match op {
                        Op::Acquire(i) => {
                            if let Ok(l) = leases.acquire(&s, &owners[i]).await {
                                held[i] = Some(l);
                            }
                        }
                        Op::Renew(i) => {
                            if let Some(l) = &held[i]
                                && let Ok(l) = leases.renew(l).await {
                                    held[i] = Some(l);
                                }
                        }
                        Op::Pause(secs) => clock.advance(Duration::from_secs(secs)),
                        Op::Append(i) => {
                            let Some(l) = &held[i] else { continue };
                            let t = l.token().get();
                            match stores[i].append(&s, l.into(), &[json!({"owner": i, "t": t})]).await {
                                Ok(_) => {
                                    prop_assert!(max_accepted.is_none_or(|m| t >= m),
                                        "accepted {t} after {max_accepted:?}");
                                    max_accepted = Some(max_accepted.map_or(t, |m| m.max(t)));
                                    accepted.push(t);
                                }
                                Err(StoreError::Fenced { presented, high_water, .. }) => {
                                    prop_assert_eq!(presented.get(), t);
                                    prop_assert!(t < high_water.get());
                                    prop_assert_eq!(Some(high_water.get()), max_accepted);
                                }
                                Err(e) => prop_assert!(false, "unexpected {e}"),
                            }
                        }
                    }
                }
                let events = all(&open(dir.path()), &s).await;
                let tokens: Vec<u64> = events.iter().map(|e| e.1.unwrap()).collect();
                prop_assert_eq!(tokens, accepted);
                Ok(())
            })?;
        }
    }
}

/// Another process's lock on a session file, from its own open file
/// description (as `flock` sees another process).
fn lock_elsewhere(store: &JsonlStore, s: &SessionId) -> nix::fcntl::Flock<fs::File> {
    let file = fs::File::open(store.path_of(s)).unwrap();
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap()
}

#[tokio::test]
async fn a_session_locked_elsewhere_is_busy_after_the_timeout_and_others_proceed() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        JsonlStore::open(dir.path(), opts().lock_timeout(Duration::from_millis(100))).unwrap();
    let (held, free) = (sid("held"), sid("free"));
    store.create(&held).await.unwrap();
    store.create(&free).await.unwrap();
    store
        .append(&held, tok(1), &[json!("before")])
        .await
        .unwrap();

    let holder = lock_elsewhere(&store, &held);
    let err = store
        .append(&held, tok(1), &[json!("x")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Busy);
    assert!(matches!(err, StoreError::Busy { ref path, .. } if *path == store.path_of(&held)));
    assert!(err.to_string().contains("retry"), "{err}");
    for err in [
        store.read(&held, 1, 10).await.unwrap_err(),
        store.delete(&held, tok(1)).await.unwrap_err(),
        store.high_water(&held).await.unwrap_err(),
        // A listing cannot tell whether the held session still exists.
        store.list().await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), StoreErrorKind::Busy);
    }
    // Every other session is untouched by the held lock.
    let r = store.append(&free, tok(1), &[json!("y")]).await.unwrap();
    assert_eq!(r.first_seq, 1);
    assert_eq!(all(&store, &free).await, vec![(1, Some(1), json!("y"))]);

    // Busy changed nothing; once the lock is released the session goes on.
    drop(holder);
    let r = store
        .append(&held, tok(1), &[json!("after")])
        .await
        .unwrap();
    assert_eq!(r.first_seq, 2);
    assert_eq!(
        all(&open(dir.path()), &held).await,
        vec![(1, Some(1), json!("before")), (2, Some(1), json!("after"))]
    );
}

#[tokio::test]
async fn a_current_thread_runtime_keeps_running_while_a_session_is_locked_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    // A deadline far beyond the test: the held call must wait, not fail.
    let store =
        JsonlStore::open(dir.path(), opts().lock_timeout(Duration::from_secs(600))).unwrap();
    let (held, free) = (sid("held"), sid("free"));
    store.create(&held).await.unwrap();
    store.create(&free).await.unwrap();

    let holder = lock_elsewhere(&store, &held);
    let waiting = tokio::spawn({
        let (store, held) = (store.clone(), held.clone());
        async move { store.append(&held, tok(1), &[json!("waited")]).await }
    });
    // Let the spawned call start: it must not take the only thread with it.
    tokio::task::yield_now().await;
    store
        .append(&free, tok(1), &[json!("meanwhile")])
        .await
        .unwrap();
    assert_eq!(
        all(&store, &free).await,
        vec![(1, Some(1), json!("meanwhile"))]
    );
    assert!(!waiting.is_finished());

    drop(holder);
    let r = waiting.await.unwrap().unwrap();
    assert_eq!((r.first_seq, r.last_seq), (1, 1));
    assert_eq!(store.list().await.unwrap(), vec![free, held]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_for_a_locked_session_leave_the_workers_free() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        JsonlStore::open(dir.path(), opts().lock_timeout(Duration::from_secs(600))).unwrap();
    let (held, free) = (sid("held"), sid("free"));
    store.create(&held).await.unwrap();
    store.create(&free).await.unwrap();

    let holder = lock_elsewhere(&store, &held);
    // More waiting calls than workers.
    let waiting: Vec<_> = (0..6)
        .map(|i| {
            let (store, held) = (store.clone(), held.clone());
            tokio::spawn(async move { store.append(&held, tok(1), &[json!(i)]).await })
        })
        .collect();
    let others = tokio::spawn({
        let (store, free) = (store.clone(), free.clone());
        async move {
            for i in 0..20 {
                store.append(&free, tok(1), &[json!(i)]).await.unwrap();
            }
        }
    });
    others.await.unwrap();
    assert_eq!(all(&store, &free).await.len(), 20);

    drop(holder);
    let mut seqs = Vec::new();
    for w in waiting {
        seqs.push(w.await.unwrap().unwrap().first_seq);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=6).collect::<Vec<_>>());
}

#[tokio::test]
async fn list_skips_files_that_are_not_readable_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, b) = (sid("a"), sid("b"));
    store.create(&a).await.unwrap();
    store.create(&b).await.unwrap();
    store.append(&b, tok(1), &[json!(1)]).await.unwrap();
    assert_eq!(store.list().await.unwrap(), vec![a.clone(), b.clone()]);

    // A stray file, a header naming a session of another file name, a
    // header that is not one, a good header followed by a damaged line, and
    // a damaged line added to a session the store already knows; files
    // that are no session files at all (in the lease directory, or not
    // `*.jsonl`).
    fs::write(dir.path().join("stray.jsonl"), "not json\n").unwrap();
    fs::create_dir(dir.path().join(DEFAULT_LEASE_DIR_NAME)).unwrap();
    fs::write(
        dir.path().join(DEFAULT_LEASE_DIR_NAME).join("x.jsonl"),
        "junk",
    )
    .unwrap();
    fs::write(dir.path().join("notes.txt"), "junk").unwrap();
    fs::write(
        store.path_of(&sid("elsewhere")),
        "{\"t\":\"h\",\"v\":1,\"id\":\"someone\",\"ts\":1}\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("event-first.jsonl"),
        "{\"t\":\"e\",\"seq\":1}\n",
    )
    .unwrap();
    fs::write(
        store.path_of(&sid("damaged")),
        "{\"t\":\"h\",\"v\":1,\"id\":\"damaged\",\"ts\":1}\n{oops\n{\"t\":\"d\",\"token\":null,\"ts\":1}\n",
    )
    .unwrap();
    let c = sid("c");
    store.create(&c).await.unwrap();
    store.append(&c, tok(1), &[json!("first")]).await.unwrap();
    store.append(&c, tok(1), &[json!("second")]).await.unwrap();
    let text = fs::read_to_string(store.path_of(&c)).unwrap();
    let first = text.lines().find(|l| l.contains("first")).unwrap();
    fs::write(store.path_of(&c), text.replacen(first, "garbage", 1)).unwrap();

    for s in [store.clone(), open(dir.path())] {
        assert_eq!(s.list().await.unwrap(), vec![a.clone(), b.clone()]);
    }
    // The damaged sessions still say so when used directly.
    assert_eq!(
        store.read(&c, 1, 1).await.unwrap_err().kind(),
        StoreErrorKind::Corrupt
    );
    // Once repaired, a skipped session is listed again.
    fs::write(
        store.path_of(&c),
        "{\"t\":\"h\",\"v\":1,\"id\":\"c\",\"ts\":1}\n",
    )
    .unwrap();
    assert_eq!(open(dir.path()).list().await.unwrap(), vec![a, b, c]);
}

#[tokio::test]
async fn pages_are_bounded_by_bytes_as_well_as_count() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 2500;
    let store = JsonlStore::open(dir.path(), opts().max_page_bytes(budget)).unwrap();
    let s = sid("big");
    store.create(&s).await.unwrap();
    // Lines of about 1 KiB: two fit the budget, three do not.
    let kib = |c: char| json!(c.to_string().repeat(1000));
    store
        .append(
            &s,
            tok(1),
            &[kib('a'), kib('b'), kib('c'), kib('d'), kib('e')],
        )
        .await
        .unwrap();
    // One event larger than the whole budget still makes a page of one.
    store
        .append(&s, tok(1), &[json!("f".repeat(5000))])
        .await
        .unwrap();
    store.append(&s, tok(1), &[json!("g")]).await.unwrap();

    let mut pages = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read(&s, from, 100).await.unwrap();
        pages.push(page.events.iter().map(|e| e.seq).collect::<Vec<_>>());
        match page.next_seq {
            Some(n) => {
                assert_eq!(n, page.events.last().unwrap().seq + 1);
                from = n;
            }
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![vec![1, 2], vec![3, 4], vec![5], vec![6], vec![7]]
    );
    // The count limit still applies within the budget.
    let page = store.read(&s, 1, 1).await.unwrap();
    assert_eq!((page.events.len(), page.next_seq), (1, Some(2)));
    // The default budget leaves small pages to the count alone.
    let page = open(dir.path()).read(&s, 1, 100).await.unwrap();
    assert_eq!((page.events.len(), page.next_seq), (7, None));
}

/// A file written before lines named their writer: its mark has no
/// recorded writer, so an equal token is refused from everyone, while a
/// higher one is accepted and binds the mark to its writer.
#[tokio::test]
async fn a_mark_whose_writer_was_not_recorded_refuses_an_equal_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = sid("old");
    fs::write(
        store.path_of(&s),
        "{\"t\":\"h\",\"v\":1,\"id\":\"old\",\"ts\":1}\n\
         {\"t\":\"e\",\"seq\":1,\"token\":5,\"ts\":2,\"payload\":\"before\"}\n",
    )
    .unwrap();
    let err = store
        .append(&s, tok(5), &[json!("same")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced { high_water, high_water_owner: None, .. } if high_water.get() == 5
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not recorded"), "{err}");
    store.append(&s, tok(6), &[json!("after")]).await.unwrap();
    store.append(&s, tok(6), &[json!("again")]).await.unwrap();
    let other = WriteFence::new(FencingToken::new(6), OwnerId::new("other").unwrap());
    let err = open(dir.path())
        .append(&s, other, &[json!("twin")])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Fenced { high_water_owner: Some(o), .. } if o.as_str() == "holder-of-6"),
        "{err:?}"
    );
    assert_eq!(
        all(&store, &s).await,
        vec![
            (1, Some(5), json!("before")),
            (2, Some(6), json!("after")),
            (3, Some(6), json!("again"))
        ]
    );
}

fn authority(s: &str) -> AuthorityId {
    AuthorityId::new(s).unwrap()
}

/// Racing first bindings from several store instances (processes): one id
/// wins, every binder of it succeeds, every other fails naming it.
#[test]
fn racing_first_bindings_record_one_authority() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(6));
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let (dir, barrier) = (dir.path().to_owned(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    let store = open(&dir);
                    let offered = authority(&format!("auth-{}", i % 2));
                    barrier.wait();
                    (offered.clone(), rt.block_on(store.bind_authority(&offered)))
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let winner = rt
            .block_on(open(dir.path()).recorded_authority())
            .unwrap()
            .unwrap();
        for (offered, result) in results {
            match result {
                Ok(()) => assert_eq!(offered, winner),
                Err(StoreError::AuthorityMismatch { recorded, .. }) => {
                    assert_ne!(offered, winner);
                    assert_eq!(recorded, winner);
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        // Nothing but the record is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}

/// A damaged record is never taken for "no record": it is `Corrupt`, with
/// the file and what to do.
#[tokio::test]
async fn a_damaged_authority_record_is_corrupt_never_rebound() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.bind_authority(&authority("one")).await.unwrap();
    let record = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    assert_eq!(
        fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600
    );
    fs::write(&record, "{\"v\":1,\"auth").unwrap();
    for s in [&store, &open(dir.path())] {
        let err = s.bind_authority(&authority("two")).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
        assert!(
            err.to_string().contains(&*record.to_string_lossy()),
            "{err}"
        );
        let err = s.bind_authority(&authority("one")).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    }
}

/// Store instances of one process creating one session at once: one
/// creates it, the others find it exists — never an I/O error from two
/// creators sharing a temporary file name.
#[test]
fn racing_creators_in_one_process_never_share_a_temporary_file() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let s = sid(&format!("s{round}"));
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (dir, barrier, s) = (dir.path().to_owned(), Arc::clone(&barrier), s.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    let store = open(&dir);
                    barrier.wait();
                    rt.block_on(store.create(&s)).map_err(|e| e.kind())
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "{results:?}"
        );
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(()) | Err(StoreErrorKind::AlreadyExists))),
            "{results:?}"
        );
    }
}

/// A file of format 1 (no commit lines) is read as before; the next write
/// adds a framing line and frames itself; a garbage final line of either
/// kind is a torn tail, never `Corrupt`.
#[tokio::test]
async fn a_file_of_format_1_is_read_and_framed_from_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = sid("v1");
    let old = "{\"t\":\"h\",\"v\":1,\"id\":\"v1\",\"ts\":1}\n\
               {\"t\":\"e\",\"seq\":1,\"token\":2,\"ts\":2,\"payload\":\"old\"}\n";
    fs::write(store.path_of(&s), format!("{old}\u{0}\u{7}garbage\n")).unwrap();
    let page = store.read(&s, 1, 10).await.unwrap();
    assert!(page.unfinished_write);
    assert_eq!(page.events.len(), 1);

    store
        .append(&s, tok(3), &[json!("new"), json!("newer")])
        .await
        .unwrap();
    let text = fs::read_to_string(store.path_of(&s)).unwrap();
    assert!(text.starts_with(old), "{text}");
    let added: Vec<&str> = text[old.len()..].lines().collect();
    assert_eq!(added.len(), 4, "{text}");
    assert_eq!(added[0], "{\"t\":\"f\"}");
    assert!(added[3].starts_with("{\"t\":\"c\",\"n\":3,"), "{text}");
    let want = vec![
        (1, Some(2), json!("old")),
        (2, Some(3), json!("new")),
        (3, Some(3), json!("newer")),
    ];
    assert_eq!(all(&open(dir.path()), &s).await, want);

    // A later write torn by a crash (its commit missing) is cut, whole.
    let before = fs::read(store.path_of(&s)).unwrap();
    let next = "{\"t\":\"e\",\"seq\":4,\"token\":3,\"owner\":\"holder-of-3\",\"ts\":3,\"payload\":\"torn\"}\n";
    fs::write(store.path_of(&s), [&before[..], next.as_bytes()].concat()).unwrap();
    let fresh = open(dir.path());
    let page = fresh.read(&s, 1, 10).await.unwrap();
    assert!(page.unfinished_write);
    assert_eq!(page.events.len(), 3);
    fresh.append(&s, tok(3), &[json!("after")]).await.unwrap();
    let mut want = want;
    want.push((4, Some(3), json!("after")));
    assert_eq!(all(&open(dir.path()), &s).await, want);
}

/// `reclaim_deleted` removes the files of sessions deleted long enough
/// ago, and only those; what fencing needs (the mark and its writer, the
/// next sequence number) stays in the graveyard, so a re-created session
/// refuses old tokens — also through another store instance that had the
/// removed file open.
#[tokio::test]
async fn reclaimed_sessions_free_their_files_and_keep_their_marks() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let with_clock =
        || JsonlStore::open(dir.path(), opts().clock(Arc::new(clock.clone()))).unwrap();
    let store = with_clock();
    let (a, b, c) = (sid("a"), sid("b"), sid("c"));
    for s in [&a, &b, &c] {
        store.create(s).await.unwrap();
    }
    store
        .append(&a, tok(5), &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    store.delete(&a, tok(6)).await.unwrap();
    store.append(&b, tok(1), &[json!("live")]).await.unwrap();
    clock.advance(Duration::from_secs(7200));
    store.delete(&c, tok(1)).await.unwrap(); // deleted recently
    // Another process has a's file open, its view cached.
    let other = with_clock();
    assert_eq!(
        other.high_water(&a).await.unwrap(),
        Some(FencingToken::new(6))
    );

    let report = store
        .reclaim_deleted(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(report.reclaimed, vec![a.clone()]);
    assert!(report.bytes > 0);
    assert!(!store.path_of(&a).exists());
    assert!(store.path_of(&b).exists() && store.path_of(&c).exists());
    assert_eq!(store.list().await.unwrap(), vec![b.clone()]);
    // Nothing more to do the second time.
    let again = store
        .reclaim_deleted(Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(again.reclaimed.is_empty());

    // The mark survives, for every instance.
    for s in [&store, &other, &with_clock()] {
        assert_eq!(s.high_water(&a).await.unwrap(), Some(FencingToken::new(6)));
    }
    other.create(&a).await.unwrap();
    assert!(store.path_of(&a).exists());
    let err = other
        .append(&a, tok(5), &[json!("stale")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Fenced);
    let twin = WriteFence::new(FencingToken::new(6), OwnerId::new("twin").unwrap());
    let err = store.append(&a, twin, &[json!("twin")]).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Fenced);
    let r = store.append(&a, tok(6), &[json!("new")]).await.unwrap();
    assert_eq!(r.first_seq, 4, "sequence numbers are never reused");
    assert_eq!(
        all(&with_clock(), &a).await,
        vec![(4, Some(6), json!("new"))]
    );

    // Reclaimed again: the graveyard keeps the newest mark.
    store.delete(&a, tok(7)).await.unwrap();
    clock.advance(Duration::from_secs(7200));
    let report = other
        .reclaim_deleted(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(report.reclaimed, vec![a.clone(), c.clone()]);
    store.create(&a).await.unwrap();
    assert_eq!(
        with_clock().high_water(&a).await.unwrap(),
        Some(FencingToken::new(7))
    );
    let r = store.append(&a, tok(7), &[json!("newer")]).await.unwrap();
    assert_eq!(r.first_seq, 5);
}

/// A deleted session whose file is locked elsewhere is left for a later
/// run, never removed under its holder.
#[tokio::test]
async fn reclaiming_skips_a_session_locked_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = sid("held");
    store.create(&s).await.unwrap();
    store.delete(&s, tok(1)).await.unwrap();
    let holder = lock_elsewhere(&store, &s);
    let report = store.reclaim_deleted(Duration::ZERO).await.unwrap();
    assert!(report.reclaimed.is_empty());
    assert_eq!(report.busy, vec![s.clone()]);
    assert!(store.path_of(&s).exists());
    drop(holder);
    let report = store.reclaim_deleted(Duration::ZERO).await.unwrap();
    assert_eq!(report.reclaimed, vec![s]);
}
