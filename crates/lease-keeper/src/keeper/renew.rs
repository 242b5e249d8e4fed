//! Renewal: one keeper-wide driver starts each run's renew task shortly
//! before its first renewal can be due, and the task renews about every
//! TTL/3 until the run ends or ownership is lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lease_port::{Lease, LeaseError, LeaseErrorKind};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use super::lock;
use super::run::{LossReason, Run};
use super::state::KeeperCore;
use crate::RenewOutcome;

/// Starts each run's renew task at the last driver tick before its first
/// renewal can be due; the task then sleeps until exactly that moment.
pub(super) async fn renew_driver(
    core: std::sync::Weak<KeeperCore>,
    tick: Duration,
    shutdown: CancellationToken,
) {
    let mut at = Instant::now();
    loop {
        at += tick;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = sleep_until(at) => {}
        }
        let Some(core) = core.upgrade() else {
            return;
        };
        let earliest = core.interval.mul_f64(1.0 - core.jitter);
        let horizon = Instant::now() + tick;
        let due: Vec<(Instant, Arc<Run>)> = {
            let mut pending = lock(&core.pending);
            let mut ids: Vec<u64> = pending
                .iter()
                .filter(|(_, (sent, _))| *sent + earliest <= horizon)
                .map(|(id, _)| *id)
                .collect();
            // In the order the runs began, not the map's: a schedule then
            // depends on the runs alone, and replays.
            ids.sort_unstable();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        for (sent, run) in due {
            if run.stop.is_cancelled() {
                continue;
            }
            let span = info_span!("lease_keeper.renew", session = %run.session);
            let task = tokio::spawn(
                renew_loop(Arc::clone(&core), Arc::clone(&run), sent).instrument(span),
            );
            *lock(&run.renew_task) = Some(task);
        }
    }
}

async fn renew_loop(core: Arc<KeeperCore>, run: Arc<Run>, sent: Instant) {
    // Local deadlines live on the monotonic clock (tokio's): the lease is
    // taken to live `ttl` from when the call that granted or last renewed
    // it was *sent*.
    let mut deadline = sent + core.ttl;
    let mut next = sent + core.next_interval();
    loop {
        tokio::select! {
            biased;
            () = run.stop.cancelled() => return,
            () = sleep_until(next.min(deadline)) => {}
        }
        if Instant::now() >= deadline {
            run.lose(&core, LossReason::Expired);
            return;
        }
        let Some(current) = run.current() else {
            return;
        };
        let t0 = Instant::now();
        let answer = tokio::select! {
            biased;
            () = run.stop.cancelled() => return,
            r = timeout_at(deadline, core.backend.renew(&current)) => r,
        };
        let latency = t0.elapsed();
        let Ok(answer) = answer else {
            expire_unanswered(&core, &run, latency);
            return;
        };
        match settle(&core, &run, &current, answer, latency) {
            Settled::Renewed => {
                run.renewed_at(&core, t0);
                deadline = t0 + core.ttl;
                next = t0 + core.next_interval();
            }
            Settled::Retry => next = Instant::now() + core.retry_interval(),
            Settled::Over => return,
        }
    }
}

/// What a run does after one renewal answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// Renewed and stored: the lease now lives `ttl` from when the call
    /// that renewed it was sent.
    Renewed,
    /// A passing fault: try again soon, until the unchanged deadline.
    Retry,
    /// The run lost its lease, or ended while the call was out: renew it
    /// no more.
    Over,
}

/// Applies one renewal answer for `run`, whose call passed `current` and
/// answered before the run's deadline. The same rules hold whether the
/// answer came from `renew` or as one result of `renew_many`.
pub(super) fn settle(
    core: &KeeperCore,
    run: &Run,
    current: &Lease,
    answer: Result<Lease, LeaseError>,
    latency: Duration,
) -> Settled {
    match answer {
        Ok(renewed) => {
            core.backend_answered(None);
            core.metrics.renew_latency(latency, RenewOutcome::Renewed);
            if renewed.token() != current.token()
                || renewed.owner() != current.owner()
                || renewed.session_id() != current.session_id()
            {
                warn!(
                    ?renewed,
                    "renew changed the token, owner or session; treating as loss"
                );
                run.lose(
                    core,
                    LossReason::Rejected {
                        kind: LeaseErrorKind::Invalid,
                    },
                );
                return Settled::Over;
            }
            if run.store_renewed(renewed) {
                Settled::Renewed
            } else {
                Settled::Over
            }
        }
        Err(e) => match e.kind() {
            LeaseErrorKind::Held => {
                core.metrics.renew_latency(latency, RenewOutcome::Held);
                run.lose(
                    core,
                    LossReason::Held {
                        holder: e.holder().cloned(),
                    },
                );
                Settled::Over
            }
            LeaseErrorKind::Transient => {
                core.backend_answered(Some(e.to_string()));
                core.metrics.renew_latency(latency, RenewOutcome::Transient);
                debug!(session = %run.session, error = %e, "renew failed transiently; retrying until the lease's expiry");
                Settled::Retry
            }
            kind => {
                core.metrics.renew_latency(latency, RenewOutcome::Failed);
                if kind == LeaseErrorKind::Rewound {
                    core.backend_answered(Some(e.to_string()));
                } else if kind == LeaseErrorKind::Unsupported {
                    if !core.allow_unleased {
                        core.backend_answered(Some(e.to_string()));
                    } else if !core.unsupported.swap(true, Ordering::AcqRel) {
                        warn!(error = %e, "lease backend does not support leases; later runs go unleased");
                    }
                }
                run.lose(core, LossReason::Rejected { kind });
                Settled::Over
            }
        },
    }
}

/// A renewal that did not answer before the run's deadline: the lease
/// must be taken as lost.
pub(super) fn expire_unanswered(core: &KeeperCore, run: &Run, latency: Duration) {
    core.backend_answered(Some(
        "renew did not answer before the lease's expiry".into(),
    ));
    core.metrics.renew_latency(latency, RenewOutcome::Failed);
    run.lose(core, LossReason::Expired);
}
