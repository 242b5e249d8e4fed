//! Who may take leases: bearer tokens and client certificates on a real
//! server over memlease, the probes that stay open without credentials,
//! and the refusal to expose an unauthenticated server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use grpcdriver::{ClientTls, GrpcLease, LeaseServer, ServeError, ServerTls, pb};
use lease_port::{Clock, LeaseErrorKind, SessionLease, SystemClock};
use memlease::MemLease;
use test_services::pki::Pki;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Running, owner, session, wire_status};

const TTL: Duration = Duration::from_secs(30);
const TOKEN: &str = "s3cret-token";

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

async fn bearer_server(backend: &MemLease) -> Running {
    Running::start(Arc::new(backend.clone()), clock(), None, |s| {
        s.bearer_token(TOKEN)
    })
    .await
}

#[tokio::test]
async fn a_missing_or_wrong_bearer_token_is_refused_and_takes_nothing() {
    let backend = MemLease::new(TTL);
    let server = bearer_server(&backend).await;
    let chat = session("chat-auth");

    let anonymous = server.client(clock(), |b| b);
    let wrong = server.client(clock(), |b| b.bearer_token("guess"));
    for (who, client) in [("no token", &anonymous), ("a wrong token", &wrong)] {
        let e = client
            .acquire(&chat, &owner("intruder"))
            .await
            .expect_err(who);
        assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{who}: {e}");
        assert!(
            e.message().contains("refused the credentials"),
            "{who}: {e}"
        );
        let status = wire_status(&e).expect("the error keeps the status it came from");
        assert_eq!(status.code(), Code::Unauthenticated, "{who}");
        // Refused before the backend was asked: no lease exists.
        assert_eq!(backend.current(&chat).await.unwrap(), None, "{who}");
        assert_eq!(backend.live_count(), 0, "{who}");
        // Not only acquire: every lease call is guarded.
        let e = client.authority().await.expect_err(who);
        assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{who}: {e}");
    }

    let right = server.client(clock(), |b| b.bearer_token(TOKEN));
    let lease = right.acquire(&chat, &owner("rightful")).await.unwrap();
    assert_eq!(
        backend.current(&chat).await.unwrap().map(|l| l.token()),
        Some(lease.token())
    );
    // A refused caller cannot release what the rightful one holds.
    let e = anonymous.release(&lease).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid);
    assert!(backend.current(&chat).await.unwrap().is_some());
    right.release(&lease).await.unwrap();
}

struct MutualTls {
    ours: Pki,
    server: Running,
    backend: MemLease,
}

async fn mutual_tls_server() -> MutualTls {
    let ours = Pki::new("mecatl test CA");
    let cert = ours.issue("lease server");
    let backend = MemLease::new(TTL);
    let tls = ServerTls::new(cert.cert_pem, cert.key_pem).require_client_certs(ours.ca_pem.clone());
    let server = Running::start(Arc::new(backend.clone()), clock(), None, |s| s.tls(tls)).await;
    MutualTls {
        ours,
        server,
        backend,
    }
}

fn tls_client(server: &Running, tls: ClientTls) -> GrpcLease {
    // Short: a refused handshake is retried as UNAVAILABLE until the
    // deadline, and the test need not wait long for that.
    server.client(clock(), |b| {
        b.tls(tls).call_timeout(Duration::from_secs(3)).attempts(2)
    })
}

#[tokio::test]
async fn mutual_tls_admits_only_certificates_of_its_own_ca() {
    let MutualTls {
        ours,
        server,
        backend,
    } = mutual_tls_server().await;
    let chat = session("chat-mtls");

    let no_cert = tls_client(&server, ClientTls::new(ours.ca_pem.clone()));
    let rogue_ca = Pki::new("someone else's CA");
    let rogue_cert = rogue_ca.issue("rogue client");
    let rogue = tls_client(
        &server,
        ClientTls::new(ours.ca_pem.clone()).identity(rogue_cert.cert_pem, rogue_cert.key_pem),
    );
    for (who, client) in [
        ("no certificate", &no_cert),
        ("a foreign certificate", &rogue),
    ] {
        let e = client
            .acquire(&chat, &owner("intruder"))
            .await
            .expect_err(who);
        // The TLS handshake fails before any gRPC status exists, so the
        // client cannot tell it from a broken connection: it must never
        // read it as a lease answer.
        assert!(
            !matches!(e.kind(), LeaseErrorKind::Held | LeaseErrorKind::Unsupported),
            "{who}: {e}"
        );
        assert_eq!(backend.live_count(), 0, "{who}: nothing acquired");
    }

    let good_cert = ours.issue_client("good client", Some("spiffe://test/good"), &[]);
    let good = tls_client(
        &server,
        ClientTls::new(ours.ca_pem.clone()).identity(good_cert.cert_pem, good_cert.key_pem),
    );
    // Its certificate's name is its identity: it acts for the owners
    // under that name.
    let lease = good
        .acquire(&chat, &owner("spiffe://test/good/host-1"))
        .await
        .unwrap();
    assert_eq!(
        backend.current(&chat).await.unwrap().map(|l| l.token()),
        Some(lease.token())
    );
    good.release(&lease).await.unwrap();
    assert_eq!(backend.live_count(), 0);
}

