//! Each backend's rig: the services its servers need, started through
//! `test-services` (Redis, etcd, PostgreSQL) or from the workspace's own
//! binaries (the lease service, the Kubernetes API emulator), and the
//! `mecated` flags that put replicas on them, all sharing one store.

use std::path::PathBuf;
use std::time::Duration;

use test_services::{EtcdServer, PostgresServer, RedisServer};

use super::counting_proxy::CountingProxy;
use super::process::{Binaries, Process};
use crate::Result;

/// Where a server's sessions are leased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    /// File leases beside a JSONL store (the default).
    File,
    Etcd,
    /// `mecatl-leased` over its in-memory backend.
    LeaseService,
    /// Sessions and their leases in Redis.
    Redis,
    /// Sessions and their leases in PostgreSQL.
    Postgres,
    /// Lease objects in the Kubernetes API emulator, beside a JSONL store.
    K8s,
    /// No leases: a JSONL store served by one process.
    Unleased,
}

impl Backend {
    pub(super) fn name(self) -> &'static str {
        match self {
            Backend::File => "file leases",
            Backend::Etcd => "etcd",
            Backend::LeaseService => "lease service",
            Backend::Redis => "Redis",
            Backend::Postgres => "PostgreSQL",
            Backend::K8s => "Kubernetes",
            Backend::Unleased => "unleased",
        }
    }

    /// What `--backend` names it by.
    pub(super) fn key(self) -> &'static str {
        match self {
            Backend::File => "file",
            Backend::Etcd => "etcd",
            Backend::LeaseService => "leased",
            Backend::Redis => "redis",
            Backend::Postgres => "postgres",
            Backend::K8s => "k8s",
            Backend::Unleased => "unleased",
        }
    }

    pub(super) fn leased(self) -> bool {
        self != Backend::Unleased
    }
}

/// How the replicas of a rig run.
pub(super) struct ReplicaPlan {
    pub(super) ttl: Duration,
    /// How long a run lasts.
    pub(super) run_length: Duration,
    pub(super) shutdown_timeout: Duration,
}

