//! Telling waiters that a session was appended to, over one subscription
//! per store instead of one blocked connection per waiter.
//!
//! Every append publishes the session id on the prefix's channel from
//! inside its script, so any process's append reaches every process that
//! subscribed. Publish and subscribe are best effort — a message sent while
//! the subscriber reconnects is lost, and a user whose ACL grants no
//! channels gets none — so a waiter also reads the session at least once a
//! [`FALLBACK_READ`]: a lost message delays it by at most that, and never
//! loses an append.
//!
//! Waiters for cancel requests, one per run held (ten thousand on a busy
//! process), read only on the caller's own slow schedule while the
//! subscription is up ([`Waiter::subscribed`]): a subscription that comes
//! back after a gap wakes every waiter, which covers what the gap lost,
//! and a waiter that sees the subscription change state reads at once and
//! falls back to [`FALLBACK_READ`] until it is up again. "Up" is proven,
//! not assumed: the subscription publishes a heartbeat to itself every
//! [`HEARTBEAT`], and one not heard for [`HEARTBEAT_DEADLINE`] (a
//! connection dead without knowing it) counts as a gap.
//!
//! The subscription runs on a thread of its own with a small runtime of
//! its own, started by the first waiter: it keeps running whatever becomes
//! of the runtime that waiter ran on, and it ends when the store is
//! dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use lease_port::SessionId;
use tokio::sync::{Notify, oneshot};
use tracing::warn;

/// How often a waiter reads its session when no message woke it.
pub(crate) const FALLBACK_READ: Duration = Duration::from_secs(1);

/// How often the subscription publishes a heartbeat to itself.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long the subscription may go without hearing its own heartbeat
/// before it is taken for dead: waiters then read each second again, and
/// it subscribes anew.
const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(3);

/// A heartbeat no other subscription sends: a control character first, so
/// no process takes it for a session's id.
fn heartbeat_payload() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("\u{2}heartbeat {:016x}", h.finish())
}

/// The longest pause between two attempts to subscribe.
const MOST_BETWEEN_ATTEMPTS: Duration = Duration::from_secs(2);

/// One subscription shared by every waiter of one store.
pub(crate) struct Appends {
    shared: Arc<Shared>,
    /// Started by the first waiter; dropping the sender ends it.
    listener: Mutex<Listener>,
}

enum Listener {
    NotStarted,
    Running {
        _stop: oneshot::Sender<()>,
    },
    /// It could not start (no thread or runtime), or Redis refuses this
    /// user any channel: waiters read on their own schedule.
    Off,
}

struct Shared {
    client: redis::Client,
    channel: String,
    connect_timeout: Duration,
    /// The waiters' signals by what they wait on; an entry goes with its
    /// last waiter.
    waiters: Mutex<HashMap<Topic, Weak<Notify>>>,
    /// Counts the subscription's changes of state: odd while it is up.
    subscription: AtomicU64,
}

/// What a waiter waits on: a session's appends, or its cancel requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Topic {
    Appends(SessionId),
    Cancels(SessionId),
}

/// What a cancel request's message starts with, before the session id.
/// Session ids hold no control characters, so an append's message (the
/// bare id) never does; a process that does not know cancel messages
/// finds no session by that name and ignores them.
pub(crate) const CANCEL_MESSAGE_MARK: char = '\u{1}';

/// A waiter's registration: woken on each append to its session (or each
/// cancel request, for [`Appends::register_cancels`]).
pub(crate) struct Waiter {
    topic: Topic,
    notify: Arc<Notify>,
    shared: Arc<Shared>,
}

impl Waiter {
    /// The signal to wait on; enable it before reading the session, so an
    /// append between the read and the wait still wakes it.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// The subscription's state now: `Some(generation)` while it is up
    /// (every message since that generation began was heard, or the next
    /// generation's start wakes this waiter), `None` while it is not.
    pub(crate) fn subscribed(&self) -> Option<u64> {
        let generation = self.shared.subscription.load(Ordering::Acquire);
        (generation % 2 == 1).then_some(generation)
    }

