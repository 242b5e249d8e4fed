//! Command-line flags (each also an environment variable) and the checked
//! configuration they produce.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lease_backends::{
    DEFAULT_POSTGRES_TABLE_PREFIX, EtcdArgs, EtcdEnv, K8sArgs, K8sEnv, PostgresArgs, PostgresEnv,
};

use crate::backend::{LeaseChoice, StoreChoice};
use crate::engine::DEFAULT_RESUME_ATTEMPTS;
use crate::transcript::DEFAULT_TRANSCRIPT_CACHE_BYTES;

/// mecated: a session server whose every run is owned by one process at a
/// time, through a lease, and whose every write is fenced by that lease.
#[derive(Debug, Parser)]
#[command(name = "mecated", version, about, long_about = None)]
pub struct Cli {
    /// Operator commands; with none, the server runs.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Server flags.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Operator commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the file leases in a directory (session, holder, token,
    /// expiry), or repair one.
    Leases(LeasesArgs),
    /// Remove the files of sessions deleted long enough ago, keeping their
    /// high-water marks (in the store's graveyard) so a re-created session
    /// still refuses old tokens. Safe while servers run.
    Gc(GcArgs),
    /// Print what the token file (--token-file) holds for a bearer token
    /// read from standard input: `sha256:` and its hash, or, given a name
    /// and roles, the whole line. The token never goes on the command line.
    HashToken(HashTokenArgs),
    /// Accept a store directory refused as an older copy of itself (put
    /// back from a backup or an older disk image, or moved): records this
    /// directory as the store and its state as the newest. Whatever was
    /// written after the copy was taken is lost for good. Refused while
    /// any server serves the store.
    AdoptStore(AdoptStoreArgs),
}

/// What `mecated hash-token` prints.
#[derive(Debug, Args)]
pub struct HashTokenArgs {
    /// The token's name, for a whole line of the token file.
    #[arg(long, requires = "roles")]
    pub name: Option<String>,
    /// The token's roles, comma-separated (`read`, `run`, `admin`).
    #[arg(long, requires = "name")]
    pub roles: Option<String>,
}

/// What `mecated adopt-store` adopts.
#[derive(Debug, Args)]
pub struct AdoptStoreArgs {
    /// The store directory.
    #[arg(long, env = "MECATED_STORE_DIR")]
    pub store_dir: PathBuf,
    /// The lease directory its servers use, which mirrors the store's
    /// generation; default `<STORE_DIR>/.session-leases` when it exists.
    #[arg(long, env = "MECATED_SESSION_LEASE_DIR")]
    pub session_lease_dir: Option<PathBuf>,
}

/// What `mecated gc` reclaims.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// The store directory.
    #[arg(long, env = "MECATED_STORE_DIR")]
    pub store_dir: PathBuf,
    /// Only sessions deleted at least this long ago (250ms, 15s, 2m, 1h).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub older_than: Duration,
}

/// Where `mecated leases` looks.
#[derive(Debug, Args)]
pub struct LeasesArgs {
    /// The lease directory to inspect.
    #[arg(long, env = "MECATED_SESSION_LEASE_DIR", conflicts_with = "store_dir")]
    pub session_lease_dir: Option<PathBuf>,
    /// A store directory; its leases are in `<STORE_DIR>/.session-leases`.
    #[arg(long, env = "MECATED_STORE_DIR")]
    pub store_dir: Option<PathBuf>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// What to do; with nothing, list.
    #[command(subcommand)]
    pub action: Option<LeasesAction>,
}

/// Operator actions on one lease file.
#[derive(Debug, Subcommand)]
pub enum LeasesAction {
    /// Rewrite a session's lease record as free, with its next token above
    /// `--min-token` — the remedy for a record that cannot be read (a
    /// checksum failure after a crash). Never lowers a token that can still
    /// be read. A live hold is refused unless `--force`: stop its holder
    /// first.
    Repair {
        /// The session whose record to repair.
        #[arg(long)]
        session: String,
        /// End a live hold too (its holder's later writes are then refused
        /// by the store, its run cancelled).
        #[arg(long)]
        force: bool,
        /// At least the highest token the session's store has accepted (its
        /// `high_water_token`), so the next owner's writes are accepted and
        /// no token is issued twice. Required for an unreadable record.
        #[arg(long, default_value_t = 0)]
        min_token: u64,
    },
    /// Make a copied lease directory (a restored backup, a move to another
    /// disk) the one its authority lives in. Only once the original is
    /// retired for good: a copy serving beside the original would issue
    /// unrelated tokens. Refused while any server serves the store. Every
    /// later token is moved far past any the copy shows, and so past any
    /// the original issued after the copy was taken: no session needs
    /// repair.
    Adopt {
        /// The store the lease directory fences (no server may be running
        /// on it); default: the `--store-dir` given to `leases`.
        #[arg(long = "store-dir", id = "adopt_store_dir")]
        store_dir: Option<PathBuf>,
    },
}

