//! Leases on an etcd cluster with authentication enabled: a user with
//! read-write permission on the prefix holds sessions; missing or wrong
//! credentials and a prefix outside the user's permission are
//! configuration errors, not passing faults; a token etcd no longer
//! honours (a member restart drops every simple token) is replaced without
//! the caller noticing.

use std::time::Duration;

use etcdlease::wire::EtcdClient;
use etcdlease::{Credentials, EtcdError, EtcdLease};
use lease_port::{LeaseError, LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::EtcdServer;

const TTL: Duration = Duration::from_secs(3);

/// Starts etcd with `root` and an `app` user allowed `/app/` only, then
/// turns authentication on.
async fn etcd_with_auth() -> EtcdServer {
    let etcd = EtcdServer::start().unwrap();
    let admin = EtcdClient::new(&[etcd.endpoint()], Duration::from_secs(5)).unwrap();
    admin.user_add("root", "root-password").await.unwrap();
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("app", "app-password").await.unwrap();
    admin.role_add("app").await.unwrap();
    admin.role_grant_prefix("app", b"/app/").await.unwrap();
    admin.user_grant_role("app", "app").await.unwrap();
    admin.auth_enable().await.unwrap();
    etcd
}

fn client(etcd: &EtcdServer, prefix: &str, credentials: Option<Credentials>) -> EtcdLease {
    let mut b = EtcdLease::builder([etcd.endpoint()])
        .prefix(prefix)
        .ttl(TTL)
        .request_timeout(Duration::from_secs(1));
    if let Some(c) = credentials {
        b = b.credentials(c);
    }
    b.build().unwrap()
}

fn app() -> Credentials {
    Credentials::new("app", "app-password")
}

fn etcd_source(e: &LeaseError) -> Option<&EtcdError> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<EtcdError>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permitted_user_holds_sessions_across_a_restart_that_voids_its_token() {
    let mut etcd = etcd_with_auth().await;
    let leases = client(&etcd, "/app/", Some(app()));
    let (s, me, other) = (
        SessionId::new("authed").unwrap(),
        OwnerId::new("me").unwrap(),
        OwnerId::new("other").unwrap(),
    );
    leases.authority().await.unwrap();
    let lease = leases.acquire(&s, &me).await.unwrap();
    let lease = leases.renew(&lease).await.unwrap();

    // A restarted member honours no token it issued before.
    etcd.restart().unwrap();
    let renewed = loop {
        match leases.renew(&lease).await {
            Ok(renewed) => break renewed,
            // The first call after the restart may meet the member still
            // starting; a refused token must never surface.
            Err(e) if e.kind() == LeaseErrorKind::Transient => {
                assert!(
                    !matches!(etcd_source(&e), Some(EtcdError::Rpc { status, .. })
                        if status.code() == tonic::Code::Unauthenticated),
                    "a stale token surfaced: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("renew after the restart: {e:?}"),
        }
    };
    assert_eq!(renewed.token(), lease.token());
    let held = client(&etcd, "/app/", Some(app()))
        .acquire(&s, &other)
        .await
        .unwrap_err();
    assert_eq!(held.holder(), Some(&me), "{held:?}");
    leases.release(&renewed).await.unwrap();
    let next = client(&etcd, "/app/", Some(app()))
        .acquire(&s, &other)
        .await
        .unwrap();
    assert!(next.token() > renewed.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_credentials_and_foreign_prefixes_are_configuration_errors() {
    let etcd = etcd_with_auth().await;
    let (s, me) = (
        SessionId::new("refused").unwrap(),
        OwnerId::new("me").unwrap(),
    );

    let anonymous = client(&etcd, "/app/", None).acquire(&s, &me).await;
    let e = anonymous.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e:?}");

    let wrong = client(&etcd, "/app/", Some(Credentials::new("app", "nope")))
        .acquire(&s, &me)
        .await
        .unwrap_err();
    assert_eq!(wrong.kind(), LeaseErrorKind::Invalid, "{wrong:?}");
    assert!(
        matches!(etcd_source(&wrong), Some(EtcdError::Auth { user, .. }) if user == "app"),
        "{wrong:?}"
    );
    assert!(
        !format!("{wrong:?} {wrong}").contains("nope"),
        "the password leaked into the error"
    );

    let foreign = client(&etcd, "/not-app/", Some(app()))
        .acquire(&s, &me)
        .await
        .unwrap_err();
    assert_eq!(foreign.kind(), LeaseErrorKind::Invalid, "{foreign:?}");
}
