//! A private `redis-server`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::Controls;
use crate::ServiceError;
use crate::process::{Binary, READY_TIMEOUT, START_ATTEMPTS, ServerProcess, free_port};

const BINARY: Binary = Binary {
    name: "redis-server",
    package: "redis-server",
    env_var: "MECATL_REDIS_SERVER",
};

/// A `redis-server` on a free loopback port, its files in a temporary
/// directory; stopped and removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    process: ServerProcess,
    port: u16,
    persistent: bool,
    /// Snapshots taken so far: names each one's file.
    snapshots: AtomicU64,
    // Dropped after the process: the server never loses its directory while
    // it runs.
    dir: TempDir,
}

impl RedisServer {
    /// A server that keeps nothing on disk: a restart empties it.
    pub fn start() -> Result<RedisServer, ServiceError> {
        Self::start_with(false)
    }

    /// A server with an append-only file synced on every write, so
    /// [`restart`](Self::restart) and [`kill`](Self::kill) keep every
    /// acknowledged write.
    pub fn start_persistent() -> Result<RedisServer, ServiceError> {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> Result<RedisServer, ServiceError> {
        let dir = tempfile::Builder::new()
            .prefix("redis-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for redis", e))?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            match spawn(dir.path(), port, Mode::of(persistent)) {
                Ok(process) => {
                    return Ok(RedisServer {
                        process,
                        port,
                        persistent,
                        snapshots: AtomicU64::new(0),
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

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the server keeps its data across [`restart`](Self::restart).
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// Stops the server (SIGTERM) and starts it again on the same port and
    /// directory.
    pub fn restart(&mut self) -> Result<(), ServiceError> {
        self.process.stop(Duration::from_secs(10));
        self.process = spawn(self.dir.path(), self.port, Mode::of(self.persistent))?;
        Ok(())
    }

    /// Saves the server's data as it is now (`SAVE`, which answers once
    /// the file is written) and keeps the file aside, in the server's
    /// directory, for [`restart_from`](Self::restart_from): an older
    /// snapshot to come back from, as a server restarted from a stale RDB
    /// file, a restored backup or a replica that lagged would. Nothing the
    /// server itself loads is left behind: a later
    /// [`restart`](Self::restart) still starts from the append-only file
    /// (persistent) or empty.
    pub fn snapshot(&self) -> Result<RedisSnapshot, ServiceError> {
        let reply = self.command(&["SAVE"])?;
        if reply != "+OK" {
            return Err(ServiceError::io(
                "redis SAVE",
                std::io::Error::other(format!("answered {reply}")),
            ));
        }
        let dir = self.dir.path().join("snapshots");
        fs::create_dir_all(&dir)
            .map_err(|e| ServiceError::io(format!("create {}", dir.display()), e))?;
        let n = self.snapshots.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("snapshot-{n}.rdb"));
        let saved = self.dir.path().join(RDB_FILE);
        fs::rename(&saved, &path).map_err(|e| {
            ServiceError::io(format!("move {} to {}", saved.display(), path.display()), e)
        })?;
        Ok(RedisSnapshot { path })
    }

    /// Stops the server (SIGTERM) and starts it again on the same port with
    /// exactly the data of `snapshot`: every write since the snapshot is
    /// gone, as after a restart from an older RDB file, and the runtime
    /// configuration (`CONFIG SET`) is back to the start-up one. A
    /// persistent server then rewrites its append-only file from that data
    /// and answers once the rewrite is done, so later
    /// [`restart`](Self::restart)s and [`kill`](Self::kill)s keep the
    /// snapshot and every write acknowledged after it. `snapshot` must come
    /// from this server.
    pub fn restart_from(&mut self, snapshot: &RedisSnapshot) -> Result<(), ServiceError> {
        self.process.stop(Duration::from_secs(10));
        let dir = self.dir.path();
        // What a persistent server would load instead of the snapshot.
        for aof in ["appendonlydir", "appendonly.aof"] {
            let path = dir.join(aof);
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match removed {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(ServiceError::io(format!("remove {}", path.display()), e));
                }
                _ => {}
            }
        }
        let rdb = dir.join(RDB_FILE);
        fs::copy(&snapshot.path, &rdb).map_err(|e| {
            ServiceError::io(
                format!("copy {} to {}", snapshot.path.display(), rdb.display()),
                e,
            )
        })?;
        // Without an append-only file to prefer, the server loads the RDB
        // file; it answers PING only once loaded.
        self.process = spawn(dir, self.port, Mode::LoadSnapshot)?;
        fs::remove_file(&rdb)
            .map_err(|e| ServiceError::io(format!("remove {}", rdb.display()), e))?;
        if self.persistent {
            self.resume_appending()?;
        }
        Ok(())
    }

    /// `CONFIG SET appendonly yes`, then waits until the rewrite that
    /// starts from the data in memory has finished.
    fn resume_appending(&self) -> Result<(), ServiceError> {
        let reply = self.command(&["CONFIG", "SET", "appendonly", "yes"])?;
        if reply != "+OK" {
            return Err(ServiceError::io(
                "redis CONFIG SET appendonly yes",
                std::io::Error::other(format!("answered {reply}")),
            ));
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let info = self.info("persistence")?;
            let field = |name: &str| info.get(name).map(String::as_str);
            if field("aof_last_bgrewrite_status") == Some("err") {
                return Err(ServiceError::io(
                    "redis append-only rewrite after a restart from a snapshot",
                    std::io::Error::other("the rewrite failed (see the server's log)"),
                ));
            }
            let done = field("aof_enabled") == Some("1")
                && field("aof_rewrite_in_progress") == Some("0")
                && field("aof_rewrite_scheduled") == Some("0")
                && field("aof_rewrites").is_some_and(|n| n != "0");
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ServiceError::io(
                    "redis append-only rewrite after a restart from a snapshot",
                    std::io::Error::other(format!("not done within {READY_TIMEOUT:?}")),
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// One section of `INFO` (`memory`, `stats`, `persistence`, …) as its
    /// `field:value` lines.
    pub fn info(&self, section: &str) -> Result<BTreeMap<String, String>, ServiceError> {
        let reply = self.command(&["INFO", section])?;
        let body = match reply.split_once("\r\n") {
            Some((header, body)) if header.starts_with('$') => body,
            _ => {
                return Err(ServiceError::io(
                    format!("redis INFO {section}"),
                    std::io::Error::other(format!("answered {reply}")),
                ));
            }
        };
        Ok(body
            .lines()
            .filter_map(|l| l.trim_end().split_once(':'))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect())
    }

    /// Kills the server with SIGKILL, as a crash would; [`restart`](Self::restart)
    /// brings it back.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Sends one command on a new connection and returns the reply in RESP
    /// form without its final CRLF (`+PONG`, `$5\r\nhello`, `:1`, `-ERR …`);
    /// for tests that look at the server directly.
    pub fn command(&self, args: &[&str]) -> Result<String, ServiceError> {
        command(self.port, args)
    }
}

/// A copy of a [`RedisServer`]'s data, taken by
/// [`snapshot`](RedisServer::snapshot) and put back by
/// [`restart_from`](RedisServer::restart_from). The file lives in the
/// server's directory and goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSnapshot {
    path: PathBuf,
}

impl RedisSnapshot {
    /// The RDB file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The file `SAVE` writes and a server without an append-only file loads.
const RDB_FILE: &str = "dump.rdb";

/// How a server is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing kept on disk.
    Ephemeral,
    /// Every write appended and synced.
    Persistent,
    /// Loading the RDB file in its directory: no append-only file, which
    /// would be preferred to it (a persistent server turns appending on
    /// once loaded).
    LoadSnapshot,
}

impl Mode {
    fn of(persistent: bool) -> Mode {
        if persistent {
            Mode::Persistent
        } else {
            Mode::Ephemeral
        }
    }
}

fn spawn(dir: &Path, port: u16, mode: Mode) -> Result<ServerProcess, ServiceError> {
    let binary = BINARY.find()?;
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .args(["--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args(["--daemonize", "no", "--save", "", "--protected-mode", "yes"])
        .args(["--unixsocket", "", "--logfile", ""])
        .arg("--dir")
        .arg(dir);
    match mode {
        Mode::Persistent => cmd.args(["--appendonly", "yes", "--appendfsync", "always"]),
        Mode::LoadSnapshot => cmd.args(["--appendonly", "no", "--appendfsync", "always"]),
        Mode::Ephemeral => cmd.args(["--appendonly", "no"]),
    };
    ServerProcess::start(BINARY.name, cmd, &dir.join("redis.log"), || {
        command(port, &["PING"]).is_ok_and(|r| r == "+PONG")
    })
}

fn command(port: u16, args: &[&str]) -> Result<String, ServiceError> {
    let io = |e| ServiceError::io(format!("redis command {args:?}"), e);
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(io)?;
    let line = line.trim_end_matches("\r\n").to_owned();
    if let Some(len) = line.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
        let mut body = vec![0; len + 2];
        reader.read_exact(&mut body).map_err(io)?;
        body.truncate(len);
        return Ok(format!("{line}\r\n{}", String::from_utf8_lossy(&body)));
    }
    Ok(line)
}

impl Controls for RedisServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }
}
