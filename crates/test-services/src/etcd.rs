//! A private single-member etcd cluster.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::Controls;
use crate::ServiceError;
use crate::process::{Binary, START_ATTEMPTS, ServerProcess, free_port};

const BINARY: Binary = Binary {
    name: "etcd",
    package: "etcd-server",
    env_var: "MECATL_ETCD",
};

/// A one-member etcd cluster on free loopback ports (client and peer), its
/// data directory temporary; stopped and removed on drop. Data survives
/// [`restart`](Self::restart) and [`kill`](Self::kill): etcd syncs its log
/// before acknowledging a write.
#[derive(Debug)]
pub struct EtcdServer {
    process: ServerProcess,
    client_port: u16,
    peer_port: u16,
    dir: TempDir,
}

impl EtcdServer {
    /// Starts a new member with an empty data directory.
    pub fn start() -> Result<EtcdServer, ServiceError> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for etcd", e))?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let (client_port, peer_port) = (free_port()?, free_port()?);
            if client_port == peer_port {
                continue;
            }
            match spawn(dir.path(), client_port, peer_port) {
                Ok(process) => {
                    return Ok(EtcdServer {
                        process,
                        client_port,
                        peer_port,
                        dir,
                    });
                }
                Err(e @ ServiceError::NotReady { .. }) => {
                    // A failed first start may leave a half-made member.
                    let _ = std::fs::remove_dir_all(dir.path().join("member"));
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            ServiceError::io("choose ports", std::io::Error::other("none free"))
        }))
    }

    /// The client address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    /// The client endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Stops the member (SIGTERM) and starts it again on the same ports and
    /// data directory.
    pub fn restart(&mut self) -> Result<(), ServiceError> {
        self.process.stop(Duration::from_secs(10));
        self.process = spawn(self.dir.path(), self.client_port, self.peer_port)?;
        Ok(())
    }

    /// Kills the member with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// POSTs a JSON body to etcd's HTTP gateway (`/v3/kv/put`,
    /// `/v3/kv/range`, …) and returns the response body; keys and values in
    /// the gateway's JSON are base64. For tests that look at etcd directly.
    pub fn post(&self, path: &str, json: &str) -> Result<String, ServiceError> {
        http(self.client_port, "POST", path, json)
    }
}

fn spawn(dir: &Path, client_port: u16, peer_port: u16) -> Result<ServerProcess, ServiceError> {
    let binary = BINARY.find()?;
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .args(["--name", "test"])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("test={peer}")])
        .args(["--initial-cluster-state", "new"])
        .args(["--logger", "zap", "--log-level", "warn"])
        // Environment settings of the machine must not reach the test member.
        .env_remove("ETCDCTL_API")
        .env_remove("ETCD_DATA_DIR");
    ServerProcess::start(BINARY.name, cmd, &dir.join("etcd.log"), || {
        http(client_port, "GET", "/health", "")
            .is_ok_and(|body| body.contains("\"health\":\"true\""))
    })
}

/// One HTTP/1.1 request on a new connection; the body of the reply when
/// its status is 200.
pub(crate) fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String, ServiceError> {
    http_at(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        method,
        path,
        body,
    )
}

/// [`http`] to any address. The connection attempt is bounded: across a
/// cut link it would otherwise wait for the kernel's own timeout.
pub(crate) fn http_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String, ServiceError> {
    let io = |e| ServiceError::io(format!("etcd {method} {path}"), e);
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(io)?;
    let reply = String::from_utf8_lossy(&reply);
    let (head, rest) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| io(std::io::Error::other("no HTTP header")))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(io(std::io::Error::other(format!(
            "answered {head:?}: {rest}"
        ))));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(dechunk(rest));
    }
    Ok(rest.to_owned())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl Controls for EtcdServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }
}
