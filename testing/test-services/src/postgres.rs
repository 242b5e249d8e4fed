//! A private PostgreSQL server.

use std::cmp::Reverse;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::Controls;
use crate::ServiceError;
use crate::pgwire::{self, IO_TIMEOUT, Rows};
use crate::process::{START_ATTEMPTS, ServerProcess, free_port};
use crate::unprivileged::{self, RunAs};

/// The Debian package that ships `initdb` and `postgres`.
const PACKAGE: &str = "postgresql";
/// Names the directory holding `initdb` and `postgres`, instead of the
/// newest `/usr/lib/postgresql/VERSION/bin`.
const BINDIR_ENV: &str = "MECATL_POSTGRES_BINDIR";
/// Where Debian puts each major version's server binaries, off `PATH`.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The superuser every [`PostgresServer`] is made with.
pub const POSTGRES_USER: &str = "mecatl";
/// Its password, asked (SCRAM-SHA-256) of every TCP client.
pub const POSTGRES_PASSWORD: &str = "mecatl-test-password";
/// The database a new server has besides the templates.
const DEFAULT_DATABASE: &str = "postgres";

/// How long a fast shutdown may take before the server is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long the processes of a killed server may take to be gone.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// The server binaries of one PostgreSQL installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binaries {
    pub(crate) initdb: PathBuf,
    pub(crate) postgres: PathBuf,
}

impl Binaries {
    fn in_dir(dir: &Path) -> Option<Binaries> {
        let found = Binaries {
            initdb: dir.join("initdb"),
            postgres: dir.join("postgres"),
        };
        (found.initdb.is_file() && found.postgres.is_file()).then_some(found)
    }

    /// `$MECATL_POSTGRES_BINDIR` when set; else the highest version under
    /// `/usr/lib/postgresql`; else `PATH`.
    pub(crate) fn find() -> Result<Binaries, ServiceError> {
        Self::find_in(
            std::env::var_os(BINDIR_ENV).map(PathBuf::from),
            Path::new(DEBIAN_ROOT),
            std::env::var_os("PATH").unwrap_or_default(),
        )
    }

    fn find_in(
        env_dir: Option<PathBuf>,
        root: &Path,
        path: std::ffi::OsString,
    ) -> Result<Binaries, ServiceError> {
        let not_installed = ServiceError::NotInstalled {
            binary: "postgres",
            package: PACKAGE,
            env_var: BINDIR_ENV,
        };
        if let Some(dir) = env_dir {
            return Binaries::in_dir(&dir).ok_or(not_installed);
        }
        let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                // "15", "16", and before 10 "9.6".
                let version = name
                    .split('.')
                    .map(|part| part.parse().ok())
                    .collect::<Option<Vec<u32>>>()?;
                Some((version, entry.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|v| Reverse(v.0.clone()));
        if let Some(found) = versions.iter().find_map(|(_, bin)| Binaries::in_dir(bin)) {
            return Ok(found);
        }
        std::env::split_paths(&path)
            .find_map(|dir| Binaries::in_dir(&dir))
            .ok_or(not_installed)
    }
}

/// A PostgreSQL server on a free loopback port, its cluster in a temporary
/// directory of its own (made by `initdb` at start); stopped, with every
/// process of its, and removed on drop.
///
/// TCP clients log in as [`POSTGRES_USER`] with [`POSTGRES_PASSWORD`]
/// (SCRAM-SHA-256); the server's Unix socket, in its private directory,
/// trusts its local users, and [`query`](Self::query) speaks through it.
/// When the tests run as root the server runs as `nobody` (PostgreSQL
/// refuses root).
///
/// Committed transactions survive [`kill`](Self::kill) (SIGKILL to the
/// server and all its processes, as a crash) and
/// [`restart`](Self::restart): a commit is answered once its WAL is written
/// to the kernel. The server does not `fsync` (`fsync = off`; except one
/// from [`start_durable`](Self::start_durable)), so what it promises holds
/// for crashes of its processes, not of the machine.
///
/// [`pause`](Controls::pause) stops every process of the server (SIGSTOP),
/// the backends of open connections too, so nothing answers until
/// [`resume`](Controls::resume).
#[derive(Debug)]
pub struct PostgresServer {
    process: ServerProcess,
    port: u16,
    binaries: Binaries,
    run_as: Option<RunAs>,
    // Dropped after the process: the server never loses its directory while
    // it runs.
    dir: TempDir,
}

impl PostgresServer {
    /// Makes a new cluster and starts a server on it.
    pub fn start() -> Result<PostgresServer, ServiceError> {
        Self::start_on(None, false)
    }

