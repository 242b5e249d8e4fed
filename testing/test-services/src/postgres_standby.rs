//! A streaming standby of a [`PostgresServer`], for failovers that lose
//! the last commits.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::pgwire::Rows;
use crate::process::{READY_TIMEOUT, START_ATTEMPTS, ServerProcess, free_port};
use crate::unprivileged::{self, RunAs};
use crate::{
    Controls, FaultProxy, POSTGRES_PASSWORD, POSTGRES_USER, PostgresServer, ProxyMode, ServiceError,
};

/// What the standby connects to the primary as, and how the primary's
/// pg_hba lets it in (the superuser may replicate; SCRAM as every TCP
/// client of the primary).
const HBA_LINE: &str = "host replication mecatl 127.0.0.1/32 scram-sha-256";
const DATABASE: &str = "postgres";

/// A hot standby of a [`PostgresServer`] on a free loopback port of its
/// own, its cluster copied by `pg_basebackup` into a temporary directory
/// of its own, streaming the primary's WAL asynchronously; killed, with
/// every process of its, and removed on drop.
///
/// Its replication connection goes through a [`FaultProxy`], so
/// [`pause_replication`](Self::pause_replication) cuts it cleanly: the
/// proxy throws away what the primary sends, and nothing sent after the
/// pause can reach the standby later from a socket buffer (as it would
/// from one of a walreceiver merely stopped with SIGSTOP). Commits on the
/// primary after the pause are then what a failover to this standby
/// loses: [`promote`](Self::promote) after killing the primary.
///
/// Clients log in as on the primary (the cluster is a copy).
/// [`failover_url`](Self::failover_url) names both servers, read-write
/// only: clients reach the primary while it lives and this standby once
/// promoted, as through a virtual IP that moved.
#[derive(Debug)]
pub struct PostgresStandby {
    process: ServerProcess,
    port: u16,
    replication: FaultProxy,
    // Dropped after the process, as the primary's.
    dir: TempDir,
}

