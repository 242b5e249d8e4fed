//! Keep-alive comments on idle event streams, timed by one ticker for
//! the whole router rather than a timer per stream.
//!
//! A comment keeps proxies and load balancers from closing a quiet
//! stream, and its write is what finds a client that went away without
//! closing. A timer per stream woke each stream's task on a schedule of
//! its own: ten thousand idle followers were a thousand wake-ups a second
//! spread evenly, each one a thread woken from its wait. One ticker wakes
//! them together, so a worker takes them one after another, and a stream
//! that sent anything since the previous tick writes nothing at all. An
//! idle stream thus carries a comment at least every two
//! [`KEEP_ALIVE`] intervals, and usually every one.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::sse::Event as SseEvent;
use futures_util::Stream;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

/// How often the ticker ticks: an idle stream carries a comment within
/// two of these, well inside the 60 s idle timeouts of common proxies
/// (nginx, cloud load balancers) and the 30 s of stricter ones.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The router's keep-alive ticker, started by the first stream that
/// needs it. Clones share it.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeepAliveTicks(Arc<Mutex<Option<watch::Receiver<()>>>>);

impl KeepAliveTicks {
    /// The ticks, from a ticker started now if none runs (the first call,
    /// or the runtime it ran on is gone). It ends once the router and
    /// every stream are gone.
    fn subscribe(&self) -> watch::Receiver<()> {
        let mut ticks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ticks) = ticks.as_ref().filter(|t| t.has_changed().is_ok()) {
            return ticks.clone();
        }
        let (tx, rx) = watch::channel(());
        tokio::spawn(tick(tx, KEEP_ALIVE));
        *ticks = Some(rx.clone());
        rx
    }

    /// `events` with a keep-alive comment at each tick that finds it has
    /// sent nothing since the previous one.
    pub(crate) fn around<S>(&self, events: S) -> WithKeepAlive<S> {
        WithKeepAlive::new(events, self.subscribe())
    }
}

/// Marks a tick every `every` until no one listens.
async fn tick(tx: watch::Sender<()>, every: Duration) {
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    // A late tick is not made up for: one comment per idle stream is
    // enough however late it comes.
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => tx.send_replace(()),
            () = tx.closed() => return,
        }
    }
}

/// An event stream with keep-alive comments when it is idle: see the
/// module's documentation.
pub(crate) struct WithKeepAlive<S> {
    events: S,
    /// `None` once the ticker is gone: no comment follows.
    ticks: Option<WatchStream<()>>,
    /// Something was sent since the last tick.
    sent: bool,
}

impl<S> WithKeepAlive<S> {
    fn new(events: S, ticks: watch::Receiver<()>) -> Self {
        Self {
            events,
            ticks: Some(WatchStream::from_changes(ticks)),
            sent: false,
        }
    }
}

impl<S> Stream for WithKeepAlive<S>
where
    S: Stream<Item = Result<SseEvent, Infallible>> + Unpin,
{
    type Item = Result<SseEvent, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match Pin::new(&mut this.events).poll_next(cx) {
            Poll::Ready(Some(event)) => {
                this.sent = true;
                return Poll::Ready(Some(event));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        while let Some(ticks) = this.ticks.as_mut() {
            match Pin::new(ticks).poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => this.ticks = None,
                Poll::Ready(Some(())) if std::mem::take(&mut this.sent) => {}
                Poll::Ready(Some(())) => {
                    return Poll::Ready(Some(Ok(SseEvent::DEFAULT_KEEP_ALIVE)));
                }
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    type Events = UnboundedReceiverStream<Result<SseEvent, Infallible>>;

    /// What the stream has ready now: `e` for an event, `:` for anything
    /// else (a comment).
    fn ready(stream: &mut WithKeepAlive<Events>) -> String {
        let mut seen = String::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(Some(Ok(event))) = stream.poll_next_unpin(&mut cx) {
            let event = format!("{event:?}");
            seen.push(if event.contains(EVENT) { 'e' } else { ':' });
        }
        seen
    }

    const EVENT: &str = "an-event-of-the-stream";

    #[tokio::test]
    async fn a_comment_at_each_tick_that_finds_the_stream_idle_and_only_then() {
        let (tick, ticks) = watch::channel(());
        let (send, events) = mpsc::unbounded_channel();
        let mut stream = WithKeepAlive::new(UnboundedReceiverStream::new(events), ticks);
        assert_eq!(ready(&mut stream), "", "a comment before any tick");
        tick.send_replace(());
        assert_eq!(ready(&mut stream), ":", "an idle stream had no comment");
        tick.send_replace(());
        assert_eq!(ready(&mut stream), ":");
        send.send(Ok(SseEvent::default().data(EVENT))).unwrap();
        assert_eq!(ready(&mut stream), "e");
        tick.send_replace(());
        assert_eq!(ready(&mut stream), "", "a comment right after an event");
        tick.send_replace(());
        assert_eq!(
            ready(&mut stream),
            ":",
            "idle for a whole tick, and no comment"
        );
        assert_eq!(ready(&mut stream), "", "two comments for one tick");
        drop(tick);
        assert_eq!(ready(&mut stream), "");
        drop(send);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(matches!(stream.poll_next_unpin(&mut cx), Poll::Ready(None)));
    }
}