    /// Makes a new cluster and starts a server that syncs its write-ahead
    /// log (`fsync = on`, as a deployment keeping its commits across a
    /// machine's crash runs): for measuring what a statement costs as
    /// deployed, a commit's flush included. It keeps it across
    /// [`restart`](Self::restart).
    pub fn start_durable() -> Result<PostgresServer, ServiceError> {
        Self::start_on(None, true)
    }

    /// Makes a new cluster and starts a server on it that also speaks TLS
    /// (`ssl = on`) with `server`'s certificate and key (from
    /// [`Pki::issue`](crate::pki::Pki::issue), say): clients choose TLS or
    /// plain TCP, as with any PostgreSQL. It keeps TLS across
    /// [`restart`](Self::restart).
    pub fn start_with_tls(server: &crate::pki::Issued) -> Result<PostgresServer, ServiceError> {
        Self::start_on(Some(server), false)
    }

    fn start_on(
        tls: Option<&crate::pki::Issued>,
        durable: bool,
    ) -> Result<PostgresServer, ServiceError> {
        let binaries = Binaries::find()?;
        let run_as = RunAs::when_root()?;
        let dir = tempfile::Builder::new()
            .prefix("postgres-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for postgres", e))?;
        if let Some(run_as) = run_as {
            run_as.own(dir.path())?;
        }
        initdb(&binaries, dir.path(), run_as)?;
        if !durable {
            // A commit is still answered only once its WAL is written to
            // the kernel, which keeps it across a crash of the server's
            // processes; skipping fsync spares a loaded machine's disk.
            configure(&dir.path().join("data"), "fsync = off\n")?;
        }
        if let Some(tls) = tls {
            enable_tls(&dir.path().join("data"), tls, run_as)?;
        }
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            match spawn(&binaries, dir.path(), port, run_as) {
                Ok(process) => {
                    return Ok(PostgresServer {
                        process,
                        port,
                        binaries,
                        run_as,
                        dir,
                    });
                }
                // Most likely the port was taken between choosing and
                // binding it; any other cause repeats and is reported.
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

    /// The superuser TCP clients log in as.
    pub fn user(&self) -> &'static str {
        POSTGRES_USER
    }

    /// Its password.
    pub fn password(&self) -> &'static str {
        POSTGRES_PASSWORD
    }

