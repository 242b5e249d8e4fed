//! The processes a measurement starts from their binaries (`mecated`,
//! `mecatl-leased`, the Kubernetes API emulator), and what `/proc` says of
//! them: CPU time and resident memory.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, SysconfVar, sysconf};

use crate::Result;

/// A started server, killed when dropped.
pub(super) struct Process {
    name: String,
    child: Option<Child>,
    /// What followed "listening on " in the first line that said it.
    pub(super) address: String,
    log: PathBuf,
    /// Kept open: a server writing to a closed pipe would fail.
    _stdout: BufReader<ChildStdout>,
}

impl Process {
    /// Starts `binary` with `args` and `env`, its standard error in `log`,
    /// and waits for the line naming its address.
    pub(super) fn start(
        name: &str,
        binary: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: &Path,
    ) -> Result<Process> {
        let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file);
        // A measurement interrupted (^C, a panic) must not leave servers
        // holding thousands of runs behind it.
        #[allow(unsafe_code)]
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("start {}: {e}", binary.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        loop {
            line.clear();
            let read = stdout.read_line(&mut line);
            if let Some((_, address)) = line.trim().split_once("listening on ") {
                let address = address.split_whitespace().next().unwrap_or("").to_owned();
                return Ok(Process {
                    name: name.to_owned(),
                    child: Some(child),
                    address,
                    log: log.to_path_buf(),
                    _stdout: stdout,
                });
            }
            if !matches!(read, Ok(n) if n > 0) {
                let _ = child.kill();
                let status = child.wait().map_err(|e| e.to_string())?;
                let said = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = said.lines().rev().take(5).collect();
                return Err(format!(
                    "{name} did not start ({status}); its last words: {tail:?}"
                ));
            }
        }
    }

    /// The last lines the process logged, for an error about it.
    pub(super) fn last_words(&self) -> String {
        let said = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut tail: Vec<&str> = said.lines().rev().take(8).collect();
        tail.reverse();
        tail.join("\n")
    }

    pub(super) fn pid(&self) -> Result<Pid> {
        self.child
            .as_ref()
            .map(|c| Pid::from_raw(c.id() as i32))
            .ok_or_else(|| format!("{} is not running", self.name))
    }

    /// CPU time the process used so far, user and system, all threads.
    pub(super) fn cpu_time(&self) -> Result<Duration> {
        let pid = self.pid()?;
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        // The command name may hold spaces: fields count from after it.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| -> Result<u64> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("{path}: no field {}", i + 3))
        };
        // utime and stime are fields 14 and 15; the list starts at field 3.
        let total = ticks(11)? + ticks(12)?;
        let per_second = sysconf(SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|&t| t > 0)
            .unwrap_or(100) as u64;
        Ok(Duration::from_secs_f64(total as f64 / per_second as f64))
    }

    /// Resident memory now, in KiB.
    pub(super) fn rss_kib(&self) -> Result<u64> {
        let pid = self.pid()?;
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| format!("{path}: no VmRSS"))
    }

    pub(super) fn signal(&self, sig: Signal) -> Result {
        kill(self.pid()?, sig).map_err(|e| format!("{sig} to {}: {e}", self.name))
    }

    /// SIGTERM, then the exit within `patience`: whether it exited cleanly.
    pub(super) fn terminate(&mut self, patience: Duration) -> Result<bool> {
        self.signal(Signal::SIGTERM)?;
        let child = self.child.as_mut().ok_or("not running")?;
        let start = Instant::now();
        while start.elapsed() < patience {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                self.child = None;
                return Ok(status.success());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(format!(
            "{} did not exit within {patience:?} of SIGTERM",
            self.name
        ))
    }

    /// SIGKILL, and the exit reaped.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where the binaries measured are.
#[derive(Clone)]
pub(super) struct Binaries {
    pub(super) dir: PathBuf,
    /// The copy the binaries were taken into, removed with the last clone.
    pub(super) _copy: Option<std::sync::Arc<tempfile::TempDir>>,
}

impl Binaries {
    /// Copies `names` out of `built`: a build of another profile sharing
    /// the directory (`cargo bench` writes `target/release` too) must not
    /// swap a binary in the middle of a run.
    pub(super) fn snapshot(built: &Path, names: &[&str]) -> Result<Binaries> {
        let copy = tempfile::Builder::new()
            .prefix("xtask-scale-bin-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        for name in names {
            let (from, to) = (built.join(name), copy.path().join(name));
            std::fs::copy(&from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
        }
        Ok(Binaries {
            dir: copy.path().to_path_buf(),
            _copy: Some(std::sync::Arc::new(copy)),
        })
    }

    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}
