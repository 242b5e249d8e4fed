//! The daemon's flags. Every flag has an environment variable of the same
//! name (`MECATL_LEASED_…`), so a container can be configured either way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use lease_backends::{
    EtcdArgs, EtcdEnv, K8sArgs, K8sEnv, PostgresArgs, PostgresEnv, RedisArgs, RedisEnv,
};

/// A lease service: session leases over gRPC (`mecatl.lease.v1`) for
/// processes on many hosts.
///
/// Every process that serves a session asks this service for the
/// session's lease before it acts and tags its writes with the lease's
/// fencing token. Run several replicas over a shared distributed backend
/// to avoid a single point of failure; over `memory` or `dir:` the service
/// is one process on one host.
#[derive(Debug, Parser)]
#[command(name = "mecatl-leased", version)]
pub(crate) struct Cli {
    /// Address to serve gRPC on. A non-loopback address needs a bearer
    /// token or client certificates (or --allow-insecure). Port 0 picks a
    /// free port; the chosen address is printed on standard output.
    #[arg(long, env = "MECATL_LEASED_LISTEN", default_value = "127.0.0.1:50151")]
    pub(crate) listen: SocketAddr,

    /// Where leases live.
    ///
    /// `memory`: in this process; every lease and token is lost on exit,
    /// and the service names a new authority each start (so a store fenced
    /// by the old one refuses the new one's tokens).
    /// `dir:PATH`: a lease directory on this host; tokens survive restarts
    /// and other processes on the host may share the directory.
    /// `etcd:ENDPOINT[,ENDPOINT…]`: an etcd v3 cluster; run several replicas
    /// of this service over it, with no single point of failure.
    /// `k8s:NAMESPACE`: Lease objects in a Kubernetes namespace (the
    /// service account needs get, list, create and update on leases).
    /// `redis:URL`: one Redis (`redis://[user:password@]host:port/db`,
    /// `rediss://` for TLS); tokens are as durable as its persistence.
    /// `postgres:URL`: tables in one PostgreSQL database
    /// (`postgres://user@host:port/db`, directly or through PgBouncer in
    /// transaction mode); expiry on the database's clock, so replicas of
    /// this service over one database hold no state of their own.
    #[arg(long, env = "MECATL_LEASED_BACKEND", value_parser = parse_backend)]
    pub(crate) backend: BackendSpec,

    /// How long a grant lives without renewal (memory and dir backends).
    #[arg(long, env = "MECATL_LEASED_TTL", default_value = "10s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// The etcd backend's settings (`--session-lease-etcd-prefix`, `-ca`,
    /// `-cert`, `-key`, `-user`, `-password-file`, the vocabulary `mecated`
    /// shares; `--etcd-prefix` and the other spellings this daemon shipped
    /// with are aliases).
    #[command(flatten)]
    pub(crate) etcd: EtcdArgs<Env>,

    /// The Redis backend's settings (`--session-lease-redis-prefix`, alias
    /// `--redis-prefix`).
    #[command(flatten)]
    pub(crate) redis: RedisArgs<Env>,

    /// The PostgreSQL backend's settings
    /// (`--session-lease-postgres-password-file`, `-table-prefix`; aliases
    /// `--postgres-password-file`, `--postgres-table-prefix`).
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs<Env>,

    /// The Kubernetes backend's settings (`--session-lease-k8s-kubeconfig`,
    /// alias `--kubeconfig`).
    #[command(flatten)]
    pub(crate) k8s: K8sArgs<Env>,

    /// Accept a lease directory on a file system that does not survive a
    /// reboot (tmpfs): tokens would restart after one.
    #[arg(long, env = "MECATL_LEASED_ALLOW_VOLATILE_LEASE_DIR")]
    pub(crate) allow_volatile_lease_dir: bool,