#[tokio::test]
async fn a_client_refuses_a_server_its_ca_did_not_sign() {
    let MutualTls {
        ours,
        server,
        backend,
    } = mutual_tls_server().await;
    let stranger = Pki::new("a CA the client does not trust");
    let cert = ours.issue("client");
    let client = tls_client(
        &server,
        ClientTls::new(stranger.ca_pem).identity(cert.cert_pem, cert.key_pem),
    );
    let e = client
        .acquire(&session("chat-x"), &owner("a"))
        .await
        .unwrap_err();
    assert!(
        !matches!(e.kind(), LeaseErrorKind::Held | LeaseErrorKind::Unsupported),
        "{e}"
    );
    assert_eq!(backend.live_count(), 0);
}

async fn plain_channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

#[tokio::test]
async fn health_and_reflection_answer_without_credentials() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{FileDescriptorResponse, ServerReflectionRequest};

    let backend = MemLease::new(TTL);
    let server = bearer_server(&backend).await;
    let channel = plain_channel(server.addr).await;

    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: pb::SERVICE_NAME.to_owned(),
        })
        .await
        .expect("health answers without a token")
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);

    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let requests = tokio_stream::iter(vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            pb::SERVICE_NAME.to_owned(),
        )),
    ]);
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(requests)
        .await
        .expect("reflection answers without a token")
        .into_inner();
    let first = answers.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        panic!("expected a service list, got {first:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&pb::SERVICE_NAME), "{names:?}");
    let second = answers.next().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(FileDescriptorResponse {
        file_descriptor_proto,
    })) = second.message_response
    else {
        panic!("expected the contract's descriptor, got {second:?}");
    };
    assert!(!file_descriptor_proto.is_empty());

    // The lease service on the same channel still wants the token.
    let e = GrpcLease::connect(server.addr.to_string())
        .unwrap()
        .authority()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid);
}

#[test]
fn an_exposed_address_needs_authentication_or_explicit_consent() {
    let exposed: SocketAddr = "0.0.0.0:7447".parse().unwrap();
    let loopback: SocketAddr = "127.0.0.1:7447".parse().unwrap();
    let server = || LeaseServer::new(Arc::new(MemLease::new(TTL)));

    assert!(matches!(
        server().check_exposure(exposed),
        Err(ServeError::Unauthenticated(a)) if a == exposed
    ));
    server().check_exposure(loopback).expect("loopback is fine");
    server()
        .bearer_token("t")
        .check_exposure(exposed)
        .expect("a bearer token authenticates");
    let pki = Pki::new("ca");
    let cert = pki.issue("server");
    server()
        .tls(
            ServerTls::new(cert.cert_pem.clone(), cert.key_pem.clone())
                .require_client_certs(pki.ca_pem.clone()),
        )
        .check_exposure(exposed)
        .expect("client certificates authenticate");
    // Encryption alone says nothing about who calls.
    assert!(matches!(
        server()
            .tls(ServerTls::new(cert.cert_pem, cert.key_pem))
            .check_exposure(exposed),
        Err(ServeError::Unauthenticated(_))
    ));
    server()
        .allow_insecure(true)
        .check_exposure(exposed)
        .expect("explicitly allowed");
}

#[tokio::test]
async fn serving_on_an_exposed_address_without_authentication_fails_to_start() {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = LeaseServer::new(Arc::new(MemLease::new(TTL)))
        .serve(listener, std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(e, ServeError::Unauthenticated(_)), "{e}");
}
