//! One KeepAlive stream per client, shared by every batch of renewals:
//! batches go out tagged with an id, a reader task hands each answer to
//! the batch that waits for it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status};

use super::Client;
use crate::pb;
use crate::status::{Refusal, from_status};

type Answer = Result<Vec<pb::RenewResult>, Status>;
/// The batches waiting for their answers, by id: ordered, so a broken
/// stream tells its waiters in the order they sent, whatever the process's
/// hash seed, and a simulated run replays.
type Pending = Arc<Mutex<BTreeMap<u64, oneshot::Sender<Answer>>>>;

/// Batches that may queue for sending on one stream.
const OUTBOX: usize = 16;

#[derive(Default)]
pub(super) struct KeepAliveLink {
    stream: tokio::sync::Mutex<Option<Stream>>,
    next_id: AtomicU64,
}

struct Stream {
    outbox: mpsc::Sender<pb::KeepAliveRequest>,
    pending: Pending,
    broken: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KeepAliveLink {
    /// Renews one batch over the stream, opening it first if there is
    /// none or the last one broke. `MethodMissing` when the server has no
    /// KeepAlive; any other failure applies to the whole batch.
    pub(super) async fn renew(
        &self,
        client: &Client,
        leases: Vec<pb::LeaseRef>,
        timeout: Duration,
    ) -> Result<Vec<pb::RenewResult>, Refusal> {
        let deadline = tokio::time::Instant::now() + timeout;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (outbox, pending, broken) = {
            let mut slot = self.stream.lock().await;
            if slot
                .as_ref()
                .is_none_or(|s| s.broken.load(Ordering::Acquire))
            {
                let opened = tokio::time::timeout_at(deadline, open(client.clone()))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::deadline_exceeded(
                            "opening the KeepAlive stream timed out",
                        ))
                    })
                    .map_err(|s| from_status(&s, true))?;
                *slot = Some(opened);
            }
            let s = slot.as_ref().expect("opened above");
            (
                s.outbox.clone(),
                Arc::clone(&s.pending),
                Arc::clone(&s.broken),
            )
        };
        lock(&pending).insert(id, tx);
        let batch = pb::KeepAliveRequest {
            batch_id: id,
            leases,
        };
        let closed = || Status::unavailable("the KeepAlive stream closed");
        let answer = match tokio::time::timeout_at(deadline, outbox.send(batch)).await {
            Err(_) => None,
            Ok(Err(_)) => Some(Err(closed())),
            Ok(Ok(())) => match tokio::time::timeout_at(deadline, rx).await {
                Err(_) => None,
                Ok(Err(_)) => Some(Err(closed())),
                Ok(Ok(answer)) => Some(answer),
            },
        };
        match answer {
            Some(Ok(results)) => Ok(results),
            Some(Err(status)) => {
                lock(&pending).remove(&id);
                Err(from_status(&status, false))
            }
            None => {
                lock(&pending).remove(&id);
                // A stream that sat on a batch past its deadline may sit on
                // the next one too: start a fresh one next time.
                broken.store(true, Ordering::Release);
                Err(from_status(
                    &Status::deadline_exceeded("the KeepAlive answer did not come in time"),
                    false,
                ))
            }
        }
    }
}

async fn open(mut client: Client) -> Result<Stream, Status> {
    let (outbox, requests) = mpsc::channel(OUTBOX);
    let response = client
        .keep_alive(Request::new(ReceiverStream::new(requests)))
        .await?;
    let mut answers = response.into_inner();
    let pending: Pending = Arc::default();
    let broken = Arc::new(AtomicBool::new(false));
    let (p, b) = (Arc::clone(&pending), Arc::clone(&broken));
    tokio::spawn(async move {
        let end = loop {
            match answers.next().await {
                Some(Ok(answer)) => {
                    if let Some(waiter) = lock(&p).remove(&answer.batch_id) {
                        let _ = waiter.send(Ok(answer.results));
                    }
                }
                Some(Err(status)) => break status,
                None => break Status::unavailable("the lease service closed the KeepAlive stream"),
            }
        };
        b.store(true, Ordering::Release);
        for (_, waiter) in std::mem::take(&mut *lock(&p)) {
            let _ = waiter.send(Err(end.clone()));
        }
    });
    Ok(Stream {
        outbox,
        pending,
        broken,
    })
}
