//! Holders in processes of their own.
//!
//! Each worker's lease calls and writes go through a child process (this
//! same executable, started as `faults holder-process …`) that opens the
//! lease directory and the store itself, as a session server would. The
//! fault injector can then stop a holder with SIGSTOP past its TTL and kill
//! it with SIGKILL in the middle of an operation, for real: a stopped
//! holder carries on with whatever it was doing when it is let go, a killed
//! one leaves behind whatever half-done work the kernel and the files hold.
//!
//! The worker, in this process, still records every invocation and
//! completion; a call the holder does not answer in time is recorded as
//! ambiguous, and a cancel is sent so the holder drops it as an in-process
//! caller would drop its future (the holder may have started it already).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcdlease::EtcdLease;
use flocklease::FlockLease;
use lease_history::{FaultKind, Recorder, Rng, Target, Writer};
use lease_port::{
    AuthorityId, FencingToken, Lease, LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease,
    SystemClock,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use session_store::{
    FsyncPolicy, GenerationCheck, JsonlOptions, JsonlStore, SessionStore, StoreError, WriteFence,
};
use test_services::netns::{Host, Network};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::sleep;

use lease_history::broken::{BrokenStore, StoreBreakage};

/// The first argument that makes this executable a holder process.
pub(crate) const HOLDER_PROCESS: &str = "holder-process";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a worker asks its holder process to do.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Call {
    Acquire {
        session: SessionId,
        owner: OwnerId,
    },
    Renew {
        lease: Lease,
    },
    Release {
        lease: Lease,
    },
    Current {
        session: SessionId,
    },
    Authority,
    Append {
        lease: Lease,
        payload: Value,
    },
    /// A second handle on the lease directory, opened, used and closed in
    /// the holder's own process: a descriptor closed beside the ones its
    /// locks are held through.
    Churn,
}

/// One line to the holder.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ToHolder {
    Call {
        id: u64,
        call: Call,
    },
    /// The caller gave up on call `id`: drop it where it stands.
    Cancel {
        id: u64,
    },
}

