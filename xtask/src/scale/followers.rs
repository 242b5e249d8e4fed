//! Idle SSE followers of live runs on one `mecated`: what holding them
//! costs the server (CPU over a steady window, against the same server
//! with the same runs and no follower; resident memory per follower), and
//! a check that every follower, once the runs are cancelled, received the
//! end of its run and then the stream's `end`.
//!
//! The followers are real connections to the real binary, each reading
//! the event stream of one session, several per session: the shape a chat
//! backend with many browser tabs open has.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::http::{Conn, FollowStream, SseEvents, open_follow, start_run};
use super::live::{LivePlan, await_metric, create_sessions, metric};
use super::process::Binaries;
use super::rig::{Backend, ReplicaPlan, Rig};
use crate::Result;

/// Client threads opening and reading followers.
const CLIENT_THREADS: usize = 8;

/// One size: `followers` connections spread evenly over `sessions`.
#[derive(Debug, Clone, Copy)]
pub(super) struct FollowerSize {
    pub(super) sessions: usize,
    pub(super) followers: usize,
}

/// What one size measured.
#[derive(Debug, Clone)]
pub(super) struct FollowerFigure {
    pub(super) size: FollowerSize,
    /// The server's CPU with the runs held and no follower, as a share of
    /// one core.
    pub(super) cpu_without: f64,
    /// The same with every follower connected and idle.
    pub(super) cpu_with: f64,
    /// Resident memory the followers added.
    pub(super) rss_growth_kib: u64,
}

impl FollowerFigure {
    /// What the idle followers cost, in % of one core (never below 0: the
    /// window is read in clock ticks, and noise can go either way).
    pub(super) fn added_cpu_percent(&self) -> f64 {
        ((self.cpu_with - self.cpu_without) * 100.0).max(0.0)
    }

    pub(super) fn rss_per_follower_kib(&self) -> f64 {
        self.rss_growth_kib as f64 / self.size.followers as f64
    }
}

fn session(i: usize) -> String {
    format!("followed-{i:05}")
}

/// `f(i)` for every `i` below `n`, on [`CLIENT_THREADS`] threads.
fn each<T: Send>(n: usize, f: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..CLIENT_THREADS.min(n.max(1)))
            .map(|t| {
                let f = &f;
                scope.spawn(move || -> Result<Vec<(usize, T)>> {
                    (t..n)
                        .step_by(CLIENT_THREADS)
                        .map(|i| Ok((i, f(i)?)))
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(n);
        for t in threads {
            all.extend(
                t.join()
                    .map_err(|_| "a client thread panicked".to_string())??,
            );
        }
        all.sort_by_key(|(i, _)| *i);
        Ok(all.into_iter().map(|(_, t)| t).collect())
    })
}

/// Raises this process's open-file limit to its hard limit, so ten
/// thousand sockets here (and in the servers it starts, which inherit
/// it) fit where the default soft limit is 1,024.
fn raise_open_file_limit(needed: u64) -> Result {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| e.to_string())?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|e| e.to_string())?;
    }
    if hard < needed {
        return Err(format!(
            "{needed} followers need as many open files, and the hard limit is {hard} \
             (raise it with `ulimit -Hn` or in /etc/security/limits.conf)"
        ));
    }
    Ok(())
}

/// The server's CPU share over `window`.
fn cpu_share(server: &super::process::Process, window: Duration) -> Result<f64> {
    let (before, clock) = (server.cpu_time()?, Instant::now());
    std::thread::sleep(window);
    Ok((server.cpu_time()? - before).as_secs_f64() / clock.elapsed().as_secs_f64())
}

