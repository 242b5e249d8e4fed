//! A leader frozen for longer than a TTL wakes up believing it still
//! leads and revokes the etcd leases that expired in its stale view, while
//! their holders are renewing them on the new leader; the revocation is
//! forwarded and committed (etcd #12528, #15247 — the etcd this project
//! tests against, 3.4.23, has it). The holder's key vanishes while the
//! holder, having just renewed, still counts on its lease. No other owner
//! may acquire the session before that count runs out. Whether the
//! revocation lands is a race inside etcd, so the freeze is repeated until
//! it has (it lands in most freezes here).

use std::time::{Duration, Instant, SystemTime};

use etcdlease::EtcdLease;
use lease_port::{Lease, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdCluster;

use crate::ONE_CLUSTER;

const TTL: Duration = Duration::from_secs(3);

fn client(endpoint: String) -> EtcdLease {
    EtcdLease::builder([endpoint])
        .prefix("/frozen/")
        .ttl(TTL)
        .request_timeout(Duration::from_millis(700))
        .build()
        .unwrap()
}

/// The monotonic instant until which the holder of `lease`, renewed by a
/// request sent at `sent`, counts on it.
fn counted_until(lease: &Lease, sent: Instant) -> Instant {
    let left = lease
        .expiry()
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    (Instant::now() + left).min(sent + TTL)
}

/// Holders, each with its own client and so its own etcd lease: the
/// frozen leader revokes them one by one, some after it stepped down.
const HOLDERS: usize = 6;

struct Held {
    until: Instant,
    lost_at: Option<Instant>,
}

/// Whether the frozen leader's revocation lands is a race inside etcd
/// (between its lessor and its stepping down): freezes are repeated, up to
/// this many, until it has.
const FREEZES: usize = 4;

#[test]
fn no_takeover_while_a_holder_counts_on_a_lease_a_frozen_leader_revoked() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = EtcdCluster::start().expect("a three-member etcd cluster");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for freeze in 0..FREEZES {
        let lost = freeze_the_leader(&cluster, &runtime, freeze);
        eprintln!("freeze {freeze}: {lost} of {HOLDERS} holders lost their leases while renewing");
        if lost > 0 {
            return;
        }
    }
}

/// Freezes the leader while holders renew and a competitor waits, checks
/// that the competitor never took a session its holder still counted on,
/// and answers how many holders lost their sessions while renewing.
fn freeze_the_leader(
    cluster: &EtcdCluster,
    runtime: &tokio::runtime::Runtime,
    freeze: usize,
) -> usize {
    let leader = cluster.wait_for_leader().expect("a leader");
    let endpoints = cluster.endpoints();
    // Holders and competitor talk to the followers only, so none of them
    // waits on the frozen member.
    let followers: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| endpoints[i].clone())
        .collect();
    let sessions: Vec<SessionId> = (0..HOLDERS)
        .map(|i| SessionId::new(format!("frozen-leader-{freeze}-{i}")).unwrap())
        .collect();
    let bob = OwnerId::new("bob").unwrap();
    let competitor = runtime.block_on(async { client(followers[1].clone()) });

    let mut renewing = Vec::new();
    for session in &sessions {
        let holder = runtime.block_on(async { client(followers[0].clone()) });
        let alice = OwnerId::new(format!("alice-{session}")).unwrap();
        let lease = runtime.block_on(holder.acquire(session, &alice)).unwrap();
        renewing.push(runtime.spawn(renew_for_a_while(holder, lease)));
    }
    cluster.pause(leader).expect("SIGSTOP the leader");
    // Longer than the frozen leader's view of any etcd lease lasts, while
    // a new leader is elected and the holders renew on it.
    std::thread::sleep(TTL * 2 + Duration::from_secs(2));
    cluster.resume(leader).expect("SIGCONT the leader");

    let taken = runtime.block_on(async {
        let mut taken: Vec<Option<(Instant, Lease)>> = vec![None; HOLDERS];
        let stop = Instant::now() + TTL * 4;
        while Instant::now() < stop {
            for (i, session) in sessions.iter().enumerate() {
                if taken[i].is_some() {
                    continue;
                }
                match competitor.acquire(session, &bob).await {
                    Ok(lease) => taken[i] = Some((Instant::now(), lease)),
                    Err(e) if e.kind() == LeaseErrorKind::Held => {}
                    Err(e) if e.kind() == LeaseErrorKind::Transient => {}
                    Err(e) => panic!("acquire of {session} by bob: {e:?}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        taken
    });
    let mut lost = 0;
    for (i, task) in renewing.into_iter().enumerate() {
        let held = runtime.block_on(task).unwrap();
        lost += usize::from(held.lost_at.is_some());
        if let Some((bob_from, bob_lease)) = &taken[i] {
            assert!(
                *bob_from >= held.until,
                "two live owners of {}: bob took {bob_lease:?} {:?} before its holder's renewed \
                 lease ran out",
                sessions[i],
                held.until - *bob_from
            );
        }
    }
    lost
}

/// Renews `lease` every TTL/3 for six TTLs or until it is lost.
async fn renew_for_a_while(holder: EtcdLease, mut lease: Lease) -> Held {
    let mut until = Instant::now() + TTL;
    let stop = Instant::now() + TTL * 6;
    while Instant::now() < stop {
        tokio::time::sleep(TTL / 3).await;
        let sent = Instant::now();
        match holder.renew(&lease).await {
            Ok(renewed) => {
                until = counted_until(&renewed, sent);
                lease = renewed;
            }
            Err(e) if e.kind() == LeaseErrorKind::Held => {
                return Held {
                    until,
                    lost_at: Some(Instant::now()),
                };
            }
            Err(e) if e.kind() == LeaseErrorKind::Transient => {}
            Err(e) => panic!("renew of {}: {e:?}", lease.session_id()),
        }
    }
    Held {
        until,
        lost_at: None,
    }
}
