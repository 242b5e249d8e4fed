//! The suite must catch broken backends: each flaw below is a bug a real
//! backend could plausibly have, and at least the named case must fail on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, ManualClock, OwnerId, SessionId,
    SessionLease,
};
use leaseconformance::{Capabilities, LeaseFactory, TimeControl, check_all};

const TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// None: the reference backend, which must pass everything.
    None,
    /// No flaw either: the backend does not report holders (`current` is
    /// optional and answers `Unsupported`), which must pass everything too.
    NoHolderReports,
    /// A takeover reuses the previous holder's token.
    NoTokenBumpOnTakeover,
    /// Release removes whatever hold the session has.
    ReleaseIgnoresOwner,
    /// Release checks the owner but not the token.
    ReleaseIgnoresToken,
    /// Renew by a former holder overwrites whoever took over.
    RenewResurrects,
    /// An expired lease still blocks other owners.
    AcquireIgnoresExpiry,
    /// The token counter is dropped with the record on release.
    TokenResetAfterRelease,
    /// Session ids are folded to lower case before use.
    CaseFoldedIds,
    /// Renew returns success but does not move the expiry.
    RenewKeepsExpiry,
    /// Acquire reads, yields, then writes: two racers can both win.
    CheckThenAct,
    /// Renewal of a released lease brings it back.
    RenewAfterRelease,
    /// Each client names an authority of its own, so a store cannot tell
    /// whether two clients' tokens are comparable.
    AuthorityPerClient,
    /// Batch renewal answers in the order the leases were acquired, not
    /// the order they were given.
    BatchOutOfOrder,
    /// Batch renewal fails every lease when one of them is lost.
    BatchAllOrNothing,
    /// The holder report still shows a lease after its release.
    CurrentIgnoresRelease,
    /// An acquire above a floor is a plain acquire (the floor dropped on
    /// the way, as by a server too old to know it).
    FloorIgnored,
    /// The grant is above the floor, but the token record is not raised:
    /// the next takeover goes back below it.
    FloorForgotten,
    /// Any floor is taken, however close to the end of the tokens.
    FloorUnbounded,
}

#[derive(Debug, Clone)]
struct Rec {
    owner: OwnerId,
    token: u64,
    expiry: SystemTime,
    released: bool,
}

#[derive(Clone)]
struct Broken {
    /// Which client of the factory this is.
    client: u64,
    flaw: Flaw,
    clock: ManualClock,
    table: Arc<Mutex<HashMap<String, Rec>>>,
}

impl Broken {
    fn key(&self, s: &SessionId) -> String {
        if self.flaw == Flaw::CaseFoldedIds {
            s.as_str().to_lowercase()
        } else {
            s.as_str().to_owned()
        }
    }

    fn live(&self, r: &Rec, now: SystemTime) -> bool {
        !r.released && (now < r.expiry || self.flaw == Flaw::AcquireIgnoresExpiry)
    }
}

#[async_trait]
impl SessionLease for Broken {
    async fn acquire(&self, s: &SessionId, o: &OwnerId) -> Result<Lease, LeaseError> {
        let key = self.key(s);
        let now = self.clock.now();
        let expiry = now + TTL;
        let check = |r: &Option<Rec>| match r {
            Some(r) if self.live(r, now) && r.owner != *o => {
                Err(LeaseError::held(Some(r.owner.clone())))
            }
            _ => Ok(()),
        };
        let write = |table: &mut HashMap<String, Rec>, current: &Option<Rec>| {
            let token = match current {
                Some(r) if self.live(r, now) && r.owner == *o => r.token,
                Some(r) if self.flaw == Flaw::NoTokenBumpOnTakeover => r.token,
                Some(r) => r.token + 1,
                None => 1,
            };
            let rec = Rec {
                owner: o.clone(),
                token,
                expiry,
                released: false,
            };
            table.insert(key.clone(), rec);
            Lease::new(s.clone(), o.clone(), FencingToken::new(token), expiry)
        };
        let seen = {
            let mut table = self.table.lock().unwrap();
            let current = table.get(&key).cloned();
            check(&current)?;
            if self.flaw != Flaw::CheckThenAct {
                return Ok(write(&mut table, &current));
            }
            current
        };
        // The flaw: decide on what was read, let others run, then write.
        tokio::task::yield_now().await;
        Ok(write(&mut self.table.lock().unwrap(), &seen))
    }