    /// File holding the bearer token every lease call must present
    /// (`authorization: Bearer <token>`). Read once at start; surrounding
    /// whitespace is ignored. Prefer it to --bearer-token, which other
    /// users of the host can see in the process list.
    #[arg(
        long,
        env = "MECATL_LEASED_BEARER_TOKEN_FILE",
        conflicts_with = "bearer_token"
    )]
    pub(crate) bearer_token_file: Option<PathBuf>,

    /// File of per-client identities: each line a bearer token's SHA-256 or
    /// a client certificate's name, the client's name, and the owner id
    /// prefixes it may act for (`token chat-a chat-a/ sha256:HEX`, `cert
    /// chat-b chat-b/ uri:spiffe://…`). A call naming an owner outside the
    /// caller's prefixes is refused with PERMISSION_DENIED. Read again on
    /// SIGHUP and whenever the file changes; a file that is refused keeps
    /// the identities in force. Beside it, --bearer-token(-file) is one
    /// more credential, named `bearer`, that acts for any owner.
    #[arg(long, env = "MECATL_LEASED_IDENTITIES_FILE")]
    pub(crate) identities_file: Option<PathBuf>,

    /// Who may read a session's holder and token with Get: `everyone`
    /// authenticated, or `own-owners`, only a caller whose identity may act
    /// for the holder (a free session reads as free to all).
    #[arg(long, env = "MECATL_LEASED_GET_ACCESS", value_enum, default_value_t = GetAccessArg::Everyone)]
    pub(crate) get_access: GetAccessArg,

    /// The bearer token itself (see --bearer-token-file).
    #[arg(long, env = "MECATL_LEASED_BEARER_TOKEN", hide_env_values = true)]
    pub(crate) bearer_token: Option<String>,

    /// PEM certificate chain to serve TLS with (needs --tls-key).
    #[arg(long, env = "MECATL_LEASED_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "MECATL_LEASED_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,

    /// PEM CA whose client certificates are required (mutual TLS; needs
    /// --tls-cert).
    #[arg(long, env = "MECATL_LEASED_TLS_CLIENT_CA", requires = "tls_cert")]
    pub(crate) tls_client_ca: Option<PathBuf>,

    /// Serve on a non-loopback address without authentication. Anyone who
    /// reaches the port can then take or release any session's lease.
    #[arg(long, env = "MECATL_LEASED_ALLOW_INSECURE")]
    pub(crate) allow_insecure: bool,

    /// Address for Prometheus metrics (`/metrics`) and a liveness probe
    /// (`/healthz`), plain HTTP. Off unless given. Port 0 picks a free
    /// port; the chosen address is printed on standard output.
    #[arg(long, env = "MECATL_LEASED_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<SocketAddr>,

    /// The most leases one batch renewal may carry.
    #[arg(long, env = "MECATL_LEASED_MAX_BATCH", default_value_t = grpcdriver::DEFAULT_MAX_BATCH)]
    pub(crate) max_batch: usize,

    /// The largest request accepted, in bytes; larger ones are refused with
    /// INVALID_ARGUMENT.
    #[arg(long, env = "MECATL_LEASED_MAX_MESSAGE_BYTES", default_value_t = grpcdriver::DEFAULT_MAX_MESSAGE_BYTES)]
    pub(crate) max_message_bytes: usize,

    /// Concurrent calls per client connection; more wait their turn.
    #[arg(long, env = "MECATL_LEASED_CONCURRENCY_PER_CONNECTION", default_value_t = grpcdriver::DEFAULT_CONCURRENCY_PER_CONNECTION)]
    pub(crate) concurrency_per_connection: usize,

    /// On SIGTERM or SIGINT: how long to let calls in flight finish before
    /// exiting anyway (KeepAlive streams are cut at the end of it; their
    /// clients reconnect).
    #[arg(long, env = "MECATL_LEASED_SHUTDOWN_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub(crate) shutdown_grace: Duration,

    /// Log format on standard error. The level comes from
    /// MECATL_LEASED_LOG (e.g. `info`, `debug`, `grpcdriver=debug`).
    #[arg(long, env = "MECATL_LEASED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// The environment variables of the shared backend settings: the names
/// this daemon has always read (`MECATL_LEASED_ETCD_CA`, not the canonical
/// flag's `…_SESSION_LEASE_ETCD_CA`), so deployments keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Env;

