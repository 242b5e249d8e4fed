//! Fifty clients, each its own process as far as the API server can tell,
//! contend for one session round after round: every hold granted is the
//! only live one, and tokens rise in the order holds were granted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8slease::ExpiryJudgement;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use tokio::sync::Barrier;

use crate::support::Cluster;

const CLIENTS: usize = 50;
const ROUNDS: usize = 8;
// Long against a hold of a few milliseconds, so no hold may lapse and be
// taken over while still counted as held.
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_one_owner_at_a_time() {
    for judgement in [ExpiryJudgement::RecordTime, ExpiryJudgement::SkewSafe] {
        let cluster = Cluster::start().await;
        let session = SessionId::new(format!("contended-{judgement:?}").to_lowercase()).unwrap();
        let holding = Arc::new(AtomicUsize::new(0));
        let grants = Arc::new(Mutex::new(Vec::new()));
        let barrier = Arc::new(Barrier::new(CLIENTS));
        let mut tasks = Vec::new();
        for i in 0..CLIENTS {
            let client = cluster.lease(TTL, judgement).await;
            let (session, holding, grants, barrier) = (
                session.clone(),
                holding.clone(),
                grants.clone(),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let me = OwnerId::new(format!("client-{i}")).unwrap();
                let mut won = 0;
                for _ in 0..ROUNDS {
                    barrier.wait().await;
                    match client.acquire(&session, &me).await {
                        Ok(lease) => {
                            let others = holding.fetch_add(1, Ordering::SeqCst);
                            assert_eq!(others, 0, "{me} was granted a lease {others} others hold");
                            grants.lock().unwrap().push(lease.token());
                            let lease = client.renew(&lease).await.expect("the holder renews");
                            tokio::task::yield_now().await;
                            holding.fetch_sub(1, Ordering::SeqCst);
                            client.release(&lease).await.expect("release");
                            won += 1;
                        }
                        Err(e) if e.kind() == LeaseErrorKind::Held => {}
                        Err(e) => panic!("{me}: {e:?}"),
                    }
                }
                won
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += t.await.expect("a contending client failed");
        }
        let grants = grants.lock().unwrap();
        assert_eq!(grants.len(), wins);
        assert!(
            wins >= ROUNDS,
            "{judgement:?}: only {wins} grants in {ROUNDS} rounds"
        );
        assert!(
            grants.windows(2).all(|w| w[1] > w[0]),
            "{judgement:?}: tokens did not rise in grant order: {grants:?}"
        );
    }
}
