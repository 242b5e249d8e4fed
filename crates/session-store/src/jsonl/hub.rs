//! Telling this process's waiters that a session file or a cancel request
//! changed, through one inotify instance per store.
//!
//! The instance watches two directories — the store's, and its cancel
//! requests' — not files: a follower costs an entry in a map, never a
//! kernel watch. (The kernel allows 128 inotify instances per user by
//! default, shared by every process of that user; one per follower ran out
//! at a few hundred followers, and the rest polled.) A thread of its own
//! reads the events, so the watch outlives whichever runtime its first
//! waiter ran on, and ends with the store.
//!
//! An event only wakes; every waiter then reads the store itself, so a
//! coalesced, reordered or overflowed event queue delays nobody: an
//! overflow wakes everyone. Where no watch can be had (the limits reached,
//! the directory gone), waiters read on an interval instead.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use tokio::sync::Notify;
use tracing::warn;

#[cfg(feature = "cancel-requests")]
use super::CANCEL_DIR_NAME;
use super::{FILE_SUFFIX, lock};

/// How long after a failed start (inotify limits reached), or after the
/// watch ended on its own, waiters poll before the next attempt.
const RETRY_START_AFTER: Duration = Duration::from_secs(10);

/// What a waiter waits on: a file in the store directory or in its cancel
/// requests' directory, by the session's file stem.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Topic {
    Appends(String),
    #[cfg(feature = "cancel-requests")]
    Cancels(String),
}

/// The store's watch, started by its first waiter.
pub(super) struct Hub {
    dir: PathBuf,
    state: Mutex<State>,
}

enum State {
    NotStarted,
    Running(Running),
    /// Could not start; waiters poll until `retry_at`.
    Off {
        retry_at: Instant,
    },
}

struct Running {
    shared: Arc<Shared>,
    inotify: Arc<Inotify>,
    dir_watch: WatchDescriptor,
}

/// What the reading thread and the waiters share.
struct Shared {
    #[cfg(feature = "cancel-requests")]
    dir: PathBuf,
    waiters: Mutex<HashMap<Topic, Weak<Notify>>>,
    /// The cancel requests' directory's watch, once that directory exists.
    #[cfg(feature = "cancel-requests")]
    cancel_watch: Mutex<Option<WatchDescriptor>>,
    /// Set by the store's drop: the thread ends at its next wake-up.
    stopping: AtomicBool,
    /// Set when the thread ended on its own (the directory went away):
    /// waiters poll.
    ended: AtomicBool,
}

/// A waiter's registration: notified on each change to its topic. Its
/// entry in the map goes with the topic's last subscription.
pub(super) struct Subscription {
    topic: Topic,
    notify: Arc<Notify>,
    shared: Arc<Shared>,
}

impl Hub {
    pub(super) fn new(dir: &Path) -> Hub {
        Hub {
            dir: dir.to_owned(),
            state: Mutex::new(State::NotStarted),
        }
    }

    /// A subscription to `topic`, the watch started if need be; `None`
    /// when no watch can be had and the caller must poll. The watch is in
    /// place when this returns: a change made after it wakes the
    /// subscription.
    pub(super) fn subscribe(&self, topic: Topic) -> Option<Subscription> {
        let mut state = lock(&self.state);
        // The watch ended on its own (its directory renamed, removed or
        // put back from a copy): waiters poll for a while, then a new
        // watch is tried on whatever is at the path now.
        if let State::Running(running) = &*state
            && running.shared.ended.load(Ordering::Acquire)
        {
            *state = State::Off {
                retry_at: Instant::now() + RETRY_START_AFTER,
            };
        }
        if let State::Off { retry_at } = *state
            && Instant::now() >= retry_at
        {
            *state = State::NotStarted;
        }
        if matches!(*state, State::NotStarted) {
            *state = match start(&self.dir) {
                Ok(running) => State::Running(running),
                Err(e) => {
                    warn!(dir = %self.dir.display(), error = %e,
                        "cannot watch the store directory; waiters poll");
                    State::Off {
                        retry_at: Instant::now() + RETRY_START_AFTER,
                    }
                }
            };
        }
        let State::Running(running) = &*state else {
            return None;
        };
        if running.shared.ended.load(Ordering::Acquire) {
            return None;
        }
        #[cfg(feature = "cancel-requests")]
        if matches!(topic, Topic::Cancels(_)) {
            running.shared.watch_cancels(&running.inotify);
        }
        let shared = Arc::clone(&running.shared);
        drop(state);
        let notify = {
            let mut waiters = lock(&shared.waiters);
            match waiters.get(&topic).and_then(Weak::upgrade) {
                Some(notify) => notify,
                None => {
                    let notify = Arc::new(Notify::new());
                    waiters.insert(topic.clone(), Arc::downgrade(&notify));
                    notify
                }
            }
        };
        Some(Subscription {
            topic,
            notify,
            shared,
        })
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let State::Running(running) = state {
            running.shared.stopping.store(true, Ordering::Release);
            // Removing the watch queues an event, which wakes the thread's
            // blocking read; it then sees `stopping` and ends, closing the
            // instance.
            if let Err(e) = running.inotify.rm_watch(running.dir_watch)
                && !running.shared.ended.load(Ordering::Acquire)
            {
                warn!(error = %e, "cannot stop the store directory's watch");
            }
        }
    }
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &*lock(&self.state) {
            State::NotStarted => "not started",
            State::Running(_) => "running",
            State::Off { .. } => "off",
        };
        f.debug_struct("Hub")
            .field("dir", &self.dir)
            .field("state", &state)
            .finish()
    }
}

