//! A private network of Linux network namespaces on this host, for real
//! partitions between real processes.
//!
//! A [`Network`] is one bridge in a namespace of its own and any number of
//! named hosts, each a namespace with its loopback up and one veth link to
//! the bridge carrying an address of a private `/24` (`10.213.X.0/24`, `X`
//! differing between networks of one test run). Nothing of the machine's
//! own network is touched: the bridge and every link live only in the
//! network's namespaces, and all of them are deleted when the last clone
//! of the [`Network`] is dropped. Namespaces that a killed earlier run left
//! behind (their names carry the pid of the process that made them) are
//! deleted when a network is next created.
//!
//! Processes run on a host through `ip netns exec`
//! ([`command`](Network::command), [`wrap`](Network::wrap),
//! [`spawn`](Network::spawn)); a thread of the test joins a host with
//! [`enter`](Network::enter), or runs a closure there with
//! [`within`](Network::within) — sockets keep the namespace they were made
//! in, so a listener bound there serves that host whichever thread accepts.
//!
//! [`cut`](Network::cut) makes every IP packet between two hosts vanish,
//! both ways: each side's neighbour entry for the other is pinned to a
//! link address nobody has, so frames leave, the bridge floods them, and
//! no host takes them. Nothing answers — no reset, no ICMP error, no
//! failed address resolution — so a connection attempt times out and an
//! open connection stalls, as across a real partition.
//! [`heal`](Network::heal) lifts it; [`isolate`](Network::isolate) cuts a
//! host from every other.
//!
//! Needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) and `ip` from Debian's
//! `iproute2`.
//!
//! ```no_run
//! use std::net::{SocketAddr, TcpListener};
//! use test_services::netns::Network;
//!
//! let net = Network::new()?;
//! let (a, b) = (net.add_host("a")?, net.add_host("b")?);
//! let listener = net.within(&b, || TcpListener::bind(SocketAddr::from((b.addr(), 7000))))??;
//! net.cut(&a, &b)?; // connections from a to b now time out
//! net.heal(&a, &b)?;
//! let out = net.command(&a, "ping").args(["-c1", &b.addr().to_string()]).output();
//! # let _ = (listener, out);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::sched::CloneFlags;

use crate::ServiceError;
use crate::process::ServerProcess;

/// Every namespace made here has a name starting with this, then the pid
/// of the process that made it.
pub const NAMESPACE_PREFIX: &str = "mecatl-net-";

/// Where `ip netns` keeps the named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// The most hosts on one network: host addresses are `.1` to `.250`.
pub const MAX_HOSTS: usize = 250;

/// The longest host name: it is part of a namespace name.
pub const MAX_HOST_NAME: usize = 32;

/// The link-layer address a cut points a host's neighbour entry at: a
/// locally administered unicast address no interface here carries (hosts
/// get `02:6d:…` addresses with a zero fourth byte).
const SINK_MAC: &str = "02:6d:ff:ff:ff:fe";

/// Networks made by this process so far; numbers namespaces and subnets.
static NETWORKS: AtomicU32 = AtomicU32::new(0);

/// One host of a [`Network`]: a name, a namespace and an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host {
    name: String,
    index: u8,
    addr: Ipv4Addr,
    namespace: String,
}

impl Host {
    /// The name it was added with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address on the network (loopback works inside it too).
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The name of its namespace, for `ip netns exec` and `ip -n`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn mac(&self, subnet: u8) -> String {
        format!("02:6d:00:00:{subnet:02x}:{:02x}", self.index)
    }
}

/// A private network of namespaces; see the [module documentation](self).
///
/// Clones share the network; it is removed when the last one is dropped.
/// Processes still running in a host's namespace keep that namespace (and
/// nothing else) alive until they exit: stop them first.
#[derive(Debug, Clone)]
pub struct Network {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ip: PathBuf,
    /// `mecatl-net-{pid}-{n}`: the bridge's namespace; hosts append
    /// `-{name}`.
    base: String,
    subnet: u8,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    hosts: Vec<Host>,
    /// Pairs of host indices, lower first, whose traffic is cut.
    cuts: BTreeSet<(u8, u8)>,
}

