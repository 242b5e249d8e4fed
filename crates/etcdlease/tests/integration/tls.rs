//! Leases over TLS to a real etcd member: a client that trusts the
//! member's CA holds sessions, through a restart of the member too; a
//! client that does not trust it, or (with client certificates demanded)
//! presents none or a foreign one, gets an error and holds nothing.

#![cfg(feature = "tls")]

use std::time::Duration;

use etcdlease::{EtcdLease, TlsOptions};
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};
use test_services::pki::Pki;
use test_services::{EtcdServer, EtcdTls};

const TTL: Duration = Duration::from_secs(3);

fn client(etcd: &EtcdServer, tls: TlsOptions) -> EtcdLease {
    EtcdLease::builder([etcd.endpoint()])
        .prefix("/tls/")
        .ttl(TTL)
        .request_timeout(Duration::from_secs(1))
        .tls(tls)
        .build()
        .expect("an https endpoint with TLS options builds")
}

fn ids(session: &str) -> (SessionId, OwnerId) {
    (
        SessionId::new(session).unwrap(),
        OwnerId::new("me").unwrap(),
    )
}

/// A failed handshake is no lease answer: never `Held`, never a grant.
fn assert_refused(who: &str, e: &lease_port::LeaseError) {
    assert!(
        !matches!(e.kind(), LeaseErrorKind::Held | LeaseErrorKind::Unsupported),
        "{who}: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_members_ca_holds_sessions_across_a_restart() {
    let ca = Pki::new("etcd test CA");
    let server = ca.issue("etcd");
    let mut etcd = EtcdServer::start_tls(EtcdTls {
        cert_pem: server.cert_pem,
        key_pem: server.key_pem,
        client_ca_pem: None,
    })
    .expect("etcd starts with TLS");
    assert!(
        etcd.endpoint().starts_with("https://"),
        "{}",
        etcd.endpoint()
    );
    let leases = client(
        &etcd,
        TlsOptions::default().ca_certificate_pem(ca.ca_pem.clone()),
    );
    let (s, me) = ids("over-tls");

    let first = leases.acquire(&s, &me).await.expect("acquire over TLS");
    let renewed = leases.renew(&first).await.expect("renew over TLS");
    assert_eq!(renewed.token(), first.token());
    leases.release(&renewed).await.expect("release over TLS");

    etcd.restart().expect("the TLS member restarts");
    // The restart broke the client's connection: the first calls may meet
    // it and fail as passing faults, then a new handshake succeeds.
    let mut attempts = 0;
    let again = loop {
        match leases.acquire(&s, &me).await {
            Ok(lease) => break lease,
            Err(e) if e.kind() == LeaseErrorKind::Transient && attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("acquire over TLS after the member restarted: {e:?}"),
        }
    };
    assert!(again.token() > first.token(), "{again:?} after {first:?}");
    assert_eq!(
        leases.current(&s).await.unwrap().map(|l| l.token()),
        Some(again.token())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_signed_by_another_ca_is_refused() {
    let theirs = Pki::new("the member's CA");
    let server = theirs.issue("etcd");
    let etcd = EtcdServer::start_tls(EtcdTls {
        cert_pem: server.cert_pem,
        key_pem: server.key_pem,
        client_ca_pem: None,
    })
    .expect("etcd starts with TLS");
    let ours = Pki::new("a CA the member's certificate does not chain to");
    let leases = client(&etcd, TlsOptions::default().ca_certificate_pem(ours.ca_pem));
    let (s, me) = ids("stranger");
    let e = leases
        .acquire(&s, &me)
        .await
        .expect_err("an untrusted member");
    assert_refused("untrusted member", &e);

    // The same member, trusted, shows nothing was granted.
    let trusting = client(
        &etcd,
        TlsOptions::default().ca_certificate_pem(theirs.ca_pem),
    );
    assert_eq!(trusting.current(&s).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_certificates_demanded_only_its_cas_clients_hold_sessions() {
    let ca = Pki::new("etcd test CA");
    let server = ca.issue("etcd");
    let etcd = EtcdServer::start_tls(EtcdTls {
        cert_pem: server.cert_pem,
        key_pem: server.key_pem,
        client_ca_pem: Some(ca.ca_pem.clone()),
    })
    .expect("etcd starts with mutual TLS");
    let trust = || TlsOptions::default().ca_certificate_pem(ca.ca_pem.clone());
    let (s, me) = ids("mutual");

    let rogue = Pki::new("someone else's CA").issue("rogue");
    for (who, tls) in [
        ("no certificate", trust()),
        (
            "a foreign certificate",
            trust().client_identity_pem(rogue.cert_pem.clone(), rogue.key_pem.clone()),
        ),
    ] {
        let e = client(&etcd, tls).acquire(&s, &me).await.expect_err(who);
        assert_refused(who, &e);
    }

    let mine = ca.issue("mecatl client");
    let leases = client(
        &etcd,
        trust().client_identity_pem(mine.cert_pem, mine.key_pem),
    );
    assert_eq!(
        leases.current(&s).await.unwrap(),
        None,
        "nothing granted to the refused"
    );
    let lease = leases
        .acquire(&s, &me)
        .await
        .expect("acquire with our certificate");
    assert_eq!(
        leases.current(&s).await.unwrap().map(|l| l.token()),
        Some(lease.token())
    );
    leases.release(&lease).await.unwrap();
}
