//! What the contract suite does not ask: renewals of many sessions in one
//! transaction, a database put back from an older copy, and bad
//! configuration.

use std::time::Duration;

use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use pglease::PgLease;
use test_services::PostgresServer;

const TTL: Duration = Duration::from_secs(5);

async fn client(url: String) -> PgLease {
    PgLease::builder(url)
        .ttl(TTL)
        .connect()
        .await
        .expect("connect to PostgreSQL")
}

/// The next transaction id the server will assign: every write
/// transaction takes one, reads take none.
fn next_xid(server: &PostgresServer) -> u64 {
    let rows = server
        .query("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
        .expect("read the next transaction id");
    rows[0][0]
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a transaction id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_renewals_are_one_transaction_not_a_hundred() {
    let server = PostgresServer::start().expect("start PostgreSQL");
    let leases = client(server.url()).await;
    let owner = OwnerId::new("replica-a").unwrap();
    let mut held = Vec::new();
    for i in 0..100 {
        let s = SessionId::new(format!("s{i}")).unwrap();
        held.push(leases.acquire(&s, &owner).await.unwrap());
    }

    let before = next_xid(&server);
    let renewed = leases.renew_many(&held).await;
    let batched = next_xid(&server) - before;
    assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");
    for (old, new) in held.iter().zip(&renewed) {
        let new = new.as_ref().unwrap();
        assert_eq!(
            (new.session_id(), new.token()),
            (old.session_id(), old.token())
        );
    }

    let before = next_xid(&server);
    for lease in &held {
        leases.renew(lease).await.unwrap();
    }
    let single = next_xid(&server) - before;
    assert_eq!(batched, 1, "renew_many took {batched} transactions");
    assert_eq!(single, 100, "single renewals took {single} transactions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_put_back_from_an_older_copy_is_refused_as_rewound() {
    let mut server = PostgresServer::start().expect("start PostgreSQL");
    let leases = client(server.url()).await;
    let (a, b) = (OwnerId::new("a").unwrap(), OwnerId::new("b").unwrap());
    let s = SessionId::new("chat").unwrap();
    leases
        .release(&leases.acquire(&s, &a).await.unwrap())
        .await
        .unwrap();

    // A copy taken now, before the grants the database will lose.
    server.shutdown();
    let copy = tempfile::tempdir().unwrap();
    copy_dir(&server.data_dir(), copy.path());
    server.restart().expect("restart PostgreSQL");
    let later = leases.acquire(&s, &b).await.unwrap();
    leases.release(&later).await.unwrap();
    let latest = leases.acquire(&s, &b).await.unwrap();

    // Put back: the copy's log and rows are both behind what the client saw.
    server.shutdown();
    std::fs::remove_dir_all(server.data_dir()).unwrap();
    copy_dir(copy.path(), &server.data_dir());
    server.restart().expect("restart PostgreSQL on the copy");
    let err = leases.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");
    let err = leases.renew(&latest).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Rewound, "{err}");
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

#[tokio::test]
async fn bad_configuration_is_invalid_before_any_connection() {
    for (url, prefix, ttl) in [
        ("not a url ::", "mecatl", TTL),
        ("postgres://127.0.0.1:1/x", "Bad-Prefix", TTL),
        ("postgres://127.0.0.1:1/x", "mecatl", Duration::ZERO),
    ] {
        let err = PgLease::builder(url)
            .table_prefix(prefix)
            .ttl(ttl)
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{url} {prefix}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_transient() {
    let err = PgLease::builder("postgres://u:p@127.0.0.1:1/x")
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err}");
}
