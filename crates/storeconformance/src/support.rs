//! Small helpers the cases share.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use lease_port::{FencingToken, OwnerId, SessionId};
use serde_json::Value;
use session_store::{SessionStore, StoreError, StoreErrorKind, StoredEvent, WriteFence};

/// How long a call that should answer promptly may take before the case
/// calls it stuck: a wait that an append should end, a read. Generous, so
/// a loaded machine does not fail a correct store.
pub(crate) const PROMPTLY: Duration = Duration::from_secs(10);

/// A session id; every case has a fresh store, so plain names do.
pub(crate) fn session(name: &str) -> SessionId {
    SessionId::new(name).expect("the suite's session ids are valid")
}

/// A writer (an owner id, unique per process incarnation in a deployment).
pub(crate) fn writer(name: &str) -> OwnerId {
    OwnerId::new(format!("conformance-{name}")).expect("the suite's owner ids are valid")
}

/// Token `token` held by `name`.
pub(crate) fn fence(token: u64, name: &str) -> WriteFence {
    WriteFence::new(FencingToken::new(token), writer(name))
}

/// Unwraps a result the contract says must succeed, naming the step.
#[track_caller]
pub(crate) fn must<T>(step: &str, r: Result<T, StoreError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{step}: expected success, got {:?} error: {e}", e.kind()),
    }
}

/// Asserts `r` failed with `kind`, naming the step; returns the error.
#[track_caller]
pub(crate) fn must_fail<T: Debug>(
    step: &str,
    r: Result<T, StoreError>,
    kind: StoreErrorKind,
) -> StoreError {
    match r {
        Err(e) if e.kind() == kind => e,
        Ok(v) => panic!("{step}: expected a refusal ({kind:?}), but it succeeded ({v:?})"),
        Err(e) => panic!(
            "{step}: expected a refusal ({kind:?}), got {:?}: {e}",
            e.kind()
        ),
    }
}

/// Runs `call`, failing the case when it takes longer than [`PROMPTLY`].
#[track_caller]
pub(crate) fn promptly<T>(step: &str, call: impl Future<Output = T>) -> impl Future<Output = T> {
    let caller = std::panic::Location::caller();
    let step = step.to_owned();
    async move {
        match tokio::time::timeout(PROMPTLY, call).await {
            Ok(v) => v,
            Err(_) => panic!("{step}: no answer within {PROMPTLY:?} (at {caller})"),
        }
    }
}

/// Every event of `session` from seq `from` on, read page by page
/// (`limit` at a time) with the page rules checked on the way: at most
/// `limit` events, in order, `next_seq` after the last one and only when
/// the page is not empty, no unfinished write.
pub(crate) async fn events_paged(
    store: &dyn SessionStore,
    step: &str,
    session: &SessionId,
    mut from: u64,
    limit: usize,
) -> Vec<StoredEvent> {
    let mut out: Vec<StoredEvent> = Vec::new();
    loop {
        let at = format!("{step}: reading {session:?} from seq {from}, limit {limit}");
        let page = must(&at, promptly(&at, store.read(session, from, limit)).await);
        assert!(
            page.events.len() <= limit,
            "{at}: the page holds {} events, more than the limit",
            page.events.len()
        );
        assert!(
            !page.unfinished_write,
            "{at}: an unfinished write reported without a crash"
        );
        for e in &page.events {
            assert!(
                e.seq >= from,
                "{at}: event seq {} is before from_seq",
                e.seq
            );
            if let Some(prev) = out.last() {
                assert!(
                    e.seq > prev.seq,
                    "{at}: seq {} follows seq {}: not increasing",
                    e.seq,
                    prev.seq
                );
            }
            out.push(e.clone());
        }
        match page.next_seq {
            None => return out,
            Some(next) => {
                let last = page.events.last().unwrap_or_else(|| {
                    panic!("{at}: an empty page says more follows (next_seq {next})")
                });
                assert!(
                    next > last.seq,
                    "{at}: next_seq {next} is not after the page's last seq {}",
                    last.seq
                );
                from = next;
            }
        }
    }
}

/// Every event of `session`, a few at a time.
pub(crate) async fn events(
    store: &dyn SessionStore,
    step: &str,
    session: &SessionId,
) -> Vec<StoredEvent> {
    events_paged(store, step, session, 1, 3).await
}

/// The events as (seq, token, payload).
pub(crate) fn summary(events: &[StoredEvent]) -> Vec<(u64, Option<u64>, Value)> {
    events
        .iter()
        .map(|e| (e.seq, e.token.map(FencingToken::get), e.payload.clone()))
        .collect()
}

/// The payloads alone.
pub(crate) fn payloads(events: &[StoredEvent]) -> Vec<Value> {
    events.iter().map(|e| e.payload.clone()).collect()
}