impl Subscription {
    /// Notified on the next change to the topic once the returned future
    /// is enabled or polled.
    pub(super) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// Whether the watch still runs; once it does not, the caller polls.
    pub(super) fn live(&self) -> bool {
        !self.shared.ended.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut waiters = lock(&self.shared.waiters);
        // The map holds a weak reference; this one and the map's entry are
        // the last when no other subscription shares the topic.
        if Arc::strong_count(&self.notify) == 1 {
            waiters.remove(&self.topic);
        }
    }
}

fn dir_mask() -> AddWatchFlags {
    // Appends and torn-tail cuts modify a file; a reclaim unlinks it; a
    // rename puts one in place; a new directory may be the cancel
    // requests'.
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

#[cfg(feature = "cancel-requests")]
fn cancel_mask() -> AddWatchFlags {
    // A request is written to a temporary file and renamed into place.
    AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ONLYDIR
}

fn start(dir: &Path) -> Result<Running, Errno> {
    // Blocking reads: the thread sleeps in the kernel until an event.
    let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC)?);
    let dir_watch = inotify.add_watch(dir, dir_mask())?;
    let shared = Arc::new(Shared {
        #[cfg(feature = "cancel-requests")]
        dir: dir.to_owned(),
        waiters: Mutex::new(HashMap::new()),
        #[cfg(feature = "cancel-requests")]
        cancel_watch: Mutex::new(None),
        stopping: AtomicBool::new(false),
        ended: AtomicBool::new(false),
    });
    #[cfg(feature = "cancel-requests")]
    shared.watch_cancels(&inotify);
    let (thread_shared, thread_inotify) = (Arc::clone(&shared), Arc::clone(&inotify));
    std::thread::Builder::new()
        .name("jsonl-store-watch".into())
        .spawn(move || read_events(&thread_shared, &thread_inotify, dir_watch))
        .map_err(|_| Errno::EAGAIN)?;
    Ok(Running {
        shared,
        inotify,
        dir_watch,
    })
}

impl Shared {
    #[cfg(feature = "cancel-requests")]
    /// Watches the cancel requests' directory if it exists and is not
    /// watched yet. Every cancel waiter is woken after the watch is added:
    /// a request renamed into place before it was would otherwise be seen
    /// only at their next interval.
    fn watch_cancels(&self, inotify: &Inotify) {
        let mut watch = lock(&self.cancel_watch);
        if watch.is_some() {
            return;
        }
        match inotify.add_watch(&self.dir.join(CANCEL_DIR_NAME), cancel_mask()) {
            Ok(wd) => *watch = Some(wd),
            // Made with the first request; the directory watch sees that.
            Err(Errno::ENOENT) => return,
            Err(e) => {
                warn!(error = %e, "cannot watch cancel requests; their waiters poll");
                return;
            }
        }
        drop(watch);
        self.wake_where(|t| matches!(t, Topic::Cancels(_)));
    }

    fn wake(&self, topic: &Topic) {
        if let Some(notify) = lock(&self.waiters).get(topic).and_then(Weak::upgrade) {
            notify.notify_waiters();
        }
    }

    fn wake_where(&self, pick: impl Fn(&Topic) -> bool) {
        let waiters: Vec<Arc<Notify>> = lock(&self.waiters)
            .iter()
            .filter(|(t, _)| pick(t))
            .filter_map(|(_, n)| n.upgrade())
            .collect();
        for notify in waiters {
            notify.notify_waiters();
        }
    }

    /// Routes one event: to the waiters of the file it names, or to all
    /// (an overflow). `false` when the store directory's watch is gone.
    fn route(&self, inotify: &Inotify, dir_watch: WatchDescriptor, event: &InotifyEvent) -> bool {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            self.wake_where(|_| true);
            return true;
        }
        let name = event.name.as_deref().and_then(OsStr::to_str);
        if event.wd == dir_watch {
            if event.mask.intersects(
                AddWatchFlags::IN_IGNORED
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF,
            ) {
                return false;
            }
            #[cfg(feature = "cancel-requests")]
            if name == Some(CANCEL_DIR_NAME) {
                self.watch_cancels(inotify);
                return true;
            }
            if let Some(stem) = name.and_then(|n| n.strip_suffix(FILE_SUFFIX)) {
                self.wake(&Topic::Appends(stem.to_owned()));
            }
            return true;
        }
        #[cfg(feature = "cancel-requests")]
        if Some(event.wd) == *lock(&self.cancel_watch) {
            if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                *lock(&self.cancel_watch) = None;
            } else if let Some(stem) = name {
                self.wake(&Topic::Cancels(stem.to_owned()));
            }
        }
        let _ = inotify;
        true
    }
}

/// The watch's thread: reads events until the store is dropped or its
/// directory's watch goes away.
fn read_events(shared: &Shared, inotify: &Inotify, dir_watch: WatchDescriptor) {
    loop {
        let events = match inotify.read_events() {
            Ok(events) => events,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                warn!(error = %e, "the store directory's watch failed; waiters poll");
                break;
            }
        };
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        if !events.iter().all(|e| shared.route(inotify, dir_watch, e)) {
            break;
        }
    }
    shared.ended.store(true, Ordering::Release);
    shared.wake_where(|_| true);
}
