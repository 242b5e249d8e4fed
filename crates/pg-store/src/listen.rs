//! Telling waiters that a session was appended to (or deleted), over one
//! `LISTEN` connection per store instead of one connection, or one poll,
//! per waiter.
//!
//! Every append and deletion calls `pg_notify(<channel>, <session id>)`
//! inside its statement; PostgreSQL delivers the notification once the
//! statement commits, so a woken waiter reads the event. `LISTEN` belongs
//! to a server session: it needs a connection of its own, held for as long
//! as the store listens. A transaction pooler (PgBouncer in transaction
//! mode) hands each transaction to any server connection and does not
//! carry it, so the listener checks that notifications arrive — it sends a
//! probe through the store's own URL after each `LISTEN` and every
//! [`PROBE_INTERVAL`] — and, while they do not, waiters read their session
//! every poll interval instead. While they do, a waiter still reads every
//! [`SAFETY_READ`], so a lost notification delays it by at most that.
//!
//! The listener runs on a thread of its own with a small runtime of its
//! own, started by the first waiter: it keeps running whatever becomes of
//! the runtime that waiter ran on, and it ends when the store is dropped.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use lease_port::SessionId;
use pg_connect::PgConfig;
use tokio::sync::{Notify, oneshot};
use tokio_postgres::AsyncMessage;
use tokio_postgres::types::Type;
use tracing::{info, warn};

/// How often a waiter reads its session while notifications arrive.
pub const SAFETY_READ: Duration = Duration::from_secs(1);

/// How often the listener checks that notifications still arrive.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a probe may take to arrive.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// The pauses between attempts after a lost connection, and after
/// notifications were found not to arrive (a pooler: that does not mend
/// soon, and every attempt leaves a `LISTEN` on some pooled connection).
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MOST_BETWEEN_ATTEMPTS: Duration = Duration::from_secs(2);
const DEAF_PAUSE: Duration = Duration::from_secs(30);
const MOST_DEAF_PAUSE: Duration = Duration::from_secs(600);

/// Probes carry a control character, which no session id holds.
const PROBE_MARK: char = '\u{1}';

/// What a cancel request's notification starts with, before the session
/// id (a control character too: never an append's bare id).
pub(crate) const CANCEL_MARK: char = '\u{2}';

/// What a waiter waits on: a session's appends, or its cancel requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Topic {
    Appends(SessionId),
    Cancels(SessionId),
}

/// How the store learns of appends.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    /// `LISTEN` with this configuration (the store's URL, or the one given
    /// for notifications).
    Listen(Box<PgConfig>),
    /// Waiters read every poll interval.
    Poll,
}

/// One listener shared by every waiter of one store.
pub(crate) struct Appends {
    shared: Arc<Shared>,
    mode: Mode,
    /// Started by the first waiter; dropping the sender ends it.
    listener: Mutex<Listener>,
}

enum Listener {
    NotStarted,
    Running {
        _stop: oneshot::Sender<()>,
    },
    /// Polling by choice, or no thread or runtime could be made.
    Off,
}

struct Shared {
    /// Where probes are sent from: the store's own URL.
    probe_config: PgConfig,
    channel: String,
    connect_timeout: Duration,
    poll_interval: Duration,
    /// The waiters' signals by what they wait on; an entry goes with its
    /// last waiter.
    waiters: Mutex<HashMap<Topic, Weak<Notify>>>,
    /// Whether the last probe arrived on the live `LISTEN` connection.
    arriving: AtomicBool,
    /// The probe awaited, and who waits for it.
    probe: Mutex<Option<(String, oneshot::Sender<()>)>>,
    probes: AtomicU64,
}