/// One line from the holder: the answer to call `id`.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    id: u64,
    answer: Result<Answer, Failure>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Answer {
    Lease(Lease),
    Current(Option<Lease>),
    Authority(String),
    Done,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Failure {
    Lease {
        kind: String,
        holder: Option<OwnerId>,
        message: String,
    },
    Fenced {
        session: SessionId,
        presented: u64,
        presented_by: OwnerId,
        high_water: u64,
        high_water_owner: Option<OwnerId>,
    },
    Store {
        message: String,
    },
}

impl From<LeaseError> for Failure {
    fn from(e: LeaseError) -> Self {
        let kind = match e.kind() {
            LeaseErrorKind::Held => "held",
            LeaseErrorKind::Unsupported => "unsupported",
            LeaseErrorKind::Invalid => "invalid",
            LeaseErrorKind::Transient => "transient",
            _ => "other",
        };
        Failure::Lease {
            kind: kind.into(),
            holder: e.holder().cloned(),
            message: e.to_string(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Fenced {
                session,
                presented,
                presented_by,
                high_water,
                high_water_owner,
            } => Failure::Fenced {
                session,
                presented: presented.get(),
                presented_by,
                high_water: high_water.get(),
                high_water_owner,
            },
            other => Failure::Store {
                message: other.to_string(),
            },
        }
    }
}

impl Failure {
    fn into_lease_error(self) -> LeaseError {
        match self {
            Failure::Lease {
                kind,
                holder,
                message,
            } => match kind.as_str() {
                "held" => LeaseError::held(holder),
                "unsupported" => LeaseError::new(LeaseErrorKind::Unsupported, message),
                "invalid" => LeaseError::new(LeaseErrorKind::Invalid, message),
                _ => LeaseError::transient(message),
            },
            other => LeaseError::transient(format!("holder process answered {other:?}")),
        }
    }

    fn into_store_error(self, session: &SessionId) -> StoreError {
        match self {
            Failure::Fenced {
                session,
                presented,
                presented_by,
                high_water,
                high_water_owner,
            } => StoreError::Fenced {
                session,
                presented: FencingToken::new(presented),
                presented_by,
                high_water: FencingToken::new(high_water),
                high_water_owner,
            },
            other => unknown_fate(session, format!("holder process answered {other:?}")),
        }
    }
}

/// A write whose fate this process cannot know.
fn unknown_fate(session: &SessionId, why: String) -> StoreError {
    StoreError::Io {
        op: "append through the holder process",
        path: PathBuf::from(session.as_str()),
        source: std::io::Error::other(why),
    }
}

// ---------------------------------------------------------------- the child

/// The lease backend a holder process opens.
#[derive(Debug, Clone)]
pub(crate) enum LeaseSpec {
    /// A lease directory on this host: `flock:DIR`.
    Flock(PathBuf),
    /// An etcd cluster: `etcd:PREFIX@ENDPOINT,ENDPOINT…`.
    Etcd {
        prefix: String,
        endpoints: Vec<String>,
    },
}

impl LeaseSpec {
    fn to_arg(&self) -> String {
        match self {
            LeaseSpec::Flock(dir) => format!("flock:{}", dir.display()),
            LeaseSpec::Etcd { prefix, endpoints } => {
                format!("etcd:{prefix}@{}", endpoints.join(","))
            }
        }
    }

    fn parse(arg: &str) -> Result<LeaseSpec, String> {
        if let Some(dir) = arg.strip_prefix("flock:") {
            return Ok(LeaseSpec::Flock(dir.into()));
        }
        let etcd = arg
            .strip_prefix("etcd:")
            .and_then(|rest| rest.split_once('@'))
            .ok_or_else(|| format!("LEASES: flock:DIR or etcd:PREFIX@ENDPOINTS, not {arg:?}"))?;
        Ok(LeaseSpec::Etcd {
            prefix: etcd.0.into(),
            endpoints: etcd.1.split(',').map(str::to_owned).collect(),
        })
    }

    fn open(&self, ttl: Duration) -> Result<Box<dyn SessionLease>, String> {
        Ok(match self {
            LeaseSpec::Flock(dir) => Box::new(
                FlockLease::builder(dir.clone())
                    .ttl(ttl)
                    .open()
                    .map_err(|e| format!("open the lease directory: {e}"))?,
            ),
            LeaseSpec::Etcd { prefix, endpoints } => Box::new(
                EtcdLease::builder(endpoints.iter().cloned())
                    .prefix(prefix.clone())
                    .ttl(ttl)
                    .request_timeout(ttl / 4)
                    .build()
                    .map_err(|e| format!("etcd lease: {e}"))?,
            ),
        })
    }
}

/// How a holder process is started: `holder-process LEASES STORE_DIR
/// TTL_MS [store-without-fencing] [generation-witness=DIR]`.
struct HolderArgs {
    leases: LeaseSpec,
    store: PathBuf,
    ttl: Duration,
    /// A broken variant: the holder writes through a store that writes
    /// refused writes anyway.
    broken_store: bool,
    /// The store's generation check, as a server opens it.
    generation: GenerationCheck,
}

/// The argument that starts a holder over a store without fencing.
const STORE_WITHOUT_FENCING: &str = "store-without-fencing";
/// The prefix of the argument that opens the store with a generation
/// check witnessed in a directory.
const GENERATION_WITNESS: &str = "generation-witness=";

fn holder_args(args: &[String]) -> Result<HolderArgs, String> {
    let usage = || {
        format!(
            "usage: faults {HOLDER_PROCESS} LEASES STORE_DIR TTL_MS [{STORE_WITHOUT_FENCING}] \
             [{GENERATION_WITNESS}DIR]"
        )
    };
    let [leases, store, ttl_ms, flags @ ..] = args else {
        return Err(usage());
    };
    let mut parsed = HolderArgs {
        leases: LeaseSpec::parse(leases)?,
        store: store.into(),
        ttl: Duration::from_millis(ttl_ms.parse().map_err(|e| format!("TTL_MS: {e}"))?),
        broken_store: false,
        generation: GenerationCheck::Off,
    };
    for flag in flags {
        if flag == STORE_WITHOUT_FENCING {
            parsed.broken_store = true;
        } else if let Some(dir) = flag.strip_prefix(GENERATION_WITNESS) {
            parsed.generation = GenerationCheck::witness(dir);
        } else {
            return Err(usage());
        }
    }
    Ok(parsed)
}

/// The store as a holder (or the rig, as one more server of it) opens it.
pub(crate) fn open_store(
    dir: &Path,
    generation: &GenerationCheck,
) -> Result<JsonlStore, StoreError> {
    JsonlStore::open(
        dir,
        JsonlOptions::default()
            .fsync(FsyncPolicy::Never)
            .generation(generation.clone()),
    )
}

/// The holder process's `main`: answers calls from stdin on stdout until
/// stdin closes.
pub(crate) fn holder_main(args: &[String]) -> ExitCode {
    let args = match holder_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holder process: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("holder process: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Hands {
    leases: Box<dyn SessionLease>,
    store: Arc<dyn SessionStore>,
    spec: LeaseSpec,
    ttl: Duration,
}

impl Hands {
    async fn act(&self, call: Call) -> Result<Answer, Failure> {
        Ok(match call {
            Call::Acquire { session, owner } => {
                Answer::Lease(self.leases.acquire(&session, &owner).await?)
            }
            Call::Renew { lease } => Answer::Lease(self.leases.renew(&lease).await?),
            Call::Release { lease } => {
                self.leases.release(&lease).await?;
                Answer::Done
            }
            Call::Current { session } => Answer::Current(self.leases.current(&session).await?),
            Call::Authority => Answer::Authority(self.leases.authority().await?.to_string()),
            Call::Append { lease, payload } => {
                self.store
                    .append(
                        lease.session_id(),
                        WriteFence::from(&lease),
                        std::slice::from_ref(&payload),
                    )
                    .await?;
                Answer::Done
            }
            Call::Churn => {
                // A second handle, opened, used and closed beside the one
                // the holder's leases go through: for file leases, every
                // lease file opened and closed again in this process.
                match &self.spec {
                    LeaseSpec::Flock(dir) => {
                        let second = FlockLease::builder(dir.clone()).ttl(self.ttl).open()?;
                        second.list().await?;
                    }
                    other => {
                        let second = other
                            .open(self.ttl)
                            .map_err(|message| Failure::Store { message })?;
                        second.authority().await?;
                    }
                }
                Answer::Done
            }
        })
    }
}

async fn serve(args: HolderArgs) -> Result<(), String> {
    let mut store: Arc<dyn SessionStore> = Arc::new(
        open_store(&args.store, &args.generation).map_err(|e| format!("open the store: {e}"))?,
    );
    if args.broken_store {
        store = Arc::new(BrokenStore::new(store, StoreBreakage::NoFence));
    }
    let hands = Arc::new(Hands {
        leases: args.leases.open(args.ttl)?,
        store,
        spec: args.leases,
        ttl: args.ttl,
    });
    let (replies, mut outbox) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(reply) = outbox.recv().await {
            let mut line = serde_json::to_vec(&reply).map_err(|e| e.to_string())?;
            line.push(b'\n');
            stdout.write_all(&line).await.map_err(|e| e.to_string())?;
            stdout.flush().await.map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    });
    let running: Arc<Mutex<HashMap<u64, AbortHandle>>> = Arc::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        match serde_json::from_str::<ToHolder>(&line).map_err(|e| format!("{e}: {line}"))? {
            ToHolder::Call { id, call } => {
                let hands = Arc::clone(&hands);
                let replies = replies.clone();
                let done = Arc::clone(&running);
                let task = tokio::spawn(async move {
                    let answer = hands.act(call).await;
                    lock(&done).remove(&id);
                    let _ = replies.send(Reply { id, answer });
                });
                let mut running = lock(&running);
                if !task.is_finished() {
                    running.insert(id, task.abort_handle());
                }
            }
            ToHolder::Cancel { id } => {
                if let Some(task) = lock(&running).remove(&id) {
                    task.abort();
                }
            }
        }
    }
    drop(replies);
    writer.await.map_err(|e| e.to_string())?
}

// --------------------------------------------------------------- the parent

/// Calls sent to a holder process, by id, each with where its answer goes.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Answer, Failure>>>>>;

/// One running holder process and the calls waiting for its answers.
struct HolderProcess {
    pid: Pid,
    calls: mpsc::UnboundedSender<ToHolder>,
    waiting: Waiting,
    /// False once its answers ended (the process is gone): a call then
    /// fails at once instead of waiting for an answer that cannot come.
    alive: Arc<AtomicBool>,
    next: AtomicU64,
    child: Mutex<Option<Child>>,
}

impl HolderProcess {
    fn spawn(config: &HolderConfig) -> Result<HolderProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("find this executable: {e}"))?;
        let mut command = std::process::Command::new(exe);
        command
            .arg(HOLDER_PROCESS)
            .arg(config.leases.to_arg())
            .arg(&config.store)
            .arg(config.ttl.as_millis().to_string())
            .args(config.broken_store.then_some(STORE_WITHOUT_FENCING))
            .args(
                config
                    .generation_witness
                    .as_ref()
                    .map(|dir| format!("{GENERATION_WITNESS}{}", dir.display())),
            );
        if let Some((network, host)) = &config.host {
            command = network.wrap(host, &command);
        }
        let mut child = Command::from(command)
            // A group of its own: should this runner die while the holder
            // is stopped, the kernel finds a stopped process in an orphaned
            // group and sends it SIGHUP and SIGCONT, which end it. A
            // running holder ends when its stdin closes.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start a holder process: {e}"))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
            .ok_or("the holder process has no pid")?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (calls, outbox) = mpsc::unbounded_channel();
        tokio::spawn(send_calls(stdin, outbox));
        let waiting: Waiting = Arc::default();
        let answered = Arc::clone(&waiting);
        let alive = Arc::new(AtomicBool::new(true));
        let living = Arc::clone(&alive);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(reply) = serde_json::from_str::<Reply>(&line) else {
                    eprintln!("holder process {pid}: unreadable answer {line:?}");
                    break;
                };
                if let Some(caller) = lock(&answered).remove(&reply.id) {
                    let _ = caller.send(reply.answer);
                }
            }
            // The process is gone: every call still waiting never gets an
            // answer, and its caller learns so from the dropped sender.
            living.store(false, Ordering::SeqCst);
            lock(&answered).clear();
        });
        Ok(HolderProcess {
            pid,
            calls,
            waiting,
            alive,
            next: AtomicU64::new(1),
            child: Mutex::new(Some(child)),
        })
    }

    async fn call(&self, call: Call) -> Result<Answer, Failure> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(id, tx);
        let gone = || Failure::Store {
            message: format!("holder process {} is gone", self.pid),
        };
        // Checked after the call waits: the reader marks the process gone
        // before it drops every waiting call.
        if !self.alive.load(Ordering::SeqCst)
            || self.calls.send(ToHolder::Call { id, call }).is_err()
        {
            lock(&self.waiting).remove(&id);
            return Err(gone());
        }
        let mut pending = Pending {
            id,
            holder: self,
            answered: false,
        };
        let answer = rx.await.map_err(|_| gone());
        pending.answered = true;
        answer?
    }

    fn signal(&self, signal: Signal) -> Result<(), String> {
        kill(self.pid, signal).map_err(|e| format!("send {signal} to holder {}: {e}", self.pid))
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        // A stopped process ignores everything but SIGKILL and SIGCONT.
        let _ = kill(self.pid, Signal::SIGKILL);
        if let Some(mut child) = lock(&self.child).take() {
            let _ = child.start_kill();
            // Reaped by tokio's orphan queue once it has exited.
            drop(child);
        }
    }
}

