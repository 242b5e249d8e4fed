//! Real `mecated` processes sharing one store directory and leasing from a
//! real PostgreSQL (`--session-lease-postgres`) through PgBouncer in
//! transaction mode, the password read from a file, all started by
//! `test_services`.

#![cfg(feature = "postgres")]

use std::time::Duration;

use pglease::PgLease;
use test_services::{PgBouncer, PostgresServer};

use crate::support::*;

const TTL_SECS: u64 = 3;
const TTL: &str = "3s";

/// Not the default prefix, so the flag is exercised.
const TABLES: &str = "mecated_tests";

struct Postgres {
    _server: PostgresServer,
    _bouncer: PgBouncer,
    _dir: tempfile::TempDir,
    /// Through the pooler, with no password in it.
    url: String,
    password_file: String,
    password: String,
}

impl Postgres {
    fn start() -> Postgres {
        let server = PostgresServer::start().expect("start PostgreSQL");
        let bouncer = PgBouncer::start(&server).expect("start PgBouncer");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pg-password");
        std::fs::write(&file, format!("{}\n", server.password())).unwrap();
        Postgres {
            url: format!("postgres://{}@{}/postgres", server.user(), bouncer.addr()),
            password_file: file.to_str().unwrap().to_owned(),
            password: server.password().to_owned(),
            _server: server,
            _bouncer: bouncer,
            _dir: dir,
        }
    }

    fn flags(&self) -> Vec<&str> {
        vec![
            "--session-lease-postgres",
            &self.url,
            "--session-lease-postgres-password-file",
            &self.password_file,
            "--session-lease-postgres-table-prefix",
            TABLES,
        ]
    }

    /// A client of the same leases as the servers, to ask the database.
    async fn client(&self) -> PgLease {
        PgLease::builder(self.url.clone())
            .password(self.password.clone())
            .table_prefix(TABLES)
            .ttl(Duration::from_secs(TTL_SECS))
            .connect()
            .await
            .expect("PostgreSQL lease client")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_competitor_gets_409_naming_the_holder() {
    let pg = Postgres::start();
    let direct = pg.client().await;
    let backend = scenarios::Backend {
        flags: pg.flags(),
        ttl: TTL,
        flag: "--session-lease-postgres",
        direct: &direct,
    };
    scenarios::competitor_gets_409_naming_the_holder(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_is_taken_over_with_a_higher_token() {
    let pg = Postgres::start();
    let direct = pg.client().await;
    let backend = scenarios::Backend {
        flags: pg.flags(),
        ttl: TTL,
        flag: "--session-lease-postgres",
        direct: &direct,
    };
    scenarios::sigkill_mid_run_is_taken_over_with_a_higher_token(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_writes_are_refused() {
    let pg = Postgres::start();
    let direct = pg.client().await;
    let backend = scenarios::Backend {
        flags: pg.flags(),
        ttl: TTL,
        flag: "--session-lease-postgres",
        direct: &direct,
    };
    scenarios::a_paused_holders_late_writes_are_refused(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fenced_by_another_authority_refuses_postgres() {
    let pg = Postgres::start();
    let direct = pg.client().await;
    let backend = scenarios::Backend {
        flags: pg.flags(),
        ttl: TTL,
        flag: "--session-lease-postgres",
        direct: &direct,
    };
    scenarios::a_store_fenced_by_another_authority_refuses_it(&backend).await;
}