    async fn acquire_above(
        &self,
        s: &SessionId,
        o: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        if self.flaw != Flaw::FloorUnbounded {
            floor.check_floor()?;
        }
        let lease = self.acquire(s, o).await?;
        if lease.token() > floor || self.flaw == Flaw::FloorIgnored {
            return Ok(lease);
        }
        let token = floor.get() + 1;
        if self.flaw != Flaw::FloorForgotten
            && let Some(r) = self.table.lock().unwrap().get_mut(&self.key(s))
        {
            r.token = token;
        }
        Ok(Lease::new(
            s.clone(),
            o.clone(),
            FencingToken::new(token),
            lease.expiry(),
        ))
    }

    async fn renew(&self, l: &Lease) -> Result<Lease, LeaseError> {
        let key = self.key(l.session_id());
        let now = self.clock.now();
        let mut table = self.table.lock().unwrap();
        let Some(r) = table.get_mut(&key) else {
            return Err(LeaseError::held(None));
        };
        let ours = r.owner == *l.owner() && r.token == l.token().get();
        let ok = match self.flaw {
            Flaw::RenewResurrects => true,
            Flaw::RenewAfterRelease => ours,
            _ => ours && !r.released,
        };
        if !ok {
            return Err(LeaseError::held(self.live(r, now).then(|| r.owner.clone())));
        }
        if self.flaw == Flaw::RenewResurrects {
            r.owner = l.owner().clone();
            r.token = l.token().get();
        }
        r.released = false;
        if self.flaw != Flaw::RenewKeepsExpiry {
            r.expiry = now + TTL;
        }
        Ok(l.with_expiry(r.expiry))
    }

    async fn release(&self, l: &Lease) -> Result<(), LeaseError> {
        let key = self.key(l.session_id());
        let mut table = self.table.lock().unwrap();
        let Some(r) = table.get_mut(&key) else {
            return Ok(());
        };
        let matches = match self.flaw {
            Flaw::ReleaseIgnoresOwner => true,
            Flaw::ReleaseIgnoresToken => r.owner == *l.owner(),
            _ => r.owner == *l.owner() && r.token == l.token().get(),
        };
        if matches {
            if self.flaw == Flaw::TokenResetAfterRelease {
                table.remove(&key);
            } else {
                r.released = true;
            }
        }
        Ok(())
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        let id = match self.flaw {
            Flaw::AuthorityPerClient => format!("broken:{}", self.client),
            _ => "broken".to_owned(),
        };
        AuthorityId::new(id)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        let mut order: Vec<&Lease> = leases.iter().collect();
        if self.flaw == Flaw::BatchOutOfOrder {
            order.sort_by(|x, y| x.session_id().as_str().cmp(y.session_id().as_str()));
        }
        let mut out = Vec::with_capacity(leases.len());
        for lease in order {
            out.push(self.renew(lease).await);
        }
        if self.flaw == Flaw::BatchAllOrNothing && out.iter().any(Result::is_err) {
            return leases.iter().map(|_| Err(LeaseError::held(None))).collect();
        }
        out
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    async fn current(&self, s: &SessionId) -> Result<Option<Lease>, LeaseError> {
        if self.flaw == Flaw::NoHolderReports {
            return Err(LeaseError::unsupported("this backend reports no holders"));
        }
        let now = self.clock.now();
        let table = self.table.lock().unwrap();
        let shown = table.get(&self.key(s)).filter(|r| {
            let released = r.released && self.flaw != Flaw::CurrentIgnoresRelease;
            !released && now < r.expiry
        });
        Ok(shown.map(|r| {
            Lease::new(
                s.clone(),
                r.owner.clone(),
                FencingToken::new(r.token),
                r.expiry,
            )
        }))
    }
}

struct Factory(Broken, AtomicU64);

#[async_trait]
impl LeaseFactory for Factory {
    type Lease = Broken;
    async fn client(&self) -> Broken {
        Broken {
            client: self.1.fetch_add(1, Ordering::Relaxed),
            ..self.0.clone()
        }
    }
    fn ttl(&self) -> Duration {
        TTL
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            time: TimeControl::Manual,
            restart: false,
        }
    }
    fn now(&self) -> SystemTime {
        self.0.clock.now()
    }
    async fn advance(&self, by: Duration) {
        self.0.clock.advance(by);
    }
}

