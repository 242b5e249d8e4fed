//! Real `mecated` processes storing sessions in a real PostgreSQL
//! (`--store-postgres`), the password read from a file: with no lease flag
//! the same database leases the sessions (pglease's tables under the
//! store's prefix) and every append checks the live lease row; an explicit
//! `--session-lease-postgres` on the same tables turns the check on too,
//! other tables leave it off. The URL's TLS keys reach both.

#![cfg(feature = "postgres")]

use std::time::{Duration, Instant};

use pglease::PgLease;
use serde_json::json;
use test_services::PostgresServer;

use crate::support::*;

const TTL_SECS: u64 = 3;
const TTL: &str = "3s";

/// Not the default prefix, so the flag is exercised.
const TABLES: &str = "mecated_store";

struct Postgres {
    server: PostgresServer,
    _dir: tempfile::TempDir,
    /// With no password in it.
    url: String,
    password_file: String,
}

impl Postgres {
    fn start() -> Postgres {
        let server = PostgresServer::start().expect("start PostgreSQL");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pg-password");
        std::fs::write(&file, format!("{}\n", server.password())).unwrap();
        Postgres {
            url: format!("postgres://{}@{}/postgres", server.user(), server.addr()),
            password_file: file.to_str().unwrap().to_owned(),
            server,
            _dir: dir,
        }
    }

    /// The store flags, and nothing else: the store leases the sessions.
    fn flags(&self) -> Vec<&str> {
        vec![
            "--store-postgres",
            &self.url,
            "--store-postgres-password-file",
            &self.password_file,
            "--store-postgres-table-prefix",
            TABLES,
        ]
    }

    /// The store flags and explicit PostgreSQL leases under `prefix`.
    fn flags_with_leases<'a>(&'a self, prefix: &'a str) -> Vec<&'a str> {
        let mut flags = self.flags();
        flags.extend([
            "--session-lease-postgres",
            &self.url,
            "--session-lease-postgres-password-file",
            &self.password_file,
            "--session-lease-postgres-table-prefix",
            prefix,
        ]);
        flags
    }

    /// A client of the leases under `prefix`, to ask the database.
    async fn client(&self, prefix: &str) -> PgLease {
        PgLease::builder(self.url.clone())
            .password(self.server.password())
            .table_prefix(prefix)
            .ttl(Duration::from_secs(TTL_SECS))
            .connect()
            .await
            .expect("PostgreSQL lease client")
    }

    /// How many events of `session` the store's table holds.
    fn stored_events(&self, session: &str) -> usize {
        let rows = self
            .server
            .query(&format!(
                "SELECT count(*) FROM {TABLES}_events WHERE session_id = '{session}'"
            ))
            .expect("count the events");
        rows[0][0].as_deref().unwrap().parse().unwrap()
    }

    /// Hands `session`'s lease under `prefix` to another owner with a
    /// higher token, as a takeover the holder has not noticed yet would:
    /// once this commits, every append that checks the lease row sees it.
    fn take_over_behind_the_holders_back(&self, prefix: &str, session: &str) {
        let rows = self
            .server
            .query(&format!(
                "UPDATE {prefix}_leases SET owner = 'intruder', token = token + 1, \
                 expires_at = now() + interval '60 seconds' \
                 WHERE session_id = '{session}' AND expires_at > now() RETURNING token"
            ))
            .expect("take the lease over");
        assert_eq!(rows.len(), 1, "no live lease of {session} to take over");
    }
}

