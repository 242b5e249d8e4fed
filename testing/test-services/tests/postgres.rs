//! A real PostgreSQL server and a real PgBouncer, spoken to by a real
//! client: data kept across a crash, a pause that silences every backend,
//! and a pooler that really pools per transaction. As root (CI's case) the
//! servers run as `nobody`.

use std::net::TcpStream;
use std::time::Duration;

use nix::sys::signal::kill;
use nix::unistd::Pid;
use test_services::{Controls, PgBouncer, PostgresServer};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // A zombie nobody reaps is gone in all that matters.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    state != Some("Z") && kill(Pid::from_raw(i32::try_from(pid).expect("pid")), None).is_ok()
}

/// The real user id of `pid`, unless it has exited.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e:?}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The values of the first column of every row `sql` returns (simple
/// query protocol: one round trip, nothing prepared, as a pooler in
/// transaction mode needs between transactions).
async fn column(client: &Client, sql: &str) -> Vec<String> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("NULL").to_owned()),
            _ => None,
        })
        .collect()
}

async fn one(client: &Client, sql: &str) -> String {
    let mut values = column(client, sql).await;
    assert_eq!(values.len(), 1, "{sql} returned {values:?}");
    values.remove(0)
}

#[tokio::test]
async fn postgres_stores_rows_a_real_client_reads_back() {
    let server = PostgresServer::start().expect("start postgres");
    assert!(server.url().starts_with("postgres://mecatl:"));
    let client = connect(&server.url()).await;
    client
        .batch_execute("CREATE TABLE lease (name text PRIMARY KEY, token bigint NOT NULL)")
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO lease VALUES ($1, $2), ($3, $4)",
            &[&"a", &1i64, &"b", &2i64],
        )
        .await
        .unwrap();
    let rows = client
        .query("SELECT name, token FROM lease ORDER BY name", &[])
        .await
        .unwrap();
    let got: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, [("a".to_owned(), 1), ("b".to_owned(), 2)]);
    // The helper's own query, over the Unix socket, sees the same.
    assert_eq!(
        server.query("SELECT count(*) FROM lease").unwrap(),
        [[Some("2".to_owned())]]
    );
}

#[tokio::test]
async fn postgres_asks_tcp_clients_for_the_password() {
    let server = PostgresServer::start().expect("start postgres");
    let wrong = server.url().replace(server.password(), "not-the-password");
    let err = tokio_postgres::connect(&wrong, NoTls)
        .await
        .err()
        .expect("a wrong password is refused");
    let message = format!("{err:?}");
    assert!(message.contains("28P01"), "{message}"); // invalid_password
    let client = connect(&server.url()).await;
    assert_eq!(
        one(
            &client,
            "SELECT auth_method FROM pg_hba_file_rules WHERE type = 'host' LIMIT 1"
        )
        .await,
        "scram-sha-256"
    );
}

#[tokio::test]
async fn postgres_keeps_committed_rows_across_a_crash_and_loses_the_rest() {
    let mut server = PostgresServer::start().expect("start postgres");
    let client = connect(&server.url()).await;
    client
        .batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    // Sent and not committed when the server dies.
    client
        .batch_execute("BEGIN; INSERT INTO t VALUES (2)")
        .await
        .unwrap();
    let processes = server.processes();
    assert!(
        processes.len() > 1,
        "a postmaster and its workers: {processes:?}"
    );
    server.kill();
    for pid in &processes {
        assert!(!alive(*pid), "postgres process {pid} outlived the kill");
    }
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "a killed server accepts"
    );
    assert!(client.simple_query("SELECT 1").await.is_err());
    server.restart().expect("restart after the crash");
    let client = connect(&server.url()).await;
    assert_eq!(column(&client, "SELECT v FROM t ORDER BY v").await, ["1"]);
}

#[tokio::test]
async fn postgres_shut_down_and_restarted_keeps_its_data_and_port() {
    let mut server = PostgresServer::start().expect("start postgres");
    let (url, addr) = (server.url(), server.addr());
    let url_of_app = server.create_database("app").expect("create a database");
    let app = connect(&url_of_app).await;
    assert_eq!(one(&app, "SELECT current_database()").await, "app");
    app.batch_execute("CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')")
        .await
        .unwrap();
    server.shutdown();
    assert!(server.processes().is_empty());
    assert!(TcpStream::connect(addr).is_err());
    server.restart().expect("restart");
    assert_eq!(server.url(), url);
    let app = connect(&url_of_app).await;
    assert_eq!(one(&app, "SELECT v FROM t").await, "kept");
    // A taken name is the server's error, not a panic.
    let err = server.create_database("app").expect_err("app exists");
    assert!(err.to_string().contains("42P04"), "{err}");
}

