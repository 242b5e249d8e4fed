//! What the server counts: calls by method and status code, their
//! latency, and open KeepAlive streams — rendered in Prometheus' text
//! format by [`ServerStats::render_prometheus`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A method of the lease service, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Method {
    Acquire,
    Renew,
    Release,
    Get,
    BatchRenew,
    KeepAliveBatch,
    GetAuthority,
    WhoAmI,
}

impl Method {
    const ALL: [Method; 8] = [
        Method::Acquire,
        Method::Renew,
        Method::Release,
        Method::Get,
        Method::BatchRenew,
        Method::KeepAliveBatch,
        Method::GetAuthority,
        Method::WhoAmI,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Method::Acquire => "Acquire",
            Method::Renew => "Renew",
            Method::Release => "Release",
            Method::Get => "Get",
            Method::BatchRenew => "BatchRenew",
            Method::KeepAliveBatch => "KeepAlive",
            Method::GetAuthority => "GetAuthority",
            Method::WhoAmI => "WhoAmI",
        }
    }
}

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Debug, Default, Clone)]
struct PerMethod {
    /// Calls by gRPC status code (index = code as i32).
    by_code: [u64; 17],
    /// Cumulative counts per bucket, plus +Inf last.
    buckets: [u64; BUCKETS.len() + 1],
    sum_seconds: f64,
}

/// One client's calls (KeepAlive: batches) and refusals, by method.
#[derive(Debug, Default, Clone)]
struct PerClient {
    calls: [u64; Method::ALL.len()],
    /// Leases refused because the caller may not act for their owner.
    denied: [u64; Method::ALL.len()],
}

/// Counters of a lease server, shared by all its connections.
#[derive(Debug, Default)]
pub struct ServerStats {
    methods: Mutex<[PerMethod; Method::ALL.len()]>,
    /// By client name: as many as the identities name (plus `anonymous`
    /// or `bearer`), or certificates the client CA signed.
    clients: Mutex<BTreeMap<Arc<str>, PerClient>>,
    open_streams: AtomicI64,
}