/// A waiter's registration: woken on each append to its session.
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

    /// How long to wait before reading again when nothing wakes it.
    pub(crate) fn read_interval(&self) -> Duration {
        if self.shared.arriving.load(Ordering::Acquire) {
            SAFETY_READ
        } else {
            self.shared.poll_interval
        }
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
        mode: Mode,
        probe_config: PgConfig,
        channel: String,
        connect_timeout: Duration,
        poll_interval: Duration,
    ) -> Appends {
        Appends {
            shared: Arc::new(Shared {
                probe_config,
                channel,
                connect_timeout,
                poll_interval,
                waiters: Mutex::new(HashMap::new()),
                arriving: AtomicBool::new(false),
                probe: Mutex::new(None),
                probes: AtomicU64::new(0),
            }),
            mode,
            listener: Mutex::new(Listener::NotStarted),
        }
    }

    /// Whether notifications arrive now.
    pub(crate) fn arriving(&self) -> bool {
        self.shared.arriving.load(Ordering::Acquire)
    }

    /// Registers a waiter for appends to `session`, starting the listener
    /// first if no waiter has yet.
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
        let Mode::Listen(config) = &self.mode else {
            return Listener::Off;
        };
        let config = (**config).clone();
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::downgrade(&self.shared);
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                warn!(error = %e, "no runtime for the LISTEN connection; waiters poll");
                return Listener::Off;
            }
        };
        let started = std::thread::Builder::new()
            .name("pg-store-listen".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = listen(shared, config) => {}
                        _ = stopped => {}
                    }
                });
            });
        match started {
            Ok(_) => Listener::Running { _stop: stop },
            Err(e) => {
                warn!(error = %e, "no thread for the LISTEN connection; waiters poll");
                Listener::Off
            }
        }
    }
}

impl Shared {
    fn deliver(&self, payload: &str) {
        if payload.starts_with(PROBE_MARK) {
            let mut probe = lock(&self.probe);
            if probe.as_ref().is_some_and(|(want, _)| want == payload)
                && let Some((_, arrived)) = probe.take()
            {
                let _ = arrived.send(());
            }
            return;
        }
        let topic = match payload.strip_prefix(CANCEL_MARK) {
            Some(session) => SessionId::new(session).map(Topic::Cancels),
            None => SessionId::new(payload).map(Topic::Appends),
        };
        let Ok(topic) = topic else {
            return;
        };
        if let Some(n) = lock(&self.waiters).get(&topic).and_then(Weak::upgrade) {
            n.notify_waiters();
        }
    }

    /// After a change in how waiters learn of appends, every waiter reads
    /// again (what was notified meanwhile may be lost) and picks its new
    /// schedule.
    fn wake_all(&self) {
        for n in lock(&self.waiters).values().filter_map(Weak::upgrade) {
            n.notify_waiters();
        }
    }

    fn set_arriving(&self, arriving: bool) {
        if self.arriving.swap(arriving, Ordering::AcqRel) != arriving {
            self.wake_all();
        }
    }

    fn next_probe(&self) -> String {
        let n = self.probes.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u32(std::process::id());
        format!("{PROBE_MARK}probe {n} {:016x}", h.finish())
    }

    /// Sends a probe through the store's own URL and waits for it on the
    /// listening connection. `None` when it could not be sent (the database
    /// is out of reach: that says nothing about delivery).
    async fn probe(&self) -> Option<bool> {
        let payload = self.next_probe();
        let (arrived_tx, arrived) = oneshot::channel();
        *lock(&self.probe) = Some((payload.clone(), arrived_tx));
        let send = async {
            let client = crate::conn::connect(&self.probe_config, self.connect_timeout)
                .await
                .ok()?;
            client
                .query_typed(
                    "SELECT pg_notify($1, $2)",
                    &[(&self.channel, Type::TEXT), (&payload, Type::TEXT)],
                )
                .await
                .ok()
        };
        tokio::time::timeout(self.connect_timeout * 2, send)
            .await
            .ok()
            .flatten()?;
        Some(
            tokio::time::timeout(PROBE_WAIT, arrived)
                .await
                .is_ok_and(|r| r.is_ok()),
        )
    }
}

/// How one `LISTEN` connection ended.
enum Ended {
    /// It could not be made, or it broke: try again soon.
    Lost(String),
    /// It works, but notifications do not reach it: a pooler.
    Deaf,
}