impl PostgresStandby {
    /// Lets the primary's superuser replicate from 127.0.0.1, copies the
    /// primary with `pg_basebackup` and starts the copy as a hot standby
    /// streaming from it. Returns once it answers queries.
    pub fn start(primary: &PostgresServer) -> Result<PostgresStandby, ServiceError> {
        allow_replication(primary)?;
        let run_as = RunAs::when_root()?;
        let dir = tempfile::Builder::new()
            .prefix("postgres-standby-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for the standby", e))?;
        if let Some(run_as) = run_as {
            run_as.own(dir.path())?;
        }
        base_backup(primary, dir.path(), run_as)?;
        let signal = dir.path().join("data").join("standby.signal");
        fs::write(&signal, "").map_err(|e| ServiceError::io("write standby.signal", e))?;
        if let Some(run_as) = run_as {
            run_as.own_file(&signal)?;
        }
        let replication = FaultProxy::start(primary.addr())?;
        let postgres = primary.bin_dir().join("postgres");
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let spawned = spawn(&postgres, dir.path(), port, replication.addr(), run_as);
            match spawned {
                Ok(process) => {
                    return Ok(PostgresStandby {
                        process,
                        port,
                        replication,
                        dir,
                    });
                }
                // Most likely the port was taken between choosing and
                // binding it.
                Err(e @ ServiceError::NotReady { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://mecatl:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{POSTGRES_USER}:{POSTGRES_PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// One URL naming the primary, then this standby, for servers that
    /// accept writes only (`target_session_attrs=read-write`): while the
    /// primary runs every connection reaches it; once it is gone and this
    /// standby is promoted, new connections reach the standby.
    pub fn failover_url(&self, primary: &PostgresServer) -> String {
        format!(
            "postgres://{POSTGRES_USER}:{POSTGRES_PASSWORD}@127.0.0.1:{},127.0.0.1:{}/{DATABASE}\
             ?target_session_attrs=read-write",
            primary.port(),
            self.port
        )
    }

    /// The standby's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `sql` as the superuser through the standby's Unix socket, as
    /// [`PostgresServer::query`] does.
    pub fn query(&self, sql: &str) -> Result<Rows, ServiceError> {
        crate::postgres::query(self.dir.path(), self.port, DATABASE, sql)
            .map_err(|e| ServiceError::io(format!("standby query {sql:?}"), e.into_io()))
    }

    /// Waits until the standby has replayed the primary's WAL up to the
    /// position the primary has written now: every commit answered so far
    /// is on the standby.
    pub fn wait_for_replay(&self, primary: &PostgresServer) -> Result<(), ServiceError> {
        let target = first(&primary.query("SELECT pg_current_wal_lsn()")?)
            .ok_or_else(|| not_done("the primary answered no log position"))?;
        let check = format!("SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if first(&self.query(&check)?).as_deref() == Some("t") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(not_done(format!(
                    "the standby did not replay up to {target} within {READY_TIMEOUT:?}"
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Cuts replication: from now on the standby receives nothing of the
    /// primary's, and commits there are missing here.
    pub fn pause_replication(&self) {
        self.replication.set_mode(ProxyMode::Blackhole);
    }

    /// Lets replication go on: the cut connection is closed and the
    /// standby connects again (within `wal_retrieve_retry_interval`).
    pub fn resume_replication(&self) {
        self.replication.set_mode(ProxyMode::Pass);
    }

    /// Promotes the standby (`pg_promote`) and returns once it accepts
    /// writes.
    pub fn promote(&self) -> Result<(), ServiceError> {
        let done = self.query(&format!(
            "SELECT pg_promote(true, {})",
            READY_TIMEOUT.as_secs()
        ))?;
        if first(&done).as_deref() != Some("t") {
            return Err(not_done(format!(
                "the standby was not promoted within {READY_TIMEOUT:?}"
            )));
        }
        Ok(())
    }

    /// The standby's processes now: the postmaster first, then the ones
    /// it started. Empty once killed.
    pub fn processes(&self) -> Vec<u32> {
        let Some(pid) = self.process.pid() else {
            return Vec::new();
        };
        let mut all = vec![pid];
        all.extend(crate::postgres::children_of(pid));
        all
    }

    /// Kills the standby with SIGKILL, every process of it, and waits
    /// until they are gone.
    pub fn kill(&mut self) {
        crate::postgres::kill_cluster(&mut self.process);
    }
}

impl Controls for PostgresStandby {
    fn process(&self) -> &ServerProcess {
        &self.process
    }
}

impl Drop for PostgresStandby {
    fn drop(&mut self) {
        self.kill();
    }
}

fn not_done(reason: impl Into<String>) -> ServiceError {
    ServiceError::io("run the standby", std::io::Error::other(reason.into()))
}

fn first(rows: &Rows) -> Option<String> {
    rows.first()?.first()?.clone()
}

/// Adds [`HBA_LINE`] to the primary's `pg_hba.conf` (once) and reloads it.
fn allow_replication(primary: &PostgresServer) -> Result<(), ServiceError> {
    let hba = primary.data_dir().join("pg_hba.conf");
    let text = fs::read_to_string(&hba)
        .map_err(|e| ServiceError::io(format!("read {}", hba.display()), e))?;
    if !text.lines().any(|l| l.trim() == HBA_LINE) {
        // Appended to the file as it is: its owner, the server's account,
        // stays.
        fs::OpenOptions::new()
            .append(true)
            .open(&hba)
            .and_then(|mut f| writeln!(f, "{HBA_LINE}"))
            .map_err(|e| ServiceError::io(format!("write {}", hba.display()), e))?;
    }
    primary.query("SELECT pg_reload_conf()")?;
    Ok(())
}

/// `pg_basebackup` of `primary` into `dir/data`, as the account the
/// standby will run as, so its files are that account's.
fn base_backup(
    primary: &PostgresServer,
    dir: &Path,
    run_as: Option<RunAs>,
) -> Result<(), ServiceError> {
    let binary = primary.bin_dir().join("pg_basebackup");
    let log_path = dir.join("pg_basebackup.log");
    let log = fs::File::create(&log_path)
        .map_err(|e| ServiceError::io(format!("create {}", log_path.display()), e))?;
    let err = log
        .try_clone()
        .map_err(|e| ServiceError::io("duplicate the log file", e))?;
    let mut cmd = Command::new(&binary);
    cmd.current_dir(dir)
        .arg("--pgdata")
        .arg(dir.join("data"))
        .args(["--host", "127.0.0.1", "--port"])
        .arg(primary.port().to_string())
        .args(["--username", POSTGRES_USER, "--no-password"])
        // The WAL written meanwhile streamed beside the copy: the copy
        // starts consistent without an archive.
        .args(["--wal-method=stream", "--checkpoint=fast", "--no-sync"])
        .env("PGPASSWORD", POSTGRES_PASSWORD)
        .env_remove("PGDATA")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    unprivileged::apply(run_as, &mut cmd);
    let status = cmd
        .status()
        .map_err(|e| ServiceError::io(format!("run {}", binary.display()), e))?;
    if status.success() {
        return Ok(());
    }
    Err(ServiceError::Command {
        what: format!("{} (log {})", binary.display(), log_path.display()),
        status,
        stderr: fs::read_to_string(&log_path).unwrap_or_default(),
    })
}

/// The standby on `port`, streaming through `upstream` (the replication
/// proxy); ready once it answers a query, which a hot standby does when
/// it reached a consistent state.
fn spawn(
    postgres: &Path,
    dir: &Path,
    port: u16,
    upstream: SocketAddr,
    run_as: Option<RunAs>,
) -> Result<ServerProcess, ServiceError> {
    let conninfo = format!(
        "host={} port={} user={POSTGRES_USER} password={POSTGRES_PASSWORD} \
         application_name=standby",
        upstream.ip(),
        upstream.port()
    );
    let mut cmd = Command::new(postgres);
    cmd.current_dir(dir)
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-p")
        .arg(port.to_string())
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        .arg("-c")
        .arg(format!("primary_conninfo={conninfo}"))
        .args(["-c", "hot_standby=on"])
        // As the primary: commits reach the kernel, not the disk.
        .args(["-c", "fsync=off"])
        .args(["-c", "shared_buffers=16MB"])
        .env_remove("PGDATA");
    unprivileged::apply(run_as, &mut cmd);
    ServerProcess::start("postgres", cmd, &dir.join("postgres.log"), || {
        crate::postgres::query(dir, port, DATABASE, "SELECT 1").is_ok()
    })
}
