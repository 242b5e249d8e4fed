//! The workload over a real in-memory backend and a real JSONL store:
//! clean when nothing is broken, and every broken variant found within a
//! bounded number of operations.

use std::sync::Arc;

use lease_history::broken::{BrokenLease, BrokenStore, LeaseBreakage, StoreBreakage};
use lease_history::{
    ClockStepper, FaultInjector, History, OpKind, Outcome, Property, SteppedClock, Target, Verdict,
    Workload, check, run, write_svg,
};
use lease_port::{Clock, SessionLease};
use memlease::MemLease;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore};

/// The budget each broken variant must be found within.
const BUDGET: u64 = 3000;

struct Rig {
    _dir: tempfile::TempDir,
    workload: Workload,
    clock: SteppedClock,
    leases: Arc<dyn SessionLease>,
    store: Arc<dyn SessionStore>,
}

fn rig(seed: u64) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let workload = Workload::new(BUDGET, seed);
    let clock = SteppedClock::new();
    let leases = Arc::new(
        MemLease::builder()
            .ttl(workload.ttl)
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let store = Arc::new(
        JsonlStore::open(
            dir.path(),
            JsonlOptions::default().fsync(FsyncPolicy::Never),
        )
        .unwrap(),
    );
    Rig {
        _dir: dir,
        workload,
        clock,
        leases,
        store,
    }
}

impl Rig {
    fn target(&self, leases: Vec<Arc<dyn SessionLease>>, store: Arc<dyn SessionStore>) -> Target {
        Target::new(leases, store, Arc::new(self.clock.clone()))
    }

    fn broken_lease(&self, breakage: LeaseBreakage) -> Arc<dyn SessionLease> {
        Arc::new(BrokenLease::new(
            Arc::clone(&self.leases),
            breakage,
            self.workload.ttl,
            Arc::new(self.clock.clone()) as Arc<dyn Clock>,
        ))
    }
}

async fn run_checked(
    rig: &Rig,
    target: Target,
    faults: Option<Box<dyn FaultInjector>>,
) -> (History, Verdict) {
    let history = run(&rig.workload, target, faults, None).await.unwrap();
    let verdict = check(&history);
    (history, verdict)
}

fn count(history: &History, kind: OpKind, outcome: fn(&Outcome) -> bool) -> usize {
    history
        .ops
        .iter()
        .filter(|op| op.kind == kind && outcome(&op.outcome))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_stack_is_clean_under_pauses_and_clock_steps() {
    let rig = rig(1);
    let stepper = ClockStepper::new(rig.clock.clone(), rig.workload.ttl, "memlease");
    let target = rig.target(vec![Arc::clone(&rig.leases)], Arc::clone(&rig.store));
    let (history, verdict) = run_checked(&rig, target, Some(Box::new(stepper))).await;
    assert!(verdict.is_clean(), "{verdict}");
    // The run exercised what the properties are about.
    assert!(
        verdict.faults.get("holder-pause").copied().unwrap_or(0) > 0,
        "{verdict}"
    );
    assert!(
        verdict.faults.get("clock-forward").copied().unwrap_or(0) > 0,
        "{verdict}"
    );
    assert!(count(&history, OpKind::Write, |o| *o == Outcome::Fenced) > 0);
    assert!(count(&history, OpKind::Renew, |o| *o == Outcome::Held) > 0);
    let tokens: std::collections::HashSet<_> = history
        .ops
        .iter()
        .filter_map(|op| match op.outcome {
            Outcome::Granted { token, .. } if op.kind == OpKind::Acquire => Some(token),
            _ => None,
        })
        .collect();
    assert!(tokens.len() > 20, "few takeovers: {}", tokens.len());
    let logged: usize = history.store_logs.values().map(Vec::len).sum();
    assert!(logged > 100, "{logged} writes landed");
    let svg = rig._dir.path().join("timeline.svg");
    write_svg(&history, &verdict, &svg).unwrap();
    assert!(std::fs::metadata(&svg).unwrap().len() > 1000);
}

fn assert_found(name: &str, verdict: &Verdict, property: Property) {
    assert!(verdict.count(property) > 0, "{name} not found:\n{verdict}");
    let within = verdict.ops_to_first_by[&property];
    assert!(within as u64 <= BUDGET, "{name}: {within} operations");
    println!("{name}: first {property} violation after {within} operations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_without_a_token_bump_is_found() {
    let rig = rig(2);
    let leases = rig.broken_lease(LeaseBreakage::NoTokenBump);
    let (_, verdict) =
        run_checked(&rig, rig.target(vec![leases], Arc::clone(&rig.store)), None).await;
    assert_found("no token bump", &verdict, Property::TokenOrder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_that_ignores_loss_is_found() {
    let rig = rig(3);
    let leases = rig.broken_lease(LeaseBreakage::RenewIgnoresLoss);
    let (_, verdict) =
        run_checked(&rig, rig.target(vec![leases], Arc::clone(&rig.store)), None).await;
    assert_found("renew ignores loss", &verdict, Property::TokenOrder);
    assert!(verdict.count(Property::SingleHolder) > 0, "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_another_owners_hold_is_found() {
    let rig = rig(4);
    let leases = rig.broken_lease(LeaseBreakage::ReleaseOthersHold);
    let (_, verdict) =
        run_checked(&rig, rig.target(vec![leases], Arc::clone(&rig.store)), None).await;
    assert_found(
        "release of another's hold",
        &verdict,
        Property::SingleHolder,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_fencing_is_found() {
    let rig = rig(5);
    let store = Arc::new(BrokenStore::new(
        Arc::clone(&rig.store),
        StoreBreakage::NoFence,
    ));
    let (_, verdict) =
        run_checked(&rig, rig.target(vec![Arc::clone(&rig.leases)], store), None).await;
    assert_found("store without fencing", &verdict, Property::StoreFencing);
    assert_eq!(verdict.count(Property::SingleHolder), 0, "{verdict}");
    assert_eq!(verdict.count(Property::TokenOrder), 0, "{verdict}");
}

/// Equal tokens from two owners reach a store only when something before
/// it failed: two lease authorities, or a takeover that kept the token.
/// Fed the twins of a lease that never bumps its token, the correct store
/// refuses every one; the broken store takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_accepting_an_equal_token_from_another_owner_is_found() {
    let control = rig(6);
    let leases = control.broken_lease(LeaseBreakage::NoTokenBump);
    let target = control.target(vec![leases], Arc::clone(&control.store));
    let (_, verdict) = run_checked(&control, target, None).await;
    assert_eq!(verdict.count(Property::StoreFencing), 0, "{verdict}");
    assert!(verdict.count(Property::TokenOrder) > 0, "{verdict}");

    let broken = rig(6);
    let leases = broken.broken_lease(LeaseBreakage::NoTokenBump);
    let store = Arc::new(BrokenStore::new(
        Arc::clone(&broken.store),
        StoreBreakage::EqualTokenFromOther,
    ));
    let (_, verdict) = run_checked(&broken, broken.target(vec![leases], store), None).await;
    assert_found(
        "equal token from another owner",
        &verdict,
        Property::StoreFencing,
    );
}