impl EtcdEnv for Env {
    const PREFIX: &'static str = "MECATL_LEASED_ETCD_PREFIX";
    const CA: &'static str = "MECATL_LEASED_ETCD_CA";
    const CERT: &'static str = "MECATL_LEASED_ETCD_CERT";
    const KEY: &'static str = "MECATL_LEASED_ETCD_KEY";
    const USER: &'static str = "MECATL_LEASED_ETCD_USER";
    const PASSWORD_FILE: &'static str = "MECATL_LEASED_ETCD_PASSWORD_FILE";
}

impl K8sEnv for Env {
    const KUBECONFIG: &'static str = "MECATL_LEASED_KUBECONFIG";
}

impl RedisEnv for Env {
    const PREFIX: &'static str = "MECATL_LEASED_REDIS_PREFIX";
}

impl PostgresEnv for Env {
    const PASSWORD_FILE: &'static str = "MECATL_LEASED_POSTGRES_PASSWORD_FILE";
    const TABLE_PREFIX: &'static str = "MECATL_LEASED_POSTGRES_TABLE_PREFIX";
}

/// Where the service keeps its leases. Its `Display` is what logs show: a
/// Redis URL may carry a password, so only its kind is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BackendSpec {
    Memory,
    Dir(PathBuf),
    Etcd(Vec<String>),
    K8s(String),
    Redis(String),
    Postgres(String),
}

impl std::fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSpec::Memory => write!(f, "memory"),
            BackendSpec::Dir(path) => write!(f, "dir:{}", path.display()),
            BackendSpec::Etcd(endpoints) => write!(f, "etcd:{}", endpoints.join(",")),
            BackendSpec::K8s(namespace) => write!(f, "k8s:{namespace}"),
            BackendSpec::Redis(_) => write!(f, "redis"),
            BackendSpec::Postgres(_) => write!(f, "postgres"),
        }
    }
}

/// Who may read a session's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GetAccessArg {
    /// Every authenticated caller.
    Everyone,
    /// A caller whose identity may act for the holder.
    OwnOwners,
}

