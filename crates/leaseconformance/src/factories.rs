//! Ready-made factories, so a backend's conformance test is a constructor
//! and a line: [`ManualClockFactory`] for backends that read an injected
//! clock, [`RealTimeFactory`] for backends whose time is real (a network
//! service's own clock).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lease_port::{Clock, ManualClock, SessionLease};

use crate::{Capabilities, LeaseFactory, TimeControl};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type MakeClient<L> = Box<dyn Fn(Arc<dyn Clock>) -> BoxFuture<L> + Send + Sync>;
type Hook = Box<dyn Fn() -> BoxFuture<()> + Send + Sync>;

/// How a backend under test comes back after a restart.
enum Restart {
    /// It cannot: the restart cases are skipped.
    No,
    /// Its durable state is all the clients see (files, a database): new
    /// clients over the same state are a restarted process.
    NewClients,
    /// This hook restarts it (a service the factory started), keeping its
    /// durable state; the suite then makes new clients.
    Hook(Hook),
}

impl Restart {
    fn possible(&self) -> bool {
        !matches!(self, Restart::No)
    }

    async fn run(&self) {
        match self {
            Restart::No => panic!("restart asked of a backend that cannot restart"),
            Restart::NewClients => {}
            Restart::Hook(hook) => hook().await,
        }
    }
}

/// A factory over a backend that reads an injected clock: every client is
/// made by `make` with the factory's [`ManualClock`], and
/// [`advance`](LeaseFactory::advance) moves that clock instantly.
///
/// Whatever the clients share (a directory, a store) lives in `make`'s
/// captures, so it lives exactly as long as the factory:
///
/// ```
/// use std::time::Duration;
/// use leaseconformance::ManualClockFactory;
/// use memlease::MemLease;
///
/// const TTL: Duration = Duration::from_secs(10);
/// let factory = ManualClockFactory::shared(TTL, |clock| {
///     MemLease::builder().ttl(TTL).clock(clock).build()
/// });
/// # tokio::runtime::Runtime::new().unwrap().block_on(
/// #     leaseconformance::cases::takeover(&factory));
/// // tests/conformance.rs:
/// // leaseconformance::suite!(async { ManualClockFactory::shared(TTL, |clock| …) });
/// ```
pub struct ManualClockFactory<L> {
    clock: ManualClock,
    ttl: Duration,
    make: MakeClient<L>,
    restart: Restart,
}

impl<L: SessionLease + 'static> ManualClockFactory<L> {
    /// Clients are independent instances (as separate processes would be),
    /// each made by `make` over state it captures — e.g. one directory.
    pub fn new(ttl: Duration, make: impl Fn(Arc<dyn Clock>) -> L + Send + Sync + 'static) -> Self {
        Self::new_async(ttl, move |clock| std::future::ready(make(clock)))
    }

    /// As [`new`](Self::new), for clients that connect asynchronously.
    pub fn new_async<Fut>(
        ttl: Duration,
        make: impl Fn(Arc<dyn Clock>) -> Fut + Send + Sync + 'static,
    ) -> Self
    where
        Fut: Future<Output = L> + Send + 'static,
    {
        ManualClockFactory {
            clock: ManualClock::new(),
            ttl,
            make: Box::new(move |clock| Box::pin(make(clock))),
            restart: Restart::No,
        }
    }

    /// One backend instance, built once by `build`, handed to every client
    /// as a clone (for backends whose instance *is* the shared store, like
    /// an in-memory one).
    pub fn shared(ttl: Duration, build: impl FnOnce(Arc<dyn Clock>) -> L) -> Self
    where
        L: Clone + Send + Sync,
    {
        let clock = ManualClock::new();
        let store = build(Arc::new(clock.clone()));
        ManualClockFactory {
            clock,
            ttl,
            make: Box::new(move |_| Box::pin(std::future::ready(store.clone()))),
            restart: Restart::No,
        }
    }

    /// The backend's state is durable in what `make` captures: the restart
    /// cases drop every client and make new ones.
    pub fn restart_by_new_clients(mut self) -> Self {
        self.restart = Restart::NewClients;
        self
    }

    /// The restart cases call `hook`, which restarts the backend keeping its
    /// durable state, then make new clients.
    pub fn restart_with<Fut>(mut self, hook: impl Fn() -> Fut + Send + Sync + 'static) -> Self
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.restart = Restart::Hook(Box::new(move || Box::pin(hook())));
        self
    }

    /// The clock every client reads.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

impl<L> fmt::Debug for ManualClockFactory<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClockFactory")
            .field("now", &self.clock.now())
            .field("ttl", &self.ttl)
            .field("restartable", &self.restart.possible())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<L: SessionLease + 'static> LeaseFactory for ManualClockFactory<L> {
    type Lease = L;

    async fn client(&self) -> L {
        (self.make)(Arc::new(self.clock.clone())).await
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            time: TimeControl::Manual,
            restart: self.restart.possible(),
        }
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn restart(&self) {
        self.restart.run().await;
    }
}

/// A factory over a backend on real time: [`advance`](LeaseFactory::advance)
/// sleeps, so pick a short TTL (about a second).
///
/// ```
/// use std::time::Duration;
/// use leaseconformance::RealTimeFactory;
/// use memlease::MemLease;
///
/// const TTL: Duration = Duration::from_millis(800);
/// let store = MemLease::new(TTL);
/// let factory = RealTimeFactory::new(TTL, move || store.clone());
/// # tokio::runtime::Runtime::new().unwrap().block_on(
/// #     leaseconformance::cases::acquire_free(&factory));
/// ```
pub struct RealTimeFactory<L> {
    ttl: Duration,
    make: Box<dyn Fn() -> BoxFuture<L> + Send + Sync>,
    restart: Restart,
}

impl<L: SessionLease + 'static> RealTimeFactory<L> {
    /// Every client is made by `make` over the state it captures.
    pub fn new(ttl: Duration, make: impl Fn() -> L + Send + Sync + 'static) -> Self {
        Self::new_async(ttl, move || std::future::ready(make()))
    }

    /// As [`new`](Self::new), for clients that connect asynchronously.
    pub fn new_async<Fut>(ttl: Duration, make: impl Fn() -> Fut + Send + Sync + 'static) -> Self
    where
        Fut: Future<Output = L> + Send + 'static,
    {
        RealTimeFactory {
            ttl,
            make: Box::new(move || Box::pin(make())),
            restart: Restart::No,
        }
    }

    /// See [`ManualClockFactory::restart_by_new_clients`].
    pub fn restart_by_new_clients(mut self) -> Self {
        self.restart = Restart::NewClients;
        self
    }

    /// See [`ManualClockFactory::restart_with`].
    pub fn restart_with<Fut>(mut self, hook: impl Fn() -> Fut + Send + Sync + 'static) -> Self
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.restart = Restart::Hook(Box::new(move || Box::pin(hook())));
        self
    }
}

impl<L> fmt::Debug for RealTimeFactory<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealTimeFactory")
            .field("ttl", &self.ttl)
            .field("restartable", &self.restart.possible())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<L: SessionLease + 'static> LeaseFactory for RealTimeFactory<L> {
    type Lease = L;

    async fn client(&self) -> L {
        (self.make)().await
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            time: TimeControl::Real,
            restart: self.restart.possible(),
        }
    }

    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }

    async fn restart(&self) {
        self.restart.run().await;
    }
}
