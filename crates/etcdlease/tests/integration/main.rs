//! etcdlease's integration tests, one binary, against real etcd servers
//! each test starts for itself: authentication (`auth`); tokens of one
//! cluster only (`authority_follows_the_cluster`); what the suite does not
//! reach (`behaviour`); an acquire dropped in flight
//! (`cancelled_acquire`); faults of a three-member cluster
//! (`cluster_faults`); a leader frozen past a TTL (`frozen_leader`); holds
//! backed by an older refresh of the shared lease (`grant_age`); a guard
//! key deleted by hand (`guard_deleted_by_hand`); nested prefixes
//! (`nested_prefixes`); a reclaim within the grace
//! (`reclaim_within_grace`); a member restored from a backup
//! (`restored_from_backup`); TLS (`tls`, with the `tls` feature). None
//! needs anything process-wide of its own (signals, environment, working
//! directory, its own executable), so they run as threads of one process;
//! the two that start three-member clusters take turns (`ONE_CLUSTER`).
//!
//! The behaviour suite is `tests/conformance.rs`, a binary of its own:
//! `cargo xtask conformance` runs it by target name.

use std::sync::Mutex;

mod auth;
mod authority_follows_the_cluster;
mod behaviour;
mod cancelled_acquire;
mod cluster_faults;
mod frozen_leader;
mod grant_age;
mod guard_deleted_by_hand;
mod nested_prefixes;
mod reclaim_within_grace;
mod restored_from_backup;
mod tls;

/// One three-member cluster at a time in this process (`cluster_faults`,
/// `frozen_leader`): two clusters of three members at once would starve a
/// two-core machine. (A runner that starts each test in a process of its
/// own, as nextest does, keeps them apart with a test group instead.)
static ONE_CLUSTER: Mutex<()> = Mutex::new(());
