//! Real services for tests, started and stopped by the tests themselves.
//!
//! Backends are tested against the real thing (DESIGN.md §6): a Redis
//! server, an etcd member, a three-member etcd cluster ([`EtcdCluster`]), a
//! PostgreSQL server ([`PostgresServer`]) and a PgBouncer in transaction
//! mode in front of one ([`PgBouncer`]). Each [`RedisServer`], [`EtcdServer`]
//! or [`PostgresServer`] is a
//! private instance on a free loopback port with its data in a temporary
//! directory, so tests run in parallel without sharing state, and it is
//! stopped when dropped — also when the test panics, and (through the
//! parent-death signal) when the test process is killed.
//!
//! A [`RedisServer`] can also come back older: [`RedisServer::snapshot`]
//! saves its data as it is (`SAVE`) and [`RedisServer::restart_from`]
//! restarts it with exactly that data, as a server restarted from a stale
//! RDB file or a restored backup would; [`RedisServer::info`] reads what
//! it reports of itself (memory, evictions). A [`PostgresStandby`] streams
//! a [`PostgresServer`]'s WAL asynchronously; its replication can be cut
//! and it can be promoted, as a failover that loses the last commits.
//!
//! PostgreSQL and PgBouncer refuse to run as root: when the tests do (as
//! CI does), their processes run as `nobody`, in directories made its own.
//!
//! Between a client and any of them (or any TCP server) a [`FaultProxy`]
//! injects network faults at run time: latency, dropped connections, a
//! blackhole, replies lost after the request went through.
//!
//! A missing binary is an error naming the Debian package to install
//! (`cargo xtask services` installs it); a test never passes by skipping
//! its service.
//!
//! ```no_run
//! use test_services::{Controls, RedisServer};
//!
//! let redis = RedisServer::start().expect("redis-server is installed");
//! let url = redis.url(); // redis://127.0.0.1:PORT
//! # let _ = url;
//! redis.pause().unwrap(); // SIGSTOP: the server stops answering
//! redis.resume().unwrap();
//! drop(redis); // stopped, its directory removed
//! ```
//!
//! For partitions between processes, [`netns::Network`] puts hosts of the
//! test's own in network namespaces on this machine, and
//! [`EtcdCluster::start_on`] runs a cluster's members on three of them.
//!
//! Start services from the test's own thread or a runtime worker: the
//! parent-death signal follows the thread that spawned the process.

mod error;
mod etcd;
mod etcd_cluster;
pub mod netns;
mod pgbouncer;
mod pgwire;
pub mod pki;
mod postgres;
mod postgres_standby;
mod process;
mod proxy;
mod redis;
mod unprivileged;

pub use error::ServiceError;
pub use etcd::{EtcdServer, EtcdTls};
pub use etcd_cluster::{CLUSTER_SIZE, EtcdCluster};
pub use pgbouncer::PgBouncer;
pub use postgres::{POSTGRES_PASSWORD, POSTGRES_USER, PostgresServer};
pub use postgres_standby::PostgresStandby;
pub use process::ServerProcess;
pub use process::find_binary;
pub use proxy::{FaultProxy, ProxyCounters, ProxyMode};
pub use redis::{RedisServer, RedisSnapshot};

/// What every service started here can be told to do, as an operator or a
/// failure would.
pub trait Controls {
    /// The running process.
    fn process(&self) -> &ServerProcess;

    /// The server's process id, while it runs.
    fn pid(&self) -> Option<u32> {
        self.process().pid()
    }

    /// SIGSTOP: the server keeps its connections but answers nothing (and
    /// its own clocks, such as etcd's lease timers, stop).
    fn pause(&self) -> Result<(), ServiceError> {
        self.process().signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// SIGCONT after [`pause`](Self::pause).
    fn resume(&self) -> Result<(), ServiceError> {
        self.process().signal(nix::sys::signal::Signal::SIGCONT)
    }
}
