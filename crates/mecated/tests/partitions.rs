//! Real network partitions between real processes: etcd members, a lease
//! service and `mecated` servers each on a host of their own — network
//! namespaces on this machine, linked through a bridge
//! (`test_services::netns`) — with links cut while a run holds a session.
//!
//! The servers share one JSONL store directory (the filesystem is common
//! to every namespace), so a holder cut from its lease authority still
//! reaches the store: only its own handling of the lost lease, and the
//! store's fence behind it, stand between it and the session's next
//! owner. The test's client lives on a host of its own too: every thread
//! of the test's runtime joins it, so each socket the test opens crosses
//! the private network.
//!
//! A binary of its own, not part of `tests/integration`: its threads move
//! into network namespaces, and a thread started from one stays there
//! (test_services' process-wide spawner thread too, made by whichever
//! test first starts a server), so no other test shares its process. It
//! also needs root and `iproute2`, which no other test here does.

mod support;

use std::future::Future;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use test_services::netns::{Host, Network};

/// The test's own host and the network around it; the runtime driving
/// the test has every thread on `client`.
struct Lab {
    net: Network,
    client: Host,
    store: tempfile::TempDir,
    /// Last, so the next lab starts once this one is gone.
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl Lab {
    fn new() -> Lab {
        // One at a time: each lab runs three etcd members and two servers,
        // and several at once on a 2-core machine starve the renewals the
        // tests are about.
        static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let alone = ONE_LAB
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let net = Network::new().expect("a private network (root and iproute2 needed)");
        let client = net.add_host("client").unwrap();
        Lab {
            net,
            client,
            store: tempfile::tempdir().unwrap(),
            _alone: alone,
        }
    }

    /// Runs `test` on a runtime whose threads, and this one, are on the
    /// client's host.
    fn run<F: Future<Output = ()>>(&self, test: impl FnOnce() -> F) {
        self.net.enter(&self.client).unwrap();
        let (net, client) = (self.net.clone(), self.client.clone());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || net.enter(&client).expect("join the client's host"))
            .build()
            .unwrap();
        rt.block_on(test());
    }

    /// `mecated` as `owner` on `host`, listening on the host's address,
    /// serving the lab's store.
    fn mecated(&self, host: &Host, owner: &str, extra: &[&str]) -> Mecated {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mecated"));
        cmd.arg("--listen")
            .arg(format!("{}:0", host.addr()))
            .args(["--owner", owner, "--store-dir"])
            .arg(self.store.path())
            // The lab's hosts are private to the test's network namespaces.
            .arg("--allow-unauthenticated")
            .args(extra)
            .env("MECATED_LOG", "warn");
        let child = self
            .net
            .wrap(host, &cmd)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mecated");
        Mecated::listening(child, owner)
    }
}

/// Long enough that A's run is still going when the lease is lost; a
/// progress event every 100 ms, so that a holder still writing when the
/// next owner starts is refused by the store at once (and the test sees
/// it) rather than happening to stop in time.
const LONG_RUN: [&str; 4] = ["--echo-delay", "30s", "--echo-steps", "300"];

/// A run on `a` holding session `id`, past its first progress event: its
/// pending result and its `run_started`.
async fn holding(
    a: &Mecated,
    id: &str,
) -> (
    tokio::task::JoinHandle<Result<Value, reqwest::Error>>,
    Value,
) {
    create(a, id).await;
    let pending = run_in_background(a, id, json!("from a"));
    let started = wait_for_event(a, id, is_run_started_by(&a.owner)).await;
    wait_for_event(a, id, |e| e["payload"]["type"] == "progress").await;
    (pending, started)
}

