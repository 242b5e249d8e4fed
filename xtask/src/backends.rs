//! The backend table: every crate that implements `SessionLease`, the
//! conformance test targets that prove it, and the real services those tests
//! start. Adding a backend means adding a row here; the tidy test fails until
//! the row exists.

use crate::services::Service;

/// One lease backend of the workspace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backend {
    /// The crate's package name (usually also its directory under `crates/`).
    pub(crate) name: &'static str,
    /// Services its tests start for themselves (they need the binaries).
    pub(crate) services: &'static [Service],
}

/// Every backend crate. Conformance targets are the crate's
/// `tests/conformance*.rs` files.
pub(crate) const BACKENDS: &[Backend] = &[
    Backend {
        name: "memlease",
        services: &[],
    },
    Backend {
        name: "flocklease",
        services: &[],
    },
    Backend {
        name: "grpcdriver",
        services: &[],
    },
    // Tested against the in-process Kubernetes API emulator; a real
    // cluster is opt-in (`conformance --kubeconfig`).
    Backend {
        name: "k8slease",
        services: &[],
    },
    Backend {
        name: "etcdlease",
        services: &[Service::Etcd],
    },
    Backend {
        name: "redis-session-store",
        services: &[Service::Redis],
    },
    // Directly and through PgBouncer in transaction pooling mode.
    Backend {
        name: "pglease",
        services: &[Service::Postgres, Service::PgBouncer],
    },
];

/// Crates other than backends whose tests start services of their own.
pub(crate) const OTHER_SERVICE_USERS: &[(&str, &[Service])] = &[
    (
        "test-services",
        &[
            Service::Redis,
            Service::Etcd,
            Service::Iproute2,
            Service::Postgres,
            Service::PgBouncer,
        ],
    ),
    ("mecatl-leased", &[Service::Etcd]),
    // A seed's run, replayed with the clocks of a far slower machine.
    ("lease-sim", &[Service::Faketime]),
    // A store, not a lease backend: directly and through PgBouncer.
    ("pg-session-store", &[Service::Postgres, Service::PgBouncer]),
    // The connection settings both PostgreSQL crates share, TLS included.
    ("pg-connect", &[Service::Postgres]),
    (
        "mecated",
        &[
            Service::Etcd,
            Service::Redis,
            Service::Postgres,
            Service::PgBouncer,
            Service::Chromium,
            Service::Iproute2,
        ],
    ),
];

pub(crate) fn find(name: &str) -> Option<&'static Backend> {
    BACKENDS.iter().find(|b| b.name == name)
}

pub(crate) fn names() -> Vec<&'static str> {
    BACKENDS.iter().map(|b| b.name).collect()
}

/// Every service any workspace test starts, each once.
pub(crate) fn all_services() -> Vec<Service> {
    let mut all: Vec<Service> = BACKENDS
        .iter()
        .flat_map(|b| b.services.iter().copied())
        .chain(
            OTHER_SERVICE_USERS
                .iter()
                .flat_map(|(_, s)| s.iter().copied()),
        )
        .collect();
    all.sort();
    all.dedup();
    all
}
