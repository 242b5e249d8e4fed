//! A child server process: found on PATH, started with the parent-death
//! signal, polled until ready, stopped on drop.

use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::ServiceError;

/// What a service needs to be found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binary {
    pub(crate) name: &'static str,
    pub(crate) package: &'static str,
    pub(crate) env_var: &'static str,
}

/// `$ENV_VAR` when set, else the first match on `PATH`.
pub fn find_binary(
    name: &'static str,
    package: &'static str,
    env_var: &'static str,
) -> Result<PathBuf, ServiceError> {
    let not_installed = || ServiceError::NotInstalled {
        binary: name,
        package,
        env_var,
    };
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(not_installed())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(not_installed)
}

impl Binary {
    pub(crate) fn find(self) -> Result<PathBuf, ServiceError> {
        find_binary(self.name, self.package, self.env_var)
    }
}

/// A port nobody listens on right now. Another process can take it before
/// the server binds it; callers retry on a start that fails.
pub(crate) fn free_port() -> Result<u16, ServiceError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ServiceError::io("reserve a loopback port", e))
}

/// How long a server may take to answer after it was started. Generous: a
/// loaded 2-core machine may be compiling beside the test.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Forks `cmd` from a thread that lives as long as the process.
///
/// The kernel sends a child its parent-death signal when the *thread* that
/// forked it exits, not the process; test threads end and runtimes retire
/// idle threads (`block_in_place`, `spawn_blocking`) long before the
/// process does. A server restarted from such a thread would be killed
/// later, unasked and unrecorded.
fn spawn_from_lasting_thread(mut cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("test-services-spawner".into())
            .spawn(move || {
                for (mut cmd, answer) in queue {
                    let _ = answer.send(cmd.spawn());
                }
            })
            .ok()
            .map(|_| jobs)
    });
    let Some(spawner) = spawner else {
        // No thread to be had: this one will do, with the caveat above.
        return cmd.spawn();
    };
    let (answer, answered) = mpsc::channel();
    let gone = || std::io::Error::other("the spawning thread is gone");
    spawner.send((cmd, answer)).map_err(|_| gone())?;
    answered.recv().map_err(|_| gone())?
}

/// A running server process, killed and reaped on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    binary: &'static str,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts `cmd` with its output in `log`, then polls `ready` until it is
    /// true, the process exits, or [`READY_TIMEOUT`] passes.
    pub(crate) fn start(
        binary: &'static str,
        mut cmd: Command,
        log: &Path,
        mut ready: impl FnMut() -> bool,
    ) -> Result<ServerProcess, ServiceError> {
        let out = fs::File::create(log)
            .map_err(|e| ServiceError::io(format!("create {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| ServiceError::io("duplicate the log file", e))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: the closure runs in the forked child before exec and only
        // makes one prctl(2) call, which is async-signal-safe and allocates
        // nothing. It makes the kernel kill the server if the test process
        // dies without running destructors (SIGKILL, abort).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = spawn_from_lasting_thread(cmd)
            .map_err(|e| ServiceError::io(format!("start {binary}"), e))?;
        let mut process = ServerProcess {
            child: Some(child),
            binary,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pause = Duration::from_millis(5);
        loop {
            if ready() {
                return Ok(process);
            }
            if let Some(status) = process.try_exit_status() {
                return Err(process.not_ready(format!("exited early ({status})")));
            }
            if Instant::now() >= deadline {
                return Err(process.not_ready(format!("no answer within {READY_TIMEOUT:?}")));
            }
            thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    fn try_exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn not_ready(mut self, reason: String) -> ServiceError {
        self.kill();
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let tail: String = text
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        ServiceError::NotReady {
            binary: self.binary,
            reason,
            log: self.log.clone(),
            tail,
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> Result<(), ServiceError> {
        let pid = self
            .pid()
            .ok_or_else(|| ServiceError::io("signal", std::io::Error::other("not running")))?;
        let pid =
            i32::try_from(pid).map_err(|e| ServiceError::io("pid", std::io::Error::other(e)))?;
        kill(Pid::from_raw(pid), signal)
            .map_err(|e| ServiceError::io(format!("send {signal}"), e.into()))
    }

    /// SIGTERM, then SIGKILL if the server has not exited within `grace`.
    pub(crate) fn stop(&mut self, grace: Duration) {
        self.stop_with(Signal::SIGTERM, grace);
    }

    /// `signal` (the server's own request to shut down), then SIGKILL if
    /// the server has not exited within `grace`.
    pub(crate) fn stop_with(&mut self, signal: Signal, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // A paused server cannot act on the signal.
        let _ = self.signal_child(&child, Signal::SIGCONT);
        let _ = self.signal_child(&child, signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL at once, as a crash would.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal_child(&self, child: &Child, signal: Signal) -> nix::Result<()> {
        let pid = i32::try_from(child.id()).map_err(|_| nix::Error::EINVAL)?;
        kill(Pid::from_raw(pid), signal)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How many times a start is retried when the chosen port was taken.
pub(crate) const START_ATTEMPTS: usize = 5;