impl Network {
    /// Creates the bridge's namespace and the bridge, after deleting the
    /// namespaces of earlier runs whose process is gone.
    pub fn new() -> Result<Network, ServiceError> {
        let ip = ip_binary()?;
        remove_stale_namespaces(&ip)?;
        let n = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let base = format!("{NAMESPACE_PREFIX}{pid}-{n}");
        // Different subnets for the networks of concurrent test runs make
        // logs and captures unambiguous; the namespaces keep them apart
        // anyway.
        let subnet = ((pid.wrapping_mul(31)).wrapping_add(n) % 256) as u8;
        let inner = Inner {
            ip,
            base,
            subnet,
            state: Mutex::new(State::default()),
        };
        // From here on, Drop removes whatever was made.
        let network = Network {
            inner: Arc::new(inner),
        };
        let inner = &network.inner;
        inner.ip(&["netns", "add", &inner.base])?;
        inner.ip(&["-n", &inner.base, "link", "add", "br0", "type", "bridge"])?;
        inner.ip(&["-n", &inner.base, "link", "set", "br0", "up"])?;
        inner.ip(&["-n", &inner.base, "link", "set", "lo", "up"])?;
        Ok(network)
    }

    /// The network's `/24`, as `10.213.X.0`.
    pub fn subnet(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.inner.subnet, 0)
    }

    /// Adds a host named `name` (lower-case letters, digits and `-`, at
    /// most [`MAX_HOST_NAME`] bytes, unique in the network), linked to the
    /// bridge and reachable from every other host.
    pub fn add_host(&self, name: &str) -> Result<Host, ServiceError> {
        let invalid = |reason: &str| ServiceError::InvalidHost {
            name: name.to_owned(),
            reason: reason.to_owned(),
        };
        if name.is_empty() || name.len() > MAX_HOST_NAME {
            return Err(invalid("must be 1 to 32 bytes long"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid("may hold only a-z, 0-9 and -"));
        }
        let mut state = self.inner.state();
        if state.hosts.iter().any(|h| h.name == name) {
            return Err(invalid("is already a host of this network"));
        }
        if state.hosts.len() >= MAX_HOSTS {
            return Err(invalid("would be one host too many for a /24"));
        }
        let index = u8::try_from(state.hosts.len() + 1).expect("at most 250 hosts");
        let host = Host {
            name: name.to_owned(),
            index,
            addr: Ipv4Addr::new(10, 213, self.inner.subnet, index),
            namespace: format!("{}-{name}", self.inner.base),
        };
        let inner = &self.inner;
        let (br, ns) = (inner.base.as_str(), host.namespace.as_str());
        let port = format!("p{index}");
        let mac = host.mac(inner.subnet);
        let cidr = format!("{}/24", host.addr);
        inner.ip(&["netns", "add", ns])?;
        // Recorded before the links exist, so Drop deletes the namespace
        // whatever step fails next.
        state.hosts.push(host.clone());
        inner.ip(&[
            "-n", br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "address",
            &mac, "netns", ns,
        ])?;
        inner.ip(&["-n", br, "link", "set", &port, "master", "br0", "up"])?;
        inner.ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
        inner.ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        inner.ip(&["-n", ns, "link", "set", "lo", "up"])?;
        // A host isolated before this one joined stays cut from it too.
        let isolated: Vec<Host> = state
            .hosts
            .iter()
            .filter(|h| h.index != index && state.cuts.contains(&(0, h.index)))
            .cloned()
            .collect();
        for other in isolated {
            inner.cut_pair(&mut state, &other, &host)?;
        }
        Ok(host)
    }

    /// The host named `name`, if the network has one.
    pub fn host(&self, name: &str) -> Option<Host> {
        self.inner
            .state()
            .hosts
            .iter()
            .find(|h| h.name == name)
            .cloned()
    }

    /// Every host, in the order they were added.
    pub fn hosts(&self) -> Vec<Host> {
        self.inner.state().hosts.clone()
    }

    /// `program` to be run on `host`: `ip netns exec NAMESPACE program`.
    /// Add arguments, environment and standard streams as to any
    /// [`Command`].
    pub fn command(&self, host: &Host, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(&self.inner.ip);
        cmd.args(["netns", "exec", host.namespace()]).arg(program);
        cmd
    }

    /// `cmd` to be run on `host`: its program, arguments, environment
    /// changes and working directory, behind `ip netns exec` (standard
    /// streams are not carried over: set them on the result). `ip` execs
    /// the program, so the child's pid is the program's own.
    pub fn wrap(&self, host: &Host, cmd: &Command) -> Command {
        let mut wrapped = self.command(host, cmd.get_program());
        wrapped.args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }

    /// Runs `program` with `args` on `host` to its end; its output, or
    /// [`ServiceError::Command`] when it fails.
    pub fn run<S: AsRef<OsStr>>(
        &self,
        host: &Host,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Output, ServiceError> {
        let mut cmd = self.command(host, program.as_ref());
        cmd.args(args);
        let what = format!("{} on {}", program.as_ref().to_string_lossy(), host.name);
        run_checked(cmd, what)
    }

    /// Starts `cmd` on `host` as a [`ServerProcess`] (output in `log`,
    /// killed with the test process), then polls `ready` until it is true,
    /// the process exits, or the start timeout passes.
    pub fn spawn(
        &self,
        host: &Host,
        binary: &'static str,
        cmd: &Command,
        log: &Path,
        ready: impl FnMut() -> bool,
    ) -> Result<ServerProcess, ServiceError> {
        ServerProcess::start(binary, self.wrap(host, cmd), log, ready)
    }

    /// Moves the calling thread onto `host`'s network: sockets it makes
    /// from now on are the host's (other threads are not affected).
    pub fn enter(&self, host: &Host) -> Result<(), ServiceError> {
        let path = Path::new(NETNS_DIR).join(host.namespace());
        let file = fs::File::open(&path)
            .map_err(|e| ServiceError::io(format!("open {}", path.display()), e))?;
        nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| {
            ServiceError::io(
                format!("enter the namespace of host {}", host.name),
                e.into(),
            )
        })
    }

    /// Runs `f` on a thread of its own that has [entered](Self::enter)
    /// `host`, and returns what it returns.
    pub fn within<T: Send>(
        &self,
        host: &Host,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, ServiceError> {
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                self.enter(host)?;
                Ok(f())
            });
            match thread.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Makes every IP packet between `a` and `b` vanish, both ways, until
    /// [`heal`](Self::heal). Cutting a cut pair again changes nothing.
    pub fn cut(&self, a: &Host, b: &Host) -> Result<(), ServiceError> {
        let mut state = self.inner.state();
        let (a, b) = self.members(&state, a, b)?;
        self.inner.cut_pair(&mut state, &a, &b)
    }

    /// Lets traffic between `a` and `b` through again. Healing a pair that
    /// is not cut changes nothing.
    pub fn heal(&self, a: &Host, b: &Host) -> Result<(), ServiceError> {
        let mut state = self.inner.state();
        let (a, b) = self.members(&state, a, b)?;
        self.inner.heal_pair(&mut state, &a, &b)
    }

    /// Cuts `host` from every other host of the network, also from hosts
    /// added later, until [`rejoin`](Self::rejoin).
    pub fn isolate(&self, host: &Host) -> Result<(), ServiceError> {
        let mut state = self.inner.state();
        let host = self.member(&state, host)?;
        state.cuts.insert((0, host.index));
        for other in state.hosts.clone() {
            if other.index != host.index {
                self.inner.cut_pair(&mut state, &host, &other)?;
            }
        }
        Ok(())
    }

    /// Heals every cut between `host` and the others (also those made with
    /// [`cut`](Self::cut)).
    pub fn rejoin(&self, host: &Host) -> Result<(), ServiceError> {
        let mut state = self.inner.state();
        let host = self.member(&state, host)?;
        state.cuts.remove(&(0, host.index));
        for other in state.hosts.clone() {
            if other.index != host.index {
                self.inner.heal_pair(&mut state, &host, &other)?;
            }
        }
        Ok(())
    }

    /// Whether traffic between `a` and `b` is cut now.
    pub fn is_cut(&self, a: &Host, b: &Host) -> bool {
        self.inner
            .state()
            .cuts
            .contains(&(a.index.min(b.index), a.index.max(b.index)))
    }

    fn member(&self, state: &State, host: &Host) -> Result<Host, ServiceError> {
        state
            .hosts
            .iter()
            .find(|h| *h == host)
            .cloned()
            .ok_or_else(|| ServiceError::InvalidHost {
                name: host.name.clone(),
                reason: format!("is not a host of network {}", self.inner.base),
            })
    }

    fn members(&self, state: &State, a: &Host, b: &Host) -> Result<(Host, Host), ServiceError> {
        let (a, b) = (self.member(state, a)?, self.member(state, b)?);
        if a == b {
            return Err(ServiceError::InvalidHost {
                name: a.name,
                reason: "cannot be cut from itself".into(),
            });
        }
        Ok((a, b))
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ip(&self, args: &[&str]) -> Result<Output, ServiceError> {
        let mut cmd = Command::new(&self.ip);
        cmd.args(args);
        run_checked(cmd, format!("ip {}", args.join(" ")))
    }

    fn cut_pair(&self, state: &mut State, a: &Host, b: &Host) -> Result<(), ServiceError> {
        // Pinned (permanent) entries are never replaced by what the peer
        // announces, and need no address resolution that could fail and
        // be reported to the sender as an unreachable host.
        for (from, to) in [(a, b), (b, a)] {
            self.ip(&[
                "-n",
                &from.namespace,
                "neigh",
                "replace",
                &to.addr.to_string(),
                "lladdr",
                SINK_MAC,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ])?;
        }
        state
            .cuts
            .insert((a.index.min(b.index), a.index.max(b.index)));
        Ok(())
    }

    fn heal_pair(&self, state: &mut State, a: &Host, b: &Host) -> Result<(), ServiceError> {
        if !state
            .cuts
            .remove(&(a.index.min(b.index), a.index.max(b.index)))
        {
            return Ok(());
        }
        for (from, to) in [(a, b), (b, a)] {
            // Resolved afresh on the next packet.
            self.ip(&[
                "-n",
                &from.namespace,
                "neigh",
                "del",
                &to.addr.to_string(),
                "dev",
                "eth0",
            ])?;
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let hosts = std::mem::take(
            &mut self
                .state
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .hosts,
        );
        // A host's namespace takes its veth pair with it.
        for host in &hosts {
            let _ = self.ip(&["netns", "del", &host.namespace]);
        }
        let _ = self.ip(&["netns", "del", &self.base]);
    }
}

/// Runs `cmd` to its end, its output captured; an error unless it exits 0.
fn run_checked(mut cmd: Command, what: String) -> Result<Output, ServiceError> {
    cmd.stdin(Stdio::null());
    let output = cmd
        .output()
        .map_err(|e| ServiceError::io(format!("run {what}"), e))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(ServiceError::Command {
            what,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// `ip`: `$MECATL_IP`, else `PATH`, else the sbin directories, which a
/// non-login shell's `PATH` may lack.
fn ip_binary() -> Result<PathBuf, ServiceError> {
    crate::find_binary("ip", "iproute2", "MECATL_IP").or_else(|e| {
        if std::env::var_os("MECATL_IP").is_some() {
            return Err(e);
        }
        ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or(e)
    })
}

/// Deletes the namespaces named `mecatl-net-{pid}-…` whose process no
/// longer runs: what a test run killed before its destructors left. The
/// number deleted.
fn remove_stale_namespaces(ip: &Path) -> Result<usize, ServiceError> {
    let entries = match fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(ServiceError::io(format!("list {NETNS_DIR}"), e)),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if process_is_alive(pid) {
            continue;
        }
        let mut cmd = Command::new(ip);
        cmd.args(["netns", "del", &name]);
        // Another run may be deleting the same leftovers right now.
        if run_checked(cmd, format!("ip netns del {name}")).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// The pid in a namespace name made here, `mecatl-net-{pid}-…`.
fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(NAMESPACE_PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok().filter(|pid| *pid > 0)
}

fn process_is_alive(pid: i32) -> bool {
    // EPERM means it exists under another user.
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn reads_the_owner_pid_from_a_namespace_name() {
        assert_eq!(owner_pid("mecatl-net-4242-0"), Some(4242));
        assert_eq!(owner_pid("mecatl-net-4242-0-etcd-1"), Some(4242));
        assert_eq!(owner_pid("mecatl-net-x-0"), None);
        assert_eq!(owner_pid("mecatl-net-0-0"), None);
        assert_eq!(owner_pid("other-4242-0"), None);
        assert_eq!(owner_pid("mecatl-net-4242"), None);
    }
}
