//! Keeping the sessions on one owner lease in view through a watch, so
//! that proving them after a renewal needs no list.
//!
//! A list of the sessions on an owner lease after each renewal proves them
//! still ours, but at 10,000 sessions it has the API server read, and this
//! client decode, 10,000 objects every renewal period. A watch on the
//! owner-lease label delivers only what changes. The owner lease carries
//! that label too, so the watch also delivers each renewal: once it has
//! delivered an event at or after the renewal's `resourceVersion`, it has
//! delivered every change before it (a watch sends events in
//! `resourceVersion` order, and an object that stops matching the label is
//! sent as deleted), and what it shows is what a consistent list sent then
//! would have shown.
//!
//! The watch only saves requests, never decides alone: whenever it cannot
//! show the sessions as of a renewal within a short wait (starting,
//! resuming after a broken connection, relisting after its history was
//! compacted, going back, refused by RBAC), the renewal lists them as
//! before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::api::{WatchEvent, WatchParams};
use lease_port::{FencingToken, OwnerId};

use crate::backend::{Inner, K8sLease};
use crate::record;

/// How long the API server keeps one watch request open (kube refuses
/// 295 s or more); the watch then resumes from its last version.
const WATCH_SECONDS: u32 = 240;
/// The pause after a failed list or a broken watch, doubling on each
/// failure in a row up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// A session held by the owner: its id, its token, and the version of
/// its object that says so.
pub(crate) type Entry = (String, FencingToken, u64);

/// The sessions on one owner lease that its owner holds, by object name.
pub(crate) type Held = HashMap<String, Entry>;

/// The watch of one owner lease's sessions. Dropping it stops the watch
/// and frees its connection.
#[derive(Debug)]
pub(crate) struct SessionsWatch {
    view: Arc<View>,
    task: tokio::task::AbortHandle,
    /// Taken while this watch exists: one owner per client watches.
    slot: Arc<AtomicBool>,
}

#[derive(Debug)]
struct View {
    shown: Mutex<Shown>,
    /// The revision `shown` has reached, sent whenever it moves.
    reached: tokio::sync::watch::Sender<u64>,
    /// Asks the watch to rebuild from a list.
    rebuild: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Shown {
    /// True while the watch runs and `held` is the state at `revision`.
    live: bool,
    revision: u64,
    held: Held,
}

impl View {
    fn lock(&self) -> MutexGuard<'_, Shown> {
        // Every update leaves `Shown` whole: a panic elsewhere cannot
        // leave it half-written.
        self.shown.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_live(&self, live: bool) {
        self.lock().live = live;
    }

    /// Starts over from a list at `revision`; live once a watch from it
    /// is established.
    fn reset(&self, revision: u64, held: Held) {
        *self.lock() = Shown {
            live: false,
            revision,
            held,
        };
        self.reached.send_replace(revision);
    }

    /// One event at `revision`: `change` is an object's name and what it
    /// now holds for our owner (`None`: nothing, or it is gone); a
    /// bookmark has none and moves only the revision.
    fn advance(&self, revision: u64, change: Option<(String, Option<Entry>)>) {
        let mut shown = self.lock();
        shown.revision = revision;
        match change {
            Some((name, Some(entry))) => {
                shown.held.insert(name, entry);
            }
            Some((name, None)) => {
                shown.held.remove(&name);
            }
            None => {}
        }
        drop(shown);
        self.reached.send_replace(revision);
    }
}

/// Whether `object` is a session held by `owner` under a known token, and
/// which.
pub(crate) fn held_entry(object: &LeaseObject, owner: &OwnerId) -> Option<Entry> {
    if record::holder(object) != Some(owner.as_str()) {
        return None;
    }
    let version = record::resource_version(object).ok()?;
    match (record::session_of(object), record::stored_token(object)) {
        (Some(session), record::StoredToken::Known(token)) => {
            Some((session.to_owned(), token, version))
        }
        _ => None,
    }
}

impl SessionsWatch {
    /// Starts watching the sessions `owner` holds on owner lease `name`,
    /// unless another owner of `lease` already watches (`slot`).
    pub(crate) fn start(
        lease: &K8sLease,
        name: &str,
        owner: &OwnerId,
        slot: &Arc<AtomicBool>,
    ) -> Option<Self> {
        if slot.swap(true, Ordering::AcqRel) {
            return None;
        }
        let view = Arc::new(View {
            shown: Mutex::default(),
            reached: tokio::sync::watch::Sender::new(0),
            rebuild: tokio::sync::Notify::new(),
        });
        // The task holds the client weakly: dropping the last clone of
        // the client drops this watch, which stops the task.
        let task = tokio::spawn(keep(
            Arc::downgrade(&lease.inner),
            view.clone(),
            name.to_owned(),
            owner.clone(),
        ));
        Some(Self {
            view,
            task: task.abort_handle(),
            slot: slot.clone(),
        })
    }

