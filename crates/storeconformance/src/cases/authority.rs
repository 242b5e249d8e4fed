//! Rule 6: a store records the lease authority whose tokens fence it.

use std::sync::Arc;

use lease_port::AuthorityId;
use serde_json::json;
use session_store::{StoreError, StoreErrorKind};
use tokio::sync::Barrier;

use crate::StoreFactory;
use crate::support::{events, fence, must, must_fail, session, summary};

fn authority(name: &str) -> AuthorityId {
    AuthorityId::new(format!("storeconformance:{name}"))
        .expect("the suite's authority ids are valid")
}

/// Rule 6: the first binding records the authority, once; later bindings
/// succeed for the same id from every client and fail for another with
/// `AuthorityMismatch` naming both, which changes nothing. A store that
/// holds sessions but no record yet is bound by its first binding, and
/// binding neither hides nor changes its sessions.
pub async fn authority_binding<F: StoreFactory>(f: &F) {
    let (one, two) = (f.store().await, f.store().await);
    let s = session("before-binding");
    must("create", one.create(&s).await);
    must(
        "x writes with token 3",
        one.append(&s, fence(3, "x"), &[json!(1)]).await,
    );
    let state = "a store holding a session, never bound";
    for (who, store) in [("one client", &one), ("another client", &two)] {
        assert_eq!(
            must(
                "read the recorded authority",
                store.recorded_authority().await
            ),
            None,
            "{state}: {who} reports a recorded authority"
        );
    }

    let (a, b) = (authority("a"), authority("b"));
    must(&format!("{state}: bind {a}"), one.bind_authority(&a).await);
    let state = format!("after {a} was bound");
    must(
        &format!("{state}: bind it again"),
        one.bind_authority(&a).await,
    );
    must(
        &format!("{state}: another client binds it"),
        two.bind_authority(&a).await,
    );
    let fresh = f.store().await;
    for (who, store) in [
        ("the binding client", &one),
        ("another client", &two),
        ("a client made afterwards", &fresh),
    ] {
        let step = format!("{state}: {who} binds {b}");
        let e = must_fail(
            &step,
            store.bind_authority(&b).await,
            StoreErrorKind::AuthorityMismatch,
        );
        let text = e.to_string();
        match e {
            StoreError::AuthorityMismatch {
                recorded, offered, ..
            } => {
                assert_eq!(
                    (&recorded, &offered),
                    (&a, &b),
                    "{step}: the refusal names the wrong authorities"
                );
                assert!(
                    text.contains(a.as_str()) && text.contains(b.as_str()),
                    "{step}: the refusal's message does not name both authorities: {text}"
                );
            }
            other => panic!("{step}: an AuthorityMismatch kind carried by {other:?}"),
        }
        assert_eq!(
            must(
                "read the recorded authority",
                store.recorded_authority().await
            ),
            Some(a.clone()),
            "{state} and {b} refused: {who} reports another record"
        );
    }
    assert_eq!(
        must("list", fresh.list().await),
        std::slice::from_ref(&s),
        "{state}: binding changed the listing"
    );
    assert_eq!(
        summary(&events(&*fresh, &state, &s).await),
        [(1, Some(3), json!(1))],
        "{state}: binding changed the session written before it"
    );
}

/// Rule 6: first bindings racing from several clients, for two
/// authorities, record exactly one: every binder of it succeeds, every
/// other fails naming it.
pub async fn racing_first_bindings<F: StoreFactory>(f: &F) {
    const RACERS: usize = 6;
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for i in 0..RACERS {
        let (store, barrier) = (f.store().await, Arc::clone(&barrier));
        let offered = authority(if i % 2 == 0 { "even" } else { "odd" });
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let result = store.bind_authority(&offered).await;
            (offered, result)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("a binding task panicked"));
    }
    let recorded = must(
        "read the record after the race",
        f.store().await.recorded_authority().await,
    );
    let Some(winner) = recorded else {
        panic!("after {RACERS} racing first bindings nothing is recorded: {results:?}")
    };
    for (offered, result) in &results {
        match result {
            Ok(()) => assert_eq!(
                offered, &winner,
                "racing first bindings: {offered} was answered bound, but {winner} is recorded \
                 (all answers: {results:?})"
            ),
            Err(StoreError::AuthorityMismatch { recorded, .. }) => {
                assert_ne!(
                    offered, &winner,
                    "racing first bindings: the recorded {winner} was refused"
                );
                assert_eq!(
                    recorded, &winner,
                    "racing first bindings: a refusal names {recorded}, not the record"
                );
            }
            Err(e) => panic!(
                "racing first bindings: binding {offered} failed with {:?}: {e}",
                e.kind()
            ),
        }
    }
}
