//! One flag vocabulary for the backend settings both servers take.
//!
//! Each server keeps its own way of *choosing* a backend (`mecated`'s
//! `--session-lease-etcd ENDPOINTS`, `mecatl-leased`'s `--backend
//! etcd:ENDPOINTS`); the settings of the chosen backend are spelled once,
//! here, and flattened into both. The canonical spelling is `mecated`'s
//! (`--session-lease-etcd-ca`); the spellings `mecatl-leased` shipped with
//! (`--etcd-ca`, `--kubeconfig`, `--redis-prefix`) are aliases, so
//! scripts using either keep working with both servers.
//!
//! Environment variables are the one thing each server names itself
//! (`MECATED_SESSION_LEASE_ETCD_CA`, `MECATL_LEASED_ETCD_CA`): every server
//! documents its own prefix, and deployments set those names. A server
//! picks them by the type parameter it flattens the struct with: a type
//! implementing [`EtcdEnv`], [`K8sEnv`] or [`RedisEnv`].

use std::marker::PhantomData;
use std::path::PathBuf;

use clap::Args;

use crate::{EtcdLeases, K8sLeases, PostgresLeases, RedisLeases};

/// The key prefix of etcd leases when none is given.
pub const DEFAULT_ETCD_PREFIX: &str = "/mecatl/leases/";

/// The key prefix of Redis leases when none is given.
pub const DEFAULT_REDIS_PREFIX: &str = "mecatl:";

/// The environment variables a server reads its etcd settings from.
pub trait EtcdEnv {
    /// For `--session-lease-etcd-prefix`.
    const PREFIX: &'static str;
    /// For `--session-lease-etcd-ca`.
    const CA: &'static str;
    /// For `--session-lease-etcd-cert`.
    const CERT: &'static str;
    /// For `--session-lease-etcd-key`.
    const KEY: &'static str;
    /// For `--session-lease-etcd-user`.
    const USER: &'static str;
    /// For `--session-lease-etcd-password-file`.
    const PASSWORD_FILE: &'static str;
}

/// The environment variables a server reads its Kubernetes settings from.
pub trait K8sEnv {
    /// For `--session-lease-k8s-kubeconfig`.
    const KUBECONFIG: &'static str;
}

/// The prefix of PostgreSQL lease tables when none is given.
pub const DEFAULT_POSTGRES_TABLE_PREFIX: &str = "mecatl";

/// The environment variables a server reads its PostgreSQL lease settings
/// from.
pub trait PostgresEnv {
    /// For `--session-lease-postgres-password-file`.
    const PASSWORD_FILE: &'static str;
    /// For `--session-lease-postgres-table-prefix`.
    const TABLE_PREFIX: &'static str;
}

/// The environment variables a server reads its Redis lease settings from.
pub trait RedisEnv {
    /// For `--session-lease-redis-prefix`.
    const PREFIX: &'static str;
}

/// How to reach etcd once a server has chosen it: everything but the
/// endpoints, which each server's selector carries.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct EtcdArgs<E: EtcdEnv> {
    /// etcd: the key prefix of the leases (every server and replica that
    /// shares sessions shares it).
    #[arg(
        id = "session_lease_etcd_prefix",
        long = "session-lease-etcd-prefix",
        visible_alias = "etcd-prefix",
        value_name = "PREFIX",
        env = E::PREFIX,
        default_value = DEFAULT_ETCD_PREFIX
    )]
    pub prefix: String,

    /// etcd: PEM CA of the members' certificates (TLS to etcd).
    #[arg(
        id = "session_lease_etcd_ca",
        long = "session-lease-etcd-ca",
        visible_alias = "etcd-ca",
        value_name = "PEM",
        env = E::CA
    )]
    pub ca: Option<PathBuf>,

    /// etcd: PEM client certificate (mutual TLS; needs
    /// --session-lease-etcd-key and --session-lease-etcd-ca).
    #[arg(
        id = "session_lease_etcd_cert",
        long = "session-lease-etcd-cert",
        visible_alias = "etcd-cert",
        value_name = "PEM",
        env = E::CERT,
        requires_all = ["session_lease_etcd_key", "session_lease_etcd_ca"]
    )]
    pub cert: Option<PathBuf>,

    /// etcd: PEM private key of --session-lease-etcd-cert.
    #[arg(
        id = "session_lease_etcd_key",
        long = "session-lease-etcd-key",
        visible_alias = "etcd-key",
        value_name = "PEM",
        env = E::KEY,
        requires = "session_lease_etcd_cert"
    )]
    pub key: Option<PathBuf>,

    /// etcd: user, for a cluster with authentication enabled (needs
    /// --session-lease-etcd-password-file; read-write on the prefix).
    #[arg(
        id = "session_lease_etcd_user",
        long = "session-lease-etcd-user",
        visible_alias = "etcd-user",
        value_name = "USER",
        env = E::USER,
        requires = "session_lease_etcd_password_file"
    )]
    pub user: Option<String>,

    /// etcd: file holding the password of --session-lease-etcd-user (one
    /// line; its line ending is not part of it).
    #[arg(
        id = "session_lease_etcd_password_file",
        long = "session-lease-etcd-password-file",
        visible_alias = "etcd-password-file",
        value_name = "FILE",
        env = E::PASSWORD_FILE,
        requires = "session_lease_etcd_user"
    )]
    pub password_file: Option<PathBuf>,

    #[arg(skip)]
    env: PhantomData<E>,
}