async fn failing_cases(flaw: Flaw) -> Vec<&'static str> {
    let report = check_all(move || async move {
        Factory(
            Broken {
                client: 0,
                flaw,
                clock: ManualClock::new(),
                table: Arc::default(),
            },
            AtomicU64::new(0),
        )
    })
    .await;
    report
        .iter()
        .filter(|c| !c.passed())
        .map(|c| c.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_backend_passes_everything() {
    assert_eq!(failing_cases(Flaw::None).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_holder_reports_passes_everything() {
    assert_eq!(
        failing_cases(Flaw::NoHolderReports).await,
        Vec::<&str>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flaw_is_caught_by_the_case_made_for_it() {
    let expectations = [
        (Flaw::NoTokenBumpOnTakeover, "expiry"),
        (Flaw::ReleaseIgnoresOwner, "release_idempotent"),
        (Flaw::ReleaseIgnoresToken, "release_idempotent"),
        (Flaw::RenewResurrects, "renew_after_loss"),
        (Flaw::AcquireIgnoresExpiry, "expiry"),
        (Flaw::TokenResetAfterRelease, "release_frees"),
        (Flaw::CaseFoldedIds, "session_isolation"),
        (Flaw::RenewKeepsExpiry, "renew_extends"),
        (Flaw::CheckThenAct, "concurrent_race"),
        (Flaw::RenewAfterRelease, "renew_after_loss"),
        (Flaw::AuthorityPerClient, "authority_stable"),
        (Flaw::BatchOutOfOrder, "renew_many"),
        (Flaw::BatchAllOrNothing, "renew_many"),
        (
            Flaw::CurrentIgnoresRelease,
            "current_reports_the_live_holder",
        ),
        (Flaw::FloorIgnored, "acquire_above_floor"),
        (Flaw::FloorForgotten, "acquire_above_floor"),
        (Flaw::FloorUnbounded, "acquire_above_floor"),
    ];
    let mut missed = Vec::new();
    for (flaw, case) in expectations {
        let failing = failing_cases(flaw).await;
        println!("{flaw:?} caught by {failing:?}");
        if !failing.contains(&case) {
            missed.push((flaw, case, failing));
        }
    }
    assert!(
        missed.is_empty(),
        "flaws not caught where expected: {missed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_check_alone_catches_every_sequential_flaw() {
    let mut missed = Vec::new();
    for flaw in [
        Flaw::NoTokenBumpOnTakeover,
        Flaw::ReleaseIgnoresOwner,
        Flaw::ReleaseIgnoresToken,
        Flaw::RenewResurrects,
        Flaw::AcquireIgnoresExpiry,
        Flaw::TokenResetAfterRelease,
        Flaw::RenewAfterRelease,
    ] {
        if !failing_cases(flaw).await.contains(&"model_check") {
            missed.push(flaw);
        }
    }
    assert!(missed.is_empty(), "model check missed {missed:?}");
}
