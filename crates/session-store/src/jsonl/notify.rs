//! Waiting for appends to a session file: an inotify watch on the file,
//! so a waiter wakes when any process writes it instead of polling. Past
//! the kernel's per-user inotify limits a waiter polls instead.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use lease_port::SessionId;
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::JsonlStore;
use crate::StoreError;
use crate::poll_for_append;
use crate::port::has_event_after;

/// An inotify instance that tokio can wait on.
struct Watch(Inotify);

impl AsRawFd for Watch {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl JsonlStore {
    /// [`SessionStore::wait_for_append`] for the JSONL store.
    pub(super) async fn wait_for_append_to_file(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let path = self.path_of(session);
        let watch = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(watch) => watch,
            // The kernel's limits on inotify instances and watches are per
            // user and shared by every process of that user: past them a
            // waiter reads the file at intervals rather than failing.
            Err(Errno::EMFILE | Errno::ENFILE | Errno::ENOMEM) => {
                return poll_for_append(self, session, after_seq, timeout).await;
            }
            Err(e) => return Err(StoreError::io("watching session file", &path, e.into())),
        };
        // Every way the file can change: written (appends, a torn tail
        // cut), or unlinked (reclaimed) so the next read reports it.
        let mask = AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        match watch.add_watch(&path, mask) {
            Ok(_) => {}
            Err(Errno::ENOENT) => {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                });
            }
            Err(Errno::ENOSPC | Errno::ENOMEM) => {
                return poll_for_append(self, session, after_seq, timeout).await;
            }
            Err(e) => return Err(StoreError::io("watching session file", &path, e.into())),
        }
        // SAFETY: `Watch` owns the inotify descriptor and never gives it
        // up: it stays open, and `as_raw_fd` keeps answering it, until the
        // `AsyncFd` (and with it the `Watch`) is dropped.
        #[allow(unsafe_code)]
        let registered =
            unsafe { AsyncFd::register_with_interest(Watch(watch), Interest::READABLE) };
        let watch = registered
            .map_err(|e| StoreError::io("watching session file", &path, e.into_parts().1))?;
        // The watch exists before the first check, so an append landing
        // between the check and the wait still wakes it.
        loop {
            if has_event_after(self, session, after_seq).await? {
                return Ok(true);
            }
            let mut ready = match tokio::time::timeout_at(deadline, watch.readable()).await {
                Err(_) => return Ok(false),
                Ok(ready) => {
                    ready.map_err(|e| StoreError::io("watching session file", &path, e))?
                }
            };
            // Only the wake-up matters: drain what was reported.
            match ready.get_inner().0.read_events() {
                Ok(_) | Err(Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => {
                    return Err(StoreError::io(
                        "watching session file",
                        &path,
                        io::Error::from(e),
                    ));
                }
            }
        }
    }
}
