//! Process metrics, rendered in the Prometheus text format at `/metrics`.
//!
//! Plain atomics rather than a metrics framework: the set is small and
//! fixed, and the lease keeper reports through [`KeeperMetrics`] hooks that
//! must stay cheap.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use lease_keeper::{KeeperErrorKind, KeeperMetrics, LossReason, RenewOutcome};
use lease_port::SessionId;

/// Upper bounds (seconds) of the renew latency histogram.
const RENEW_BUCKETS: [f64; 10] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// How a run ended, for `mecated_runs_total{outcome}`.
#[derive(Debug, Clone, Copy)]
pub enum RunOutcome {
    /// The agent finished.
    Completed,
    /// The agent or a write failed.
    Failed,
    /// Cancelled by a client, or by shutdown when resumption is off.
    Cancelled,
    /// Stopped because the lease was lost.
    LeaseLost,
    /// Cut off by shutdown, left for the next owner to run again.
    Interrupted,
}

/// Every metric of the process.
#[derive(Debug, Default)]
pub struct Metrics {
    runs_active: AtomicU64,
    runs: [AtomicU64; 5],
    resumed: AtomicU64,
    resume_sweeps: AtomicU64,
    held: AtomicU64,
    acquisitions: AtomicU64,
    acquire_failures: [AtomicU64; 5],
    losses: AtomicU64,
    releases_ok: AtomicU64,
    releases_failed: AtomicU64,
    renew_buckets: [AtomicU64; RENEW_BUCKETS.len()],
    renew_count: AtomicU64,
    renew_sum_nanos: AtomicU64,
    renew_failures: AtomicU64,
    tokens: AtomicU64,
    token_file_reads: [AtomicU64; 2],
}

impl Metrics {
    /// A run started.
    pub fn run_started(&self) {
        self.runs_active.fetch_add(1, Relaxed);
    }

    /// A run ended.
    pub fn run_ended(&self, outcome: RunOutcome) {
        self.runs_active.fetch_sub(1, Relaxed);
        self.runs[outcome as usize].fetch_add(1, Relaxed);
    }

    /// A run of an interrupted run's input started.
    pub fn run_resumed(&self) {
        self.resumed.fetch_add(1, Relaxed);
    }

    /// A look through the store for interrupted runs to resume ended.
    pub fn resume_sweep_done(&self) {
        self.resume_sweeps.fetch_add(1, Relaxed);
    }

    /// The token file was read (at start-up or a reload): `tokens` are in
    /// force now.
    pub fn token_file_read(&self, tokens: usize) {
        self.tokens.store(tokens as u64, Relaxed);
        self.token_file_reads[0].fetch_add(1, Relaxed);
    }

    /// A reload of the token file was refused; the tokens in force stay.
    pub fn token_file_refused(&self) {
        self.token_file_reads[1].fetch_add(1, Relaxed);
    }