    /// `postgres://mecatl:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for(DEFAULT_DATABASE)
    }

    /// The URL of `database` on this server (see
    /// [`create_database`](Self::create_database)).
    pub fn url_for(&self, database: &str) -> String {
        url(self.port, database)
    }

    /// The directory of the server's binaries (`initdb`, `postgres`):
    /// `/usr/lib/postgresql/VERSION/bin` on Debian.
    pub fn bin_dir(&self) -> &Path {
        self.binaries
            .postgres
            .parent()
            .unwrap_or_else(|| Path::new("/"))
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory of the server's Unix socket (`.s.PGSQL.PORT`), where
    /// local users log in without a password.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates `database`, owned by the superuser, and returns its URL.
    pub fn create_database(&self, database: &str) -> Result<String, ServiceError> {
        if database.is_empty() || database.contains('\0') {
            return Err(ServiceError::io(
                "create a database",
                std::io::Error::other(format!("{database:?} cannot name a database")),
            ));
        }
        let quoted = database.replace('"', "\"\"");
        self.query(&format!("CREATE DATABASE \"{quoted}\""))?;
        Ok(self.url_for(database))
    }

    /// Runs `sql` (one or more statements, as a simple query) as the
    /// superuser on the default database, through the server's Unix socket,
    /// on a new connection; the rows returned, each value as text. For tests
    /// that look at the server directly.
    pub fn query(&self, sql: &str) -> Result<Rows, ServiceError> {
        query(self.dir.path(), self.port, DEFAULT_DATABASE, sql)
            .map_err(|e| ServiceError::io(format!("postgres query {sql:?}"), e.into_io()))
    }

    /// The server's processes now: the postmaster first, then the
    /// processes it started (backends, checkpointer, WAL writer, …). Empty
    /// once stopped or killed.
    pub fn processes(&self) -> Vec<u32> {
        let Some(pid) = self.process.pid() else {
            return Vec::new();
        };
        let mut all = vec![pid];
        all.extend(children_of(pid));
        all
    }

    /// Kills the server with SIGKILL, as a crash would: the postmaster and
    /// every process it started, at once, then waits until they are gone.
    /// Committed transactions are kept; [`restart`](Self::restart) brings
    /// the server back, recovering from its WAL.
    pub fn kill(&mut self) {
        kill_cluster(&mut self.process);
    }

    /// Stops the server as its operator would (a fast shutdown: SIGINT,
    /// open transactions rolled back, a checkpoint written). It stays down
    /// until [`restart`](Self::restart). A paused server is resumed first.
    pub fn shutdown(&mut self) {
        let Some(pid) = self.process.pid() else {
            return;
        };
        let _ = self.signal_all(Signal::SIGCONT);
        let children = children_of(pid);
        self.process.stop_with(Signal::SIGINT, SHUTDOWN_GRACE);
        // A clean shutdown leaves none; one killed for taking too long may.
        for child in &children {
            let _ = signal_pid(*child, Signal::SIGKILL);
        }
        wait_for(REAP_TIMEOUT, || all_gone(&children));
    }

    /// Shuts the server down (see [`shutdown`](Self::shutdown)) if it runs
    /// and starts it again on the same port and cluster; after
    /// [`kill`](Self::kill), starts it again, recovering.
    pub fn restart(&mut self) -> Result<(), ServiceError> {
        self.shutdown();
        self.process = spawn(&self.binaries, self.dir.path(), self.port, self.run_as)?;
        Ok(())
    }

    /// Sends `signal` to every process of the server: the postmaster first
    /// for SIGSTOP (so it starts none while the others are stopped), last
    /// otherwise.
    fn signal_all(&self, signal: Signal) -> Result<(), ServiceError> {
        let pid = self
            .process
            .pid()
            .ok_or_else(|| ServiceError::io("signal", std::io::Error::other("not running")))?;
        if signal == Signal::SIGSTOP {
            self.process.signal(signal)?;
            wait_for(REAP_TIMEOUT, || state_of(pid).is_none_or(|s| s == 'T'));
        }
        for child in children_of(pid) {
            // One that has just exited needs no signal.
            let _ = signal_pid(child, signal);
        }
        if signal != Signal::SIGSTOP {
            self.process.signal(signal)?;
        }
        Ok(())
    }
}

impl Controls for PostgresServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    /// SIGSTOP to the postmaster and every process it started: open
    /// connections get no answer either.
    fn pause(&self) -> Result<(), ServiceError> {
        self.signal_all(Signal::SIGSTOP)
    }

    /// SIGCONT to all of them.
    fn resume(&self) -> Result<(), ServiceError> {
        self.signal_all(Signal::SIGCONT)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // Not the postmaster alone: its children would outlive it for a
        // moment, in a directory about to be removed.
        self.kill();
    }
}

pub(crate) fn url(port: u16, database: &str) -> String {
    format!("postgres://{POSTGRES_USER}:{POSTGRES_PASSWORD}@127.0.0.1:{port}/{database}")
}

