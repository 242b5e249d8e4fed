//! Real network partitions: etcd members and holder processes on hosts of
//! a private network of namespaces, links cut and healed under them.
//!
//! The store is a directory every namespace shares (namespaces separate
//! networks, not file systems), so a holder cut from the lease service
//! still reaches the store: the case fencing exists for.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lease_history::{FaultKind, Recorder, Rng, Workload};
use test_services::EtcdCluster;
use test_services::netns::{Host, Network};
use tokio::task::block_in_place;
use tokio::time::sleep;

use crate::holders::{self, Holder, HolderConfig, LeaseSpec};
use crate::injectors::{Action, Chaos};
use crate::rigs::{Rig, jsonl};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Cuts on one private network: holders from the lease service, from its
/// leader, members from each other.
pub(crate) struct Partitions {
    network: Network,
    cluster: Arc<Mutex<EtcdCluster>>,
    holders: Vec<Arc<Holder>>,
    longest: Duration,
}

/// A set of links cut together, healed together.
struct Cut {
    pairs: Vec<(Host, Host)>,
    what: String,
}

impl Partitions {
    fn member(&self, i: usize) -> Result<Host, String> {
        lock(&self.cluster)
            .host(i)
            .cloned()
            .ok_or_else(|| format!("etcd member {i} is on no host"))
    }

    fn members(&self) -> Result<Vec<Host>, String> {
        (0..test_services::CLUSTER_SIZE)
            .map(|i| self.member(i))
            .collect()
    }

    /// The leader, once the cluster has one again (right after a heal it
    /// may be electing); `None` when it has none for long.
    fn leader(&self) -> Option<usize> {
        block_in_place(|| lock(&self.cluster).wait_for_leader()).ok()
    }

    fn choose(&self, rng: &mut Rng) -> Result<Cut, String> {
        let holder = &self.holders[rng.below(self.holders.len() as u64) as usize];
        let holder_host = holder
            .host()
            .cloned()
            .ok_or("a holder without a host cannot be partitioned")?;
        let members = self.members()?;
        let others = |i: usize| {
            members
                .iter()
                .enumerate()
                .filter(move |(j, _)| *j != i)
                .map(|(_, m)| m.clone())
        };
        let mut kind = rng.below(4);
        let leader = if matches!(kind, 1 | 2) {
            self.leader()
        } else {
            None
        };
        if leader.is_none() && matches!(kind, 1 | 2) {
            // No leader to cut: cut the holder from every member instead.
            kind = 0;
        }
        let leader = leader.unwrap_or(0);
        Ok(match kind {
            // The case fencing exists for: the holder still reaches the
            // store, but no member of the lease service.
            0 => Cut {
                pairs: members
                    .iter()
                    .map(|m| (holder_host.clone(), m.clone()))
                    .collect(),
                what: format!("{} cut from every etcd member", holder.name()),
            },
            // Its client must move to another member.
            1 => Cut {
                pairs: vec![(holder_host, members[leader].clone())],
                what: format!("{} cut from the etcd leader m{leader}", holder.name()),
            },
            // The leader alone on its side: a new one is elected, the old
            // one may still believe it leads.
            2 => Cut {
                pairs: others(leader)
                    .map(|m| (members[leader].clone(), m))
                    .collect(),
                what: format!("etcd leader m{leader} cut from the other members"),
            },
            // A holder with one member, the rest of the cluster on the
            // other side: the minority member answers nothing linearizable.
            _ => {
                let member = rng.below(members.len() as u64) as usize;
                let mut pairs: Vec<_> = others(member)
                    .map(|m| (members[member].clone(), m))
                    .collect();
                pairs.extend(others(member).map(|m| (holder_host.clone(), m)));
                Cut {
                    pairs,
                    what: format!(
                        "{} with etcd member m{member}, apart from the others",
                        holder.name()
                    ),
                }
            }
        })
    }

    pub(crate) async fn inject(&self, rng: &mut Rng, rec: &Recorder) -> Result<(), String> {
        let cut = self.choose(rng)?;
        let fault = rec.fault(FaultKind::Partition, &cut.what);
        for (a, b) in &cut.pairs {
            self.network.cut(a, b).map_err(|e| e.to_string())?;
        }
        sleep(rng.between(self.longest / 4, self.longest * 2)).await;
        for (a, b) in &cut.pairs {
            self.network.heal(a, b).map_err(|e| e.to_string())?;
        }
        rec.heal(fault);
        Ok(())
    }
}

/// Three etcd members and one holder process per worker, each on a host of
/// its own on one private network; faults are partitions and the holder
/// processes' stops and kills.
pub(crate) async fn etcd_partitions(w: &mut Workload, dir: &Path) -> Result<Rig, String> {
    w.ttl = Duration::from_secs(2);
    let network = block_in_place(Network::new).map_err(|e| format!("private network: {e}"))?;
    let cluster = block_in_place(|| EtcdCluster::start_on(&network))
        .map_err(|e| format!("start the etcd cluster: {e}"))?;
    let store = jsonl(dir)?;
    let mut holders = Vec::new();
    for i in 0..w.workers {
        let name = format!("w{i}");
        let host = network
            .add_host(&name)
            .map_err(|e| format!("add host {name}: {e}"))?;
        holders.push(Holder::start(
            name,
            HolderConfig {
                leases: LeaseSpec::Etcd {
                    prefix: "/faults/".into(),
                    endpoints: cluster.endpoints(),
                },
                store: dir.join("store"),
                ttl: w.ttl,
                broken_store: false,
                generation_witness: None,
                host: Some((network.clone(), host)),
            },
        )?);
    }
    let target = holders::target_of(&holders, store);
    let cluster = Arc::new(Mutex::new(cluster));
    let partitions = Partitions {
        network: network.clone(),
        cluster: Arc::clone(&cluster),
        holders: holders.clone(),
        longest: w.ttl,
    };
    Ok(Rig {
        target,
        faults: Some(Box::new(Chaos::new(vec![
            Action::Partitions(Box::new(partitions)),
            Action::Holders(holders::set_of(holders)),
        ]))),
        // The holders go with the target, before these; the cluster goes
        // before the network its members run on.
        keep: vec![Box::new(cluster), Box::new(network)],
    })
}