impl<E: EtcdEnv> EtcdArgs<E> {
    /// etcd at `endpoints`, with these settings.
    pub fn leases(&self, endpoints: Vec<String>) -> EtcdLeases {
        EtcdLeases {
            endpoints,
            prefix: self.prefix.clone(),
            ca: self.ca.clone(),
            // clap requires the key with the certificate, and the password
            // file with the user: neither half is ever dropped alone.
            identity: self.cert.clone().zip(self.key.clone()),
            user: self.user.clone().zip(self.password_file.clone()),
        }
    }
}

/// How to reach the Kubernetes API once a server has chosen Lease objects:
/// everything but the namespace, which each server's selector carries.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct K8sArgs<E: K8sEnv> {
    /// Kubernetes: the kubeconfig to reach the cluster with. Default: the
    /// pod's service account inside a cluster, else $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(
        id = "session_lease_k8s_kubeconfig",
        long = "session-lease-k8s-kubeconfig",
        visible_alias = "kubeconfig",
        value_name = "FILE",
        env = E::KUBECONFIG
    )]
    pub kubeconfig: Option<PathBuf>,

    #[arg(skip)]
    env: PhantomData<E>,
}

impl<E: K8sEnv> K8sArgs<E> {
    /// Lease objects in `namespace`, with these settings.
    pub fn leases(&self, namespace: String) -> K8sLeases {
        K8sLeases {
            namespace,
            kubeconfig: self.kubeconfig.clone(),
        }
    }
}

/// The settings of Redis leases once a server has chosen them: everything
/// but the URL, which each server's selector carries.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct RedisArgs<E: RedisEnv> {
    /// Redis: the key prefix of the leases (every server and replica that
    /// shares sessions shares it).
    #[arg(
        id = "session_lease_redis_prefix",
        long = "session-lease-redis-prefix",
        visible_alias = "redis-prefix",
        value_name = "PREFIX",
        env = E::PREFIX,
        default_value = DEFAULT_REDIS_PREFIX
    )]
    pub prefix: String,

    #[arg(skip)]
    env: PhantomData<E>,
}

impl<E: RedisEnv> RedisArgs<E> {
    /// The Redis at `url` (credentials and `rediss://` included), with
    /// these settings.
    pub fn leases(&self, url: String) -> RedisLeases {
        RedisLeases {
            url,
            prefix: self.prefix.clone(),
        }
    }
}

/// The settings of PostgreSQL leases once a server has chosen them:
/// everything but the URL, which each server's selector carries.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PostgresArgs<E: PostgresEnv> {
    /// PostgreSQL: file holding the password, in place of any the URL
    /// carries (one line; its line ending is not part of it).
    #[arg(
        id = "session_lease_postgres_password_file",
        long = "session-lease-postgres-password-file",
        visible_alias = "postgres-password-file",
        value_name = "FILE",
        env = E::PASSWORD_FILE
    )]
    pub password_file: Option<PathBuf>,

    /// PostgreSQL: prefix of the lease tables' names (every server and
    /// replica that shares sessions shares it).
    #[arg(
        id = "session_lease_postgres_table_prefix",
        long = "session-lease-postgres-table-prefix",
        visible_alias = "postgres-table-prefix",
        value_name = "PREFIX",
        env = E::TABLE_PREFIX,
        default_value = DEFAULT_POSTGRES_TABLE_PREFIX
    )]
    pub table_prefix: String,

    #[arg(skip)]
    env: PhantomData<E>,
}