    /// Whether the subscription is still in `generation`.
    pub(crate) fn still(&self, generation: u64) -> bool {
        self.shared.subscription.load(Ordering::Acquire) == generation
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiters = lock(&self.shared.waiters);
        // Others still wait on this session while they hold the signal.
        if Arc::strong_count(&self.notify) == 1 {
            waiters.remove(&self.topic);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Appends {
    pub(crate) fn new(
        client: redis::Client,
        channel: String,
        connect_timeout: Duration,
    ) -> Appends {
        Appends {
            shared: Arc::new(Shared {
                client,
                channel,
                connect_timeout,
                waiters: Mutex::new(HashMap::new()),
                subscription: AtomicU64::new(0),
            }),
            listener: Mutex::new(Listener::NotStarted),
        }
    }

    /// Registers a waiter for appends to `session`, starting the
    /// subscription first if no waiter has yet.
    pub(crate) fn register(&self, session: &SessionId) -> Waiter {
        self.register_for(Topic::Appends(session.clone()))
    }

    /// Registers a waiter for cancel requests of `session`.
    pub(crate) fn register_cancels(&self, session: &SessionId) -> Waiter {
        self.register_for(Topic::Cancels(session.clone()))
    }

    fn register_for(&self, topic: Topic) -> Waiter {
        {
            let mut listener = lock(&self.listener);
            if matches!(*listener, Listener::NotStarted) {
                *listener = self.start_listener();
            }
        }
        // The waiters' lock is held from the look-up to the insert, and a
        // dropping waiter checks the count under it: an entry is never
        // removed while a waiter holds its signal.
        let mut waiters = lock(&self.shared.waiters);
        let notify = match waiters.get(&topic).and_then(Weak::upgrade) {
            Some(n) => n,
            None => {
                let n = Arc::new(Notify::new());
                waiters.insert(topic.clone(), Arc::downgrade(&n));
                n
            }
        };
        Waiter {
            topic,
            notify,
            shared: Arc::clone(&self.shared),
        }
    }

    fn start_listener(&self) -> Listener {
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::downgrade(&self.shared);
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                warn!(error = %e, "no runtime for the appends subscription; waiters read every second");
                return Listener::Off;
            }
        };
        let started = std::thread::Builder::new()
            .name("redis-appends".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = listen(shared) => {}
                        _ = stopped => {}
                    }
                });
            });
        match started {
            Ok(_) => Listener::Running { _stop: stop },
            Err(e) => {
                warn!(error = %e, "no thread for the appends subscription; waiters read every second");
                Listener::Off
            }
        }
    }
}

impl Shared {
    fn wake(&self, message: &str) {
        let topic = match message.strip_prefix(CANCEL_MESSAGE_MARK) {
            Some(session) => SessionId::new(session).map(Topic::Cancels),
            None => SessionId::new(message).map(Topic::Appends),
        };
        let Ok(topic) = topic else {
            return;
        };
        if let Some(n) = lock(&self.waiters).get(&topic).and_then(Weak::upgrade) {
            n.notify_waiters();
        }
    }

    /// The subscription came up (`up`) or went down: the state changes,
    /// and every waiter reads again.
    fn changed(&self, up: bool) {
        let now = self.subscription.load(Ordering::Acquire);
        if (now % 2 == 1) != up {
            self.subscription.fetch_add(1, Ordering::AcqRel);
        }
        self.wake_all();
    }

    /// After a gap in the subscription every waiter reads again.
    fn wake_all(&self) {
        for n in lock(&self.waiters).values().filter_map(Weak::upgrade) {
            n.notify_waiters();
        }
    }
}