    /// The sessions held, by object name, as of a revision at least `at`.
    /// `None` when the watch is not running, or does not get there within
    /// `patience` (it is then rebuilt), and the caller must list.
    pub(crate) async fn held_at(&self, at: u64, patience: Duration) -> Option<Held> {
        if !self.view.lock().live {
            return None;
        }
        let mut reached = self.view.reached.subscribe();
        let got_there = tokio::time::timeout(patience, reached.wait_for(|r| *r >= at))
            .await
            .is_ok_and(|r| r.is_ok());
        let shown = self.view.lock();
        if got_there && shown.live && shown.revision >= at {
            return Some(shown.held.clone());
        }
        let stuck = shown.live;
        drop(shown);
        if stuck {
            // Live, yet not there in time: a connection that died without
            // closing shows as this. Start over.
            self.view.rebuild.notify_one();
        }
        None
    }
}

impl Drop for SessionsWatch {
    fn drop(&mut self) {
        self.task.abort();
        self.slot.store(false, Ordering::Release);
    }
}

/// How one watch request ended. Each but `Stop` is followed by a new
/// list, never by a watch resumed from the last version seen: storage that
/// went back while no watch ran (an API server restarted for an etcd
/// restore) may have written other changes under the versions in between,
/// which a resumed watch would never send. A list every few minutes per
/// watching owner is the price.
enum Ended {
    /// Closed by the server on time, its history gone, its versions gone
    /// back, or asked to: list again.
    Relist,
    /// Broken: list again after a pause.
    Broken,
    /// The client is gone, or the API server refuses to watch.
    Stop,
}

async fn keep(lease: Weak<Inner>, view: Arc<View>, name: String, owner: OwnerId) {
    let mut pause = FIRST_PAUSE;
    loop {
        let Some(inner) = lease.upgrade() else { return };
        let listed = K8sLease { inner }.list_on(&name, &owner).await;
        let from = match listed {
            Ok((Some(revision), held)) => {
                view.reset(revision, held);
                revision
            }
            // Versions that are not integers cannot be ordered.
            Ok((None, _)) => return,
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
                continue;
            }
        };
        let began = tokio::time::Instant::now();
        let ended = watch(&lease, &view, &name, &owner, from).await;
        view.set_live(false);
        match ended {
            // A watch that ends as soon as it starts is not let spin.
            Ended::Relist if began.elapsed() >= FIRST_PAUSE => pause = FIRST_PAUSE,
            Ended::Relist | Ended::Broken => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
            Ended::Stop => return,
        }
    }
}

/// One watch request from revision `from`, applying its events to `view`.
async fn watch(lease: &Weak<Inner>, view: &View, name: &str, owner: &OwnerId, from: u64) -> Ended {
    let Some((api, timeout)) = lease
        .upgrade()
        .map(|inner| (inner.api.clone(), inner.request_timeout))
    else {
        return Ended::Stop;
    };
    let params = WatchParams::default()
        .labels(&format!("{}={name}", record::OWNER_LEASE_LABEL))
        .timeout(WATCH_SECONDS);
    let stream = match tokio::time::timeout(timeout, api.watch(&params, &from.to_string())).await {
        Ok(Ok(stream)) => stream,
        // Not granted: the renewals list, as a Role without `watch` asks.
        Ok(Err(refused)) => return refusal(&refused).unwrap_or(Ended::Broken),
        Err(_) => return Ended::Broken,
    };
    let mut stream = std::pin::pin!(stream);
    view.set_live(true);
    let mut at = from;
    loop {
        let next = tokio::select! {
            () = view.rebuild.notified() => return Ended::Relist,
            next = stream.next() => next,
        };
        let event = match next {
            None => return Ended::Relist,
            // kube hands an error status of the request itself (403, 410)
            // over as the stream's first item.
            Some(Err(e)) => return refusal(&e).unwrap_or(Ended::Broken),
            Some(Ok(event)) => event,
        };
        if let Err(ended) = apply(view, owner, &mut at, event) {
            return ended;
        }
    }
}

/// What an API status refusing the watch means, if it is final for this
/// request: not granted by RBAC (stop; renewals list, as a Role without
/// `watch` asks), or a version whose history is gone (list again).
fn refusal(error: &kube::Error) -> Option<Ended> {
    match error {
        kube::Error::Api(status) if status.code == 403 => Some(Ended::Stop),
        kube::Error::Api(status) if status.code == 410 => Some(Ended::Relist),
        _ => None,
    }
}

