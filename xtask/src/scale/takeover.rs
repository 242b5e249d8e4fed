//! Takeover latency: a replica holding a run is killed (SIGKILL) or
//! stopped (SIGTERM), and another replica that keeps asking for the
//! session gets its first run of it. The time between, against the TTL.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::http::{Conn, start_run};
use super::live::events;
use super::process::Binaries;
use super::rig::{Backend, ReplicaPlan, Rig};
use crate::Result;

/// How a takeover measurement goes.
pub(super) struct TakeoverPlan {
    pub(super) ttl: Duration,
    pub(super) repeats: usize,
}

/// The bound on a stopped holder's shutdown, the server's default: it
/// cancels its runs at once and releases their leases within it.
pub(super) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// One backend's takeovers after one signal.
#[derive(Debug, Clone)]
pub(super) struct TakeoverFigure {
    pub(super) backend: Backend,
    pub(super) signal: Signal,
    pub(super) ttl: Duration,
    pub(super) times: Vec<Duration>,
}

impl TakeoverFigure {
    pub(super) fn median(&self) -> Duration {
        let mut t = self.times.clone();
        t.sort();
        t.get(t.len() / 2).copied().unwrap_or_default()
    }

    pub(super) fn in_ttls(&self) -> f64 {
        self.median().as_secs_f64() / self.ttl.as_secs_f64()
    }
}

/// Both signals' takeovers on `backend`.
pub(super) fn takeovers(
    backend: Backend,
    plan: &TakeoverPlan,
    bins: &Binaries,
) -> Result<Vec<TakeoverFigure>> {
    let mut rig = Rig::start(backend, bins, plan.ttl)?;
    let replica = ReplicaPlan {
        ttl: plan.ttl,
        run_length: Duration::from_secs(3600),
        shutdown_timeout: SHUTDOWN_TIMEOUT,
    };
    let taker = rig.replica(&replica)?;
    let mut figures = Vec::new();
    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        let mut times = Vec::new();
        for repeat in 0..plan.repeats {
            let session = format!("takeover-{}-{repeat}", signal.as_str().to_lowercase());
            times.push(once(&mut rig, &replica, &taker.address, &session, signal)?);
        }
        figures.push(TakeoverFigure {
            backend,
            signal,
            ttl: plan.ttl,
            times,
        });
    }
    drop(taker);
    drop(rig);
    Ok(figures)
}

/// One takeover of `session` by the replica at `taker`.
fn once(
    rig: &mut Rig,
    replica: &ReplicaPlan,
    taker: &str,
    session: &str,
    signal: Signal,
) -> Result<Duration> {
    let name = rig.backend.name();
    let mut holder = rig.replica(replica)?;
    create(&holder.address, session)?;
    let started = start_run(&holder.address, session, None)?;
    if started.status != 200 {
        return Err(format!("{name}: the holder's run: {}", started.body));
    }
    // Mid-way between renewals, as a crash would fall.
    std::thread::sleep(replica.ttl / 2);
    let signalled = Instant::now();
    holder.signal(signal)?;
    loop {
        let answer = start_run(taker, session, Some("60s"))?;
        match answer.status {
            200 => break,
            409 | 503 if signalled.elapsed() < replica.ttl * 20 => continue,
            s => {
                return Err(format!(
                    "{name}: no takeover after {signal}: {s} {}",
                    answer.body
                ));
            }
        }
    }
    let took = signalled.elapsed();
    if signal == Signal::SIGTERM && !holder.terminate(Duration::from_secs(30))? {
        return Err(format!("{name}: the holder exited uncleanly on SIGTERM"));
    }
    holder.kill();
    check_log(taker, session, name, signal)?;
    Ok(took)
}

fn create(base: &str, session: &str) -> Result {
    let body = serde_json::json!({ "id": session });
    let answer = Conn::open(base)?.call("POST", "/v1/sessions", Some(&body))?;
    match answer.status {
        201 => Ok(()),
        s => Err(format!("create {session}: {s} {}", answer.body)),
    }
}

/// The log shows the holder's run, then the taker's under a greater token
/// (a stopped holder's run ended `cancelled` between them; a killed one's
/// has no end); the taker's run is then cancelled and ends so.
fn check_log(taker: &str, session: &str, name: &str, signal: Signal) -> Result {
    let mut conn = Conn::open(taker)?;
    let log = events(&mut conn, session)?;
    let kinds: Vec<(&str, &str, u64)> = log
        .iter()
        .filter_map(|e| {
            let p = &e["payload"];
            Some((
                p["type"].as_str()?,
                p["status"].as_str().unwrap_or(""),
                e["token"].as_u64()?,
            ))
        })
        .collect();
    let starts: Vec<u64> = kinds
        .iter()
        .filter(|(k, ..)| *k == "run_started")
        .map(|&(.., t)| t)
        .collect();
    let ended_cancelled = starts
        .first()
        .is_some_and(|&t| kinds.contains(&("run_ended", "cancelled", t)));
    let shape_ok = matches!(kinds.first(), Some(("run_started", ..)))
        && matches!(kinds.last(), Some(("run_started", ..)))
        && starts.len() == 2
        && starts[1] > starts[0]
        && (signal != Signal::SIGTERM || ended_cancelled);
    if !shape_ok {
        return Err(format!(
            "{name}: {session}'s log after the takeover: {kinds:?}"
        ));
    }
    let path = format!("/v1/sessions/{session}/runs/current");
    let answer = conn.call("DELETE", &path, None)?;
    if answer.status != 202 {
        return Err(format!(
            "{name}: cancel {session}: {} {}",
            answer.status, answer.body
        ));
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let last = events(&mut conn, session)?;
        if last.last().is_some_and(|e| {
            e["payload"]["type"] == "run_ended" && e["payload"]["status"] == "cancelled"
        }) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "{name}: the taker's run of {session} did not end cancelled"
    ))
}