/// Which agent drives runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AgentKind {
    /// Replies with the input (optionally after a delay).
    Echo,
    /// Runs `--agent-command` per turn (JSON on stdin, JSON lines on stdout).
    Exec,
}

/// How much of its session the `exec` agent's program is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TranscriptChoice {
    /// Every event.
    Full,
    /// From the newest `checkpoint` event on.
    SinceCheckpoint,
    /// The run's claim alone.
    ClaimOnly,
}

impl From<TranscriptChoice> for crate::agent::TranscriptScope {
    fn from(choice: TranscriptChoice) -> Self {
        match choice {
            TranscriptChoice::Full => Self::Full,
            TranscriptChoice::SinceCheckpoint => Self::SinceCheckpoint,
            TranscriptChoice::ClaimOnly => Self::ClaimOnly,
        }
    }
}

/// When appends reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FsyncChoice {
    /// fdatasync before acknowledging each write.
    Always,
    /// Leave it to the kernel.
    Never,
}

/// Flags of the server.
#[derive(Debug, Args)]
// A kubeconfig is only read for Kubernetes leases: given without them, it
// is a mistake to report, not a setting to ignore.
#[command(mut_arg("session_lease_k8s_kubeconfig", |a| a.requires("session_lease_k8s_namespace")))]
pub struct ServeArgs {
    /// Address to serve HTTP on. An address beyond loopback needs
    /// --token-file (or --allow-unauthenticated).
    #[arg(long, env = "MECATED_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Authenticate callers with the bearer tokens of this file: one line
    /// per token, `NAME ROLES sha256:HEX` (roles `read`, `run`, `admin`,
    /// comma-separated; the hash from `mecated hash-token`), `#` comments.
    /// Read again on SIGHUP and when it changes; a malformed file is
    /// refused, and on a reload the tokens read before stay in force.
    #[arg(long, env = "MECATED_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// How often to look whether --token-file changed (and read it again
    /// if it did); 0s reads it again on SIGHUP only.
    #[arg(
        long,
        env = "MECATED_TOKEN_FILE_CHECK_INTERVAL",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub token_file_check_interval: Duration,

    /// Serve a non-loopback --listen without --token-file: anyone who
    /// reaches it can start runs, cancel them, delete sessions and read
    /// every transcript.
    #[arg(long, env = "MECATED_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,

    /// Without --token-file, the server answers only requests addressed to
    /// an IP address or `localhost`, and takes no write whose `Origin` is
    /// another site, so that a web page cannot drive it by rebinding its
    /// own name to this address. Each --allowed-host adds a name it
    /// answers under (a Service's, say); comma-separated in the variable.
    #[arg(
        long = "allowed-host",
        env = "MECATED_ALLOWED_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,