    /// Lease losses so far.
    pub fn losses(&self) -> u64 {
        self.losses.load(Relaxed)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let g = |v: &AtomicU64| v.load(Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        metric(
            "mecated_runs_active",
            "gauge",
            "Runs in progress.",
            &[(String::new(), g(&self.runs_active))],
        );
        let outcomes = [
            "completed",
            "failed",
            "cancelled",
            "lease_lost",
            "interrupted",
        ];
        let runs: Vec<_> = outcomes
            .iter()
            .zip(&self.runs)
            .map(|(o, v)| (format!("{{outcome=\"{o}\"}}"), g(v)))
            .collect();
        metric(
            "mecated_runs_total",
            "counter",
            "Runs finished, by outcome.",
            &runs,
        );
        metric(
            "mecated_runs_resumed_total",
            "counter",
            "Runs started to run an interrupted run's input again.",
            &[(String::new(), g(&self.resumed))],
        );
        metric(
            "mecated_resume_sweeps_total",
            "counter",
            "Looks through the store for interrupted runs to resume that ended (one at start-up).",
            &[(String::new(), g(&self.resume_sweeps))],
        );
        metric(
            "mecated_session_leases_held",
            "gauge",
            "Session leases this process holds.",
            &[(String::new(), g(&self.held))],
        );
        metric(
            "mecated_session_lease_acquisitions_total",
            "counter",
            "Session leases acquired.",
            &[(String::new(), g(&self.acquisitions))],
        );
        let kinds = [
            "leased_elsewhere",
            "unavailable",
            "busy",
            "shutting_down",
            "invalid",
        ];
        let failures: Vec<_> = kinds
            .iter()
            .zip(&self.acquire_failures)
            .map(|(k, v)| (format!("{{kind=\"{k}\"}}"), g(v)))
            .collect();
        metric(
            "mecated_session_lease_acquire_failures_total",
            "counter",
            "Failed acquisitions, by kind.",
            &failures,
        );
        metric(
            "mecated_session_lease_losses_total",
            "counter",
            "Leases lost while a run held them.",
            &[(String::new(), g(&self.losses))],
        );
        metric(
            "mecated_session_lease_releases_total",
            "counter",
            "Lease releases, by result.",
            &[
                ("{result=\"ok\"}".into(), g(&self.releases_ok)),
                ("{result=\"failed\"}".into(), g(&self.releases_failed)),
            ],
        );
        metric(
            "mecated_session_lease_renew_failures_total",
            "counter",
            "Renewal calls that did not extend the lease.",
            &[(String::new(), g(&self.renew_failures))],
        );
        self.render_renew_histogram(&mut out);
        self.render_auth(&mut out);
        out
    }

    /// The renewal latency histogram, whose samples are not one value per label.
    fn render_renew_histogram(&self, out: &mut String) {
        let g = |v: &AtomicU64| v.load(Relaxed);
        let _ = writeln!(
            out,
            "# HELP mecated_session_lease_renew_seconds Latency of renewal calls.\n# TYPE mecated_session_lease_renew_seconds histogram"
        );
        for (bound, count) in RENEW_BUCKETS.iter().zip(&self.renew_buckets) {
            let _ = writeln!(
                out,
                "mecated_session_lease_renew_seconds_bucket{{le=\"{bound}\"}} {}",
                g(count)
            );
        }
        let total = g(&self.renew_count);
        let _ = writeln!(
            out,
            "mecated_session_lease_renew_seconds_bucket{{le=\"+Inf\"}} {total}\nmecated_session_lease_renew_seconds_sum {}\nmecated_session_lease_renew_seconds_count {total}",
            g(&self.renew_sum_nanos) as f64 / 1e9
        );
    }

    /// The token file's metrics, in the Prometheus text format.
    fn render_auth(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP mecated_auth_tokens Bearer tokens in force (0 without --token-file).\n\
             # TYPE mecated_auth_tokens gauge\nmecated_auth_tokens {}",
            self.tokens.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP mecated_auth_token_file_reads_total Readings of the token file (at start-up, \
             on SIGHUP, when it changed), by outcome: a refused one keeps the tokens in force.\n\
             # TYPE mecated_auth_token_file_reads_total counter"
        );
        for (outcome, count) in ["read", "refused"].iter().zip(&self.token_file_reads) {
            let _ = writeln!(
                out,
                "mecated_auth_token_file_reads_total{{outcome=\"{outcome}\"}} {}",
                count.load(Relaxed)
            );
        }
    }
}

impl KeeperMetrics for Metrics {
    fn held_leases(&self, count: usize) {
        self.held.store(count as u64, Relaxed);
    }

    fn acquired(&self, _: &SessionId) {
        self.acquisitions.fetch_add(1, Relaxed);
    }

    fn acquire_failed(&self, _: &SessionId, kind: KeeperErrorKind) {
        let idx = match kind {
            KeeperErrorKind::LeasedElsewhere => 0,
            KeeperErrorKind::Unavailable => 1,
            KeeperErrorKind::Busy => 2,
            KeeperErrorKind::ShuttingDown => 3,
            _ => 4,
        };
        self.acquire_failures[idx].fetch_add(1, Relaxed);
    }

    fn lost(&self, _: &SessionId, _: &LossReason) {
        self.losses.fetch_add(1, Relaxed);
    }

    fn renew_latency(&self, latency: Duration, outcome: RenewOutcome) {
        // Cumulative buckets: every bound at or above the sample counts it.
        let secs = latency.as_secs_f64();
        for (bound, count) in RENEW_BUCKETS.iter().zip(&self.renew_buckets) {
            if secs <= *bound {
                count.fetch_add(1, Relaxed);
            }
        }
        self.renew_count.fetch_add(1, Relaxed);
        self.renew_sum_nanos.fetch_add(
            u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX),
            Relaxed,
        );
        if outcome != RenewOutcome::Renewed {
            self.renew_failures.fetch_add(1, Relaxed);
        }
    }

    fn released(&self, _: &SessionId, ok: bool) {
        let counter = if ok {
            &self.releases_ok
        } else {
            &self.releases_failed
        };
        counter.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_cumulative_buckets() {
        let m = Metrics::default();
        m.run_started();
        m.run_ended(RunOutcome::LeaseLost);
        m.run_resumed();
        m.renew_latency(Duration::from_millis(2), RenewOutcome::Renewed);
        m.renew_latency(Duration::from_secs(5), RenewOutcome::Transient);
        let text = m.render();
        assert!(text.contains("mecated_runs_total{outcome=\"lease_lost\"} 1"));
        assert!(text.contains("mecated_runs_active 0"));
        assert!(text.contains("mecated_runs_resumed_total 1"));
        assert!(text.contains("mecated_session_lease_renew_seconds_bucket{le=\"0.0025\"} 1"));
        assert!(text.contains("mecated_session_lease_renew_seconds_bucket{le=\"2.5\"} 1"));
        assert!(text.contains("mecated_session_lease_renew_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("mecated_session_lease_renew_failures_total 1"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
        }
    }
}
