//! A private three-member etcd cluster, for tests of leader loss, a stopped
//! member and a whole-cluster restart.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::ServiceError;
use crate::etcd::http_at;
use crate::netns::{Host, Network};
use crate::process::{Binary, READY_TIMEOUT, START_ATTEMPTS, ServerProcess, free_port};

const BINARY: Binary = Binary {
    name: "etcd",
    package: "etcd-server",
    env_var: "MECATL_ETCD",
};

/// How many members a cluster has: the smallest that survives losing one.
pub const CLUSTER_SIZE: usize = 3;

/// Raft timing of the members, in milliseconds: short, so a lost leader is
/// replaced within about a second, and etcd's minimum lease TTL is 1 s.
const HEARTBEAT_MS: u32 = 50;
const ELECTION_MS: u32 = 500;

/// The ports of a member on a host of its own: etcd's usual ones.
const HOST_CLIENT_PORT: u16 = 2379;
const HOST_PEER_PORT: u16 = 2380;

#[derive(Debug)]
struct Member {
    name: String,
    /// The host it runs on, on a [`Network`]; loopback otherwise.
    host: Option<Host>,
    ip: Ipv4Addr,
    client_port: u16,
    peer_port: u16,
    process: Option<ServerProcess>,
}

/// Three etcd members on free loopback ports, each with its own data
/// directory under one temporary directory; stopped and removed on drop.
///
/// Members are addressed by index (`0..CLUSTER_SIZE`). Data survives
/// [`kill`](Self::kill), [`start_member`](Self::start_member) and
/// [`restart_all`](Self::restart_all): etcd syncs its log before it
/// acknowledges a write.
///
/// Start it from a thread that outlives it (the test's own thread): each
/// member dies with the thread that started it.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    network: Option<Network>,
    token: String,
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts a new cluster and waits until it has a leader.
    pub fn start() -> Result<EtcdCluster, ServiceError> {
        Self::start_with(None)
    }

    /// Starts a new cluster whose members run on three new hosts of
    /// `network`, `etcd-0` to `etcd-2` (see [`host`](Self::host)), each
    /// serving clients at `http://ADDR:2379` and its peers at port 2380,
    /// and waits until it has a leader. Cut links between members, or
    /// between a member and its clients' hosts, with
    /// [`Network::cut`]; the cluster itself never needs a cut link (it
    /// checks its members from their own hosts).
    pub fn start_on(network: &Network) -> Result<EtcdCluster, ServiceError> {
        Self::start_with(Some(network))
    }

    fn start_with(network: Option<&Network>) -> Result<EtcdCluster, ServiceError> {
        let hosts = match network {
            Some(network) => Some(
                (0..CLUSTER_SIZE)
                    .map(|i| network.add_host(&format!("etcd-{i}")))
                    .collect::<Result<Vec<Host>, ServiceError>>()?,
            ),
            None => None,
        };
        let mut dir = tempfile::Builder::new()
            .prefix("etcd-cluster-")
            .tempdir()
            .map_err(|e| ServiceError::io("create a directory for etcd", e))?;
        // A distinct token gives every test cluster its own cluster id.
        let token = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "etcd-cluster".into());
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let mut members = Vec::with_capacity(CLUSTER_SIZE);
            if let Some(hosts) = &hosts {
                // A host of its own per member: the usual ports are free.
                for (i, host) in hosts.iter().enumerate() {
                    members.push(Member {
                        name: format!("m{i}"),
                        host: Some(host.clone()),
                        ip: host.addr(),
                        client_port: HOST_CLIENT_PORT,
                        peer_port: HOST_PEER_PORT,
                        process: None,
                    });
                }
            } else {
                let mut ports = std::collections::BTreeSet::new();
                while ports.len() < CLUSTER_SIZE * 2 {
                    ports.insert(free_port()?);
                }
                let mut ports = ports.into_iter();
                for i in 0..CLUSTER_SIZE {
                    members.push(Member {
                        name: format!("m{i}"),
                        host: None,
                        ip: Ipv4Addr::LOCALHOST,
                        client_port: ports.next().expect("enough ports"),
                        peer_port: ports.next().expect("enough ports"),
                        process: None,
                    });
                }
            }
            let mut cluster = EtcdCluster {
                members,
                network: network.cloned(),
                token: token.clone(),
                dir,
            };
            match cluster.start_all_and_wait() {
                Ok(()) => return Ok(cluster),
                // Most likely a port was taken between choosing and binding
                // it; any other cause repeats and is reported.
                Err(e @ (ServiceError::NotReady { .. } | ServiceError::Io { .. })) => {
                    cluster.stop_all();
                    for m in &cluster.members {
                        let _ = std::fs::remove_dir_all(cluster.data_dir(&m.name));
                    }
                    last = Some(e);
                    dir = cluster.into_dir();
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            ServiceError::io("choose ports", std::io::Error::other("none free"))
        }))
    }

    fn into_dir(mut self) -> TempDir {
        self.stop_all();
        let members = std::mem::take(&mut self.members);
        drop(members);
        // Moving the directory out of a type with Drop needs a swap.
        let placeholder = tempfile::Builder::new()
            .prefix("etcd-cluster-empty-")
            .tempdir()
            .expect("a temporary directory");
        std::mem::replace(&mut self.dir, placeholder)
    }

    fn data_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://{}:{}", m.name, m.ip, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&self, i: usize) -> Result<ServerProcess, ServiceError> {
        let m = &self.members[i];
        let binary = BINARY.find()?;
        let client = format!("http://{}:{}", m.ip, m.client_port);
        let peer = format!("http://{}:{}", m.ip, m.peer_port);
        let mut cmd = Command::new(binary);
        cmd.current_dir(self.dir.path())
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(self.data_dir(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster()])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .args(["--logger", "zap", "--log-level", "warn"])
            .env_remove("ETCDCTL_API")
            .env_remove("ETCD_DATA_DIR");
        let log = self.dir.path().join(format!("{}.log", m.name));
        // A member serves clients only once it has joined a quorum, so
        // the members are started together and the cluster is waited for
        // afterwards (`wait_for_leader`). A member restarted alone into a
        // running cluster answers as soon as it has caught up.
        match (&self.network, &m.host) {
            (Some(network), Some(host)) => network.spawn(host, BINARY.name, &cmd, &log, || true),
            _ => ServerProcess::start(BINARY.name, cmd, &log, || true),
        }
    }

    fn start_all_and_wait(&mut self) -> Result<(), ServiceError> {
        for i in 0..self.members.len() {
            if self.members[i].process.is_none() {
                let p = self.spawn(i)?;
                self.members[i].process = Some(p);
            }
        }
        self.wait_for_leader().map(drop)
    }

    fn stop_all(&mut self) {
        for m in &mut self.members {
            if let Some(mut p) = m.process.take() {
                p.stop(Duration::from_secs(10));
            }
        }
    }

    /// Every member's client endpoint, `http://127.0.0.1:PORT` (or
    /// `http://ADDR:2379` on a [`Network`]).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}:{}", m.ip, m.client_port))
            .collect()
    }

    /// The host member `i` runs on, when the cluster was started with
    /// [`start_on`](Self::start_on).
    pub fn host(&self, i: usize) -> Option<&Host> {
        self.members[i].host.as_ref()
    }

    /// One HTTP request to member `i`'s gateway, made from its own host so
    /// that no cut link stands in the way.
    fn http(&self, i: usize, method: &str, path: &str, body: &str) -> Result<String, ServiceError> {
        let m = &self.members[i];
        let addr = SocketAddr::from((m.ip, m.client_port));
        match (&self.network, &m.host) {
            (Some(network), Some(host)) => {
                network.within(host, || http_at(addr, method, path, body))?
            }
            _ => http_at(addr, method, path, body),
        }
    }

    /// The member process `i`, while it runs.
    pub fn process(&self, i: usize) -> Option<&ServerProcess> {
        self.members[i].process.as_ref()
    }

    /// The index of the current leader, as a running member reports it.
    pub fn leader(&self) -> Result<usize, ServiceError> {
        for (j, _) in self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.process.is_some())
        {
            let Ok(status) = self.http(j, "POST", "/v3/maintenance/status", "{}") else {
                continue;
            };
            let Some(leader) = json_field(&status, "leader") else {
                continue;
            };
            for (i, other) in self.members.iter().enumerate() {
                if other.process.is_none() {
                    continue;
                }
                let Ok(s) = self.http(i, "POST", "/v3/maintenance/status", "{}") else {
                    continue;
                };
                if json_field(&s, "member_id").as_deref() == Some(leader.as_str()) {
                    return Ok(i);
                }
            }
        }
        Err(ServiceError::io(
            "find the etcd leader",
            std::io::Error::other("no running member names a running leader"),
        ))
    }

    /// Waits until a running member reports a leader; returns its index.
    pub fn wait_for_leader(&self) -> Result<usize, ServiceError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.leader() {
                Ok(i) => return Ok(i),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Kills member `i` with SIGKILL, as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            p.kill();
        }
    }

    /// Starts member `i` again from its data, after [`kill`](Self::kill),
    /// and waits until it serves clients.
    pub fn start_member(&mut self, i: usize) -> Result<(), ServiceError> {
        if self.members[i].process.is_none() {
            let p = self.spawn(i)?;
            self.members[i].process = Some(p);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while self
            .http(i, "GET", "/health", "")
            .map_or(true, |b| !b.contains("\"health\":\"true\""))
        {
            if Instant::now() >= deadline {
                return Err(ServiceError::io(
                    format!("start etcd member {i}"),
                    std::io::Error::other("not healthy in time"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// SIGSTOP to member `i`: it keeps its connections and answers nothing.
    pub fn pause(&self, i: usize) -> Result<(), ServiceError> {
        self.signal(i, nix::sys::signal::Signal::SIGSTOP)
    }

    /// SIGCONT to member `i`.
    pub fn resume(&self, i: usize) -> Result<(), ServiceError> {
        self.signal(i, nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&self, i: usize, signal: nix::sys::signal::Signal) -> Result<(), ServiceError> {
        self.members[i]
            .process
            .as_ref()
            .ok_or_else(|| ServiceError::io("signal", std::io::Error::other("not running")))?
            .signal(signal)
    }

    /// Stops every member (SIGTERM) and starts the whole cluster again from
    /// its data, waiting for a leader.
    pub fn restart_all(&mut self) -> Result<(), ServiceError> {
        self.stop_all();
        self.start_all_and_wait()
    }

    /// The directory holding every member's data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut p) = m.process.take() {
                p.kill();
            }
        }
    }
}

/// The string value of `"name":"…"` in etcd's JSON (its 64-bit ids are
/// strings there).
fn json_field(json: &str, name: &str) -> Option<String> {
    let start = json.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let len = json[start..].find('"')?;
    Some(json[start..start + len].to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_string_fields() {
        let json = r#"{"header":{"cluster_id":"1","member_id":"22"},"leader":"22"}"#;
        assert_eq!(super::json_field(json, "member_id").as_deref(), Some("22"));
        assert_eq!(super::json_field(json, "leader").as_deref(), Some("22"));
        assert_eq!(super::json_field(json, "absent"), None);
    }
}