    /// How many follows (event streams) one token may hold open at once;
    /// one more is refused with 429 `too_many_follows` until one ends. 0
    /// bounds nothing. Callers of a server without --token-file are not
    /// told apart, and not bounded.
    #[arg(
        long,
        env = "MECATED_MAX_FOLLOWS_PER_CLIENT",
        default_value_t = crate::http::DEFAULT_MAX_FOLLOWS_PER_CLIENT
    )]
    pub max_follows_per_client: usize,

    /// Also serve `/metrics` on this address, open (counts and latencies,
    /// no session id): for scrapers without a token. On --listen,
    /// `/metrics` needs the `read` role when callers are authenticated.
    #[arg(long, env = "MECATED_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Directory of the JSONL session store (one append-only file per
    /// session). With no lease flag, file leases are used automatically under
    /// `<STORE_DIR>/.session-leases`.
    #[arg(long, env = "MECATED_STORE_DIR", default_value = "mecated-data")]
    pub store_dir: PathBuf,

    /// Store sessions in Redis at this URL (`redis://[user:password@]host:port/db`,
    /// `rediss://` for TLS) instead of a directory: servers on any host share
    /// them. Without a lease flag, Redis leases the sessions itself.
    #[arg(long, env = "MECATED_STORE_REDIS", conflicts_with = "no_session_lease")]
    pub store_redis: Option<String>,

    /// Key prefix of the Redis store; servers that share sessions share it.
    #[arg(long, env = "MECATED_STORE_REDIS_PREFIX", default_value = "mecatl:")]
    pub store_redis_prefix: String,

    /// Store sessions in tables of this PostgreSQL database
    /// (`postgres://USER@HOST:PORT/DB`) instead of a directory: servers on
    /// any host share them. Without a lease flag, the same database leases
    /// the sessions too (pglease's tables under the same prefix), and every
    /// append checks the live lease row, so a holder whose lease was taken
    /// over is refused even before the new owner writes.
    #[arg(
        long,
        env = "MECATED_STORE_POSTGRES",
        value_name = "URL",
        conflicts_with_all = ["no_session_lease", "store_redis"]
    )]
    pub store_postgres: Option<String>,

    /// File holding the password of --store-postgres, in place of any the
    /// URL carries (one line; its line ending is not part of it).
    #[arg(
        long,
        env = "MECATED_STORE_POSTGRES_PASSWORD_FILE",
        value_name = "FILE",
        requires = "store_postgres"
    )]
    pub store_postgres_password_file: Option<PathBuf>,

    /// Prefix of the PostgreSQL store's tables' names, and of the leases'
    /// it brings; servers that share sessions share it.
    #[arg(
        long,
        env = "MECATED_STORE_POSTGRES_TABLE_PREFIX",
        value_name = "PREFIX",
        default_value = DEFAULT_POSTGRES_TABLE_PREFIX
    )]
    pub store_postgres_table_prefix: String,

    /// Single-host file leases in this directory (shared by every process
    /// serving the same sessions). Overrides the automatic
    /// `<STORE_DIR>/.session-leases`.
    #[arg(long, env = "MECATED_SESSION_LEASE_DIR")]
    pub session_lease_dir: Option<PathBuf>,

    /// Run without leases. Only safe when this is the one process serving
    /// the store; destructive maintenance then needs the single-process
    /// proof (an exclusive lock on `<STORE_DIR>/.mecated.lock`).
    #[arg(
        long,
        env = "MECATED_NO_SESSION_LEASE",
        conflicts_with = "session_lease_dir"
    )]
    pub no_session_lease: bool,

    /// Leases from a remote lease service (`mecatl-leased`, or any server
    /// of the `mecatl.lease.v1` gRPC contract) at `HOST:PORT` (or an
    /// `http://` / `https://` URI): processes on several hosts. Its TTL
    /// must be at least --session-lease-ttl.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_URL",
        conflicts_with_all = ["session_lease_dir", "no_session_lease"]
    )]
    pub session_lease_url: Option<String>,

    /// Leases on etcd v3 at these endpoints (comma-separated
    /// `http://HOST:PORT` or `https://…`): processes on several hosts that
    /// reach one etcd cluster. Tokens are etcd revisions.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_ETCD",
        value_delimiter = ',',
        conflicts_with_all = ["session_lease_dir", "no_session_lease", "session_lease_url"]
    )]
    pub session_lease_etcd: Vec<String>,

    /// The etcd settings (`--session-lease-etcd-prefix`, `-ca`, `-cert`,
    /// `-key`, `-user`, `-password-file`), the vocabulary `mecatl-leased`
    /// shares (its `--etcd-ca` spellings are aliases here too).
    #[command(flatten)]
    pub etcd: EtcdArgs<Env>,

    /// Leases as `coordination.k8s.io/v1` Lease objects in this Kubernetes
    /// namespace: the replicas of one deployment. The service account needs
    /// get, list, create and update on leases there.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_K8S_NAMESPACE",
        conflicts_with_all = ["session_lease_dir", "no_session_lease", "session_lease_url", "session_lease_etcd"]
    )]
    pub session_lease_k8s_namespace: Option<String>,

    /// The Kubernetes settings (`--session-lease-k8s-kubeconfig`, alias
    /// `--kubeconfig`).
    #[command(flatten)]
    pub k8s: K8sArgs<Env>,

    /// Leases in tables of this PostgreSQL database
    /// (`postgres://USER@HOST:PORT/DB`, directly or through PgBouncer in
    /// transaction mode): processes on any hosts that reach it. Expiry is
    /// judged on the database's clock; tokens are as durable as its commits.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_POSTGRES",
        value_name = "URL",
        conflicts_with_all = ["session_lease_dir", "no_session_lease", "session_lease_url", "session_lease_etcd", "session_lease_k8s_namespace"]
    )]
    pub session_lease_postgres: Option<String>,

    /// The PostgreSQL settings (`--session-lease-postgres-password-file`,
    /// `-table-prefix`), the vocabulary `mecatl-leased` shares.
    #[command(flatten)]
    pub postgres: PostgresArgs<Env>,

    /// File holding the bearer token for the lease service (read once at
    /// start; surrounding whitespace ignored).
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_TOKEN_FILE",
        requires = "session_lease_url"
    )]
    pub session_lease_token_file: Option<PathBuf>,

    /// PEM CA that signed the lease service's certificate: connects with
    /// TLS.
    #[arg(long, env = "MECATED_SESSION_LEASE_CA", requires = "session_lease_url")]
    pub session_lease_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS with the lease service (needs
    /// --session-lease-key and --session-lease-ca).
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_CERT",
        requires_all = ["session_lease_key", "session_lease_ca"]
    )]
    pub session_lease_cert: Option<PathBuf>,

    /// PEM private key of --session-lease-cert.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_KEY",
        requires = "session_lease_cert"
    )]
    pub session_lease_key: Option<PathBuf>,

    /// Send the bearer token to a non-loopback lease service without TLS.
    /// Anyone on the path could read it and take or release any lease.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_PLAINTEXT_TOKEN",
        requires = "session_lease_token_file"
    )]
    pub session_lease_plaintext_token: bool,

    /// The name to verify the lease service's certificate against, when
    /// it is not the host in --session-lease-url.
    #[arg(
        long,
        env = "MECATED_SESSION_LEASE_TLS_DOMAIN",
        requires = "session_lease_ca"
    )]
    pub session_lease_tls_domain: Option<String>,

    /// How long a lease lasts unless renewed (renewed every third of it),
    /// e.g. `15s`, `1500ms`, `2m`.
    #[arg(long, env = "MECATED_SESSION_LEASE_TTL", default_value = "15s", value_parser = parse_duration)]
    pub session_lease_ttl: Duration,

    /// This process's owner identity in leases. Default: host name, pid and a
    /// random suffix. Two processes must never share one. A lease service
    /// that tells clients apart (--session-lease-url with a token or
    /// certificate of this process's own identity) lets it act only for
    /// owner ids under its identity's prefixes: an id outside them is put
    /// under the first one (`chat-a/` + the id).
    #[arg(long, env = "MECATED_OWNER")]
    pub owner: Option<String>,

    /// The agent driving runs.
    #[arg(long, env = "MECATED_AGENT", value_enum, default_value_t = AgentKind::Echo)]
    pub agent: AgentKind,

    /// `echo` agent: how long a run takes.
    #[arg(long, env = "MECATED_ECHO_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub echo_delay: Duration,

    /// `echo` agent: progress events emitted over the delay.
    #[arg(long, env = "MECATED_ECHO_STEPS", default_value_t = 4)]
    pub echo_steps: u32,

    /// `exec` agent: the program to run per turn.
    #[arg(long, env = "MECATED_AGENT_COMMAND")]
    pub agent_command: Option<PathBuf>,

    /// `exec` agent: an argument for the program (repeatable).
    #[arg(long = "agent-arg", env = "MECATED_AGENT_ARGS", value_delimiter = ' ')]
    pub agent_args: Vec<String>,

    /// `exec` agent: how much of the session the program is handed:
    /// `full` (every event), `since-checkpoint` (from the newest event of
    /// type `checkpoint` on, so runs cost the same however long the
    /// session grows) or `claim-only` (no history).
    #[arg(long, env = "MECATED_AGENT_TRANSCRIPT", value_enum, default_value_t = TranscriptChoice::Full)]
    pub agent_transcript: TranscriptChoice,

    /// When the store syncs appends to disk: `always` (before a write is
    /// acknowledged) or `never` (left to the kernel; a machine crash may lose
    /// recent events, a process crash does not). File leases follow it:
    /// with `never` their files are not synced either, but the lease
    /// directory counts the host's boots (one sync per boot), so no fencing
    /// token is ever issued twice, even after a power loss took back both
    /// a lease file and the events written under its token.
    #[arg(long, env = "MECATED_STORE_FSYNC", value_enum, default_value_t = FsyncChoice::Always)]
    pub store_fsync: FsyncChoice,

    /// Bytes of session transcripts kept in memory between runs, so that a
    /// run reads only the events added since this process last ran the
    /// session. The least recently run sessions are dropped first; a
    /// session larger than this is never kept. 0 keeps none (every run
    /// reads its whole transcript).
    #[arg(long, env = "MECATED_TRANSCRIPT_CACHE_BYTES", default_value_t = DEFAULT_TRANSCRIPT_CACHE_BYTES)]
    pub transcript_cache_bytes: usize,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "MECATED_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,

    /// Accept a session lease directory on tmpfs or ramfs. A reboot empties
    /// it, and the store it fences then refuses to start with it: only for
    /// stores that do not outlive a reboot either.
    #[arg(long, env = "MECATED_ALLOW_VOLATILE_LEASE_DIR")]
    pub allow_volatile_lease_dir: bool,

    /// On the first SIGTERM or SIGINT, how long the runs in progress may go
    /// on to their ends while the server refuses new ones (`/readyz` 503,
    /// runs answered 503 `draining`). A second signal, or this timeout,
    /// ends the drain; the shutdown that follows cancels what still runs.
    /// 0s cancels at once.
    #[arg(long, env = "MECATED_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Run the input of a run that recorded no end (its process died or
    /// lost its lease mid-run) again, instead of only ending it as
    /// `interrupted` and waiting for a client to send it again. The next
    /// owner does it: a replica with a follower of the session, one a
    /// follower reaches, or any replica at its start, once per
    /// interruption. The agent may so see an input twice: fence its side
    /// effects with the run's token and effect key.
    #[arg(long, env = "MECATED_RESUME_INTERRUPTED")]
    pub resume_interrupted: bool,

    /// With `--resume-interrupted`, how many times one input is run again
    /// after interruptions; past it the run is only ended, so an input
    /// that kills its process cannot take every replica down in turn.
    #[arg(long, env = "MECATED_RESUME_MAX_ATTEMPTS", default_value_t = DEFAULT_RESUME_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub resume_max_attempts: u32,

    /// After the drain, how long shutdown waits for the runs it cancels to
    /// end and for leases to be released.
    #[arg(long, env = "MECATED_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
}

