//! The lease service host: the real `grpcdriver` server over a `memlease`
//! table on the simulated clock, with every grant reported to the world.
//! The table lives outside the host, as a durable backend would, so a
//! restarted service serves the same leases.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use grpcdriver::LeaseServer;
use lease_port::{AuthorityId, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease};
use memlease::MemLease;

use crate::clock::SimClock;
use crate::net;
use crate::world::World;

/// The lease service's port.
pub(crate) const LEASE_PORT: u16 = 7878;

/// The simulated time as the calling host sees it.
pub(crate) fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The owner part of an owner or writer id (`p1#9f…` → `p1`).
pub(crate) fn owner_of(id: &str) -> &str {
    id.split('#').next().unwrap_or(id)
}

/// The backend as the service runs it, reporting every call to the world.
pub(crate) struct Observed {
    pub inner: Arc<dyn SessionLease>,
    pub world: Arc<World>,
}

impl Observed {
    fn granted(&self, session: &SessionId, answer: &Result<Lease, LeaseError>) {
        match answer {
            Ok(lease) => self.world.granted(
                now(),
                lease.session_id().as_str(),
                lease.token().get(),
                owner_of(lease.owner().as_str()),
            ),
            Err(e) => self.world.refused(
                now(),
                session.as_str(),
                &format!("acquire ({:?})", e.kind()),
            ),
        }
    }

    fn renewed(&self, asked: &Lease, answer: &Result<Lease, LeaseError>) {
        let session = asked.session_id().as_str();
        match answer {
            Ok(lease) => self.world.renewed(now(), session, lease.token().get()),
            Err(e) => self.world.refused(
                now(),
                session,
                &format!("renew of token {} ({:?})", asked.token().get(), e.kind()),
            ),
        }
    }
}

#[async_trait]
impl SessionLease for Observed {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        let answer = self.inner.acquire(session, owner).await;
        self.granted(session, &answer);
        answer
    }

    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        let answer = self.inner.acquire_above(session, owner, floor).await;
        self.granted(session, &answer);
        answer
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let answer = self.inner.renew(lease).await;
        self.renewed(lease, &answer);
        answer
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        let answers = self.inner.renew_many(leases).await;
        for (lease, answer) in leases.iter().zip(&answers) {
            self.renewed(lease, answer);
        }
        answers
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.world
            .releasing(now(), lease.session_id().as_str(), lease.token().get());
        self.inner.release(lease).await
    }

    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        self.world.read();
        self.inner.current(session).await
    }

    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.inner.authority().await
    }

    fn renews_in_batches(&self) -> bool {
        self.inner.renews_in_batches()
    }

    fn granted_ttl(&self) -> Option<Duration> {
        self.inner.granted_ttl()
    }
}

/// The holder of `session` in the table right now, by the authority's own
/// clock: its token and owner.
pub(crate) fn holder(table: &MemLease, session: &SessionId) -> Option<(u64, String)> {
    // The table answers without waiting: a lock and a read.
    let lease = table.current(session).now_or_never()?.ok()??;
    Some((
        lease.token().get(),
        owner_of(lease.owner().as_str()).to_owned(),
    ))
}

/// Serves `backend` as the lease service until the host is crashed.
pub(crate) async fn serve(
    backend: Arc<dyn SessionLease>,
    clock: SimClock,
    ttl: Duration,
) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", LEASE_PORT)).await?;
    LeaseServer::new(backend)
        .clock(Arc::new(clock))
        .ttl(ttl)
        .serve_with_incoming(net::incoming(listener), std::future::pending())
        .await?;
    Ok(())
}
