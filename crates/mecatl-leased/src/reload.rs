//! The identities file, read again while serving: on SIGHUP, and when its
//! contents change (a Kubernetes Secret volume swaps its files in place of
//! a signal; a copy that keeps the old times and size is still a change).
//! A file that is refused changes nothing: the identities in force stay,
//! and the refusal is logged with the line at fault, again at every look
//! until the file is mended.

use std::time::Duration;

use grpcdriver::IdentityStore;
use tokio::signal::unix::Signal;
use tokio::sync::watch;
use tracing::{error, info};

/// How often the file is read for a change (it is small: one read).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Reloads `store` from its file on every `hangup` (SIGHUP, registered by
/// the caller before it announced itself, so an early signal cannot kill
/// the process) and whenever its contents change, until `stop` turns true.
pub(crate) async fn watch_identities(
    store: IdentityStore,
    mut hangup: Option<Signal>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            Some(()) = async {
                match &mut hangup {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => match store.reload() {
                Ok(n) => info!(credentials = n, why = "SIGHUP", "identities reloaded"),
                Err(e) => error!(error = %e, "identities not reloaded; those in force stay"),
            },
            _ = tick.tick() => match store.reload_if_changed() {
                Ok(None) => {}
                Ok(Some(n)) => info!(credentials = n, why = "the file changed", "identities reloaded"),
                Err(e) => error!(error = %e, "identities not reloaded; those in force stay"),
            },
        }
    }
}
