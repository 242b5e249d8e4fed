//! Several workers contend for a handful of sessions through one memlease
//! table: each takes a session, "works" for a while, and releases it; some
//! workers stall past the TTL and are taken over. Every grant is printed
//! with its fencing token, and the run ends with a check that no two grants
//! of one session overlapped and that tokens only rose.
//!
//! ```text
//! cargo run -p memlease --example contend -- [WORKERS] [SESSIONS] [ROUNDS]
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use memlease::MemLease;

const TTL: Duration = Duration::from_millis(300);

#[derive(Debug)]
struct Grant {
    worker: usize,
    token: u64,
    from: SystemTime,
    until: SystemTime,
}

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (workers, sessions, rounds) = (arg(1, 4), arg(2, 2), arg(3, 6));
    let leases = MemLease::new(TTL);
    let history: Arc<Mutex<BTreeMap<usize, Vec<Grant>>>> = Arc::default();
    let start = Instant::now();
    println!("{workers} workers, {sessions} sessions, {rounds} rounds each, TTL {TTL:?}");

    let mut tasks = Vec::new();
    for w in 0..workers {
        let (leases, history) = (leases.clone(), Arc::clone(&history));
        tasks.push(tokio::spawn(async move {
            let me = OwnerId::new(format!("worker-{w}"))?;
            for round in 0..rounds {
                let s = (w + round) % sessions;
                let id = SessionId::new(format!("session-{s}"))?;
                let lease = match leases.acquire(&id, &me).await {
                    Ok(lease) => lease,
                    Err(e) if e.kind() == LeaseErrorKind::Held => {
                        println!(
                            "{:>6.0?} worker-{w} session-{s}: leased elsewhere ({})",
                            start.elapsed(),
                            e.holder().map(|h| h.as_str()).unwrap_or("unknown")
                        );
                        tokio::time::sleep(TTL / 3).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                let from = SystemTime::now();
                println!(
                    "{:>6.0?} worker-{w} session-{s}: acquired, token {}",
                    start.elapsed(),
                    lease.token()
                );
                // Every third grant stalls past its TTL and is never renewed.
                let stalls = (w + round) % 3 == 2;
                let work = if stalls { TTL * 2 } else { TTL / 4 };
                tokio::time::sleep(work).await;
                let until = if stalls {
                    // The grant ended at its expiry, not when the worker woke.
                    lease.expiry()
                } else {
                    SystemTime::now()
                };
                match leases.renew(&lease).await {
                    Ok(_) => leases.release(&lease).await?,
                    Err(e) if e.kind() == LeaseErrorKind::Held => println!(
                        "{:>6.0?} worker-{w} session-{s}: lost the lease while stalled",
                        start.elapsed()
                    ),
                    Err(e) => return Err(e.into()),
                }
                let grant = Grant {
                    worker: w,
                    token: lease.token().get(),
                    from,
                    until,
                };
                history
                    .lock()
                    .map_err(|_| "poisoned")?
                    .entry(s)
                    .or_default()
                    .push(grant);
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }

    let history = history.lock().map_err(|_| "poisoned")?;
    let mut grants = 0;
    for (s, list) in history.iter() {
        let mut list: Vec<_> = list.iter().collect();
        list.sort_by_key(|g| g.token);
        for pair in list.windows(2) {
            if pair[1].from < pair[0].until {
                let (a, b) = (pair[0], pair[1]);
                return Err(format!(
                    "session-{s}: worker-{} (token {}) overlaps worker-{} (token {})",
                    a.worker, a.token, b.worker, b.token
                )
                .into());
            }
        }
        grants += list.len();
    }
    println!("{grants} grants, no overlap, tokens strictly rising per session");
    Ok(())
}