/// The services of one backend and a directory for everything else; the
/// replicas are started from it and must be dropped before it.
pub(super) struct Rig {
    pub(super) backend: Backend,
    bins: Binaries,
    flags: Vec<String>,
    replicas_started: usize,
    _etcd: Option<EtcdServer>,
    _redis: Option<RedisServer>,
    _postgres: Option<PostgresServer>,
    _process: Option<Process>,
    /// Between the servers and the Kubernetes API emulator.
    proxy: Option<CountingProxy>,
    /// Last: removed once every service is stopped.
    dir: tempfile::TempDir,
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl Rig {
    pub(super) fn start(backend: Backend, bins: &Binaries, ttl: Duration) -> Result<Rig> {
        let dir = tempfile::Builder::new()
            .prefix("xtask-scale-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let mut rig = Rig {
            backend,
            bins: bins.clone(),
            flags: Vec::new(),
            replicas_started: 0,
            _etcd: None,
            _redis: None,
            _postgres: None,
            _process: None,
            proxy: None,
            dir,
        };
        let store = rig.dir.path().join("store");
        let jsonl = vec!["--store-dir".into(), store.display().to_string()];
        rig.flags = match backend {
            Backend::File => jsonl,
            Backend::Unleased => [jsonl, vec!["--no-session-lease".into()]].concat(),
            Backend::Etcd => {
                let etcd = EtcdServer::start().map_err(|e| format!("start etcd: {e}"))?;
                let flags = vec!["--session-lease-etcd".into(), etcd.endpoint()];
                rig._etcd = Some(etcd);
                [jsonl, flags].concat()
            }
            Backend::Redis => {
                let redis = RedisServer::start().map_err(|e| format!("start redis: {e}"))?;
                let flags = vec!["--store-redis".into(), redis.url()];
                rig._redis = Some(redis);
                flags
            }
            Backend::Postgres => rig.postgres()?,
            Backend::LeaseService => [jsonl, rig.lease_service(ttl)?].concat(),
            Backend::K8s => [jsonl, rig.emulator()?].concat(),
        };
        Ok(rig)
    }

    fn postgres(&mut self) -> Result<Vec<String>> {
        let pg = PostgresServer::start().map_err(|e| format!("start postgres: {e}"))?;
        let password = self.dir.path().join("postgres-password");
        std::fs::write(&password, pg.password())
            .map_err(|e| format!("{}: {e}", password.display()))?;
        let url = format!("postgres://{}@{}/postgres", pg.user(), pg.addr());
        self._postgres = Some(pg);
        Ok(vec![
            "--store-postgres".into(),
            url,
            "--store-postgres-password-file".into(),
            password.display().to_string(),
        ])
    }

    fn lease_service(&mut self, ttl: Duration) -> Result<Vec<String>> {
        let args = ["--listen", "127.0.0.1:0", "--backend", "memory", "--ttl"]
            .map(String::from)
            .into_iter()
            .chain([secs(ttl)])
            .collect::<Vec<_>>();
        let leased = Process::start(
            "mecatl-leased",
            &self.bins.path("mecatl-leased"),
            &args,
            &[],
            &self.dir.path().join("mecatl-leased.log"),
        )?;
        let flags = vec!["--session-lease-url".into(), leased.address.clone()];
        self._process = Some(leased);
        Ok(flags)
    }

    /// The emulator, reached in plain HTTP through a [`CountingProxy`] so
    /// the requests of the servers can be counted.
    fn emulator(&mut self) -> Result<Vec<String>> {
        const TOKEN: &str = "scale-admin";
        let args = ["--listen", "127.0.0.1:0", "--token", TOKEN].map(String::from);
        let emulator = Process::start(
            "k8s-emulator",
            &self.bins.path("k8s-emulator"),
            &args,
            &[],
            &self.dir.path().join("k8s-emulator.log"),
        )?;
        let proxy = CountingProxy::start(emulator.address.trim_start_matches("http://"))?;
        let kubeconfig = self.dir.path().join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    \
             server: \"http://{}\"\nusers:\n- name: admin\n  user:\n    token: \"{TOKEN}\"\n\
             contexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: admin\n    \
             namespace: default\ncurrent-context: emulator\n",
            proxy.addr
        );
        std::fs::write(&kubeconfig, text).map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        self._process = Some(emulator);
        self.proxy = Some(proxy);
        Ok(vec![
            "--session-lease-k8s-namespace".into(),
            "default".into(),
            "--session-lease-k8s-kubeconfig".into(),
            kubeconfig.display().to_string(),
        ])
    }

    /// Requests the servers sent the Kubernetes API so far, on that rig.
    pub(super) fn api_requests(&self) -> Option<u64> {
        self.proxy.as_ref().map(CountingProxy::requests)
    }

    /// Starts one more `mecated` replica of this rig.
    pub(super) fn replica(&mut self, plan: &ReplicaPlan) -> Result<Process> {
        let i = self.replicas_started;
        self.replicas_started += 1;
        let owner = format!("scale-replica-{i}");
        let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--owner", &owner]
            .map(String::from)
            .to_vec();
        args.extend([
            "--session-lease-ttl".into(),
            secs(plan.ttl),
            "--echo-delay".into(),
            secs(plan.run_length),
            // One step, at the run's end: nothing is written while runs
            // are held, so what is measured is holding them.
            "--echo-steps".into(),
            "1".into(),
            "--shutdown-timeout".into(),
            secs(plan.shutdown_timeout),
            // A stopped holder cancels its runs at once: what is measured
            // is the hand-over, not how long a run may drain.
            "--drain-timeout".into(),
            "0s".into(),
        ]);
        if self.flags.first().is_some_and(|f| f == "--store-dir") {
            // Run starts cost fsyncs a held run never repeats.
            args.extend(["--store-fsync".into(), "never".into()]);
        }
        args.extend(self.flags.iter().cloned());
        Process::start(
            &owner,
            &self.bins.path("mecated"),
            &args,
            // Per-run info lines from ten thousand runs would be most of
            // what the process does.
            &[("MECATED_LOG", "warn".into())],
            &self.log(&owner),
        )
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }
}
