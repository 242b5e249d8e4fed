//! Faults of a real three-member etcd cluster while workers contend for a
//! few sessions: the leader killed mid-run, a member stopped with SIGSTOP,
//! the whole cluster restarted from its data.
//!
//! Every worker is a separate `EtcdLease` client with its own owner id,
//! knowing all three members. A worker records each hold as the interval
//! in which it believed it owned the session: from the acquire's answer to
//! the earliest of its release being sent, its local deadline (the lease's
//! expiry, counted on the monotonic clock), and learning the lease was
//! lost. A release ends the hold when it is sent, whatever its answer: one
//! that times out may still commit (the member that took it hands it to a
//! new leader), so a holder stops acting before it releases, as the keeper
//! does.
//! Some holds are abandoned (neither renewed nor released), so sessions are
//! also taken over by expiry. Checked afterwards, per
//! session: no two holds overlap, tokens rise strictly from one hold to the
//! next and never repeat — and holds kept being granted after the fault.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use etcdlease::EtcdLease;
use lease_port::{Lease, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdCluster;

use crate::ONE_CLUSTER;

const TTL: Duration = Duration::from_secs(3);
const WORKERS: usize = 4;
const SESSIONS: usize = 3;

#[derive(Debug, Clone)]
struct Hold {
    session: usize,
    worker: usize,
    token: u64,
    start: Instant,
    end: Instant,
    /// Why the hold ended, for the report of an overlap.
    ended: &'static str,
}

/// The monotonic instant at which `lease` expires, as its holder counts.
fn deadline_of(lease: &Lease) -> Instant {
    let left = lease
        .expiry()
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Instant::now() + left
}

async fn worker(
    w: usize,
    client: EtcdLease,
    sessions: Arc<Vec<SessionId>>,
    stop: Arc<AtomicBool>,
    holds: Arc<Mutex<Vec<Hold>>>,
) {
    let owner = OwnerId::new(format!("worker-{w}")).unwrap();
    let mut n = w;
    // A worker that abandoned a session stays away from it until the hold
    // has expired in its own view, as a process that stopped would; before
    // that, acquiring again would be the live holder re-acquiring.
    let mut abandoned_until: [Option<Instant>; SESSIONS] = [None; SESSIONS];
    // Bounded in count as well as by the stop flag.
    for _ in 0..10_000 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        n += 1;
        let s = n % SESSIONS;
        if abandoned_until[s].is_some_and(|t| Instant::now() < t) {
            tokio::time::sleep(Duration::from_millis(30)).await;
            continue;
        }
        let lease = match client.acquire(&sessions[s], &owner).await {
            Ok(lease) => lease,
            Err(e) if e.kind() == LeaseErrorKind::Held => {
                tokio::time::sleep(Duration::from_millis(30)).await;
                continue;
            }
            Err(e) if e.kind() == LeaseErrorKind::Transient => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => panic!("worker {w}: acquire failed with {e:?}"),
        };
        let start = Instant::now();
        let token = lease.token().get();
        let mut deadline = deadline_of(&lease);
        let mut current = lease;
        let mut end = None;
        for _ in 0..1 + n % 3 {
            tokio::time::sleep(TTL / 3).await;
            let sent = Instant::now();
            if sent >= deadline {
                end = Some((deadline, "expired: renewals failed"));
                break;
            }
            match client.renew(&current).await {
                Ok(renewed) => {
                    assert_eq!(renewed.token().get(), token, "renew changed the token");
                    deadline = deadline_of(&renewed).min(sent + TTL);
                    current = renewed;
                }
                Err(e) if e.kind() == LeaseErrorKind::Held => {
                    end = Some((Instant::now().min(deadline), "renewal found it lost"));
                    break;
                }
                Err(e) if e.kind() == LeaseErrorKind::Transient => {}
                Err(e) => panic!("worker {w}: renew failed with {e:?}"),
            }
        }
        let (end, ended) = match end {
            Some(end) => end,
            // Abandoned: the session is left to expire.
            None if n.is_multiple_of(4) => {
                abandoned_until[s] = Some(deadline);
                (deadline, "abandoned")
            }
            None => {
                let sent = Instant::now();
                match client.release(&current).await {
                    Ok(()) => (sent.min(deadline), "released"),
                    // The release may still land, or the key may outlive
                    // it until it expires: the worker stays away until
                    // then, as after abandoning, but acts no more.
                    Err(_) => {
                        abandoned_until[s] = Some(deadline);
                        (sent.min(deadline), "release failed")
                    }
                }
            }
        };
        holds.lock().unwrap().push(Hold {
            session: s,
            worker: w,
            token,
            start,
            end,
            ended,
        });
    }
}

