//! Who may act for whom: each credential acts only for its own owner ids,
//! on a real server over memlease. The first test is the theft this
//! guards against, step by step: a client that learned another's grant
//! through `Get` can neither release it nor take the session.

use std::sync::Arc;
use std::time::Duration;

use grpcdriver::{
    CallerInfo, ClientTls, GetAccess, GrpcLease, Identities, IdentityStore, ServerStats, ServerTls,
    hash_token,
};
use lease_port::{Clock, LeaseErrorKind, SessionLease, SystemClock};
use memlease::MemLease;
use test_services::pki::Pki;
use tonic::Code;

use crate::support::{Running, owner, session, wire_status};

const TTL: Duration = Duration::from_secs(30);

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// Two clients, `x` and `y`, each acting for the owners under its name,
/// and an operator's token acting for anyone.
fn identities() -> Identities {
    Identities::parse(&format!(
        "token x x/ {}\ntoken y y/ {}\ntoken ops * {}\n",
        hash_token("token-x"),
        hash_token("token-y"),
        hash_token("token-ops"),
    ))
    .unwrap()
}

async fn server_with(backend: &MemLease, store: IdentityStore, get: GetAccess) -> Running {
    counted_server(backend, store, get).await.0
}

/// The server and its counters.
async fn counted_server(
    backend: &MemLease,
    store: IdentityStore,
    get: GetAccess,
) -> (Running, Arc<ServerStats>) {
    let mut stats = None;
    let running = Running::start(Arc::new(backend.clone()), clock(), None, |s| {
        stats = Some(s.stats());
        s.identities(store).get_access(get)
    })
    .await;
    (running, stats.expect("configured"))
}

fn client(server: &Running, token: &str) -> GrpcLease {
    server.client(clock(), |b| b.bearer_token(token))
}

fn assert_not_permitted(e: &lease_port::LeaseError, what: &str) {
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{what}: {e}");
    let status = wire_status(e).unwrap_or_else(|| panic!("{what}: no status in {e}"));
    assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
    assert!(
        e.message().contains("does not let this client act"),
        "{what}: {e}"
    );
}

#[tokio::test]
async fn a_client_cannot_release_or_take_a_lease_of_another_clients_owner() {
    let backend = MemLease::new(TTL);
    let store = IdentityStore::new(identities());
    let (server, stats) = counted_server(&backend, store, GetAccess::Everyone).await;
    let (x, y) = (client(&server, "token-x"), client(&server, "token-y"));
    let chat = session("chat-theft");

    let held = y.acquire(&chat, &owner("y/host-1")).await.unwrap();

    // x asks for the session under y's owner id: refused, and it is not
    // handed y's token.
    let e = x.acquire(&chat, &owner("y/host-1")).await.unwrap_err();
    assert_not_permitted(&e, "acquire as y");

    // x reads y's grant (Get is open to every caller here)...
    let seen = x.current(&chat).await.unwrap().expect("y holds it");
    assert_eq!((seen.owner(), seen.token()), (held.owner(), held.token()));
    // ...and can neither release it nor renew it, alone or in a batch.
    let e = x.release(&seen).await.unwrap_err();
    assert_not_permitted(&e, "release y's grant");
    let e = x.renew(&seen).await.unwrap_err();
    assert_not_permitted(&e, "renew y's grant");
    let batch = x.renew_many(std::slice::from_ref(&seen)).await;
    assert_eq!(batch.len(), 1);
    let e = batch[0].as_ref().unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    assert!(e.message().contains("may not act for"), "{e}");

    // Under its own name, x meets y's live lease like anyone else.
    let e = x.acquire(&chat, &owner("x/host-2")).await.unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Held, "{e}");

    // y's lease was never touched: it renews under the same token.
    let renewed = y.renew(&held).await.unwrap();
    assert_eq!(renewed.token(), held.token());
    assert_eq!(
        backend.current(&chat).await.unwrap().map(|l| l.token()),
        Some(held.token())
    );

    // Calls and refusals are counted by client (KeepAlive: by batch).
    assert_eq!(stats.client_calls("x", "Acquire"), (2, 1));
    assert_eq!(stats.client_calls("x", "Release"), (1, 1));
    assert_eq!(stats.client_calls("x", "Renew"), (1, 1));
    assert_eq!(stats.client_calls("x", "KeepAlive"), (1, 1));
    assert_eq!(stats.client_calls("y", "Renew"), (1, 0));
    let text = stats.render_prometheus();
    assert!(
        text.contains("mecatl_lease_client_denied_total{client=\"x\",method=\"Release\"} 1"),
        "{text}"
    );

    y.release(&renewed).await.unwrap();
    assert_eq!(backend.current(&chat).await.unwrap(), None);
    assert_eq!(stats.client_calls("y", "Release"), (1, 0));
}