impl<E: PostgresEnv> PostgresArgs<E> {
    /// The database at `url`, with these settings.
    pub fn leases(&self, url: String) -> PostgresLeases {
        PostgresLeases {
            url,
            password_file: self.password_file.clone(),
            table_prefix: self.table_prefix.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct TestEnv;

    impl EtcdEnv for TestEnv {
        const PREFIX: &'static str = "T_ETCD_PREFIX";
        const CA: &'static str = "T_ETCD_CA";
        const CERT: &'static str = "T_ETCD_CERT";
        const KEY: &'static str = "T_ETCD_KEY";
        const USER: &'static str = "T_ETCD_USER";
        const PASSWORD_FILE: &'static str = "T_ETCD_PASSWORD_FILE";
    }

    impl K8sEnv for TestEnv {
        const KUBECONFIG: &'static str = "T_KUBECONFIG";
    }

    impl RedisEnv for TestEnv {
        const PREFIX: &'static str = "T_REDIS_PREFIX";
    }

    impl PostgresEnv for TestEnv {
        const PASSWORD_FILE: &'static str = "T_PG_PASSWORD_FILE";
        const TABLE_PREFIX: &'static str = "T_PG_TABLE_PREFIX";
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        etcd: EtcdArgs<TestEnv>,
        #[command(flatten)]
        k8s: K8sArgs<TestEnv>,
        #[command(flatten)]
        redis: RedisArgs<TestEnv>,
        #[command(flatten)]
        postgres: PostgresArgs<TestEnv>,
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
    }

    #[test]
    fn the_flags_are_a_valid_command() {
        Cli::command().debug_assert();
    }

    /// Scripts written for `mecatl-leased` (`--etcd-ca`, `--kubeconfig`,
    /// `--redis-prefix`) configure exactly what the canonical spellings do.
    #[test]
    fn the_old_spellings_parse_to_the_same_configuration_as_the_new() {
        let old = parse(&[
            "--etcd-prefix=/p/",
            "--etcd-ca=ca.pem",
            "--etcd-cert=c.pem",
            "--etcd-key=k.pem",
            "--etcd-user=app",
            "--etcd-password-file=pw",
            "--kubeconfig=kc",
            "--redis-prefix=r:",
            "--postgres-password-file=pgpw",
            "--postgres-table-prefix=chat",
        ])
        .unwrap();
        let new = parse(&[
            "--session-lease-etcd-prefix=/p/",
            "--session-lease-etcd-ca=ca.pem",
            "--session-lease-etcd-cert=c.pem",
            "--session-lease-etcd-key=k.pem",
            "--session-lease-etcd-user=app",
            "--session-lease-etcd-password-file=pw",
            "--session-lease-k8s-kubeconfig=kc",
            "--session-lease-redis-prefix=r:",
            "--session-lease-postgres-password-file=pgpw",
            "--session-lease-postgres-table-prefix=chat",
        ])
        .unwrap();
        assert_eq!(old.etcd, new.etcd);
        assert_eq!(old.k8s, new.k8s);
        assert_eq!(old.redis, new.redis);
        assert_eq!(old.postgres, new.postgres);
        assert_eq!(
            new.postgres.leases("postgres://db/x".into()),
            PostgresLeases {
                url: "postgres://db/x".into(),
                password_file: Some("pgpw".into()),
                table_prefix: "chat".into(),
            }
        );
        let endpoints = vec!["http://e:2379".to_owned()];
        assert_eq!(
            new.etcd.leases(endpoints.clone()),
            EtcdLeases {
                endpoints,
                prefix: "/p/".into(),
                ca: Some("ca.pem".into()),
                identity: Some(("c.pem".into(), "k.pem".into())),
                user: Some(("app".into(), "pw".into())),
            }
        );
        assert_eq!(
            old.k8s.leases("ns".into()),
            K8sLeases {
                namespace: "ns".into(),
                kubeconfig: Some("kc".into()),
            }
        );
        assert_eq!(old.redis.leases("redis://r".into()).prefix, "r:");
    }

    #[test]
    fn defaults_and_half_given_pairs() {
        let none = parse(&[]).unwrap();
        assert_eq!(none.etcd.prefix, DEFAULT_ETCD_PREFIX);
        assert_eq!(none.redis.prefix, DEFAULT_REDIS_PREFIX);
        let etcd = none.etcd.leases(vec![]);
        assert_eq!((etcd.ca, etcd.identity, etcd.user), (None, None, None));
        for half in [
            &["--etcd-cert", "c.pem", "--etcd-ca", "ca.pem"][..],
            &["--session-lease-etcd-key", "k.pem"],
            &["--etcd-cert", "c.pem", "--etcd-key", "k.pem"],
            &["--etcd-user", "app"],
            &["--session-lease-etcd-password-file", "pw"],
        ] {
            assert!(parse(half).is_err(), "{half:?} was accepted");
        }
    }

    /// Each setting reads the variable the server named for it.
    #[test]
    fn every_setting_reads_the_variable_its_server_names() {
        let cmd = Cli::command();
        for (id, var) in [
            ("session_lease_etcd_prefix", "T_ETCD_PREFIX"),
            ("session_lease_etcd_ca", "T_ETCD_CA"),
            ("session_lease_etcd_cert", "T_ETCD_CERT"),
            ("session_lease_etcd_key", "T_ETCD_KEY"),
            ("session_lease_etcd_user", "T_ETCD_USER"),
            ("session_lease_etcd_password_file", "T_ETCD_PASSWORD_FILE"),
            ("session_lease_k8s_kubeconfig", "T_KUBECONFIG"),
            ("session_lease_redis_prefix", "T_REDIS_PREFIX"),
        ] {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("no argument {id}"));
            assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var), "{id}");
        }
    }
}