/// A call in flight; dropped unanswered, it tells the holder to drop it too.
struct Pending<'a> {
    id: u64,
    holder: &'a HolderProcess,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            lock(&self.holder.waiting).remove(&self.id);
            let _ = self.holder.calls.send(ToHolder::Cancel { id: self.id });
        }
    }
}

async fn send_calls(mut stdin: ChildStdin, mut outbox: mpsc::UnboundedReceiver<ToHolder>) {
    while let Some(message) = outbox.recv().await {
        let Ok(mut line) = serde_json::to_vec(&message) else {
            continue;
        };
        line.push(b'\n');
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
    }
}

/// How a worker's holder processes are started.
#[derive(Debug, Clone)]
pub(crate) struct HolderConfig {
    pub(crate) leases: LeaseSpec,
    /// The JSONL store's directory.
    pub(crate) store: PathBuf,
    pub(crate) ttl: Duration,
    /// A broken variant: write through a store without fencing.
    pub(crate) broken_store: bool,
    /// Open the store with a generation check witnessed in this directory
    /// (the lease directory), as a server does; `None`: no check.
    pub(crate) generation_witness: Option<PathBuf>,
    /// The host of a private network the holder runs on, if any; else
    /// this host's own network.
    pub(crate) host: Option<(Network, Host)>,
}