/// The environment variables of the shared lease settings: `MECATED_`
/// and the flag's name, as for every other flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Env;

impl PostgresEnv for Env {
    const PASSWORD_FILE: &'static str = "MECATED_SESSION_LEASE_POSTGRES_PASSWORD_FILE";
    const TABLE_PREFIX: &'static str = "MECATED_SESSION_LEASE_POSTGRES_TABLE_PREFIX";
}

impl EtcdEnv for Env {
    const PREFIX: &'static str = "MECATED_SESSION_LEASE_ETCD_PREFIX";
    const CA: &'static str = "MECATED_SESSION_LEASE_ETCD_CA";
    const CERT: &'static str = "MECATED_SESSION_LEASE_ETCD_CERT";
    const KEY: &'static str = "MECATED_SESSION_LEASE_ETCD_KEY";
    const USER: &'static str = "MECATED_SESSION_LEASE_ETCD_USER";
    const PASSWORD_FILE: &'static str = "MECATED_SESSION_LEASE_ETCD_PASSWORD_FILE";
}

impl K8sEnv for Env {
    const KUBECONFIG: &'static str = "MECATED_SESSION_LEASE_K8S_KUBECONFIG";
}

/// Parses `250ms`, `15s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try 15s, 500ms, 2m)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

impl ServeArgs {
    /// The store and lease backend these flags select, or why the flags
    /// contradict each other.
    pub fn choices(&self) -> Result<(StoreChoice, LeaseChoice), String> {
        if self.session_lease_ttl < Duration::from_millis(300) {
            return Err(format!(
                "--session-lease-ttl {:?} is too short: renewals every third of it would race the network",
                self.session_lease_ttl
            ));
        }
        if self.agent == AgentKind::Exec && self.agent_command.is_none() {
            return Err("--agent exec needs --agent-command".into());
        }
        if self.agent != AgentKind::Exec && self.agent_command.is_some() {
            return Err("--agent-command is only used with --agent exec".into());
        }
        if self.agent != AgentKind::Exec && self.agent_transcript != TranscriptChoice::Full {
            return Err("--agent-transcript is only used with --agent exec".into());
        }
        Ok((StoreChoice::from_args(self)?, LeaseChoice::from_args(self)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<LeaseChoice, String> {
        let cli = Cli::try_parse_from(std::iter::once("mecated").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.serve.choices().map(|(_, lease)| lease)
    }

    #[test]
    fn store_dir_alone_means_file_leases_inside_it() {
        let lease = parse(&["--store-dir", "/srv/s"]).unwrap();
        assert_eq!(lease, LeaseChoice::Dir("/srv/s/.session-leases".into()));
    }

    #[test]
    fn a_lease_service_url_selects_the_service_and_excludes_the_rest() {
        let lease = parse(&["--session-lease-url", "leases:50151"]).unwrap();
        assert!(
            matches!(&lease, LeaseChoice::Service(s) if s.address == "leases:50151"),
            "{lease:?}"
        );
        for other in [
            &["--session-lease-dir", "/x"][..],
            &["--no-session-lease"][..],
        ] {
            let args = [&["--session-lease-url", "leases:50151"][..], other].concat();
            assert!(parse(&args).is_err(), "{args:?}");
        }
        assert!(
            parse(&["--session-lease-ca", "ca.pem"]).is_err(),
            "TLS without a URL"
        );
        assert!(
            parse(&[
                "--session-lease-url",
                "l:1",
                "--session-lease-cert",
                "c.pem"
            ])
            .is_err(),
            "a client certificate without key and CA"
        );
    }

    #[test]
    fn explicit_lease_dir_wins() {
        let lease = parse(&["--session-lease-dir", "/run/leases"]).unwrap();
        assert_eq!(lease, LeaseChoice::Dir("/run/leases".into()));
    }

    #[test]
    fn contradictions_fail_with_a_clear_error() {
        for args in [
            &["--session-lease-dir", "/x", "--no-session-lease"][..],
            &["--agent", "exec"],
            &["--agent-command", "/bin/true"],
            &["--agent-transcript", "claim-only"],
            &["--session-lease-ttl", "10ms"],
            &["--session-lease-ttl", "soon"],
        ] {
            assert!(parse(args).is_err(), "{args:?} was accepted");
        }
    }

    #[test]
    fn no_session_lease_runs_unleased() {
        assert_eq!(
            parse(&["--no-session-lease"]).unwrap(),
            LeaseChoice::Unleased
        );
    }

    /// The etcd and Kubernetes settings are spelled as `mecatl-leased`
    /// spells them too; both spellings make one configuration.
    #[cfg(all(feature = "etcd", feature = "k8s"))]
    #[test]
    fn the_shared_spellings_select_the_same_backend() {
        let etcd = |settings: &[&str]| {
            parse(&[&["--session-lease-etcd", "http://e:2379"][..], settings].concat()).unwrap()
        };
        let canonical = etcd(&[
            "--session-lease-etcd-prefix=/p/",
            "--session-lease-etcd-ca=ca.pem",
            "--session-lease-etcd-user=app",
            "--session-lease-etcd-password-file=pw",
        ]);
        let leased = etcd(&[
            "--etcd-prefix=/p/",
            "--etcd-ca=ca.pem",
            "--etcd-user=app",
            "--etcd-password-file=pw",
        ]);
        assert_eq!(canonical, leased);
        assert!(
            matches!(&canonical, LeaseChoice::Etcd(e) if e.prefix == "/p/"
                && e.user == Some(("app".into(), "pw".into()))),
            "{canonical:?}"
        );
        let k8s = |kubeconfig: &str| {
            parse(&["--session-lease-k8s-namespace", "ns", kubeconfig, "kc"]).unwrap()
        };
        assert_eq!(k8s("--session-lease-k8s-kubeconfig"), k8s("--kubeconfig"));
        assert!(
            parse(&["--session-lease-k8s-kubeconfig", "kc"]).is_err(),
            "a kubeconfig without Kubernetes leases"
        );
    }

    fn store_and_lease(args: &[&str]) -> Result<(StoreChoice, LeaseChoice), String> {
        let cli = Cli::try_parse_from(std::iter::once("mecated").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.serve.choices()
    }

    /// With no lease flag a PostgreSQL store leases its sessions itself; a
    /// lease flag names other leases; the flags that cannot go with it are
    /// refused, each naming the flag in the way.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_postgres_store_leases_itself_unless_told_otherwise() {
        use crate::backend::PostgresStore;
        let store = [
            "--store-postgres",
            "postgres://app@db/chat",
            "--store-postgres-password-file",
            "/run/pw",
            "--store-postgres-table-prefix",
            "chat",
        ];
        let (chosen, lease) = store_and_lease(&store).unwrap();
        assert_eq!(
            chosen,
            StoreChoice::Postgres(PostgresStore {
                url: "postgres://app@db/chat".into(),
                password_file: Some("/run/pw".into()),
                table_prefix: "chat".into(),
            })
        );
        assert_eq!(lease, LeaseChoice::Store);
        let (_, lease) = store_and_lease(&["--store-postgres", "postgres://db/x"]).unwrap();
        assert_eq!(lease, LeaseChoice::Store);
        let (chosen, _) = store_and_lease(&["--store-postgres", "postgres://db/x"]).unwrap();
        assert!(
            matches!(&chosen, StoreChoice::Postgres(p) if p.table_prefix == "mecatl"
                && p.password_file.is_none()),
            "{chosen:?}"
        );
        let explicit = [&store[..], &["--session-lease-postgres", "postgres://db/x"]].concat();
        let (_, lease) = store_and_lease(&explicit).unwrap();
        assert!(matches!(lease, LeaseChoice::Postgres(_)), "{lease:?}");
        let dir = [&store[..], &["--session-lease-dir", "/run/leases"]].concat();
        assert_eq!(
            store_and_lease(&dir).unwrap().1,
            LeaseChoice::Dir("/run/leases".into())
        );
        for (extra, named) in [
            (&["--no-session-lease"][..], "--no-session-lease"),
            (&["--store-redis", "redis://r"][..], "--store-redis"),
        ] {
            let args = [&store[..], extra].concat();
            let err = store_and_lease(&args).unwrap_err();
            assert!(err.contains(named), "{args:?}: {err}");
            assert!(err.contains("--store-postgres"), "{args:?}: {err}");
        }
        let err = store_and_lease(&["--store-postgres-password-file", "/run/pw"]).unwrap_err();
        assert!(err.contains("--store-postgres <URL>"), "{err}");
    }

    /// Each store setting reads `MECATED_` and its flag's name.
    #[test]
    fn the_postgres_store_settings_read_their_environment_variables() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for (id, var) in [
            ("store_postgres", "MECATED_STORE_POSTGRES"),
            (
                "store_postgres_password_file",
                "MECATED_STORE_POSTGRES_PASSWORD_FILE",
            ),
            (
                "store_postgres_table_prefix",
                "MECATED_STORE_POSTGRES_TABLE_PREFIX",
            ),
        ] {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var), "{id}");
        }
    }

    /// The variables the shared settings read are still `MECATED_`'s.
    #[test]
    fn the_shared_settings_keep_their_environment_variables() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for (id, var) in [
            (
                "session_lease_postgres_password_file",
                "MECATED_SESSION_LEASE_POSTGRES_PASSWORD_FILE",
            ),
            (
                "session_lease_postgres_table_prefix",
                "MECATED_SESSION_LEASE_POSTGRES_TABLE_PREFIX",
            ),
            (
                "session_lease_etcd_prefix",
                "MECATED_SESSION_LEASE_ETCD_PREFIX",
            ),
            ("session_lease_etcd_ca", "MECATED_SESSION_LEASE_ETCD_CA"),
            ("session_lease_etcd_cert", "MECATED_SESSION_LEASE_ETCD_CERT"),
            ("session_lease_etcd_key", "MECATED_SESSION_LEASE_ETCD_KEY"),
            ("session_lease_etcd_user", "MECATED_SESSION_LEASE_ETCD_USER"),
            (
                "session_lease_etcd_password_file",
                "MECATED_SESSION_LEASE_ETCD_PASSWORD_FILE",
            ),
            (
                "session_lease_k8s_kubeconfig",
                "MECATED_SESSION_LEASE_K8S_KUBECONFIG",
            ),
        ] {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var), "{id}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1w").is_err());
    }
}