#[tokio::test]
async fn paused_postgres_answers_open_and_new_connections_only_after_resume() {
    let server = PostgresServer::start().expect("start postgres");
    let open = connect(&server.url()).await;
    assert_eq!(one(&open, "SELECT 1").await, "1");
    server.pause().unwrap();
    let stalled = tokio::time::timeout(Duration::from_millis(500), open.simple_query("SELECT 2"));
    assert!(
        stalled.await.is_err(),
        "a backend of a paused server answered"
    );
    let url = server.url();
    let new = tokio::time::timeout(
        Duration::from_millis(500),
        tokio_postgres::connect(&url, NoTls),
    );
    assert!(new.await.is_err(), "a paused server let a client log in");
    server.resume().unwrap();
    assert_eq!(one(&open, "SELECT 3").await, "3");
    let client = connect(&server.url()).await;
    assert_eq!(one(&client, "SELECT 4").await, "4");
}

#[test]
fn postgres_runs_unprivileged_and_dropping_it_stops_every_process_and_removes_its_directory() {
    let server = PostgresServer::start().expect("start postgres");
    let processes = server.processes();
    let (addr, dir) = (server.addr(), server.data_dir());
    assert!(dir.is_dir());
    assert!(
        server.bin_dir().join("initdb").is_file(),
        "{}",
        server.bin_dir().display()
    );
    let postmaster = uid_of(processes[0]).expect("the postmaster runs");
    if nix::unistd::Uid::effective().is_root() {
        assert_ne!(postmaster, 0, "the postmaster runs as root");
    }
    for pid in &processes {
        // A backend may have exited since it was listed.
        if let Some(uid) = uid_of(*pid) {
            assert_eq!(uid, postmaster, "postgres process {pid}");
        }
    }
    drop(server);
    for pid in &processes {
        assert!(!alive(*pid), "postgres process {pid} outlived the drop");
    }
    assert!(TcpStream::connect(addr).is_err(), "{addr} still accepts");
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

#[tokio::test]
async fn pgbouncer_passes_transactions_through_to_the_server() {
    let server = PostgresServer::start().expect("start postgres");
    let bouncer = PgBouncer::start(&server).expect("start pgbouncer");
    assert_ne!(bouncer.url(), server.url());
    assert_eq!(
        std::fs::read_to_string(bouncer.config_path())
            .unwrap()
            .lines()
            .find(|l| l.starts_with("pool_mode")),
        Some("pool_mode = transaction")
    );
    let mut client = connect(&bouncer.url()).await;
    // Inside a transaction the client keeps one server connection, so
    // prepared statements work there.
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    tx.execute("INSERT INTO t VALUES ($1), ($2)", &[&1i32, &2i32])
        .await
        .unwrap();
    let sum: i64 = tx
        .query_one("SELECT sum(v) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sum, 3);
    tx.commit().await.unwrap();
    assert_eq!(
        server.query("SELECT v FROM t ORDER BY v").unwrap(),
        [[Some("1".to_owned())], [Some("2".to_owned())]]
    );
    // A rolled-back transaction through the pooler leaves nothing.
    client
        .batch_execute("BEGIN; INSERT INTO t VALUES (3); ROLLBACK")
        .await
        .unwrap();
    assert_eq!(one(&client, "SELECT count(*) FROM t").await, "2");
}

/// In session mode each client keeps its server connection, and with it its
/// `pg_backend_pid()` and its `SET`s, for as long as it is connected. In
/// transaction mode a server connection goes back to the pool at every
/// commit: the next transaction of the same client may run on another
/// backend, and a `SET` made in one client's transaction is seen by
/// another client whose transaction lands on that backend.
#[tokio::test]
async fn pgbouncer_pools_per_transaction_so_session_state_does_not_follow_the_client() {
    let server = PostgresServer::start().expect("start postgres");
    let bouncer = PgBouncer::start(&server).expect("start pgbouncer");
    let a = connect(&bouncer.url()).await;
    let b = connect(&bouncer.url()).await;
    let mut swapped = None;
    for attempt in 0..20 {
        let name = format!("set-by-a-{attempt}");
        // Both in a transaction at once: two server connections.
        column(&a, "BEGIN").await;
        column(&a, &format!("SET application_name = '{name}'")).await;
        let a_pid = one(&a, "SELECT pg_backend_pid()").await;
        column(&b, "BEGIN").await;
        let b_pid = one(&b, "SELECT pg_backend_pid()").await;
        assert_ne!(a_pid, b_pid, "two open transactions share a backend");
        // b's connection back to the pool first, a's last.
        column(&b, "COMMIT").await;
        column(&a, "COMMIT").await;
        // b's next transaction, alone.
        let row = one(
            &b,
            "SELECT pg_backend_pid()::text || ' ' || current_setting('application_name')",
        )
        .await;
        let (pid, setting) = row.split_once(' ').expect("pid and setting");
        if pid != b_pid {
            assert_eq!(pid, a_pid, "b landed on a backend neither used");
            assert_eq!(setting, name, "a's SET stayed with its backend, not with a");
            eprintln!("b's transaction {attempt} ran on a's backend, with a's SET");
            swapped = Some(attempt);
            break;
        }
    }
    assert!(
        swapped.is_some(),
        "b kept its backend across 20 transactions: pgbouncer is pooling per session"
    );
}

#[tokio::test]
async fn pgbouncer_follows_a_server_that_crashed_and_came_back() {
    let mut server = PostgresServer::start().expect("start postgres");
    let bouncer = PgBouncer::start(&server).expect("start pgbouncer");
    let client = connect(&bouncer.url()).await;
    client
        .batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
        .await
        .unwrap();
    // Between transactions the client holds no server connection: the
    // crash breaks only the pooler's, and the client's survives it. (A
    // query sent while the server is down would wait for it, up to the
    // pooler's query_wait_timeout.)
    server.kill();
    server.restart().expect("restart postgres");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match client.simple_query("SELECT v FROM t").await {
            Ok(rows) => {
                let got: Vec<_> = rows
                    .into_iter()
                    .filter_map(|m| match m {
                        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                        _ => None,
                    })
                    .collect();
                assert_eq!(got, ["7"]);
                break;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the pooler never reached the restarted server: {e}"),
        }
    }
}

#[tokio::test]
async fn pgbouncer_takes_settings_and_fails_queries_while_its_server_is_down() {
    let mut server = PostgresServer::start().expect("start postgres");
    let bouncer =
        PgBouncer::start_with(&server, &[("query_wait_timeout", "1")]).expect("start pgbouncer");
    let client = connect(&bouncer.url()).await;
    assert_eq!(one(&client, "SELECT 1").await, "1");
    server.kill();
    // No server connection to be had: after a second the pooler gives up
    // on the query (and the client).
    let failed = tokio::time::timeout(Duration::from_secs(30), client.simple_query("SELECT 2"))
        .await
        .expect("the pooler answers within its query_wait_timeout");
    let err = failed.expect_err("no server to run it on");
    assert!(format!("{err:?}").contains("query_wait_timeout"), "{err:?}");
    server.restart().expect("restart postgres");
    // For server_login_retry (a second here) after its last failed login
    // the pooler turns clients away; then it serves again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let client = loop {
        match tokio_postgres::connect(&bouncer.url(), NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                match client.simple_query("SELECT 3").await {
                    Ok(_) => break client,
                    Err(e) if tokio::time::Instant::now() < deadline => drop(e),
                    Err(e) => panic!("the pooler never served again: {e:?}"),
                }
            }
            Err(e) if tokio::time::Instant::now() < deadline => drop(e),
            Err(e) => panic!("the pooler never let a client in again: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(one(&client, "SELECT 4").await, "4");
}

#[tokio::test]
async fn paused_pgbouncer_answers_only_after_resume() {
    let server = PostgresServer::start().expect("start postgres");
    let bouncer = PgBouncer::start(&server).expect("start pgbouncer");
    let client = connect(&bouncer.url()).await;
    bouncer.pause().unwrap();
    let stalled = tokio::time::timeout(Duration::from_millis(500), client.simple_query("SELECT 1"));
    assert!(stalled.await.is_err(), "a paused pooler answered");
    bouncer.resume().unwrap();
    assert_eq!(one(&client, "SELECT 2").await, "2");
}

#[test]
fn pgbouncer_runs_unprivileged_and_dropping_it_stops_it() {
    let server = PostgresServer::start().expect("start postgres");
    let mut bouncer = PgBouncer::start(&server).expect("start pgbouncer");
    bouncer.kill();
    bouncer.restart().expect("restart pgbouncer");
    let pid = bouncer.pid().expect("running");
    if nix::unistd::Uid::effective().is_root() {
        assert_ne!(uid_of(pid), Some(0), "pgbouncer runs as root");
    }
    let (addr, config) = (bouncer.addr(), bouncer.config_path());
    assert!(TcpStream::connect(addr).is_ok());
    drop(bouncer);
    assert!(!alive(pid), "pgbouncer {pid} outlived the drop");
    assert!(TcpStream::connect(addr).is_err(), "{addr} still accepts");
    assert!(!config.exists());
    // The server is untouched.
    assert_eq!(server.query("SELECT 1").unwrap(), [[Some("1".to_owned())]]);
}