fn check(holds: &[Hold]) {
    for s in 0..SESSIONS {
        let mut of_session: Vec<&Hold> = holds.iter().filter(|h| h.session == s).collect();
        of_session.sort_by_key(|h| h.start);
        let mut tokens: Vec<u64> = of_session.iter().map(|h| h.token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(
            tokens.len(),
            of_session.len(),
            "session {s}: a token was issued twice: {of_session:#?}"
        );
        for pair in of_session.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                a.end <= b.start,
                "session {s}: worker {} held until {:?} ({}) after worker {} acquired at {:?}:\n{a:#?}\n{b:#?}",
                a.worker,
                a.end,
                a.ended,
                b.worker,
                b.start
            );
            assert!(
                b.token > a.token,
                "session {s}: token {} after {} did not rise",
                b.token,
                a.token
            );
        }
    }
}

/// Runs the workers for `before`, applies `fault` (on this thread, which
/// started the cluster), runs them for `after`, then checks the holds.
fn run_with_fault(
    name: &str,
    before: Duration,
    after: Duration,
    fault: impl FnOnce(&mut EtcdCluster),
) {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = EtcdCluster::start().expect("start a three-member etcd cluster");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sessions: Arc<Vec<SessionId>> = Arc::new(
        (0..SESSIONS)
            .map(|i| SessionId::new(format!("{name}-{i}")).unwrap())
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let client = runtime.block_on(async {
            EtcdLease::builder(cluster.endpoints())
                .prefix(format!("/{name}/"))
                .ttl(TTL)
                .request_timeout(Duration::from_millis(700))
                .build()
                .unwrap()
        });
        tasks.push(runtime.spawn(worker(
            w,
            client,
            Arc::clone(&sessions),
            Arc::clone(&stop),
            Arc::clone(&holds),
        )));
    }
    std::thread::sleep(before);
    let fault_at = Instant::now();
    fault(&mut cluster);
    std::thread::sleep(after);
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for t in tasks {
            t.await.expect("a worker panicked");
        }
    });
    let holds = holds.lock().unwrap().clone();
    check(&holds);
    let before_fault = holds.iter().filter(|h| h.start < fault_at).count();
    let after_fault = holds.iter().filter(|h| h.start > fault_at).count();
    assert!(
        before_fault > 0 && after_fault > 0,
        "{name}: {before_fault} holds before the fault and {after_fault} after: the run checked too little"
    );
    eprintln!(
        "{name}: {} holds checked ({before_fault} before the fault, {after_fault} after)",
        holds.len()
    );
}

#[test]
fn leader_killed_mid_run() {
    run_with_fault(
        "leader-killed",
        Duration::from_secs(4),
        Duration::from_secs(8),
        |cluster| {
            let leader = cluster.leader().expect("a leader");
            cluster.kill(leader);
            std::thread::sleep(TTL * 2);
            cluster
                .start_member(leader)
                .expect("start the old leader again");
        },
    );
}

#[test]
fn member_stopped_with_sigstop() {
    run_with_fault(
        "member-stopped",
        Duration::from_secs(4),
        Duration::from_secs(8),
        |cluster| {
            // The leader: its followers must elect another while it is
            // frozen, and clients talking to it must move on.
            let leader = cluster.leader().expect("a leader");
            cluster.pause(leader).expect("SIGSTOP");
            std::thread::sleep(TTL * 2);
            cluster.resume(leader).expect("SIGCONT");
        },
    );
}

#[test]
fn whole_cluster_restarted_from_its_data() {
    run_with_fault(
        "cluster-restarted",
        Duration::from_secs(4),
        Duration::from_secs(8),
        |cluster| cluster.restart_all().expect("restart the cluster"),
    );
}
