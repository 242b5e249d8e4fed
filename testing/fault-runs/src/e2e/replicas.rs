//! The server processes under test: started from their binaries on free
//! loopback ports, stopped, killed and started again with real signals.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::lock_read;

/// Starts of one replica tried before giving up.
const START_ATTEMPTS: usize = 6;

/// How to start one replica: binary, arguments, environment.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) binary: PathBuf,
    /// Where its standard error goes (appended across restarts).
    pub(crate) log: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
}

/// One replica: its launch, its process while it runs, its address.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) name: String,
    launch: Launch,
    child: Option<Child>,
}

impl Replica {
    /// Starts it; its base URL.
    fn spawn(&mut self) -> Result<String, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.launch.log)
            .map_err(|e| format!("{}: {e}", self.launch.log.display()))?;
        let mut child = Command::new(&self.launch.binary)
            .args(&self.launch.args)
            .envs(self.launch.env.iter().map(|(k, v)| (k, v)))
            .env("MECATED_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.launch.binary.display()))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let read = BufReader::new(stdout).read_line(&mut line);
        let base = match (read, line.trim().strip_prefix("listening on ")) {
            (Ok(_), Some(base)) => base.to_owned(),
            (read, _) => {
                let _ = child.kill();
                let status = child.wait().map_err(|e| e.to_string())?;
                let said = std::fs::read_to_string(&self.launch.log).unwrap_or_default();
                let tail: Vec<&str> = said.lines().rev().take(5).collect();
                return Err(format!(
                    "{} did not start ({status}, read {read:?}): first line {line:?}; \
                     its last words: {:?}",
                    self.name, tail
                ));
            }
        };
        self.child = Some(child);
        Ok(base)
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    fn signal(&self, sig: Signal) -> Result<(), String> {
        match self.pid() {
            Some(pid) => kill(pid, sig).map_err(|e| format!("{sig} to {}: {e}", self.name)),
            None => Ok(()),
        }
    }

    /// Waits up to `patience` for the process to exit; whether it did.
    fn reap(&mut self, patience: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        let start = Instant::now();
        while start.elapsed() < patience {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.signal(Signal::SIGCONT);
        self.kill_now();
    }
}

/// The replicas, and where clients reach each one (`None` while down).
pub(crate) struct Replicas {
    replicas: Vec<std::sync::Mutex<Replica>>,
    bases: Arc<RwLock<Vec<Option<String>>>>,
}

impl Replicas {
    /// Starts one replica per launch, in order.
    pub(crate) fn start(launches: Vec<(String, Launch)>) -> Result<Replicas, String> {
        let mut replicas = Vec::new();
        let mut bases = Vec::new();
        for (name, launch) in launches {
            let mut r = Replica {
                name,
                launch,
                child: None,
            };
            bases.push(Some(r.spawn()?));
            replicas.push(std::sync::Mutex::new(r));
        }
        Ok(Replicas {
            replicas,
            bases: Arc::new(RwLock::new(bases)),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.replicas.len()
    }

    pub(crate) fn name(&self, i: usize) -> String {
        super::lock(&self.replicas[i]).name.clone()
    }

    /// Where clients look up each replica's address.
    pub(crate) fn bases(&self) -> Arc<RwLock<Vec<Option<String>>>> {
        Arc::clone(&self.bases)
    }

    /// The address of some replica that is up.
    pub(crate) fn any_base(&self) -> Option<String> {
        lock_read(&self.bases).iter().flatten().next().cloned()
    }

    /// SIGSTOP: the process keeps its address but answers nothing.
    pub(crate) fn pause(&self, i: usize) -> Result<(), String> {
        super::lock(&self.replicas[i]).signal(Signal::SIGSTOP)
    }

    pub(crate) fn resume(&self, i: usize) -> Result<(), String> {
        super::lock(&self.replicas[i]).signal(Signal::SIGCONT)
    }

    /// SIGSTOP to the replica, then to the process group of each agent it
    /// runs (each runs in a group of its own): the replica frozen whole,
    /// as a frozen VM or cgroup is. Returns the agents' groups, for
    /// [`thaw_agents`](Self::thaw_agents).
    pub(crate) fn freeze(&self, i: usize) -> Result<Vec<Pid>, String> {
        let r = super::lock(&self.replicas[i]);
        let Some(pid) = r.pid() else {
            return Ok(Vec::new());
        };
        r.signal(Signal::SIGSTOP)?;
        // A child it was spawning as the stop landed may not be in a
        // group of its own yet: only children that lead their group are
        // its agents (and never ours, nor the replica's).
        let groups = child_process_groups(pid);
        for &group in &groups {
            // An agent that exited meanwhile has nothing to stop.
            let _ = killpg(group, Signal::SIGSTOP);
        }
        Ok(groups)
    }

    /// Whether the replica runs an agent now (a run in progress).
    pub(crate) fn runs_agents(&self, i: usize) -> bool {
        let pid = super::lock(&self.replicas[i]).pid();
        pid.is_some_and(|pid| !child_process_groups(pid).is_empty())
    }

    /// SIGCONT to agents' process groups [`freeze`](Self::freeze) stopped.
    pub(crate) fn thaw_agents(groups: &[Pid]) {
        for &group in groups {
            let _ = killpg(group, Signal::SIGCONT);
        }
    }

    /// SIGKILL, as a crash would; [`start_again`](Self::start_again)
    /// brings it back.
    pub(crate) fn kill(&self, i: usize) {
        self.bases.write().unwrap_or_else(|e| e.into_inner())[i] = None;
        super::lock(&self.replicas[i]).kill_now();
    }

    /// SIGTERM and wait for the clean exit (releases every lease), killing
    /// it if it does not come.
    pub(crate) fn stop(&self, i: usize, patience: Duration) -> Result<(), String> {
        self.bases.write().unwrap_or_else(|e| e.into_inner())[i] = None;
        let mut r = super::lock(&self.replicas[i]);
        r.signal(Signal::SIGCONT)?;
        r.signal(Signal::SIGTERM)?;
        if !r.reap(patience) {
            r.kill_now();
            return Err(format!("{} did not exit on SIGTERM", r.name));
        }
        Ok(())
    }

    /// Starts a stopped or killed replica again, with the same launch (the
    /// same owner id: a new incarnation of it) on a new port.
    /// A replica that cannot start yet (its services still down) is tried
    /// again, as a supervisor would, a few times.
    pub(crate) fn start_again(&self, i: usize) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match super::lock(&self.replicas[i]).spawn() {
                Ok(base) => {
                    self.bases.write().unwrap_or_else(|e| e.into_inner())[i] = Some(base);
                    return Ok(());
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(last)
    }

    /// Every replica running and resumed.
    pub(crate) fn heal_all(&self) -> Result<(), String> {
        for i in 0..self.len() {
            let down = super::lock(&self.replicas[i]).child.is_none();
            if down {
                self.start_again(i)?;
            } else {
                self.resume(i)?;
            }
        }
        Ok(())
    }

    /// Stops every replica.
    pub(crate) fn stop_all(&self) {
        for i in 0..self.len() {
            let _ = self.stop(i, Duration::from_secs(10));
        }
    }
}

/// The process groups `parent`'s children lead, from `/proc`: a child
/// still in its parent's group (an agent spawned a moment ago, before it
/// moved to its own) is not listed, so a signal to the listed groups never
/// reaches the parent's group, which is this harness's.
fn child_process_groups(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut groups: Vec<Pid> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| {
            // "pid (comm) state ppid pgrp …": comm may hold anything but
            // ends at the last parenthesis.
            let pid: i32 = stat.split_whitespace().next()?.parse().ok()?;
            let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
            let ppid: i32 = fields.nth(1)?.parse().ok()?;
            let pgrp: i32 = fields.next()?.parse().ok()?;
            (ppid == parent.as_raw() && pgrp == pid).then(|| Pid::from_raw(pgrp))
        })
        .filter(|group| *group != parent && *group != nix::unistd::getpgrp())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}