fn backend<'a>(pg: &'a Postgres, direct: &'a PgLease) -> scenarios::Backend<'a> {
    scenarios::Backend {
        flags: pg.flags(),
        ttl: TTL,
        flag: "--store-postgres",
        direct,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_gets_409_naming_the_holder() {
    let pg = Postgres::start();
    let direct = pg.client(TABLES).await;
    scenarios::competitor_gets_409_naming_the_holder(&backend(&pg, &direct)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_is_taken_over_with_a_higher_token() {
    let pg = Postgres::start();
    let direct = pg.client(TABLES).await;
    scenarios::sigkill_mid_run_is_taken_over_with_a_higher_token(&backend(&pg, &direct)).await;
}

/// The log lives in the database: a server started after the first one
/// stopped, on another store directory, reads it whole and continues it
/// under a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_log_survives_a_restart_of_the_server() {
    let pg = Postgres::start();
    let flags = [&["--session-lease-ttl", TTL][..], &pg.flags()].concat();
    let first_dir = tempfile::tempdir().unwrap();
    let mut first = Mecated::start(first_dir.path(), "proc-1", &flags);
    create(&first, "kept").await;
    let (status, before) = run(&first, "kept", json!("before")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{before}");
    let logged = events(&first, "kept").await;
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(first.wait_exit().success());

    let second_dir = tempfile::tempdir().unwrap();
    let second = Mecated::start(second_dir.path(), "proc-2", &flags);
    assert_eq!(events(&second, "kept").await, logged);
    let (status, after) = run(&second, "kept", json!("after")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{after}");
    assert!(
        after["token"].as_u64() > before["token"].as_u64(),
        "{before} then {after}"
    );
    let log = events(&second, "kept").await;
    assert_eq!(log[..logged.len()], logged[..]);
    assert_gapless(&log);
    let replies: Vec<_> = log
        .iter()
        .filter(|e| e["payload"]["type"] == "message" && e["payload"]["role"] == "assistant")
        .map(|e| e["payload"]["content"].clone())
        .collect();
    assert_eq!(replies, [json!("before"), json!("after")], "{log:?}");
}

/// Events of `session` written after its lease was taken over behind the
/// holder's back, while the holder `a` runs it: none when the store
/// checks the lease row, some when only its mark fences (the holder keeps
/// writing until its next renewal fails).
async fn writes_after_a_silent_takeover(pg: &Postgres, a: &Mecated, lease_prefix: &str) -> usize {
    create(a, "c").await;
    let pending = run_in_background(a, "c", json!("from a"));
    wait_for_event(a, "c", |e| e["payload"]["type"] == "progress").await;
    pg.take_over_behind_the_holders_back(lease_prefix, "c");
    let at_takeover = pg.stored_events("c");
    let result = pending.await.unwrap().unwrap();
    assert_eq!(result["status"], "lease_lost", "{result}");
    // Give the holder every chance to write late.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pg.stored_events("c") - at_takeover
}

/// The holder's next append after the takeover is refused, before the new
/// owner wrote anything: the store checked the live lease row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_checks_its_own_leases_in_every_append() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let flags = [&["--session-lease-ttl", TTL][..], &pg.flags()].concat();
    let a = Mecated::start(dir.path(), "proc-a", &slow(&flags));
    let late = writes_after_a_silent_takeover(&pg, &a, TABLES).await;
    assert_eq!(late, 0, "the holder wrote {late} events after the takeover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_leases_on_the_same_tables_are_checked_too() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        &["--session-lease-ttl", TTL][..],
        &pg.flags_with_leases(TABLES),
    ]
    .concat();
    let a = Mecated::start(dir.path(), "proc-a", &slow(&flags));
    let late = writes_after_a_silent_takeover(&pg, &a, TABLES).await;
    assert_eq!(late, 0, "the holder wrote {late} events after the takeover");
}

/// Leases named through a pooler in front of the store's database: the
/// URLs differ, the database is the same — the store's database records
/// the leases' authority — and the check is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_reached_through_a_pooler_are_still_checked() {
    let pg = Postgres::start();
    let pooler = test_services::PgBouncer::start(&pg.server).expect("start PgBouncer");
    let through_pooler = format!("postgres://{}@{}/postgres", pg.server.user(), pooler.addr());
    let dir = tempfile::tempdir().unwrap();
    let mut flags = vec!["--session-lease-ttl", TTL];
    flags.extend(pg.flags());
    flags.extend([
        "--session-lease-postgres",
        &through_pooler,
        "--session-lease-postgres-password-file",
        &pg.password_file,
        "--session-lease-postgres-table-prefix",
        TABLES,
    ]);
    let a = Mecated::start(dir.path(), "proc-a", &slow(&flags));
    let late = writes_after_a_silent_takeover(&pg, &a, TABLES).await;
    assert_eq!(late, 0, "the holder wrote {late} events after the takeover");
}

/// Leases in other tables cannot be read by the append: the check is off,
/// and only the holder's failed renewal stops its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_in_other_tables_are_not_checked() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let others = "other_leases";
    let flags = [
        &["--session-lease-ttl", TTL][..],
        &pg.flags_with_leases(others),
    ]
    .concat();
    let a = Mecated::start(dir.path(), "proc-a", &slow(&flags));
    let late = writes_after_a_silent_takeover(&pg, &a, others).await;
    assert!(late > 0, "no write after the takeover: was the check on?");
}

/// A run that writes a progress event every 50 ms for 30 s.
fn slow<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    [flags, &["--echo-delay", "30s", "--echo-steps", "600"]].concat()
}

/// A password file that cannot be read stops the start, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_password_file_is_refused_by_name() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-file");
    let missing = missing.to_str().unwrap();
    let args = [
        "--store-postgres",
        pg.url.as_str(),
        "--store-postgres-password-file",
        missing,
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let started = Instant::now();
    let stderr = refused_start(dir.path(), "proc-x", &args);
    assert!(stderr.contains("PostgreSQL password file"), "{stderr}");
    assert!(stderr.contains(missing), "{stderr}");
    assert!(started.elapsed() < PATIENCE);
}

/// `sslmode=verify-full` in the store's URL reaches the store and the
/// leases it brings: a server with the right CA serves runs, one given a
/// foreign CA refuses to start, saying the certificate is not trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_urls_tls_settings_reach_the_store_and_its_leases() {
    let pki = test_services::pki::Pki::new("mecated test CA");
    let server = PostgresServer::start_with_tls(&pki.issue("postgres")).expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let foreign = dir.path().join("foreign.pem");
    std::fs::write(&foreign, test_services::pki::Pki::new("another CA").ca_pem).unwrap();
    let url = |root: &std::path::Path| {
        format!(
            "postgres://{}:{}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
            server.user(),
            server.password(),
            server.port(),
            root.display()
        )
    };

    let trusted = url(&ca);
    let a = Mecated::start(dir.path(), "proc-a", &["--store-postgres", &trusted]);
    create(&a, "t").await;
    let (status, body) = run(&a, "t", json!("over tls")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    let rows = server
        .query(
            "SELECT count(*), bool_and(ssl) FROM pg_stat_activity JOIN pg_stat_ssl USING (pid) \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .unwrap();
    assert_ne!(rows[0][0].as_deref(), Some("0"), "no connection seen");
    assert_eq!(rows[0][1].as_deref(), Some("t"), "a connection without TLS");

    let untrusted = url(&foreign);
    let flags = ["--store-postgres", untrusted.as_str()];
    let args: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    let stderr = refused_start(dir.path(), "proc-b", &args);
    assert!(stderr.contains("is not trusted"), "{stderr}");
}

/// A run on one server is cancelled through another: the request is
/// recorded in the database and notified on its `LISTEN` connection, and
/// the holder stops the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_cancelled_through_another_server() {
    let pg = Postgres::start();
    let flags = [&["--session-lease-ttl", TTL][..], &pg.flags()].concat();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let long = [&flags[..], &["--echo-delay", "30s", "--echo-steps", "300"]].concat();
    let a = Mecated::start(dir_a.path(), "pg-a", &long);
    let b = Mecated::start(dir_b.path(), "pg-b", &flags);
    create(&a, "cancelled").await;
    let run = run_in_background(&a, "cancelled", json!("long"));
    wait_for_event(&a, "cancelled", |e| e["payload"]["type"] == "progress").await;

    let cancel = client()
        .delete(b.url("/v1/sessions/cancelled/runs/current"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), reqwest::StatusCode::ACCEPTED);
    let cancel: serde_json::Value = cancel.json().await.unwrap();
    assert_eq!(
        (&cancel["live"], &cancel["here"]),
        (&json!(true), &json!(false)),
        "{cancel}"
    );
    let result = run.await.unwrap().unwrap();
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["token"], cancel["token"], "{result}");
}