/// `initdb` in `dir/data`: the superuser with its password, SCRAM for TCP
/// clients, trust on the Unix socket (in `dir`, which only the server's
/// account and root can enter).
fn initdb(binaries: &Binaries, dir: &Path, run_as: Option<RunAs>) -> Result<(), ServiceError> {
    let pwfile = dir.join("superuser-password");
    fs::write(&pwfile, format!("{POSTGRES_PASSWORD}\n"))
        .map_err(|e| ServiceError::io(format!("write {}", pwfile.display()), e))?;
    if let Some(run_as) = run_as {
        run_as.own_file(&pwfile)?;
    }
    let log_path = dir.join("initdb.log");
    let log = fs::File::create(&log_path)
        .map_err(|e| ServiceError::io(format!("create {}", log_path.display()), e))?;
    let err = log
        .try_clone()
        .map_err(|e| ServiceError::io("duplicate the log file", e))?;
    let mut cmd = Command::new(&binaries.initdb);
    cmd.current_dir(dir)
        .arg("--pgdata")
        .arg(dir.join("data"))
        .args(["--username", POSTGRES_USER])
        .arg(format!("--pwfile={}", pwfile.display()))
        .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
        .args(["--encoding=UTF8", "--no-locale"])
        // Its files are written to the kernel; a crash of the machine
        // would lose the test's cluster anyway.
        .arg("--no-sync")
        .env_remove("PGDATA")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    unprivileged::apply(run_as, &mut cmd);
    let status = cmd
        .status()
        .map_err(|e| ServiceError::io(format!("run {}", binaries.initdb.display()), e))?;
    let _ = fs::remove_file(&pwfile);
    if status.success() {
        return Ok(());
    }
    Err(ServiceError::Command {
        what: format!("{} (log {})", binaries.initdb.display(), log_path.display()),
        status,
        stderr: fs::read_to_string(&log_path).unwrap_or_default(),
    })
}

/// Puts the certificate and key in the data directory (the key readable by
/// the server's account alone, as PostgreSQL demands) and turns TLS on in
/// `postgresql.conf`, so a restart keeps it.
fn enable_tls(
    data: &Path,
    tls: &crate::pki::Issued,
    run_as: Option<RunAs>,
) -> Result<(), ServiceError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for (name, pem) in [("server.crt", &tls.cert_pem), ("server.key", &tls.key_pem)] {
        let path = data.join(name);
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(pem.as_bytes()))
            .map_err(|e| ServiceError::io(format!("write {}", path.display()), e))?;
        if let Some(run_as) = run_as {
            run_as.own_file(&path)?;
        }
    }
    configure(
        data,
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
    )
}

/// Appends `settings` to the data directory's `postgresql.conf`, so a
/// restart keeps them.
fn configure(data: &Path, settings: &str) -> Result<(), ServiceError> {
    use std::io::Write;
    let conf = data.join("postgresql.conf");
    fs::OpenOptions::new()
        .append(true)
        .open(&conf)
        .and_then(|mut f| f.write_all(format!("\n{settings}").as_bytes()))
        .map_err(|e| ServiceError::io(format!("write {settings:?} to {}", conf.display()), e))
}

fn spawn(
    binaries: &Binaries,
    dir: &Path,
    port: u16,
    run_as: Option<RunAs>,
) -> Result<ServerProcess, ServiceError> {
    let mut cmd = Command::new(&binaries.postgres);
    cmd.current_dir(dir)
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-p")
        .arg(port.to_string())
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        // Several servers run side by side.
        .args(["-c", "shared_buffers=16MB"])
        .env_remove("PGDATA");
    unprivileged::apply(run_as, &mut cmd);
    ServerProcess::start("postgres", cmd, &dir.join("postgres.log"), || {
        query(dir, port, DEFAULT_DATABASE, "SELECT 1").is_ok()
    })
}

