//! The identities file, read again while serving: on SIGHUP, and when the
//! file changes (a Kubernetes Secret volume swaps its files in place of a
//! signal). A file that is refused changes nothing: the identities in
//! force stay, and the refusal is logged with the line at fault.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use grpcdriver::IdentityStore;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info};

/// How often the file is looked at for a change.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// What tells one version of the file from another without reading it.
fn stamp(path: &Path) -> Option<(u64, u64, i64, i64, u64)> {
    // `metadata` follows symbolic links, so a Secret volume's swap of
    // its `..data` link shows as a new inode.
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

fn reload(store: &IdentityStore, why: &str) {
    match store.reload() {
        Ok(n) => info!(credentials = n, why, "identities reloaded"),
        Err(e) => error!(error = %e, why, "identities not reloaded; those in force stay"),
    }
}

/// Reloads `store` from its file on SIGHUP and on every change seen, until
/// `stop` turns true.
pub(crate) async fn watch_identities(store: IdentityStore, mut stop: watch::Receiver<bool>) {
    let Some(path) = store.path().map(Path::to_path_buf) else {
        return;
    };
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            error!(error = %e, "no SIGHUP handler: the identities reload only when the file changes");
            None
        }
    };
    let mut seen = stamp(&path);
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
            } => {
                seen = stamp(&path);
                reload(&store, "SIGHUP");
            }
            _ = tick.tick() => {
                let now = stamp(&path);
                if now != seen {
                    seen = now;
                    reload(&store, "the file changed");
                }
            }
        }
    }
}