/// Applies one event, the watch having reached revision `at`.
fn apply(
    view: &View,
    owner: &OwnerId,
    at: &mut u64,
    event: WatchEvent<LeaseObject>,
) -> Result<(), Ended> {
    let (object, gone) = match event {
        WatchEvent::Added(object) | WatchEvent::Modified(object) => (object, false),
        WatchEvent::Deleted(object) => (object, true),
        WatchEvent::Bookmark(bookmark) => {
            let revision = bookmark.metadata.resource_version.parse::<u64>();
            return match revision {
                Ok(revision) if revision >= *at => {
                    *at = revision;
                    view.advance(revision, None);
                    Ok(())
                }
                _ => Err(Ended::Relist),
            };
        }
        WatchEvent::Error(status) if status.code == 410 => return Err(Ended::Relist),
        WatchEvent::Error(_) => return Err(Ended::Broken),
    };
    // Each write has a version of its own, sent in rising order: one not
    // above the last is storage that went back, and the list that follows
    // says so.
    let revision = record::resource_version(&object).map_err(|_| Ended::Relist)?;
    if revision <= *at {
        return Err(Ended::Relist);
    }
    *at = revision;
    let Some(name) = object.metadata.name.clone() else {
        return Err(Ended::Relist);
    };
    let entry = if gone {
        None
    } else {
        held_entry(&object, owner)
    };
    view.advance(revision, Some((name, entry)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use kube::core::watch::{Bookmark, BookmarkMeta};
    use kube::core::{Status, TypeMeta};
    use lease_port::SessionId;

    use super::*;

    const OWNER_LEASE: &str = "mecatl-o-test";

    fn view() -> View {
        View {
            shown: Mutex::default(),
            reached: tokio::sync::watch::Sender::new(0),
            rebuild: tokio::sync::Notify::new(),
        }
    }

    fn owner(name: &str) -> OwnerId {
        OwnerId::new(name).unwrap()
    }

    /// Session `session`'s object at `version`, held by `holder` under
    /// `token`.
    fn held(session: &str, holder: &str, token: u64, version: u64) -> LeaseObject {
        let free = record::new_free(session, &SessionId::new(session).unwrap());
        let mut object = record::taken_over(
            &free,
            &owner(holder),
            FencingToken::new(token),
            OWNER_LEASE,
            Duration::from_secs(10),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
        )
        .unwrap();
        object.metadata.resource_version = Some(version.to_string());
        object
    }

    fn bookmark(version: u64) -> WatchEvent<LeaseObject> {
        WatchEvent::Bookmark(Bookmark {
            types: TypeMeta::default(),
            metadata: BookmarkMeta {
                resource_version: version.to_string(),
                annotations: Default::default(),
            },
        })
    }

    fn error(code: u16) -> WatchEvent<LeaseObject> {
        WatchEvent::Error(Box::new(Status {
            code,
            ..Status::default()
        }))
    }

    fn shown(view: &View) -> Vec<(String, u64)> {
        let mut held: Vec<_> = view
            .lock()
            .held
            .values()
            .map(|(s, t, _)| (s.clone(), t.get()))
            .collect();
        held.sort();
        held
    }

    #[test]
    fn events_keep_the_sessions_the_owner_holds_and_their_tokens() {
        let (view, me, mut at) = (view(), owner("pod-a"), 10);
        let step = |at: &mut u64, event| assert!(apply(&view, &me, at, event).is_ok());
        step(&mut at, WatchEvent::Added(held("s1", "pod-a", 7, 11)));
        step(&mut at, WatchEvent::Added(held("s2", "pod-a", 8, 12)));
        step(&mut at, WatchEvent::Added(held("s3", "pod-a", 9, 13)));
        assert_eq!(
            shown(&view),
            [("s1".into(), 7), ("s2".into(), 8), ("s3".into(), 9)]
        );
        // Given to another holder, deleted, or left the label (sent as
        // deleted): no longer ours.
        step(&mut at, WatchEvent::Modified(held("s1", "pod-b", 20, 14)));
        step(&mut at, WatchEvent::Deleted(held("s2", "pod-a", 8, 15)));
        assert_eq!(shown(&view), [("s3".into(), 9)]);
        step(&mut at, bookmark(30));
        assert_eq!(
            (at, *view.reached.borrow(), view.lock().revision),
            (30, 30, 30)
        );
    }

    #[test]
    fn versions_that_do_not_rise_and_expired_history_rebuild_from_a_list() {
        let me = owner("pod-a");
        let ends = |event| {
            let (view, mut at) = (view(), 20);
            match apply(&view, &me, &mut at, event) {
                Ok(()) => "applied",
                Err(Ended::Relist) => "relist",
                Err(Ended::Broken) => "broken",
                Err(_) => "other",
            }
        };
        assert_eq!(
            ends(WatchEvent::Added(held("s1", "pod-a", 7, 21))),
            "applied"
        );
        // Storage that went back sends a version already passed.
        assert_eq!(
            ends(WatchEvent::Modified(held("s1", "pod-a", 7, 20))),
            "relist"
        );
        assert_eq!(
            ends(WatchEvent::Deleted(held("s1", "pod-a", 7, 3))),
            "relist"
        );
        assert_eq!(ends(bookmark(19)), "relist");
        assert_eq!(ends(bookmark(20)), "applied");
        assert_eq!(ends(error(410)), "relist");
        assert_eq!(ends(error(500)), "broken");
    }
}