#[tokio::test]
async fn each_client_learns_its_name_and_owner_prefixes() {
    let backend = MemLease::new(TTL);
    let server = server_with(
        &backend,
        IdentityStore::new(identities()),
        GetAccess::Everyone,
    )
    .await;
    let x = client(&server, "token-x")
        .who_am_i()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        x,
        CallerInfo {
            client: "x".into(),
            owner_prefixes: vec!["x/".into()],
        }
    );
    let mine = x.owner_id("host-1/77").unwrap();
    assert_eq!(mine.as_str(), "x/host-1/77");
    assert!(x.admits(&mine));
    assert!(!x.admits(&owner("y/host-1/77")));
    // An owner id built this way is one the service accepts.
    let lease = client(&server, "token-x")
        .acquire(&session("chat-mine"), &mine)
        .await
        .unwrap();
    assert_eq!(lease.owner(), &mine);

    let ops = client(&server, "token-ops")
        .who_am_i()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ops.owner_prefixes, vec![String::new()]);
    assert!(ops.admits(&owner("anyone")));

    // No credential, a wrong one: nobody to be.
    for token in [None, Some("token-z")] {
        let c = server.client(clock(), |b| match token {
            Some(t) => b.bearer_token(t),
            None => b,
        });
        let e = c.who_am_i().await.unwrap_err();
        assert_eq!(
            wire_status(&e).map(tonic::Status::code),
            Some(Code::Unauthenticated),
            "{e}"
        );
    }
}

#[tokio::test]
async fn a_service_that_authenticates_nobody_or_shares_one_token_lets_anyone_be_anyone() {
    let open = Running::start(Arc::new(MemLease::new(TTL)), clock(), None, |s| s).await;
    let me = open
        .client(clock(), |b| b)
        .who_am_i()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(me.client, "anonymous");
    assert_eq!(me.owner_prefixes, vec![String::new()]);

    let shared = Running::start(Arc::new(MemLease::new(TTL)), clock(), None, |s| {
        s.bearer_token("shared")
    })
    .await;
    let me = shared
        .client(clock(), |b| b.bearer_token("shared"))
        .who_am_i()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(me.client, "bearer");
    assert_eq!(me.owner_prefixes, vec![String::new()]);
}

#[tokio::test]
async fn a_restricted_get_shows_a_holder_only_to_a_client_that_may_act_for_it() {
    let backend = MemLease::new(TTL);
    let server = server_with(
        &backend,
        IdentityStore::new(identities()),
        GetAccess::OwnOwners,
    )
    .await;
    let (x, y) = (client(&server, "token-x"), client(&server, "token-y"));
    let chat = session("chat-private");
    assert_eq!(x.current(&chat).await.unwrap(), None, "free reads as free");
    let held = y.acquire(&chat, &owner("y/host-1")).await.unwrap();
    assert_eq!(
        y.current(&chat).await.unwrap().map(|l| l.token()),
        Some(held.token())
    );
    let e = x.current(&chat).await.unwrap_err();
    assert_not_permitted(&e, "get y's session");
    let ops = client(&server, "token-ops");
    assert!(ops.current(&chat).await.unwrap().is_some());
}

