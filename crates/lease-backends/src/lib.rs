//! The wiring Mecatl's servers share between their flags and their lease
//! backends: one flag vocabulary, one reading of the files the flags name,
//! and one function per backend that opens it from its configuration.
//!
//! # When to choose it
//!
//! - You write a server that lets its operator pick the lease backend at
//!   start-up, as `mecated` and `mecatl-leased` do: flatten the flag
//!   structs ([`EtcdArgs`], [`K8sArgs`], [`RedisArgs`]) into your `clap`
//!   parser, turn the chosen backend into its configuration
//!   ([`EtcdLeases`], [`K8sLeases`], [`RedisLeases`], [`LeaseService`],
//!   [`DirLeases`]) and `open` it. Your users get the spellings, file rules
//!   and error messages the shipped servers have.
//! - Not when the backend is fixed in code: depend on its crate
//!   (`etcdlease`, `flocklease`, …) and use its builder, which has every
//!   knob this crate leaves at the servers' choice.
//!
//! Features `etcd`, `k8s`, `redis`, `postgres` and `grpc` (all default) bring in the
//! client crate of each network backend and its `open`; memory and file
//! leases are always here. `postgres-store` (default too) adds the
//! PostgreSQL session store ([`PostgresStore`]), which brings pglease's
//! leases in its own database and checks them in every append. The flag structs and configurations exist
//! without their feature, so a server built without one can still parse its
//! flags and say which feature the operator asked for.
//!
//! # Example
//!
//! A server taking `--etcd ENDPOINTS` or `--dir PATH`, with its own
//! environment variables, opening file leases:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use clap::Parser;
//! use lease_backends::{DirLeases, EtcdArgs, EtcdEnv};
//! use lease_port::{OwnerId, SessionId, SessionLease, SystemClock};
//!
//! #[derive(Debug, Clone, PartialEq, Eq)]
//! struct MyEnv;
//! impl EtcdEnv for MyEnv {
//!     const PREFIX: &'static str = "MYSERVER_ETCD_PREFIX";
//!     const CA: &'static str = "MYSERVER_ETCD_CA";
//!     const CERT: &'static str = "MYSERVER_ETCD_CERT";
//!     const KEY: &'static str = "MYSERVER_ETCD_KEY";
//!     const USER: &'static str = "MYSERVER_ETCD_USER";
//!     const PASSWORD_FILE: &'static str = "MYSERVER_ETCD_PASSWORD_FILE";
//! }
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[arg(long, value_delimiter = ',', conflicts_with = "dir")]
//!     etcd: Vec<String>,
//!     #[arg(long)]
//!     dir: Option<std::path::PathBuf>,
//!     #[command(flatten)]
//!     etcd_settings: EtcdArgs<MyEnv>,
//! }
//!
//! // The old spelling `--etcd-prefix` and the canonical one mean the same.
//! let cli = Cli::parse_from(["myserver", "--etcd", "http://e1:2379,http://e2:2379",
//!                            "--etcd-prefix", "/my/leases/"]);
//! let etcd = cli.etcd_settings.leases(cli.etcd);
//! assert_eq!(etcd.describe(), "etcd at http://e1:2379,http://e2:2379");
//! assert_eq!(etcd.prefix, "/my/leases/");
//!
//! let tmp = tempfile::tempdir()?;
//! let cli = Cli::parse_from(["myserver", "--dir", &tmp.path().display().to_string()]);
//! let dir = DirLeases { dir: cli.dir.expect("given"), allow_volatile: false };
//! let leases = dir.open(Duration::from_secs(15), Arc::new(SystemClock))?;
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let lease = leases.acquire(&SessionId::new("chat-1")?, &OwnerId::new("me")?).await?;
//! leases.release(&lease).await?;
//! # Ok::<(), lease_port::LeaseError>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Errors
//!
//! Opening fails with an [`OpenError`]: its [`kind`](OpenError::kind)
//! tells a file the configuration names ([`OpenErrorKind::File`], the file
//! in [`path`](OpenError::path)) from a volatile lease directory and from
//! the backend's own refusal, kept as the source. A caller reporting
//! backend failures as [`LeaseError`](lease_port::LeaseError) converts it
//! with `From`.

mod error;
mod etcd;
mod files;
mod flags;
mod k8s;
mod local;
mod postgres;
mod postgres_store;
mod redis;
mod service;

pub use error::{FileError, FileErrorKind, OpenError, OpenErrorKind};
pub use etcd::EtcdLeases;
#[cfg(feature = "etcd")]
pub use files::read_etcd_credentials;
pub use files::{read_password_file, read_tls_file, read_token_file};
pub use flags::{
    DEFAULT_ETCD_PREFIX, DEFAULT_POSTGRES_TABLE_PREFIX, DEFAULT_REDIS_PREFIX, EtcdArgs, EtcdEnv,
    K8sArgs, K8sEnv, PostgresArgs, PostgresEnv, RedisArgs, RedisEnv,
};
pub use k8s::K8sLeases;
pub use local::{DirLeases, open_memory};
pub use postgres::PostgresLeases;
pub use postgres_store::PostgresStore;
pub use redis::RedisLeases;
pub use service::LeaseService;
