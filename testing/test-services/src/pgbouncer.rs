//! A private PgBouncer in front of a [`PostgresServer`].

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::Controls;
use crate::ServiceError;
use crate::pgwire::{self, IO_TIMEOUT};
use crate::postgres::{self, POSTGRES_PASSWORD, POSTGRES_USER, PostgresServer};
use crate::process::{Binary, START_ATTEMPTS, ServerProcess, free_port};
use crate::unprivileged::{self, RunAs};

const BINARY: Binary = Binary {
    name: "pgbouncer",
    package: "pgbouncer",
    env_var: "MECATL_PGBOUNCER",
};

/// Where Debian installs it: off a non-root user's `PATH`.
const DEBIAN_PATH: &str = "/usr/sbin/pgbouncer";

/// PgBouncer on a free loopback port, pooling connections to one
/// [`PostgresServer`] in transaction mode (`pool_mode = transaction`): a
/// client holds a server connection for one transaction only, so
/// session-level state (`SET`, prepared statements, advisory locks held
/// past a transaction, `pg_backend_pid()`) does not follow the client from
/// one transaction to the next. Its configuration and auth file are in a
/// temporary directory; stopped and removed on drop. Clients log in as the
/// server's superuser with its password (SCRAM-SHA-256), every database of
/// the server passed through. Runs as `nobody` when the tests run as root
/// (PgBouncer refuses root).
///
/// It retries a failed login to the server after a second
/// (`server_login_retry = 1`, not 15), so it follows a server that was
/// killed and restarted within a test's patience. Otherwise PgBouncer's
/// defaults hold: a query sent while the server is down or paused waits for
/// a server connection up to `query_wait_timeout` (120 s), then the client
/// is disconnected; [`start_with`](Self::start_with) sets others.
#[derive(Debug)]
pub struct PgBouncer {
    process: ServerProcess,
    port: u16,
    binary: PathBuf,
    run_as: Option<RunAs>,
    // Dropped after the process.
    dir: TempDir,
}

impl PgBouncer {
    /// Starts a pooler in front of `server` (which must outlive it to be of
    /// use; the pooler holds no reference to it).
    pub fn start(server: &PostgresServer) -> Result<PgBouncer, ServiceError> {
        Self::start_with(server, &[])
    }

    /// [`start`](Self::start) with more settings of the `[pgbouncer]`
    /// section, each `(name, value)` written as `name = value` after the
    /// helper's own, which they override (`("query_wait_timeout", "2")`,
    /// `("default_pool_size", "1")`).
    pub fn start_with(
        server: &PostgresServer,
        settings: &[(&str, &str)],
    ) -> Result<PgBouncer, ServiceError> {
        let binary = find()?;
        let run_as = RunAs::when_root()?;
        let dir = tempfile::Builder::new()
            .prefix("pgbouncer-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for pgbouncer", e))?;
        if let Some(run_as) = run_as {
            run_as.own(dir.path())?;
        }
        let users = dir.path().join("userlist.txt");
        fs::write(
            &users,
            format!("\"{POSTGRES_USER}\" \"{POSTGRES_PASSWORD}\"\n"),
        )
        .map_err(|e| ServiceError::io(format!("write {}", users.display()), e))?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            write_config(dir.path(), port, server.port(), settings)?;
            if let Some(run_as) = run_as {
                run_as.own_file(&users)?;
                run_as.own_file(&dir.path().join(CONFIG))?;
            }
            match spawn(&binary, dir.path(), port, run_as) {
                Ok(process) => {
                    return Ok(PgBouncer {
                        process,
                        port,
                        binary,
                        run_as,
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

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://mecatl:PASSWORD@127.0.0.1:PORT/postgres`, through the
    /// pooler.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of `database` through the pooler.
    pub fn url_for(&self, database: &str) -> String {
        postgres::url(self.port, database)
    }

    /// The configuration file it runs with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join(CONFIG)
    }

    /// Kills the pooler with SIGKILL: every client connection breaks;
    /// [`restart`](Self::restart) brings it back.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the pooler (SIGTERM: at once, connections closed) and starts it
    /// again on the same port.
    pub fn restart(&mut self) -> Result<(), ServiceError> {
        self.process.stop(Duration::from_secs(10));
        self.process = spawn(&self.binary, self.dir.path(), self.port, self.run_as)?;
        Ok(())
    }
}

impl Controls for PgBouncer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }
}

const CONFIG: &str = "pgbouncer.ini";

/// `$MECATL_PGBOUNCER`, else `PATH`, else Debian's `/usr/sbin`.
fn find() -> Result<PathBuf, ServiceError> {
    match BINARY.find() {
        Err(e) if std::env::var_os(BINARY.env_var).is_none() => {
            let debian = Path::new(DEBIAN_PATH);
            if debian.is_file() {
                Ok(debian.to_path_buf())
            } else {
                Err(e)
            }
        }
        found => found,
    }
}

fn write_config(
    dir: &Path,
    port: u16,
    server_port: u16,
    settings: &[(&str, &str)],
) -> Result<(), ServiceError> {
    let users = dir.join("userlist.txt");
    let mut config = format!(
        "[databases]\n\
         * = host=127.0.0.1 port={server_port}\n\
         \n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         pool_mode = transaction\n\
         auth_type = scram-sha-256\n\
         auth_file = {users}\n\
         admin_users = {POSTGRES_USER}\n\
         logfile =\n\
         pidfile =\n\
         server_login_retry = 1\n\
         ignore_startup_parameters = extra_float_digits\n",
        users = users.display(),
    );
    for (name, value) in settings {
        if [name, value].iter().any(|s| s.contains(['\n', '\r'])) {
            return Err(ServiceError::io(
                "configure pgbouncer",
                std::io::Error::other(format!("a setting on more than one line: {name:?}")),
            ));
        }
        config.push_str(&format!("{name} = {value}\n"));
    }
    let path = dir.join(CONFIG);
    fs::write(&path, config).map_err(|e| ServiceError::io(format!("write {}", path.display()), e))
}

fn spawn(
    binary: &Path,
    dir: &Path,
    port: u16,
    run_as: Option<RunAs>,
) -> Result<ServerProcess, ServiceError> {
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir).arg(dir.join(CONFIG));
    unprivileged::apply(run_as, &mut cmd);
    ServerProcess::start(BINARY.name, cmd, &dir.join("pgbouncer.log"), || {
        asks_for_a_password(port)
    })
}

/// Whether the pooler answers a startup with an authentication request:
/// it listens and has read its configuration.
fn asks_for_a_password(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    if stream.set_read_timeout(Some(IO_TIMEOUT)).is_err() {
        return false;
    }
    pgwire::send_startup(&mut stream, POSTGRES_USER, "postgres").is_ok()
        && matches!(pgwire::read_message(&mut stream), Ok((b'R', _)))
}