#[tokio::test]
async fn identities_replaced_while_serving_take_effect_for_calls_and_open_streams() {
    let backend = MemLease::new(TTL);
    let store = IdentityStore::new(identities());
    let server = server_with(&backend, store.clone(), GetAccess::Everyone).await;
    let x = client(&server, "token-x");
    let chat = session("chat-rotate");
    let held = x.acquire(&chat, &owner("x/host-1")).await.unwrap();
    // The KeepAlive stream opens under the old identities.
    let renewed = x.renew_many(std::slice::from_ref(&held)).await;
    assert!(renewed[0].is_ok(), "{renewed:?}");

    // Rotation: x's token is replaced by a new one.
    store.replace(
        Identities::parse(&format!(
            "token x x/ {}\ntoken y y/ {}\n",
            hash_token("token-x2"),
            hash_token("token-y"),
        ))
        .unwrap(),
    );
    // The old token renews nothing more, on the stream it opened before.
    let renewed = x.renew_many(std::slice::from_ref(&held)).await;
    let e = renewed[0].as_ref().unwrap_err();
    assert_eq!(e.kind(), LeaseErrorKind::Invalid, "{e}");
    assert!(e.message().contains("refused the credentials"), "{e}");
    let e = x.renew(&held).await.unwrap_err();
    assert_eq!(
        wire_status(&e).map(tonic::Status::code),
        Some(Code::Unauthenticated)
    );
    // The new token acts for x's owners.
    let x2 = client(&server, "token-x2");
    let renewed = x2.renew(&held).await.unwrap();
    assert_eq!(renewed.token(), held.token());
}

struct Certified {
    ca: Pki,
    server: Running,
}

async fn mutual_tls(store: Option<IdentityStore>) -> Certified {
    let ca = Pki::new("mecatl identity CA");
    let cert = ca.issue("lease server");
    let tls = ServerTls::new(cert.cert_pem, cert.key_pem).require_client_certs(ca.ca_pem.clone());
    let server = Running::start(Arc::new(MemLease::new(TTL)), clock(), None, |s| {
        let s = s.tls(tls);
        match store {
            Some(store) => s.identities(store),
            None => s,
        }
    })
    .await;
    Certified { ca, server }
}

fn cert_client(c: &Certified, uri: Option<&str>, dns: &[&str]) -> GrpcLease {
    let issued = c.ca.issue_client("client", uri, dns);
    c.server.client(clock(), |b| {
        b.tls(ClientTls::new(c.ca.ca_pem.clone()).identity(issued.cert_pem, issued.key_pem))
            .call_timeout(Duration::from_secs(3))
            .attempts(2)
    })
}

#[tokio::test]
async fn a_client_certificate_acts_for_the_owners_under_its_own_name() {
    let c = mutual_tls(None).await;
    let a = cert_client(&c, Some("spiffe://test/ns/chat/sa/a"), &[]);
    let b = cert_client(&c, None, &["b.chat.svc"]);
    let me = a.who_am_i().await.unwrap().unwrap();
    assert_eq!(me.client, "spiffe://test/ns/chat/sa/a");
    assert_eq!(
        me.owner_prefixes,
        vec!["spiffe://test/ns/chat/sa/a/".to_owned()]
    );
    let chat = session("chat-cert");
    let held = a
        .acquire(&chat, &me.owner_id("host-1").unwrap())
        .await
        .unwrap();
    let e = b.release(&held).await.unwrap_err();
    assert_not_permitted(&e, "b releases a's grant");
    let e = b.acquire(&chat, held.owner()).await.unwrap_err();
    assert_not_permitted(&e, "b acquires as a");
    let b_me = b.who_am_i().await.unwrap().unwrap();
    assert_eq!(b_me.owner_prefixes, vec!["b.chat.svc/".to_owned()]);
}

#[tokio::test]
async fn an_identities_file_names_certificates_and_refuses_the_unlisted() {
    let store = IdentityStore::new(
        Identities::parse(
            "cert chat-a chat-a/ uri:spiffe://test/a\ncert chat-b chat-b/ dns:b.chat.svc\n",
        )
        .unwrap(),
    );
    let c = mutual_tls(Some(store)).await;
    let a = cert_client(&c, Some("spiffe://test/a"), &[]);
    let me = a.who_am_i().await.unwrap().unwrap();
    assert_eq!(me.client, "chat-a");
    assert_eq!(me.owner_prefixes, vec!["chat-a/".to_owned()]);
    let b = cert_client(&c, None, &["B.chat.svc"]);
    assert_eq!(b.who_am_i().await.unwrap().unwrap().client, "chat-b");
    // Signed by the right CA, but named in no line: refused.
    let stranger = cert_client(&c, Some("spiffe://test/stranger"), &[]);
    let e = stranger
        .acquire(&session("chat-x"), &owner("chat-a/1"))
        .await
        .unwrap_err();
    assert_eq!(
        wire_status(&e).map(tonic::Status::code),
        Some(Code::Unauthenticated),
        "{e}"
    );
}