/// `sql` through the server's Unix socket in `dir`, as its trusted local
/// user.
pub(crate) fn query(
    dir: &Path,
    port: u16,
    database: &str,
    sql: &str,
) -> Result<Rows, pgwire::WireError> {
    let mut stream = UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    pgwire::start_trusted(&mut stream, POSTGRES_USER, database)?;
    let rows = pgwire::simple_query(&mut stream, sql);
    pgwire::terminate(&mut stream);
    rows
}

/// SIGKILLs a PostgreSQL server, as a crash would: the postmaster and every
/// process it started, at once, then waits until they are gone.
pub(crate) fn kill_cluster(process: &mut ServerProcess) {
    let Some(pid) = process.pid() else {
        return;
    };
    // Stopped first, the postmaster starts no process while its children
    // are listed and killed.
    if process.signal(Signal::SIGSTOP).is_ok() {
        wait_for(REAP_TIMEOUT, || state_of(pid).is_none_or(|s| s == 'T'));
    }
    let children = children_of(pid);
    for child in &children {
        let _ = signal_pid(*child, Signal::SIGKILL);
    }
    process.kill();
    wait_for(REAP_TIMEOUT, || all_gone(&children));
}

/// The processes whose parent is `pid`.
pub(crate) fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|candidate| stat_of(*candidate).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// A process's state letter (`R`, `S`, `T`, `Z`, …) and parent.
fn stat_of(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

fn state_of(pid: u32) -> Option<char> {
    stat_of(pid).map(|(state, _)| state)
}

/// Whether each of `pids` has exited (a zombie nobody reaps holds nothing).
fn all_gone(pids: &[u32]) -> bool {
    pids.iter()
        .all(|pid| state_of(*pid).is_none_or(|s| s == 'Z' || s == 'X'))
}

fn signal_pid(pid: u32, signal: Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::Error::EINVAL)?;
    kill(Pid::from_raw(pid), signal)
}

fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make_bin(dir: &Path) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("initdb"), "").unwrap();
        fs::write(dir.join("postgres"), "").unwrap();
    }

    #[test]
    fn the_highest_debian_version_is_chosen() {
        let root = tempfile::tempdir().unwrap();
        for version in ["9.6", "13", "15", "16"] {
            make_bin(&root.path().join(version).join("bin"));
        }
        // A newer version without its server binaries (only a client).
        fs::create_dir_all(root.path().join("17").join("bin")).unwrap();
        fs::create_dir_all(root.path().join("not-a-version").join("bin")).unwrap();
        let found = Binaries::find_in(None, root.path(), Default::default()).unwrap();
        assert_eq!(found.postgres, root.path().join("16/bin/postgres"));
    }

    #[test]
    fn path_is_the_last_resort_and_then_the_package_is_named() {
        let root = tempfile::tempdir().unwrap();
        let on_path = root.path().join("elsewhere");
        make_bin(&on_path);
        let none = root.path().join("no-debian-root");
        let found = Binaries::find_in(None, &none, on_path.clone().into_os_string()).unwrap();
        assert_eq!(found.initdb, on_path.join("initdb"));

        let err = Binaries::find_in(None, &none, Default::default()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("install the Debian package postgresql"),
            "{message}"
        );
        assert!(message.contains(BINDIR_ENV), "{message}");
    }

    #[test]
    fn a_bin_dir_named_in_the_environment_is_the_only_one_looked_at() {
        let root = tempfile::tempdir().unwrap();
        make_bin(&root.path().join("15/bin"));
        let err = Binaries::find_in(
            Some(root.path().join("missing")),
            root.path(),
            Default::default(),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            ServiceError::NotInstalled {
                package: "postgresql",
                ..
            }
        ));
    }

    #[test]
    fn stat_reads_state_and_parent_past_odd_names() {
        let (state, ppid) = stat_of(std::process::id()).expect("this process");
        assert!(state == 'R' || state == 'S', "{state}");
        assert_eq!(ppid, std::os::unix::process::parent_id());
    }
}