impl ServerStats {
    pub(crate) fn record(&self, method: Method, code: tonic::Code, took: Duration) {
        let secs = took.as_secs_f64();
        let mut all = self
            .methods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let m = &mut all[method as usize];
        if let Some(n) = m.by_code.get_mut(code as usize) {
            *n += 1;
        }
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                m.buckets[i] += 1;
            }
        }
        m.buckets[BUCKETS.len()] += 1;
        m.sum_seconds += secs;
    }

    pub(crate) fn record_client(&self, client: Arc<str>, method: Method) {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        clients.entry(client).or_default().calls[method as usize] += 1;
    }

    pub(crate) fn record_denied(&self, client: Arc<str>, method: Method) {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        clients.entry(client).or_default().denied[method as usize] += 1;
    }

    /// Calls (KeepAlive: batches) `client` made of `method` (its gRPC
    /// name), and the leases of them refused because it may not act for
    /// their owner.
    pub fn client_calls(&self, client: &str, method: &str) -> (u64, u64) {
        let clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(m) = Method::ALL.iter().find(|m| m.name() == method) else {
            return (0, 0);
        };
        clients
            .get(client)
            .map_or((0, 0), |c| (c.calls[*m as usize], c.denied[*m as usize]))
    }

    pub(crate) fn stream_opened(&self) {
        self.open_streams.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stream_closed(&self) {
        self.open_streams.fetch_sub(1, Ordering::Relaxed);
    }

    /// Calls answered so far by `method` (its gRPC name, e.g. `"Renew"`)
    /// with `code`.
    pub fn calls(&self, method: &str, code: tonic::Code) -> u64 {
        let all = self
            .methods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Method::ALL
            .iter()
            .find(|m| m.name() == method)
            .map_or(0, |m| all[*m as usize].by_code[code as usize])
    }

    /// KeepAlive streams open now.
    pub fn open_streams(&self) -> i64 {
        self.open_streams.load(Ordering::Relaxed)
    }

    /// Every counter in Prometheus' text exposition format.
    pub fn render_prometheus(&self) -> String {
        let all = self
            .methods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut out = String::new();
        out.push_str("# HELP mecatl_lease_calls_total Lease service calls (KeepAlive: batches) by method and status code.\n");
        out.push_str("# TYPE mecatl_lease_calls_total counter\n");
        for m in Method::ALL {
            for (code, n) in all[m as usize].by_code.iter().enumerate() {
                if *n > 0 {
                    let code = tonic::Code::from_i32(i32::try_from(code).unwrap_or(2));
                    let _ = writeln!(
                        out,
                        "mecatl_lease_calls_total{{method=\"{}\",code=\"{code:?}\"}} {n}",
                        m.name()
                    );
                }
            }
        }
        out.push_str(
            "# HELP mecatl_lease_call_seconds Time to answer a call (KeepAlive: a batch).\n",
        );
        out.push_str("# TYPE mecatl_lease_call_seconds histogram\n");
        for m in Method::ALL {
            let pm = &all[m as usize];
            let total = pm.buckets[BUCKETS.len()];
            if total == 0 {
                continue;
            }
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "mecatl_lease_call_seconds_bucket{{method=\"{}\",le=\"{bound}\"}} {}",
                    m.name(),
                    pm.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "mecatl_lease_call_seconds_bucket{{method=\"{}\",le=\"+Inf\"}} {total}",
                m.name()
            );
            let _ = writeln!(
                out,
                "mecatl_lease_call_seconds_sum{{method=\"{}\"}} {}",
                m.name(),
                pm.sum_seconds
            );
            let _ = writeln!(
                out,
                "mecatl_lease_call_seconds_count{{method=\"{}\"}} {total}",
                m.name()
            );
        }
        self.render_clients(&mut out);
        out.push_str("# HELP mecatl_lease_keepalive_streams KeepAlive streams open now.\n");
        out.push_str("# TYPE mecatl_lease_keepalive_streams gauge\n");
        let _ = writeln!(
            out,
            "mecatl_lease_keepalive_streams {}",
            self.open_streams()
        );
        out
    }
}

impl ServerStats {
    fn render_clients(&self, out: &mut String) {
        let clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        // (metric, help, whether it counts refusals rather than calls)
        let counters = [
            (
                "mecatl_lease_client_calls_total",
                "Lease service calls (KeepAlive: batches) by client and method.",
                false,
            ),
            (
                "mecatl_lease_client_denied_total",
                "Leases refused because the client may not act for their owner, by client and method.",
                true,
            ),
        ];
        for (metric, help, refusals) in counters {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
            for (name, c) in &clients {
                for m in Method::ALL {
                    let n = if refusals { c.denied } else { c.calls }[m as usize];
                    if n > 0 {
                        let _ = writeln!(
                            out,
                            "{metric}{{client=\"{}\",method=\"{}\"}} {n}",
                            label(name),
                            m.name()
                        );
                    }
                }
            }
        }
    }
}

/// A Prometheus label value: a certificate's name may hold any character.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_method_and_code_and_rendered() {
        let stats = ServerStats::default();
        stats.record(Method::Renew, tonic::Code::Ok, Duration::from_micros(200));
        stats.record(
            Method::Renew,
            tonic::Code::Aborted,
            Duration::from_millis(2),
        );
        stats.stream_opened();
        assert_eq!(stats.calls("Renew", tonic::Code::Ok), 1);
        assert_eq!(stats.calls("Renew", tonic::Code::Aborted), 1);
        assert_eq!(stats.calls("Acquire", tonic::Code::Ok), 0);
        let text = stats.render_prometheus();
        assert!(
            text.contains("mecatl_lease_calls_total{method=\"Renew\",code=\"Aborted\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mecatl_lease_call_seconds_bucket{method=\"Renew\",le=\"0.00025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mecatl_lease_call_seconds_count{method=\"Renew\"} 2"),
            "{text}"
        );
        assert!(text.contains("mecatl_lease_keepalive_streams 1"), "{text}");
    }
}