impl From<GetAccessArg> for grpcdriver::GetAccess {
    fn from(a: GetAccessArg) -> Self {
        match a {
            GetAccessArg::Everyone => grpcdriver::GetAccess::Everyone,
            GetAccessArg::OwnOwners => grpcdriver::GetAccess::OwnOwners,
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

fn parse_backend(text: &str) -> Result<BackendSpec, String> {
    match text.split_once(':') {
        None if text == "memory" => Ok(BackendSpec::Memory),
        Some(("dir", path)) if !path.is_empty() => Ok(BackendSpec::Dir(PathBuf::from(path))),
        Some(("etcd", endpoints)) if !endpoints.is_empty() => Ok(BackendSpec::Etcd(
            endpoints.split(',').map(str::to_owned).collect(),
        )),
        Some(("k8s", ns)) if !ns.is_empty() => Ok(BackendSpec::K8s(ns.to_owned())),
        Some(("redis", url)) if !url.is_empty() => Ok(BackendSpec::Redis(url.to_owned())),
        Some(("postgres", url)) if !url.is_empty() => Ok(BackendSpec::Postgres(url.to_owned())),
        _ => Err(format!(
            "{text:?}: expected `memory`, `dir:PATH`, `etcd:ENDPOINTS`, `k8s:NAMESPACE`, \
             `redis:URL` or `postgres:URL`"
        )),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e} (try 10s, 500ms, 2m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_or_are_refused() {
        assert_eq!(parse_backend("memory"), Ok(BackendSpec::Memory));
        assert_eq!(
            parse_backend("dir:/var/lib/x"),
            Ok(BackendSpec::Dir("/var/lib/x".into()))
        );
        assert_eq!(
            parse_backend("etcd:http://a:2379,http://b:2379"),
            Ok(BackendSpec::Etcd(vec![
                "http://a:2379".into(),
                "http://b:2379".into()
            ]))
        );
        assert_eq!(
            parse_backend("k8s:chat"),
            Ok(BackendSpec::K8s("chat".into()))
        );
        assert_eq!(
            parse_backend("postgres:postgres://app@db:5432/chat"),
            Ok(BackendSpec::Postgres("postgres://app@db:5432/chat".into()))
        );
        assert_eq!(
            BackendSpec::Postgres("postgres://app:secret@db/chat".into()).to_string(),
            "postgres",
            "a URL may carry a password: logs show the kind only"
        );
        for bad in [
            "",
            "dir:",
            "memory:x",
            "etcd",
            "etcd:",
            "k8s:",
            "file:/x",
            "postgres:",
        ] {
            assert!(parse_backend(bad).is_err(), "{bad:?}");
        }
    }

    /// Scripts and units written with the spellings this daemon shipped
    /// with configure exactly what the shared, canonical spellings do.
    #[test]
    fn the_old_spellings_parse_to_the_same_configuration_as_the_new() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["mecatl-leased", "--backend", "memory"], args].concat()).unwrap()
        };
        let old = parse(&[
            "--etcd-prefix=/p/",
            "--etcd-ca=ca.pem",
            "--etcd-cert=c.pem",
            "--etcd-key=k.pem",
            "--etcd-user=app",
            "--etcd-password-file=pw",
            "--redis-prefix=r:",
            "--kubeconfig=kc",
        ]);
        let new = parse(&[
            "--session-lease-etcd-prefix=/p/",
            "--session-lease-etcd-ca=ca.pem",
            "--session-lease-etcd-cert=c.pem",
            "--session-lease-etcd-key=k.pem",
            "--session-lease-etcd-user=app",
            "--session-lease-etcd-password-file=pw",
            "--session-lease-redis-prefix=r:",
            "--session-lease-k8s-kubeconfig=kc",
        ]);
        let endpoints = vec!["http://e:2379".to_owned()];
        assert_eq!(
            old.etcd.leases(endpoints.clone()),
            new.etcd.leases(endpoints.clone())
        );
        assert_eq!(
            old.etcd.leases(endpoints.clone()),
            lease_backends::EtcdLeases {
                endpoints,
                prefix: "/p/".into(),
                ca: Some("ca.pem".into()),
                identity: Some(("c.pem".into(), "k.pem".into())),
                user: Some(("app".into(), "pw".into())),
            }
        );
        assert_eq!(old.redis, new.redis);
        assert_eq!(old.redis.prefix, "r:");
        assert_eq!(old.k8s, new.k8s);
        assert_eq!(old.k8s.kubeconfig, Some("kc".into()));
    }

    /// Every variable the daemon documented still sets its setting.
    #[test]
    fn the_shared_settings_keep_their_environment_variables() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for (id, var) in [
            ("session_lease_etcd_prefix", "MECATL_LEASED_ETCD_PREFIX"),
            ("session_lease_etcd_ca", "MECATL_LEASED_ETCD_CA"),
            ("session_lease_etcd_cert", "MECATL_LEASED_ETCD_CERT"),
            ("session_lease_etcd_key", "MECATL_LEASED_ETCD_KEY"),
            ("session_lease_etcd_user", "MECATL_LEASED_ETCD_USER"),
            (
                "session_lease_etcd_password_file",
                "MECATL_LEASED_ETCD_PASSWORD_FILE",
            ),
            ("session_lease_redis_prefix", "MECATL_LEASED_REDIS_PREFIX"),
            (
                "session_lease_postgres_password_file",
                "MECATL_LEASED_POSTGRES_PASSWORD_FILE",
            ),
            (
                "session_lease_postgres_table_prefix",
                "MECATL_LEASED_POSTGRES_TABLE_PREFIX",
            ),
            ("session_lease_k8s_kubeconfig", "MECATL_LEASED_KUBECONFIG"),
        ] {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var), "{id}");
        }
        cmd.debug_assert();
    }

    #[test]
    fn flags_contradicting_each_other_are_refused() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["mecatl-leased", "--backend", "memory"], args].concat())
        };
        assert!(parse(&[]).is_ok());
        assert!(parse(&["--tls-cert", "c.pem"]).is_err(), "cert without key");
        assert!(
            parse(&["--tls-client-ca", "ca.pem"]).is_err(),
            "client CA without a cert"
        );
        assert!(parse(&["--bearer-token", "x", "--bearer-token-file", "f"]).is_err());
        assert!(parse(&["--ttl", "ten"]).is_err());
    }
}
