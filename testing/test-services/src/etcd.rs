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
    /// Serves `/health` in plain HTTP when the client port speaks TLS.
    metrics_port: Option<u16>,
    dir: TempDir,
}

/// How a member started with [`EtcdServer::start_tls`] serves its clients:
/// its certificate, and the CA whose client certificates it demands, if
/// any.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The server's certificate (for `127.0.0.1`), PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
    /// With a CA, every client must present a certificate it signed
    /// (`--client-cert-auth`); without, any client that trusts the server
    /// may speak.
    pub client_ca_pem: Option<String>,
}

impl EtcdServer {
    /// Starts a new member with an empty data directory.
    pub fn start() -> Result<EtcdServer, ServiceError> {
        Self::start_with(None)
    }

    /// Starts a new member whose clients speak TLS to it (`https://`
    /// endpoints). Its peer port stays plain: the cluster has one member.
    /// [`post`](Self::post) is for plain members only.
    pub fn start_tls(tls: EtcdTls) -> Result<EtcdServer, ServiceError> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<EtcdTls>) -> Result<EtcdServer, ServiceError> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for etcd", e))?;
        if let Some(tls) = &tls {
            write_tls_files(dir.path(), tls)?;
        }
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let metrics_port = match tls {
                Some(_) => Some(free_port()?),
                None => None,
            };
            let mut ports = vec![client_port, peer_port];
            ports.extend(metrics_port);
            ports.sort_unstable();
            ports.dedup();
            if ports.len() != 2 + usize::from(metrics_port.is_some()) {
                continue;
            }
            let ports = Ports {
                client: client_port,
                peer: peer_port,
                metrics: metrics_port,
            };
            match spawn(dir.path(), ports, tls.as_ref()) {
                Ok(process) => {
                    return Ok(EtcdServer {
                        process,
                        client_port,
                        peer_port,
                        metrics_port,
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

    /// The client endpoint, `http://127.0.0.1:PORT`, or `https://…` for a
    /// member started with [`start_tls`](Self::start_tls).
    pub fn endpoint(&self) -> String {
        let scheme = if self.metrics_port.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Stops the member (SIGTERM) and starts it again on the same ports and
    /// data directory (and certificates).
    pub fn restart(&mut self) -> Result<(), ServiceError> {
        self.process.stop(Duration::from_secs(10));
        let tls = self
            .metrics_port
            .is_some()
            .then(|| TlsFiles::in_dir(self.dir.path()));
        let ports = Ports {
            client: self.client_port,
            peer: self.peer_port,
            metrics: self.metrics_port,
        };
        self.process = spawn_member(self.dir.path(), ports, tls.as_ref())?;
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
        if self.metrics_port.is_some() {
            return Err(ServiceError::io(
                format!("etcd POST {path}"),
                std::io::Error::other("the member speaks TLS to its clients; post is plain HTTP"),
            ));
        }
        http(self.client_port, "POST", path, json)
    }
}

/// The ports of one member.
#[derive(Debug, Clone, Copy)]
struct Ports {
    client: u16,
    peer: u16,
    /// Set when the client port speaks TLS.
    metrics: Option<u16>,
}

/// Where a TLS member's certificates are, in its directory.
struct TlsFiles {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    client_ca: Option<std::path::PathBuf>,
}

impl TlsFiles {
    fn in_dir(dir: &Path) -> TlsFiles {
        let client_ca = dir.join("client-ca.pem");
        TlsFiles {
            cert: dir.join("server.pem"),
            key: dir.join("server-key.pem"),
            client_ca: client_ca.is_file().then_some(client_ca),
        }
    }
}

fn write_tls_files(dir: &Path, tls: &EtcdTls) -> Result<(), ServiceError> {
    let write = |name: &str, pem: &str| {
        std::fs::write(dir.join(name), pem)
            .map_err(|e| ServiceError::io(format!("write {name} for etcd"), e))
    };
    write("server.pem", &tls.cert_pem)?;
    write("server-key.pem", &tls.key_pem)?;
    if let Some(ca) = &tls.client_ca_pem {
        write("client-ca.pem", ca)?;
    }
    Ok(())
}

fn spawn(dir: &Path, ports: Ports, tls: Option<&EtcdTls>) -> Result<ServerProcess, ServiceError> {
    let files = tls.map(|_| TlsFiles::in_dir(dir));
    spawn_member(dir, ports, files.as_ref())
}

fn spawn_member(
    dir: &Path,
    ports: Ports,
    tls: Option<&TlsFiles>,
) -> Result<ServerProcess, ServiceError> {
    let binary = BINARY.find()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client = format!("{scheme}://127.0.0.1:{}", ports.client);
    let peer = format!("http://127.0.0.1:{}", ports.peer);
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
    if let Some(tls) = tls {
        cmd.arg("--cert-file")
            .arg(&tls.cert)
            .arg("--key-file")
            .arg(&tls.key);
        if let Some(ca) = &tls.client_ca {
            cmd.arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(ca);
        }
    }
    // A TLS client port cannot be asked in plain HTTP whether the member
    // is up: etcd's metrics listener answers `/health` beside it.
    if let Some(metrics) = ports.metrics {
        cmd.args([
            "--listen-metrics-urls",
            &format!("http://127.0.0.1:{metrics}"),
        ]);
    }
    let health_port = ports.metrics.unwrap_or(ports.client);
    ServerProcess::start(BINARY.name, cmd, &dir.join("etcd.log"), || {
        http(health_port, "GET", "/health", "")
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
