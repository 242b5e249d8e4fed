//! N live runs held by one `mecated` process: its CPU over a steady
//! window and its resident memory, and a check that every run was held
//! the whole time and ended cleanly when cancelled.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::http::{Conn, start_run};
use super::process::Binaries;
use super::rig::{Backend, ReplicaPlan, Rig};
use crate::Result;

/// Client threads creating sessions and starting runs: enough to keep a
/// server busy, few enough to leave it the cores.
const CLIENT_THREADS: usize = 8;

/// One backend at one size.
#[derive(Debug, Clone)]
pub(super) struct LiveFigure {
    pub(super) backend: Backend,
    pub(super) runs: usize,
    /// The server's CPU over the window, as a share of one core.
    pub(super) cpu_share: f64,
    /// Resident memory with the runs held, less that before any started.
    pub(super) rss_growth_kib: u64,
    /// Kubernetes API requests per renewal period (a third of the TTL)
    /// over the window, on that backend.
    pub(super) api_requests_per_period: Option<f64>,
}

/// How a live-run measurement goes.
pub(super) struct LivePlan {
    pub(super) ttl: Duration,
    /// Measured once every run started and a renewal period passed.
    pub(super) window: Duration,
}

fn session(i: usize) -> String {
    format!("live-{i:05}")
}

/// `f(i, conn)` for every `i` below `n`, on [`CLIENT_THREADS`] threads with
/// a connection each.
fn each(base: &str, n: usize, f: impl Fn(usize, &mut Conn) -> Result + Sync) -> Result {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..CLIENT_THREADS.min(n.max(1)))
            .map(|t| {
                let f = &f;
                scope.spawn(move || -> Result {
                    let mut conn = Conn::open(base)?;
                    for i in (t..n).step_by(CLIENT_THREADS) {
                        f(i, &mut conn)?;
                    }
                    Ok(())
                })
            })
            .collect();
        threads.into_iter().try_for_each(|t| {
            t.join()
                .map_err(|_| "a client thread panicked".to_string())?
        })
    })
}

/// The server's metric `name` (with its labels, as printed).
pub(super) fn metric(conn: &mut Conn, name: &str) -> Result<f64> {
    let answer = conn.call("GET", "/metrics", None)?;
    let text = answer.body.as_str().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("/metrics has no {name}"))
}

/// How the server's runs ended so far and how its leases fared, from its
/// metrics.
fn run_counts(conn: &mut Conn) -> Result<String> {
    let answer = conn.call("GET", "/metrics", None)?;
    let text = answer.body.as_str().unwrap_or_default();
    Ok(text
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.starts_with("mecated_runs_")
                    || l.contains("_losses_")
                    || l.contains("_failures_"))
        })
        .collect::<Vec<_>>()
        .join(", "))
}

