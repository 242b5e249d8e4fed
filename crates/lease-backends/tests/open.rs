//! Each backend opens from its configuration, and each way it cannot is an
//! error of its own kind naming what to fix.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lease_backends::{DirLeases, OpenError, OpenErrorKind, open_memory};
use lease_port::{LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease, SystemClock};

const TTL: Duration = Duration::from_secs(15);

fn ids() -> (SessionId, OwnerId) {
    (SessionId::new("s").unwrap(), OwnerId::new("o").unwrap())
}

#[tokio::test]
async fn memory_and_a_directory_open_and_lease() {
    let (s, o) = ids();
    let memory = open_memory(TTL, Arc::new(SystemClock));
    let held = memory.acquire(&s, &o).await.unwrap();
    memory.release(&held).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let dir = DirLeases {
        dir: tmp.path().join("leases"),
        allow_volatile: false,
    };
    let files = dir.open(TTL, Arc::new(SystemClock)).unwrap();
    assert!(!files.is_volatile());
    let held = files.acquire(&s, &o).await.unwrap();
    files.release(&held).await.unwrap();
}

#[test]
fn a_volatile_directory_is_refused_unless_allowed() {
    let shm = Path::new("/dev/shm");
    assert!(shm.is_dir(), "this test needs /dev/shm (tmpfs)");
    let tmp = tempfile::tempdir_in(shm).unwrap();
    let mut dir = DirLeases {
        dir: tmp.path().join("leases"),
        allow_volatile: false,
    };
    let refused = dir.open(TTL, Arc::new(SystemClock)).unwrap_err();
    assert_eq!(refused.kind(), OpenErrorKind::VolatileDir, "{refused}");
    assert_eq!(refused.path(), Some(dir.dir.as_path()));
    assert!(
        refused.backend().starts_with("file leases in "),
        "{refused}"
    );
    dir.allow_volatile = true;
    assert!(dir.open(TTL, Arc::new(SystemClock)).unwrap().is_volatile());
}

#[test]
fn a_directory_that_is_a_file_is_the_backends_refusal() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let dir = DirLeases {
        dir: file,
        allow_volatile: false,
    };
    let e = dir.open(TTL, Arc::new(SystemClock)).unwrap_err();
    assert_eq!(e.kind(), OpenErrorKind::Backend, "{e}");
    // What flocklease answered, kind and all.
    assert_eq!(as_lease_error(e).kind(), LeaseErrorKind::Transient);
}

/// A backend's own error converts to the `LeaseError` it was; a file error
/// becomes `Invalid`, its message still naming the file.
fn as_lease_error(e: OpenError) -> LeaseError {
    e.into()
}

#[cfg(feature = "etcd")]
mod etcd {
    use lease_backends::EtcdLeases;

    use super::*;

    /// etcd on a port nobody listens on (it is reached on first use only),
    /// over TLS with a CA in `dir`.
    fn config(dir: &Path) -> EtcdLeases {
        EtcdLeases {
            endpoints: vec!["http://127.0.0.1:1".into()],
            prefix: "/t/".into(),
            ca: Some(dir.join("ca.pem")),
            identity: None,
            user: None,
        }
    }

    #[tokio::test]
    async fn a_missing_ca_names_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let e = config(tmp.path()).open(TTL).unwrap_err();
        assert_eq!(e.kind(), OpenErrorKind::File, "{e}");
        assert_eq!(e.path(), Some(tmp.path().join("ca.pem").as_path()));
        let text = e.to_string();
        assert!(
            text.starts_with("etcd at http://127.0.0.1:1: the etcd CA "),
            "{text}"
        );
        let lease = as_lease_error(e);
        assert_eq!(lease.kind(), LeaseErrorKind::Invalid);
        assert!(lease.to_string().contains("ca.pem"), "{lease}");
    }

    /// The password is read by etcdlease's rule: two trailing newlines are
    /// the line ending, an empty file is refused naming it.
    #[tokio::test]
    async fn the_password_file_follows_the_one_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let password = tmp.path().join("password");
        let mut etcd = config(tmp.path());
        etcd.ca = None;
        etcd.user = Some(("app".into(), password.clone()));
        std::fs::write(&password, "s3cret\n\n").unwrap();
        etcd.open(TTL).expect("two newlines end one password");
        std::fs::write(&password, "\n\n").unwrap();
        let e = etcd.open(TTL).unwrap_err();
        assert_eq!(e.kind(), OpenErrorKind::File, "{e}");
        assert_eq!(e.path(), Some(password.as_path()));
        assert!(e.to_string().contains("holds no password"), "{e}");
    }

    #[tokio::test]
    async fn a_configuration_etcd_refuses_is_the_backends_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut etcd = config(tmp.path());
        etcd.ca = None;
        // etcd counts whole seconds.
        let e = etcd.open(Duration::from_millis(1500)).unwrap_err();
        assert_eq!(e.kind(), OpenErrorKind::Backend, "{e}");
        assert_eq!(as_lease_error(e).kind(), LeaseErrorKind::Invalid);
    }
}

#[cfg(feature = "grpc")]
mod service {
    use lease_backends::LeaseService;

    use super::*;

    fn service() -> LeaseService {
        LeaseService {
            address: "127.0.0.1:1".into(),
            token_file: None,
            ca: None,
            identity: None,
            tls_domain: None,
            plaintext_token: false,
        }
    }

    #[tokio::test]
    async fn the_token_and_tls_files_are_read_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let token = tmp.path().join("token");
        std::fs::write(&token, "t0ken\n").unwrap();
        let with_token = LeaseService {
            token_file: Some(token.clone()),
            ..service()
        };
        with_token
            .open(TTL)
            .expect("a loopback service takes a token in plain text");
        std::fs::write(&token, "\n").unwrap();
        let e = with_token.open(TTL).unwrap_err();
        assert_eq!(e.kind(), OpenErrorKind::File, "{e}");
        assert_eq!(e.path(), Some(token.as_path()));

        let missing = tmp.path().join("ca.pem");
        let e = LeaseService {
            ca: Some(missing.clone()),
            ..service()
        }
        .open(TTL)
        .unwrap_err();
        assert_eq!(e.kind(), OpenErrorKind::File, "{e}");
        assert_eq!(e.path(), Some(missing.as_path()));
        assert!(e.backend().starts_with("the lease service at "), "{e}");
    }
}

#[cfg(feature = "k8s")]
#[tokio::test]
async fn a_kubeconfig_that_cannot_be_read_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("kubeconfig");
    let k8s = lease_backends::K8sLeases {
        namespace: "ns".into(),
        kubeconfig: Some(path.clone()),
    };
    let e = k8s.open(TTL).await.unwrap_err();
    assert_eq!(e.kind(), OpenErrorKind::File, "{e}");
    assert_eq!(e.path(), Some(path.as_path()));
    assert_eq!(k8s.describe(), "Kubernetes leases in namespace ns");
}