/// Listens and wakes waiters until the store is dropped; listens again
/// after any failure, waking every waiter once it hears again.
async fn listen(shared: Weak<Shared>, config: PgConfig) {
    let mut pause = FIRST_PAUSE;
    let mut deaf_pause = DEAF_PAUSE;
    let mut warned_lost = false;
    let mut warned_deaf = false;
    loop {
        let Some(s) = shared.upgrade() else { return };
        let ended = one_connection(&s, &config).await;
        if s.arriving.load(Ordering::Acquire) {
            // It worked for a while: a new streak of trouble.
            (warned_lost, warned_deaf) = (false, false);
            (pause, deaf_pause) = (FIRST_PAUSE, DEAF_PAUSE);
        }
        s.set_arriving(false);
        let wait = match ended {
            Ended::Lost(why) => {
                if !warned_lost {
                    warn!(channel = %s.channel, error = %why, "the LISTEN connection is down; waiters poll meanwhile");
                    warned_lost = true;
                }
                let wait = pause;
                pause = (pause * 2).min(MOST_BETWEEN_ATTEMPTS);
                wait
            }
            Ended::Deaf => {
                if !warned_deaf {
                    warn!(
                        channel = %s.channel,
                        "notifications do not arrive on the LISTEN connection (a transaction \
                         pooler such as PgBouncer in transaction mode does not carry LISTEN): \
                         waiters poll; give the store a direct URL for notifications \
                         (PgStoreBuilder::notify_url)"
                    );
                    warned_deaf = true;
                }
                let wait = deaf_pause;
                deaf_pause = (deaf_pause * 2).min(MOST_DEAF_PAUSE);
                pause = FIRST_PAUSE;
                wait
            }
        };
        drop(s);
        tokio::time::sleep(wait).await;
    }
}

/// One `LISTEN` connection, probed after `LISTEN` and every
/// [`PROBE_INTERVAL`], until it breaks or a probe does not arrive.
async fn one_connection(s: &Shared, config: &PgConfig) -> Ended {
    let (client, mut connection) = match config.connect(s.connect_timeout).await {
        Ok(c) => c,
        Err(e) => return Ended::Lost(crate::conn::not_connected(e).to_string()),
    };
    let driver = async {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => s.deliver(n.payload()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return e.to_string(),
                None => return "the connection closed".to_owned(),
            }
        }
    };
    let control = async {
        let statement = format!("LISTEN {}", s.channel);
        let listen = client.batch_execute(&statement);
        match tokio::time::timeout(s.connect_timeout, listen).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Ended::Lost(e.to_string()),
            Err(_) => return Ended::Lost("LISTEN was not answered in time".into()),
        }
        loop {
            match s.probe().await {
                Some(true) => {
                    if !s.arriving.load(Ordering::Acquire) {
                        info!(channel = %s.channel, "notifications arrive: waiters are woken by them");
                    }
                    s.set_arriving(true);
                }
                Some(false) => return Ended::Deaf,
                None => {}
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    };
    tokio::select! {
        why = driver => Ended::Lost(why),
        ended = control => ended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appends() -> Appends {
        // Nothing listens there; polling mode starts no listener.
        let config = PgConfig::parse("host=127.0.0.1 port=1").unwrap();
        Appends::new(
            Mode::Poll,
            config,
            "t_session_appends".into(),
            Duration::from_millis(100),
            Duration::from_millis(50),
        )
    }

    #[test]
    fn a_sessions_entry_goes_with_its_last_waiter() {
        let appends = appends();
        let id = |i: usize| SessionId::new(format!("s{i}")).unwrap();
        let waiters: Vec<Waiter> = (0..1000).map(|i| appends.register(&id(i % 10))).collect();
        assert_eq!(lock(&appends.shared.waiters).len(), 10);
        let (first, second): (Vec<_>, Vec<_>) =
            waiters.into_iter().enumerate().partition(|(i, _)| *i < 995);
        drop(first);
        assert_eq!(lock(&appends.shared.waiters).len(), 5);
        drop(second);
        assert!(lock(&appends.shared.waiters).is_empty());
    }

    #[test]
    fn probes_are_never_taken_for_sessions_and_only_the_awaited_one_counts() {
        let appends = appends();
        let s = &appends.shared;
        let waiter = appends.register(&SessionId::new("s").unwrap());
        assert_eq!(waiter.read_interval(), Duration::from_millis(50));
        let probe = s.next_probe();
        assert!(
            SessionId::new(&probe).is_err(),
            "a probe reads as a session id"
        );
        let (tx, mut rx) = oneshot::channel();
        *lock(&s.probe) = Some((probe.clone(), tx));
        s.deliver(&s.next_probe()); // an older or foreign probe
        assert!(rx.try_recv().is_err());
        s.deliver(&probe);
        assert!(rx.try_recv().is_ok());
        s.set_arriving(true);
        assert_eq!(waiter.read_interval(), SAFETY_READ);
    }
}
