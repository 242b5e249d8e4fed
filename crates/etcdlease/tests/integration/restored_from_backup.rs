//! An etcd member whose data is put back to an older copy under running
//! clients (a restore from a backup or snapshot): same cluster, same
//! member, but its revisions start again from where the copy was taken, so
//! the tokens it hands out repeat ones issued before. A client that saw a
//! newer revision refuses every such answer as
//! [`Rewound`](LeaseErrorKind::Rewound), never as a passing fault to retry
//! and never as a lease; a client started afresh goes on with the older
//! state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcdlease::{EtcdError, EtcdLease};
use lease_port::{LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

fn client(etcd: &EtcdServer) -> EtcdLease {
    EtcdLease::builder([etcd.endpoint()])
        .prefix("/restored/")
        .ttl(Duration::from_secs(3))
        .request_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// The data directory of the running member serving `etcd`, found from its
/// process's command line (`--listen-client-urls`) and working directory.
fn data_dir(etcd: &EtcdServer) -> PathBuf {
    let endpoint = etcd.endpoint();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let serves = args
            .windows(2)
            .any(|w| w[0] == b"--listen-client-urls" && w[1] == endpoint.as_bytes());
        if serves && let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) {
            return cwd.join("data");
        }
    }
    panic!("no etcd process serves {endpoint}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn etcd_source(e: &LeaseError) -> Option<&EtcdError> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<EtcdError>())
}

fn assert_rewound(e: &LeaseError) {
    assert_eq!(e.kind(), LeaseErrorKind::Rewound, "{e:?}");
    assert!(!e.is_retryable(), "{e:?}");
    assert!(
        matches!(etcd_source(e), Some(EtcdError::Rewound { .. })),
        "{e:?}"
    );
    assert!(
        e.message().contains("restore the newer data"),
        "the message says what to do: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restored_from_an_older_copy_is_refused_as_rewound() {
    let mut etcd = EtcdServer::start().unwrap();
    let (alice, bob) = (OwnerId::new("alice").unwrap(), OwnerId::new("bob").unwrap());
    let s = SessionId::new("s").unwrap();

    // The backup: a copy of the member's data, taken while it is down.
    let data = data_dir(&etcd);
    let backup = data.with_file_name("data-backup");
    etcd.kill();
    copy_dir(&data, &backup);
    etcd.restart().unwrap();

    let running = client(&etcd);
    let mut lease = running.acquire(&s, &alice).await.unwrap();
    for _ in 0..5 {
        lease = running.renew(&lease).await.unwrap();
        running
            .acquire(&SessionId::new("other").unwrap(), &alice)
            .await
            .unwrap();
    }

    // Restored under the running client.
    let data = data_dir(&etcd);
    etcd.kill();
    std::fs::remove_dir_all(&data).unwrap();
    copy_dir(&backup, &data);
    etcd.restart().unwrap();

    for _ in 0..3 {
        assert_rewound(&running.renew(&lease).await.unwrap_err());
        assert_rewound(&running.acquire(&s, &bob).await.unwrap_err());
    }

    // A client started afresh goes on with the older state (alice's hold
    // is not in it).
    let fresh = client(&etcd);
    let again = fresh.acquire(&s, &bob).await.unwrap();
    fresh.renew(&again).await.unwrap();
}