/// Subscribes and wakes waiters until the store is dropped; subscribes
/// again after any failure, waking every waiter once subscribed (what was
/// published meanwhile is lost). A user Redis allows no channel ends it:
/// that does not mend by retrying.
async fn listen(shared: Weak<Shared>) {
    let mut pause = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let Some(s) = shared.upgrade() else { return };
        let subscribed = async {
            let mut pubsub = tokio::time::timeout(s.connect_timeout, s.client.get_async_pubsub())
                .await
                .map_err(|_| None)?
                .map_err(Some)?;
            tokio::time::timeout(s.connect_timeout, pubsub.subscribe(&s.channel))
                .await
                .map_err(|_| None)?
                .map_err(Some)?;
            Ok::<_, Option<redis::RedisError>>(pubsub)
        }
        .await;
        let pubsub = match subscribed {
            Ok(p) => p,
            Err(Some(e)) if e.code() == Some("NOPERM") => {
                warn!(
                    channel = %s.channel,
                    error = %e,
                    "this Redis user may not subscribe to appends; waiters read every second"
                );
                return;
            }
            Err(e) => {
                if !warned {
                    let error = e.map_or_else(|| "no answer in time".to_owned(), |e| e.to_string());
                    warn!(
                        channel = %s.channel,
                        %error,
                        "cannot subscribe to appends yet; waiters read every second meanwhile"
                    );
                    warned = true;
                }
                drop(s);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MOST_BETWEEN_ATTEMPTS);
                continue;
            }
        };
        // The connection its heartbeats are published on: a subscription
        // that hears nothing may be dead without knowing it (a failover
        // behind one address, a dropped NAT entry), and only hearing its
        // own heartbeat proves it is not.
        let publisher = tokio::time::timeout(
            s.connect_timeout,
            s.client.get_multiplexed_async_connection(),
        )
        .await;
        let Ok(Ok(publisher)) = publisher else {
            drop(s);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOST_BETWEEN_ATTEMPTS);
            continue;
        };
        pause = Duration::from_millis(100);
        warned = false;
        let channel = s.channel.clone();
        // Appends made before this subscription took effect were not heard.
        s.changed(true);
        drop(s);
        if !hear(&shared, pubsub, publisher, &channel).await {
            return;
        }
        // The connection ended or went deaf: waiters fall back to reading,
        // and it subscribes again.
        if let Some(s) = shared.upgrade() {
            s.changed(false);
        }
    }
}

/// Wakes waiters from `pubsub`'s messages and publishes its heartbeat on
/// `publisher`, until the connection ends or goes deaf (its heartbeat not
/// heard for [`HEARTBEAT_DEADLINE`]). False when the store was dropped.
async fn hear(
    shared: &Weak<Shared>,
    pubsub: redis::aio::PubSub,
    mut publisher: redis::aio::MultiplexedConnection,
    channel: &str,
) -> bool {
    let beat = heartbeat_payload();
    let mut messages = pubsub.into_on_message();
    let mut ticks = tokio::time::interval(HEARTBEAT);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = tokio::time::Instant::now();
    loop {
        tokio::select! {
            msg = messages.next() => {
                let Some(msg) = msg else { return true };
                let Some(s) = shared.upgrade() else { return false };
                match msg.get_payload::<String>() {
                    Ok(payload) if payload == beat => heard = tokio::time::Instant::now(),
                    Ok(session) => s.wake(&session),
                    Err(_) => {}
                }
            }
            _ = ticks.tick() => {
                if heard.elapsed() > HEARTBEAT_DEADLINE {
                    warn!(channel = %channel, "the appends subscription stopped hearing its own heartbeat; subscribing again");
                    return true;
                }
                // Unanswered, the deadline above ends the subscription.
                let _ = tokio::time::timeout(
                    HEARTBEAT,
                    redis::cmd("PUBLISH").arg(channel).arg(&beat).exec_async(&mut publisher),
                )
                .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_entry_goes_with_its_last_waiter() {
        // Nothing listens there: the subscription keeps trying, which the
        // map does not care about.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let appends = Appends::new(client, "t:appends".into(), Duration::from_millis(100));
        let id = |i: usize| SessionId::new(format!("s{i}")).unwrap();
        let waiters: Vec<Waiter> = (0..1000).map(|i| appends.register(&id(i % 10))).collect();
        assert_eq!(lock(&appends.shared.waiters).len(), 10);
        let (first_half, second_half): (Vec<_>, Vec<_>) =
            waiters.into_iter().enumerate().partition(|(i, _)| *i < 995);
        drop(first_half);
        // Sessions 5..9 still have a waiter each; 0..4 none.
        assert_eq!(lock(&appends.shared.waiters).len(), 5);
        drop(second_half);
        assert!(lock(&appends.shared.waiters).is_empty());
    }
}
