//! A private `redis-server`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::Controls;
use crate::ServiceError;
use crate::process::{Binary, START_ATTEMPTS, ServerProcess, free_port};

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
            match spawn(dir.path(), port, persistent) {
                Ok(process) => {
                    return Ok(RedisServer {
                        process,
                        port,
                        persistent,
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
        self.process = spawn(self.dir.path(), self.port, self.persistent)?;
        Ok(())
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

fn spawn(dir: &Path, port: u16, persistent: bool) -> Result<ServerProcess, ServiceError> {
    let binary = BINARY.find()?;
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .args(["--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args(["--daemonize", "no", "--save", "", "--protected-mode", "yes"])
        .args(["--unixsocket", "", "--logfile", ""])
        .arg("--dir")
        .arg(dir);
    if persistent {
        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
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