/// What a takeover across a partition must show. `a_run` is the cut
/// holder's pending run, `a_started` its `run_started`; `b` retries until
/// it owns the session.
///
/// - A ends its own run on its own deadline (its lease expired: renewals
///   went unanswered until then), not because the store refused a write
///   of its;
/// - B takes the session with a higher token;
/// - no event of A's run is in the log after B's first event.
///
/// Returns when the test had A's answer (wall clock, ms) and when the
/// store stamped B's first event.
async fn assert_clean_takeover(
    a_run: tokio::task::JoinHandle<Result<Value, reqwest::Error>>,
    a_started: &Value,
    b: &Mecated,
    id: &str,
) -> (u64, u64) {
    // B tries from the moment of the cut, concurrently with A's run.
    let a_ends = async {
        let result = a_run.await.unwrap().expect("A's client reaches A");
        (result, wall_ms())
    };
    let ((a_result, a_gave_up_by), b_result) =
        tokio::join!(a_ends, run_when_free(b, id, json!("from b")));
    assert_eq!(a_result["status"], "lease_lost", "{a_result}");
    let error = a_result["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("its lease on session {id} expired")),
        "A did not stop on its own deadline: {error}"
    );

    assert_eq!(b_result["status"], "completed", "{b_result}");
    let (a_token, b_token) = (
        a_started["token"].as_u64().unwrap(),
        b_result["token"].as_u64().unwrap(),
    );
    assert!(b_token > a_token, "B's token {b_token} not above {a_token}");

    let log = events(b, id).await;
    assert_gapless(&log);
    let b_first = log
        .iter()
        .find(|e| e["token"].as_u64() == Some(b_token))
        .expect("B's run is in the log");
    // A's run recorded no end (its lease was gone): B fences A out, ends
    // A's run as interrupted, then claims.
    let b_first_seq = b_first["seq"].as_u64().unwrap();
    let at = |seq: u64| log.iter().find(|e| e["seq"].as_u64() == Some(seq));
    assert!(
        b_first["payload"]["type"] == "takeover"
            && is_owner(&b_first["payload"]["owner"], &b.owner),
        "B's first event is its takeover: {b_first}"
    );
    let ended = at(b_first_seq + 1).expect("A's run's end");
    assert_eq!(ended["payload"]["status"], "interrupted", "{ended}");
    assert_eq!(ended["payload"]["run_token"], a_token, "{ended}");
    let claim = at(b_first_seq + 2).expect("B's claim");
    assert!(
        is_run_started_by(&b.owner)(claim),
        "B's claim follows: {claim}"
    );
    for e in &log {
        if e["token"].as_u64() == Some(a_token) {
            assert!(
                e["seq"].as_u64().unwrap() < b_first_seq,
                "A's event {e} landed after B's first event (seq {b_first_seq})"
            );
        }
    }
    assert_only_token_after_takeover(&log, &b.owner, b_token);
    assert!(
        log.iter().all(|e| e["payload"]["content"] != "from a"),
        "A's reply was written"
    );
    (a_gave_up_by, b_first["time_ms"].as_u64().unwrap())
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use test_services::EtcdCluster;

    /// Whole seconds, above etcd's 2 s minimum (see etcd_leases.rs).
    const TTL: &str = "3s";

    /// For a holder that must keep its session across a partition: turning
    /// to another member costs a request timeout (a quarter of the TTL) on
    /// the silent one, and possibly an election; with 3 s, and once with
    /// 6 s, renewals lost that way on a loaded machine lost the lease
    /// (safely, but the test is about keeping it).
    const KEEPING_TTL: &str = "12s";
    const PREFIX: &str = "/mecated-partitions/";

    /// Server flags for the cluster, its members listed in `order`: a
    /// client sends to the first until it fails to answer.
    fn flags(cluster: &EtcdCluster, order: &[usize], ttl: &str) -> Vec<String> {
        let endpoints = cluster.endpoints();
        let listed: Vec<&str> = order.iter().map(|&i| endpoints[i].as_str()).collect();
        [
            "--session-lease-etcd",
            &listed.join(","),
            "--session-lease-etcd-prefix",
            PREFIX,
            "--session-lease-ttl",
            ttl,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn with<'a>(flags: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
        flags
            .iter()
            .map(String::as_str)
            .chain(more.iter().copied())
            .collect()
    }

    /// Three members on three hosts, two servers on two more; A's host cut
    /// from every member but not from the store: A stops, B takes over
    /// after the TTL and the lapsed-hold wait, nothing of A's lands after.
    #[test]
    fn a_holder_cut_from_every_etcd_member_stops_before_another_takes_over() {
        let lab = Lab::new();
        let cluster = EtcdCluster::start_on(&lab.net).unwrap();
        let (host_a, host_b) = (
            lab.net.add_host("server-a").unwrap(),
            lab.net.add_host("server-b").unwrap(),
        );
        let flags = flags(&cluster, &[0, 1, 2], TTL);
        lab.run(|| async {
            let a = lab.mecated(&host_a, "proc-a", &with(&flags, &LONG_RUN));
            let b = lab.mecated(&host_b, "proc-b", &with(&flags, &[]));
            let (a_run, a_started) = holding(&a, "cut").await;

            for i in 0..3 {
                lab.net.cut(&host_a, cluster.host(i).unwrap()).unwrap();
            }
            let (a_gave_up_by, b_started_at) =
                assert_clean_takeover(a_run, &a_started, &b, "cut").await;
            // etcd keeps A's key a grace past A's own expiry, and B waits
            // out the lapsed hold a TTL and a grace more: seconds in which
            // A's answer reaches the test long before B can start.
            assert!(
                b_started_at >= a_gave_up_by,
                "B's run started (at {b_started_at}) before A had given the session up \
                 (by {a_gave_up_by})"
            );
        });
    }

    /// A holder renewing through a member that the partition leaves
    /// without its leader: its requests there go unanswered, it turns to
    /// the next member and keeps the session; B is refused throughout and
    /// the run completes under one token.
    #[test]
    fn a_holder_renewing_through_a_member_cut_from_the_leader_keeps_its_session() {
        let lab = Lab::new();
        let cluster = EtcdCluster::start_on(&lab.net).unwrap();
        let (host_a, host_b) = (
            lab.net.add_host("server-a").unwrap(),
            lab.net.add_host("server-b").unwrap(),
        );
        let leader = cluster.wait_for_leader().unwrap();
        let minority = (leader + 1) % 3;
        let third = (leader + 2) % 3;
        let flags_a = flags(&cluster, &[minority, third, leader], KEEPING_TTL);
        let flags_b = flags(&cluster, &[0, 1, 2], KEEPING_TTL);
        lab.run(|| async {
            let a = lab.mecated(
                &host_a,
                "proc-a",
                &with(&flags_a, &["--echo-delay", "15s", "--echo-steps", "15"]),
            );
            let b = lab.mecated(&host_b, "proc-b", &with(&flags_b, &[]));
            let (a_run, a_started) = holding(&a, "minority").await;

            lab.net
                .cut(
                    cluster.host(minority).unwrap(),
                    cluster.host(leader).unwrap(),
                )
                .unwrap();
            assert_kept_through_the_partition(a_run, &a_started, &b, "minority").await;
        });
    }

    /// The leader cut from both other members (servers and client still
    /// reach it) while the holder renews through it: the old leader stops
    /// leading, the others elect a new one, and the holder, turning to
    /// them, keeps its session; B is refused throughout.
    #[test]
    fn a_holder_renewing_through_a_leader_cut_from_the_others_keeps_its_session() {
        let lab = Lab::new();
        let cluster = EtcdCluster::start_on(&lab.net).unwrap();
        let (host_a, host_b) = (
            lab.net.add_host("server-a").unwrap(),
            lab.net.add_host("server-b").unwrap(),
        );
        let leader = cluster.wait_for_leader().unwrap();
        let others = [(leader + 1) % 3, (leader + 2) % 3];
        let flags_a = flags(&cluster, &[leader, others[0], others[1]], KEEPING_TTL);
        let flags_b = flags(&cluster, &[others[0], others[1], leader], KEEPING_TTL);
        lab.run(|| async {
            let a = lab.mecated(
                &host_a,
                "proc-a",
                &with(&flags_a, &["--echo-delay", "15s", "--echo-steps", "15"]),
            );
            let b = lab.mecated(&host_b, "proc-b", &with(&flags_b, &[]));
            let (a_run, a_started) = holding(&a, "leader").await;

            let old = cluster.host(leader).unwrap();
            for i in others {
                lab.net.cut(old, cluster.host(i).unwrap()).unwrap();
            }
            assert_kept_through_the_partition(a_run, &a_started, &b, "leader").await;
        });
    }

    /// While A's run lasts, B never runs: refused as leased elsewhere
    /// (naming A), or told to retry while the cluster elects a leader or a
    /// request of B's times out. A's run completes, and the log up to its
    /// `run_ended` holds A's run alone, under one token. B may run once
    /// A's run has ended and released: A's answer to its own client can
    /// arrive after B's attempt was sent, so a run of B's is judged by
    /// where it sits in the log, not by when the test saw A's answer.
    async fn assert_kept_through_the_partition(
        mut a_run: tokio::task::JoinHandle<Result<Value, reqwest::Error>>,
        a_started: &Value,
        b: &Mecated,
        id: &str,
    ) {
        let mut refusals = 0;
        let a_result = loop {
            tokio::select! {
                result = &mut a_run => break result.unwrap().expect("A's client reaches A"),
                () = tokio::time::sleep(Duration::from_millis(300)) => {
                    let (status, body) = run(b, id, json!("from b")).await;
                    match status {
                        reqwest::StatusCode::CONFLICT => {
                            assert!(is_owner(&body["error"]["holder"], "proc-a"), "{body}");
                            refusals += 1;
                        }
                        reqwest::StatusCode::OK => {
                            let b_started = body["events"][0]["seq"].as_u64();
                            let log = events(b, id).await;
                            let a_ended = log.iter().find(|e| {
                                e["payload"]["type"] == "run_ended"
                                    && e["token"] == a_started["token"]
                            });
                            assert!(
                                a_ended.is_some_and(|e| e["seq"].as_u64() < b_started),
                                "B ran during A's run: {body}"
                            );
                        }
                        // Told to retry (no leader yet, a request timed
                        // out): B did not run either.
                        _ => {}
                    }
                }
            }
        };
        assert_eq!(a_result["status"], "completed", "{a_result}");
        assert!(refusals > 0, "B was never refused as leased elsewhere");
        let token = a_started["token"].as_u64().unwrap();
        let log = events(b, id).await;
        assert_gapless(&log);
        let a_ended = log
            .iter()
            .position(|e| e["payload"]["type"] == "run_ended")
            .unwrap_or_else(|| panic!("A's run never ended in the log: {log:?}"));
        assert!(
            log[..=a_ended]
                .iter()
                .all(|e| e["token"].as_u64() == Some(token)),
            "another token reached the log during A's run: {log:?}"
        );
    }
}

#[cfg(feature = "grpc")]
mod lease_service {
    use std::sync::Arc;

    use grpcdriver::LeaseServer;
    use memlease::MemLease;

    use super::*;

    const TTL: Duration = Duration::from_secs(1);

    /// The gRPC lease service on a host of its own: a listener bound on
    /// that host (its connections stay there, whichever thread serves
    /// them), served by this test's runtime. The address to give servers.
    fn serve_on(lab: &Lab, host: &Host) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = lab
            .net
            .within(host, || {
                std::net::TcpListener::bind((host.addr(), 0)).and_then(|l| {
                    l.set_nonblocking(true)?;
                    Ok(l)
                })
            })
            .unwrap()
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            // Plain and unauthenticated on a non-loopback address: the
            // network is the test's own, with nobody else on it.
            LeaseServer::new(Arc::new(MemLease::new(TTL)))
                .ttl(TTL)
                .allow_insecure(true)
                .serve(listener, async {
                    let _ = stopped.await;
                }),
        );
        (addr, stop)
    }

    /// The lease service on its own host, two servers on two others; A's
    /// host cut from the service but not from the store: A stops, B takes
    /// over after the TTL, nothing of A's lands after.
    #[test]
    fn a_holder_cut_from_the_lease_service_stops_before_another_takes_over() {
        let lab = Lab::new();
        let service = lab.net.add_host("lease-service").unwrap();
        let (host_a, host_b) = (
            lab.net.add_host("server-a").unwrap(),
            lab.net.add_host("server-b").unwrap(),
        );
        lab.run(|| async {
            let (addr, _stop) = serve_on(&lab, &service);
            let flags = ["--session-lease-url", &addr, "--session-lease-ttl", "1s"];
            let a = lab.mecated(&host_a, "proc-a", &[&flags[..], &LONG_RUN].concat());
            let b = lab.mecated(&host_b, "proc-b", &flags);
            let (a_run, a_started) = holding(&a, "cut").await;

            lab.net.cut(&host_a, &service).unwrap();
            // A's expiry and the service's are only a network delay apart,
            // too close to order from here; A's own `Expired` (checked
            // inside) is what shows it stopped first.
            assert_clean_takeover(a_run, &a_started, &b, "cut").await;
        });
    }
}
