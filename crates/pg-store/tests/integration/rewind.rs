//! A database that went back — rows put back by hand, the authority record
//! made anew, the whole cluster restored from an older copy — is refused
//! as `Rewound` by every store instance that saw the newer state, before
//! it writes.

use lease_port::AuthorityId;
use serde_json::json;
use session_store::{SessionStore, StoreErrorKind};

use crate::support::{fence, server, session, store};

/// A session row showing less than this instance saw (an older copy of
/// the row) refuses writes — one the older mark would accept too — and
/// reads; so does a row gone. A client started afterwards knows nothing
/// newer and takes the row as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_row_below_what_was_seen_is_refused() {
    let server = server();
    let store = store(&server.url()).await;
    let s = session("chat");
    store.create(&s).await.unwrap();
    store
        .append(&s, fence(5, "a"), &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    server
        .query("UPDATE mecatl_sessions SET last_seq = 1, mark = 2 WHERE session_id = 'chat'")
        .unwrap();
    let err = store
        .append(&s, fence(3, "old"), &[json!("stale")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("went back"), "{err}");
    for e in [
        store.read(&s, 1, 10).await.map(drop).unwrap_err(),
        store.high_water(&s).await.map(drop).unwrap_err(),
        store.delete(&s, fence(9, "a")).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), StoreErrorKind::Rewound, "{e}");
    }
    let count = server
        .query("SELECT count(*) FROM mecatl_events WHERE session_id = 'chat'")
        .unwrap();
    assert_eq!(count[0][0].as_deref(), Some("3"), "a refused write wrote");

    server
        .query("DELETE FROM mecatl_sessions WHERE session_id = 'chat'")
        .unwrap();
    let err = store.create(&s).await.unwrap_err();
    assert_eq!(
        err.kind(),
        StoreErrorKind::Rewound,
        "a vanished row was created afresh: {err}"
    );

    let fresh = crate::support::store(&server.url()).await;
    fresh.create(&s).await.unwrap();
}

/// A store instance that bound an authority refuses to write once the
/// record changed under it: written anew (the tables made again) or gone.
/// A fresh instance binds what it finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_record_made_anew_refuses_bound_writers() {
    let server = server();
    let bound = store(&server.url()).await;
    let a = AuthorityId::new("pg:test:a").unwrap();
    bound.bind_authority(&a).await.unwrap();
    let s = session("chat");
    bound.create(&s).await.unwrap();
    bound.append(&s, fence(1, "w"), &[json!(1)]).await.unwrap();

    server.query("DELETE FROM mecatl_store_authority").unwrap();
    let err = bound
        .append(&s, fence(1, "w"), &[json!(2)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("is gone"), "{err}");

    let other = store(&server.url()).await;
    other.bind_authority(&a).await.unwrap();
    let err = bound
        .append(&s, fence(1, "w"), &[json!(2)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    assert!(err.to_string().contains("written anew"), "{err}");
    let err = bound.bind_authority(&a).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    other.append(&s, fence(1, "w"), &[json!(2)]).await.unwrap();
    // Unbound instances, unfenced or not, are not held to a record.
    let unbound = store(&server.url()).await;
    unbound
        .append(&s, fence(1, "w"), &[json!(3)])
        .await
        .unwrap();
}

/// The whole cluster put back from a copy taken before the last writes:
/// the instance that saw them refuses (its log position and its floors are
/// ahead of the copy), for writes and reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_put_back_from_an_older_copy_is_refused() {
    let mut server = server();
    let store = store(&server.url()).await;
    let s = session("chat");
    store.create(&s).await.unwrap();
    store.append(&s, fence(1, "a"), &[json!(1)]).await.unwrap();

    tokio::task::block_in_place(|| server.shutdown());
    let copy = tempfile_dir();
    copy_dir(&server.data_dir(), &copy);
    tokio::task::block_in_place(|| server.restart().expect("restart PostgreSQL"));
    store
        .append(&s, fence(2, "b"), &[json!(2), json!(3)])
        .await
        .unwrap();
    store.append(&s, fence(3, "c"), &[json!(4)]).await.unwrap();

    tokio::task::block_in_place(|| {
        server.shutdown();
        std::fs::remove_dir_all(server.data_dir()).unwrap();
        copy_dir(&copy, &server.data_dir());
        server.restart().expect("restart PostgreSQL on the copy");
    });
    // The copy's mark is 1: b's stale token 2 would pass it.
    let err = store
        .append(&s, fence(2, "b"), &[json!("stale")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    let err = store.read(&s, 1, 10).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rewound, "{err}");
    let _ = std::fs::remove_dir_all(&copy);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "pg-store-copy-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir(&dir).unwrap();
    dir
}

/// `cp -a`: the server's files keep their owner (the unprivileged account
/// the server runs as) and modes.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}