/// Measures `size` idle followers of live runs under file leases.
pub(super) fn followers(
    size: FollowerSize,
    plan: &LivePlan,
    bins: &Binaries,
) -> Result<FollowerFigure> {
    // Sockets on both ends, and the server's own files beside them.
    raise_open_file_limit(size.followers as u64 + 1024)?;
    let mut rig = Rig::start(Backend::File, bins, plan.ttl)?;
    let server = rig.replica(&ReplicaPlan {
        ttl: plan.ttl,
        run_length: Duration::from_secs(3600),
        shutdown_timeout: Duration::from_secs(10),
    })?;
    let base = server.address.clone();
    create_sessions(&base, size.sessions, session)?;
    each(size.sessions, |i| {
        let answer = start_run(&base, &session(i), None)?;
        match answer.status {
            200 => Ok(()),
            s => Err(format!("a run of {}: {s} {}", session(i), answer.body)),
        }
    })?;
    let mut conn = Conn::open(&base)?;
    await_metric(
        &mut conn,
        "mecated_runs_active",
        size.sessions as f64,
        plan.ttl * 2,
    )?;
    std::thread::sleep(plan.ttl / 2);
    let cpu_without = cpu_share(&server, plan.window)?;
    let rss_before = server.rss_kib()?;
    let streams = each(size.followers, |i| {
        open_follow(&base, &session(i % size.sessions))
    })?;
    // Each follower has caught up and waits on its session's tail.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = server.rss_kib()?;
    let cpu_with = cpu_share(&server, plan.window)?;
    let active = metric(&mut conn, "mecated_runs_active")?;
    if active != size.sessions as f64 {
        return Err(format!(
            "{active} runs active of {} with the followers connected",
            size.sessions
        ));
    }
    each(size.sessions, |i| {
        let path = format!("/v1/sessions/{}/runs/current", session(i));
        let answer = Conn::open(&base)?.call("DELETE", &path, None)?;
        match answer.status {
            202 => Ok(()),
            s => Err(format!("cancel {}: {s} {}", session(i), answer.body)),
        }
    })?;
    check_every_follower_ended(streams, size)?;
    drop(server);
    drop(rig);
    Ok(FollowerFigure {
        size,
        cpu_without,
        cpu_with,
        rss_growth_kib: rss_after.saturating_sub(rss_before),
    })
}

/// Every follower received its run's end, as a cancel, and then the
/// stream's end naming it; none was cut off or left waiting.
fn check_every_follower_ended(streams: Vec<FollowStream>, size: FollowerSize) -> Result {
    let slots: Vec<Mutex<Option<FollowStream>>> =
        streams.into_iter().map(|s| Mutex::new(Some(s))).collect();
    let wrong = each(size.followers, |i| {
        let stream = slots[i]
            .lock()
            .map_err(|_| "a follower's slot was poisoned".to_string())?
            .take()
            .ok_or("a follower was read twice")?;
        let name = session(i % size.sessions);
        let events = stream
            .rest()
            .map_err(|e| format!("follower {i} of {name}: {e}"))?;
        Ok(ended_cancelled(&events)
            .err()
            .map(|e| format!("follower {i} of {name}: {e}")))
    })?;
    let wrong: Vec<String> = wrong.into_iter().flatten().collect();
    match wrong.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} of {} followers did not receive their run's end and the stream's end; the first: {first}",
            wrong.len(),
            size.followers
        )),
    }
}

/// Whether an event stream's last two events are a run's end as
/// `cancelled` and the stream's `end` naming it.
fn ended_cancelled(stream: &SseEvents) -> Result {
    let last_two = stream.len().checked_sub(2).map(|at| &stream[at..]);
    let Some([(kind, event), (end_kind, end)]) = last_two else {
        return Err(format!("{} events: {stream:?}", stream.len()));
    };
    let payload = &event["payload"];
    if kind != "event" || payload["type"] != "run_ended" || payload["status"] != "cancelled" {
        return Err(format!("the last event is {kind} {event}"));
    }
    if end_kind != "end" || end["reason"] != "run_ended" {
        return Err(format!("the stream ended with {end_kind} {end}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stream_ends_cancelled_only_with_the_run_end_then_the_end() {
        let end = || ("end".to_string(), json!({ "reason": "run_ended" }));
        let run_end = |status: &str| {
            let payload = json!({ "type": "run_ended", "status": status });
            ("event".to_string(), json!({ "seq": 3, "payload": payload }))
        };
        assert!(ended_cancelled(&vec![run_end("cancelled"), end()]).is_ok());
        assert!(ended_cancelled(&vec![run_end("completed"), end()]).is_err());
        assert!(ended_cancelled(&vec![end()]).is_err());
        assert!(ended_cancelled(&vec![run_end("cancelled")]).is_err());
        let gone = ("end".to_string(), json!({ "reason": "run_gone" }));
        assert!(ended_cancelled(&vec![run_end("cancelled"), gone]).is_err());
    }
}
