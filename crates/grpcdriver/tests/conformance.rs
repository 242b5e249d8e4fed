//! The lease contract through a real tonic server on loopback: every
//! client is its own `GrpcLease` (its own connection), the backend lives
//! behind the server. Over memlease the server's backend and every client
//! read the factory's manual clock; over flocklease the server is also
//! restarted (a new backend over the same directory, on the same address)
//! for the restart cases, and clients reconnect by themselves.

mod support;

use std::sync::Arc;
use std::time::Duration;

use flocklease::FlockLease;
use grpcdriver::GrpcLease;
use lease_port::{Clock, SessionLease};
use leaseconformance::ManualClockFactory;
use memlease::MemLease;
use support::Running;
use tokio::sync::Mutex;

const TTL: Duration = Duration::from_secs(10);

type MakeBackend = Arc<dyn Fn(Arc<dyn Clock>) -> Arc<dyn SessionLease> + Send + Sync>;

/// The server behind a factory: started by the first client with the
/// factory's clock, restarted by the restart hook.
#[derive(Default)]
struct Slot {
    server: Option<Running>,
    clock: Option<Arc<dyn Clock>>,
}

fn factory(make_backend: MakeBackend, restartable: bool) -> ManualClockFactory<GrpcLease> {
    let slot = Arc::new(Mutex::new(Slot::default()));
    let (s, make) = (Arc::clone(&slot), Arc::clone(&make_backend));
    let factory = ManualClockFactory::new_async(TTL, move |clock: Arc<dyn Clock>| {
        let (slot, make) = (Arc::clone(&s), Arc::clone(&make));
        async move {
            let mut slot = slot.lock().await;
            if slot.server.is_none() {
                let backend = make(Arc::clone(&clock));
                slot.server = Some(Running::start(backend, Arc::clone(&clock), None, |s| s).await);
                slot.clock = Some(Arc::clone(&clock));
            }
            slot.server.as_ref().unwrap().client(clock, |b| b)
        }
    });
    if !restartable {
        return factory;
    }
    factory.restart_with(move || {
        let (slot, make) = (Arc::clone(&slot), Arc::clone(&make_backend));
        async move {
            let mut slot = slot.lock().await;
            let clock = slot.clock.clone().expect("started before a restart");
            let mut old = slot.server.take().expect("started before a restart");
            let addr = old.addr;
            old.stop().await.expect("the server stops cleanly");
            let backend = make(Arc::clone(&clock));
            slot.server = Some(Running::start(backend, clock, Some(addr), |s| s).await);
        }
    })
}

mod over_memlease {
    use super::*;

    fn memlease() -> ManualClockFactory<GrpcLease> {
        factory(
            Arc::new(|clock| Arc::new(MemLease::builder().ttl(TTL).clock(clock).build())),
            false,
        )
    }

    leaseconformance::suite!(async { memlease() });
}

mod over_flocklease {
    use super::*;

    fn flocklease() -> ManualClockFactory<GrpcLease> {
        let dir = Arc::new(tempfile::tempdir().expect("temporary directory"));
        factory(
            Arc::new(move |clock| {
                Arc::new(
                    FlockLease::builder(dir.path())
                        .ttl(TTL)
                        .clock(clock)
                        .open()
                        .expect("open the lease directory"),
                )
            }),
            true,
        )
    }

    leaseconformance::suite!(async { flocklease() });
}