/// Polls `metric` until it reads `want`, for at most `patience`.
pub(super) fn await_metric(conn: &mut Conn, name: &str, want: f64, patience: Duration) -> Result {
    let start = Instant::now();
    loop {
        let now = metric(conn, name)?;
        if now == want {
            return Ok(());
        }
        if start.elapsed() > patience {
            return Err(format!("{name} is {now} after {patience:?}, not {want}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn create_sessions(base: &str, n: usize, name: fn(usize) -> String) -> Result {
    each(base, n, |i, conn| {
        let answer = conn.call("POST", "/v1/sessions", Some(&json!({ "id": name(i) })))?;
        match answer.status {
            201 => Ok(()),
            s => Err(format!("create {}: {s} {}", name(i), answer.body)),
        }
    })
}

/// Measures `runs` live runs on `backend`.
pub(super) fn live(
    backend: Backend,
    runs: usize,
    plan: &LivePlan,
    bins: &Binaries,
) -> Result<LiveFigure> {
    let mut rig = Rig::start(backend, bins, plan.ttl)?;
    let mut server = rig.replica(&ReplicaPlan {
        ttl: plan.ttl,
        // Longer than the measurement by far: every run is cancelled.
        run_length: Duration::from_secs(3600),
        shutdown_timeout: Duration::from_secs(10),
    })?;
    let base = server.address.clone();
    create_sessions(&base, runs, session)?;
    let mut conn = Conn::open(&base)?;
    std::thread::sleep(Duration::from_secs(1));
    let idle_rss = server.rss_kib()?;
    each(&base, runs, |i, _| {
        let answer = start_run(&base, &session(i), None)?;
        match answer.status {
            200 => Ok(()),
            s => Err(format!("a run of {}: {s} {}", session(i), answer.body)),
        }
    })?;
    await_metric(&mut conn, "mecated_runs_active", runs as f64, plan.ttl * 2)?;
    // A renewal of every lease before the window, so it holds the steady
    // state, not the starts.
    std::thread::sleep(plan.ttl / 2);
    let (cpu_before, clock, api_before) = (server.cpu_time()?, Instant::now(), rig.api_requests());
    std::thread::sleep(plan.window);
    let elapsed = clock.elapsed().as_secs_f64();
    let cpu_share = (server.cpu_time()? - cpu_before).as_secs_f64() / elapsed;
    let periods = elapsed / (plan.ttl / 3).as_secs_f64();
    let api_requests_per_period = rig
        .api_requests()
        .zip(api_before)
        .map(|(after, before)| (after - before) as f64 / periods);
    let rss = server.rss_kib()?;
    check_requests(backend, runs, api_requests_per_period)?;
    check_held(&mut conn, backend, runs).map_err(|e| {
        let counts = run_counts(&mut conn).unwrap_or_else(|e| e);
        format!(
            "{e}\n  server metrics: {counts}\n  its log ends:\n{}",
            server.last_words()
        )
    })?;
    cancel_all(&base, &mut conn, runs)?;
    let clean = server.terminate(Duration::from_secs(30))?;
    if !clean {
        return Err(format!(
            "{}: mecated exited uncleanly on SIGTERM",
            backend.name()
        ));
    }
    drop(rig);
    Ok(LiveFigure {
        backend,
        runs,
        cpu_share,
        rss_growth_kib: rss.saturating_sub(idle_rss),
        api_requests_per_period,
    })
}

/// Renewing many sessions costs the Kubernetes API a few requests per
/// period, not some for each: at a hundred sessions or more, fewer than
/// one for every two sessions (a count, whatever the time it took).
fn check_requests(backend: Backend, runs: usize, per_period: Option<f64>) -> Result {
    match per_period {
        Some(n) if runs >= 100 && n >= runs as f64 / 2.0 => Err(format!(
            "{}: {n:.1} API requests per renewal period for {runs} sessions",
            backend.name()
        )),
        _ => Ok(()),
    }
}

/// Every run still going, under its lease, none lost on the way.
fn check_held(conn: &mut Conn, backend: Backend, runs: usize) -> Result {
    let active = metric(conn, "mecated_runs_active")?;
    if active != runs as f64 {
        return Err(format!(
            "{}: {active} runs active of {runs}",
            backend.name()
        ));
    }
    if !backend.leased() {
        return Ok(());
    }
    let held = metric(conn, "mecated_session_leases_held")?;
    let lost = metric(conn, "mecated_session_lease_losses_total")?;
    if held != runs as f64 || lost != 0.0 {
        return Err(format!(
            "{}: {held} leases held and {lost} lost, with {runs} runs",
            backend.name()
        ));
    }
    for i in 0..runs {
        let lease = conn.call("GET", &format!("/v1/sessions/{}/lease", session(i)), None)?;
        if lease.body["state"] != "held" {
            return Err(format!("{}: lease {}", session(i), lease.body));
        }
    }
    Ok(())
}

/// Cancels every run, then checks each ended `cancelled` in its log.
fn cancel_all(base: &str, conn: &mut Conn, runs: usize) -> Result {
    each(base, runs, |i, conn| {
        let path = format!("/v1/sessions/{}/runs/current", session(i));
        let answer = conn.call("DELETE", &path, None)?;
        match answer.status {
            202 if answer.body["live"] != false => Ok(()),
            s => Err(format!("cancel {}: {s} {}", session(i), answer.body)),
        }
    })?;
    await_metric(conn, "mecated_runs_active", 0.0, Duration::from_secs(60))?;
    each(base, runs, |i, conn| {
        let ended = last_run_end(conn, &session(i))?;
        match ended.as_deref() {
            Some("cancelled") => Ok(()),
            other => Err(format!("{}: its run ended {other:?}", session(i))),
        }
    })
}

/// The events of `session`, from the first.
pub(super) fn events(conn: &mut Conn, session: &str) -> Result<Vec<Value>> {
    let answer = conn.call("GET", &format!("/v1/sessions/{session}/events"), None)?;
    match (answer.status, answer.body["events"].as_array()) {
        (200, Some(events)) if answer.body["next_after"].is_null() => Ok(events.clone()),
        (status, _) => Err(format!("events of {session}: {status} {}", answer.body)),
    }
}

/// How the session's last run ended, if its end is recorded.
fn last_run_end(conn: &mut Conn, session: &str) -> Result<Option<String>> {
    Ok(events(conn, session)?
        .iter()
        .rev()
        .find(|e| e["payload"]["type"] == "run_ended")
        .and_then(|e| e["payload"]["status"].as_str().map(str::to_owned)))
}

/// The figure of `backend` at `runs`, if measured.
pub(super) fn find(figures: &[LiveFigure], backend: Backend, runs: usize) -> Option<&LiveFigure> {
    figures
        .iter()
        .find(|f| f.backend == backend && f.runs == runs)
}

impl LiveFigure {
    /// The server's CPU as % of one core.
    pub(super) fn cpu_percent(&self) -> f64 {
        self.cpu_share * 100.0
    }
}