/// A worker's holder: the process now standing in for it, replaced by a
/// new one when it is killed.
pub(crate) struct Holder {
    name: String,
    config: HolderConfig,
    process: Mutex<Arc<HolderProcess>>,
    /// Woken each time an acquire or a renewal is granted through it: the
    /// moment a stop makes the likeliest stale writer.
    granted: Notify,
}

impl Holder {
    /// Starts the holder process of worker `name`.
    pub(crate) fn start(name: String, config: HolderConfig) -> Result<Arc<Holder>, String> {
        let process = HolderProcess::spawn(&config)?;
        Ok(Arc::new(Holder {
            name,
            config,
            process: Mutex::new(Arc::new(process)),
            granted: Notify::new(),
        }))
    }

    /// The host of a private network it runs on, if any.
    pub(crate) fn host(&self) -> Option<&Host> {
        self.config.host.as_ref().map(|(_, h)| h)
    }

    /// Its worker's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// How its processes are started.
    pub(crate) fn config(&self) -> &HolderConfig {
        &self.config
    }

    fn process(&self) -> Arc<HolderProcess> {
        Arc::clone(&lock(&self.process))
    }

    async fn call(&self, call: Call) -> Result<Answer, Failure> {
        self.process().call(call).await
    }

    /// SIGKILL, then a new process in its place: calls in flight on the old
    /// one end unanswered.
    fn kill_and_replace(&self) -> Result<(), String> {
        let old = self.process();
        old.signal(Signal::SIGKILL)?;
        let new = HolderProcess::spawn(&self.config)?;
        *lock(&self.process) = Arc::new(new);
        Ok(())
    }

