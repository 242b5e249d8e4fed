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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use lease_port::SessionId;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::warn;

/// How often a waiter reads its session when no message woke it.
pub(crate) const FALLBACK_READ: Duration = Duration::from_secs(1);

/// The longest pause between two attempts to subscribe.
const MOST_BETWEEN_ATTEMPTS: Duration = Duration::from_secs(2);

/// One subscription shared by every waiter of one store.
pub(crate) struct Appends {
    shared: Arc<Shared>,
    /// The subscriber task, started by the first waiter; started again by
    /// a later one if it ended with its runtime.
    listener: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    client: redis::Client,
    channel: String,
    connect_timeout: Duration,
    /// The waiters' signals by session; entries die with their last waiter.
    waiters: Mutex<HashMap<SessionId, Weak<Notify>>>,
}

/// A waiter's registration: woken on each append to its session.
pub(crate) struct Waiter {
    notify: Arc<Notify>,
}

impl Waiter {
    /// The signal to wait on; enable it before reading the session, so an
    /// append between the read and the wait still wakes it.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
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
            }),
            listener: Mutex::new(None),
        }
    }

    /// Registers a waiter for `session`, starting the subscription if no
    /// task runs it. Call from within a tokio runtime.
    pub(crate) fn register(&self, session: &SessionId) -> Waiter {
        let notify = {
            let mut waiters = lock(&self.shared.waiters);
            match waiters.get(session).and_then(Weak::upgrade) {
                Some(n) => n,
                None => {
                    let n = Arc::new(Notify::new());
                    waiters.insert(session.clone(), Arc::downgrade(&n));
                    n
                }
            }
        };
        let mut listener = lock(&self.listener);
        if listener.as_ref().is_none_or(JoinHandle::is_finished) {
            *listener = Some(tokio::spawn(listen(Arc::downgrade(&self.shared))));
        }
        Waiter { notify }
    }
}

impl Drop for Appends {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.listener).take() {
            task.abort();
        }
    }
}

impl Shared {
    fn wake(&self, session: &str) {
        let mut waiters = lock(&self.waiters);
        let Ok(id) = SessionId::new(session) else {
            return;
        };
        match waiters.get(&id).map(Weak::upgrade) {
            Some(Some(n)) => n.notify_waiters(),
            Some(None) => {
                waiters.remove(&id);
            }
            None => {}
        }
    }

    /// After a gap in the subscription every waiter reads again, and
    /// entries without waiters go.
    fn wake_all(&self) {
        let mut waiters = lock(&self.waiters);
        waiters.retain(|_, w| match w.upgrade() {
            Some(n) => {
                n.notify_waiters();
                true
            }
            None => false,
        });
    }
}

/// Subscribes and wakes waiters until the store is dropped; subscribes
/// again after any failure, waking every waiter once subscribed (what was
/// published meanwhile is lost).
async fn listen(shared: Weak<Shared>) {
    let mut pause = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let Some(s) = shared.upgrade() else { return };
        let subscribed = async {
            let mut pubsub = tokio::time::timeout(s.connect_timeout, s.client.get_async_pubsub())
                .await
                .map_err(|_| format!("no connection within {:?}", s.connect_timeout))?
                .map_err(|e| e.to_string())?;
            tokio::time::timeout(s.connect_timeout, pubsub.subscribe(&s.channel))
                .await
                .map_err(|_| format!("no SUBSCRIBE answer within {:?}", s.connect_timeout))?
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(pubsub)
        }
        .await;
        let pubsub = match subscribed {
            Ok(p) => p,
            Err(e) => {
                if !warned {
                    warn!(
                        channel = %s.channel,
                        error = %e,
                        "cannot subscribe to appends; followers read every second instead"
                    );
                    warned = true;
                }
                drop(s);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MOST_BETWEEN_ATTEMPTS);
                continue;
            }
        };
        pause = Duration::from_millis(100);
        warned = false;
        // Appends made before this subscription took effect were not heard.
        s.wake_all();
        drop(s);
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let Some(s) = shared.upgrade() else { return };
            if let Ok(session) = msg.get_payload::<String>() {
                s.wake(&session);
            }
        }
        // The connection ended: subscribe again.
    }
}