    /// The lease a grant answered, waking a stop that waits for one.
    fn granted(&self, answer: Result<Answer, Failure>) -> Result<Lease, LeaseError> {
        match answer.map_err(Failure::into_lease_error)? {
            Answer::Lease(lease) => {
                self.granted.notify_waiters();
                Ok(lease)
            }
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(answer: Answer) -> LeaseError {
    LeaseError::transient(format!("holder process answered {answer:?}"))
}

#[async_trait]
impl SessionLease for Holder {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        let call = Call::Acquire {
            session: session.clone(),
            owner: owner.clone(),
        };
        self.granted(self.call(call).await)
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let call = Call::Renew {
            lease: lease.clone(),
        };
        self.granted(self.call(call).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let call = Call::Release {
            lease: lease.clone(),
        };
        match self.call(call).await.map_err(Failure::into_lease_error)? {
            Answer::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        match self
            .call(Call::Authority)
            .await
            .map_err(Failure::into_lease_error)?
        {
            Answer::Authority(id) => AuthorityId::new(id),
            other => Err(unexpected(other)),
        }
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let call = Call::Current {
            session: session.clone(),
        };
        match self.call(call).await.map_err(Failure::into_lease_error)? {
            Answer::Current(lease) => Ok(lease),
            other => Err(unexpected(other)),
        }
    }
}

#[async_trait]
impl Writer for Holder {
    /// Kills the holder process and waits for it to be gone: a call its
    /// worker gave up on may still be running there, and must not land
    /// after the store is read back.
    async fn settle(&self) {
        let process = self.process();
        let _ = process.signal(Signal::SIGKILL);
        let child = lock(&process.child).take();
        if let Some(mut child) = child {
            let _ = child.wait().await;
        }
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        payload: &Value,
    ) -> Result<(), StoreError> {
        // The holder writes under the lease it was given; the fence is
        // rebuilt from it on the other side.
        let WriteFence::Fenced(fence) = fence else {
            return Err(StoreError::Unfenced {
                session: session.clone(),
                high_water: None,
            });
        };
        let lease = Lease::new(
            session.clone(),
            fence.owner().clone(),
            fence.token(),
            std::time::SystemTime::UNIX_EPOCH,
        );
        let call = Call::Append {
            lease,
            payload: payload.clone(),
        };
        match self.call(call).await {
            Ok(Answer::Done) => Ok(()),
            Ok(other) => Err(unknown_fate(session, format!("answered {other:?}"))),
            Err(failure) => Err(failure.into_store_error(session)),
        }
    }
}

/// Workers whose leases and writes all go through their own holder
/// process; `store` is what the run prepares and reads back.
pub(crate) fn target_of(holders: &[Arc<Holder>], store: Arc<dyn SessionStore>) -> Target {
    let mut target = Target::new(
        holders
            .iter()
            .map(|h| Arc::clone(h) as Arc<dyn SessionLease>)
            .collect(),
        store,
        Arc::new(SystemClock),
    );
    target.writers = holders
        .iter()
        .map(|h| Arc::clone(h) as Arc<dyn Writer>)
        .collect();
    target
}

/// The holders a rig's workers go through now: replaced as a whole when
/// every client restarts.
pub(crate) type HolderSet = Arc<Mutex<Vec<Arc<Holder>>>>;

/// `holders` as the rig's current set.
pub(crate) fn set_of(holders: Vec<Arc<Holder>>) -> HolderSet {
    Arc::new(Mutex::new(holders))
}

/// The holders in `set` now.
pub(crate) fn current(set: &HolderSet) -> Vec<Arc<Holder>> {
    lock(set).clone()
}

/// Stops a holder process with SIGSTOP past its TTL, or kills it and
/// starts another in its place, or churns a descriptor in it.
pub(crate) async fn hurt(
    holders: &[Arc<Holder>],
    rng: &mut Rng,
    rec: &Recorder,
) -> Result<(), String> {
    let Some(holder) = holders.get(rng.below(holders.len() as u64) as usize) else {
        return Ok(());
    };
    let ttl = holder.config.ttl;
    // Stops are the fault that makes stale writers; half are stops.
    match rng.below(4) {
        0 | 1 => {
            // Right after a grant its worker is mid-hold with its next
            // write queued, which the stop holds back past the TTL while a
            // rival takes over: aimed there, a stop finds a missing fence
            // in a run of a few hundred operations rather than, by chance,
            // in most. Half the stops are aimed. The rest, and an aimed
            // one whose holder is granted nothing within a TTL (one that
            // holds a lease renews it sooner, so it holds none), land
            // wherever the holder stands, which is nearly always between
            // calls. The wait is time without a fault: up to a TTL each.
            if rng.below(2) == 0 {
                let _ = tokio::time::timeout(ttl, holder.granted.notified()).await;
            }
            let process = holder.process();
            let fault = rec.fault(FaultKind::HolderStopped, &holder.name);
            process.signal(Signal::SIGSTOP)?;
            sleep(rng.between(ttl * 5 / 4, ttl * 2)).await;
            process.signal(Signal::SIGCONT)?;
            rec.heal(fault);
        }
        2 => {
            let fault = rec.fault(FaultKind::HolderKilled, &holder.name);
            holder.kill_and_replace()?;
            rec.heal(fault);
        }
        _ => {
            let fault = rec.fault(FaultKind::HandleChurn, &holder.name);
            // Its answer does not matter: the fault is the descriptor
            // opened and closed beside the holder's own.
            let _ = holder.call(Call::Churn).await;
            rec.heal(fault);
        }
    }
    Ok(())
}
