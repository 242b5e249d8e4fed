//! Real OS processes sharing one lease directory.
//!
//! This test binary has its own `main` (`harness = false`): run normally it
//! is the parent and runs the scenarios below; re-executed with
//! `FLOCKLEASE_TEST_ROLE` set it is one of the competing processes. Accepts
//! name filters, `--exact` and `--list` like a libtest binary. That is why
//! it is not part of `tests/integration`: the holders it starts are this
//! executable, so its `main` must be its own.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use flocklease::FlockLease;
use lease_port::{LeaseErrorKind, OwnerId, SessionId, SessionLease};

const ROLE: &str = "FLOCKLEASE_TEST_ROLE";

type Scenario = fn();

const SCENARIOS: &[(&str, Scenario)] = &[
    (
        "racing_processes_hold_one_at_a_time_with_rising_tokens",
        race,
    ),
    (
        "sigkilled_holder_is_taken_over_after_expiry",
        sigkill_takeover,
    ),
    (
        "a_process_in_another_time_namespace_honours_a_live_lease",
        other_time_namespace,
    ),
];

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exact = args.iter().any(|a| a == "--exact");
    let (filters, skips) = name_filters(&args);
    let matches = |name: &str, f: &str| if exact { name == f } else { name.contains(f) };
    let selected: Vec<_> = SCENARIOS
        .iter()
        .filter(|(name, _)| {
            (filters.is_empty() || filters.iter().any(|f| matches(name, f)))
                && !skips.iter().any(|f| matches(name, f))
        })
        .collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            for (name, _) in &selected {
                println!("{name}: test");
            }
        }
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", selected.len());
    let mut failed = Vec::new();
    for (name, scenario) in &selected {
        let ok = std::panic::catch_unwind(scenario).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(*name);
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        selected.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// libtest's options that take a value as the next argument: that value
/// (`--format terse`, as nextest lists tests) is no name filter.
const OPTIONS_WITH_VALUES: &[&str] = &[
    "--format",
    "--color",
    "--test-threads",
    "--logfile",
    "--shuffle-seed",
    "-Z",
];

/// The name filters among `args`, and the `--skip` ones.
fn name_filters(args: &[String]) -> (Vec<&str>, Vec<&str>) {
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--skip" {
            skips.extend(it.next().map(String::as_str));
        } else if OPTIONS_WITH_VALUES.contains(&arg.as_str()) {
            it.next();
        } else if !arg.starts_with('-') {
            filters.push(arg.as_str());
        }
    }
    (filters, skips)
}

/// Nanoseconds on CLOCK_MONOTONIC, which every process on a Linux host
/// shares, so the parent can order events from different children.
fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

fn spawn(role: &str, vars: &[(&str, String)], stdout: Stdio) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("own executable"));
    cmd.env(ROLE, role).stdout(stdout).stderr(Stdio::inherit());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child process")
}

fn child(role: &str) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = match role {
        "race" => rt.block_on(child_race()),
        "hold" => rt.block_on(child_hold()),
        "try" => rt.block_on(child_try()),
        other => Err(format!("unknown role {other}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("child {role} ({}): {e}", std::process::id());
            ExitCode::FAILURE
        }
    }
}

// ---- racing processes -------------------------------------------------------

const WORKERS: usize = 4;
const SESSIONS: usize = 3;
const ROUNDS: usize = 40;
/// Tokens per durable reservation in the race: small, so reservations run
/// out and are renewed during the race.
const RESERVATION: u64 = 4;

/// One racer: tries every session each round; while holding, records the
/// monotonic interval it held it, then releases. Writes one line per hold:
/// `session token t_start t_end worker`.
async fn child_race() -> Result<(), String> {
    let dir = env("DIR");
    let worker: usize = env("WORKER").parse().map_err(|e| format!("{e}"))?;
    let leases = FlockLease::builder(&dir)
        .ttl(Duration::from_secs(60))
        .lock_timeout(Duration::from_secs(10))
        .token_reservation(RESERVATION)
        .open()
        .map_err(|e| e.to_string())?;
    let me = OwnerId::new(format!("worker-{worker}-pid-{}", std::process::id())).unwrap();
    let sessions: Vec<SessionId> = (0..SESSIONS)
        .map(|i| SessionId::new(format!("race/{i}")).unwrap())
        .collect();
    let mut out = String::new();
    for round in 0..ROUNDS {
        for k in 0..SESSIONS {
            let idx = (round + worker + k) % SESSIONS;
            match leases.acquire(&sessions[idx], &me).await {
                Ok(lease) => {
                    let start = mono_ns();
                    std::thread::sleep(Duration::from_micros(200));
                    let end = mono_ns();
                    leases
                        .release(&lease)
                        .await
                        .map_err(|e| format!("release: {e:?}"))?;
                    out.push_str(&format!("{idx} {} {start} {end} {worker}\n", lease.token()));
                }
                Err(e) if e.kind() == LeaseErrorKind::Held => {}
                Err(e) => return Err(format!("acquire: {e:?}")),
            }
        }
    }
    std::fs::write(env("OUT"), out).map_err(|e| e.to_string())
}

fn race() {
    let dir = tempfile::tempdir().unwrap();
    let lease_dir = dir.path().join("leases");
    let children: Vec<_> = (0..WORKERS)
        .map(|w| {
            spawn(
                "race",
                &[
                    ("DIR", lease_dir.display().to_string()),
                    ("WORKER", w.to_string()),
                    (
                        "OUT",
                        dir.path()
                            .join(format!("history-{w}"))
                            .display()
                            .to_string(),
                    ),
                ],
                Stdio::null(),
            )
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a racer failed");
    }
    let mut holds: BTreeMap<usize, Vec<(u64, u64, u64, usize)>> = BTreeMap::new();
    for w in 0..WORKERS {
        let text = std::fs::read_to_string(dir.path().join(format!("history-{w}"))).unwrap();
        for line in text.lines() {
            let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            holds
                .entry(f[0] as usize)
                .or_default()
                .push((f[2], f[3], f[1], f[4] as usize));
        }
    }
    assert_eq!(
        holds.len(),
        SESSIONS,
        "every session was held at least once"
    );
    let mut winners = std::collections::BTreeSet::new();
    for (session, mut hs) in holds {
        hs.sort();
        for pair in hs.windows(2) {
            let ((_, e1, t1, w1), (s2, _, t2, w2)) = (pair[0], pair[1]);
            assert!(
                e1 < s2,
                "session {session}: worker {w1} held until {e1} but worker {w2} held from {s2}"
            );
            assert!(t2 > t1, "session {session}: token {t2} after {t1}");
        }
        // Every grant is a takeover after a release, and its token follows
        // the reservation rule exactly: the process that made the session's
        // current reservation issues the next token while it lasts; any
        // other process, or an exhausted reservation, jumps past the ceiling
        // and reserves RESERVATION tokens from there.
        let (mut token, mut ceiling, mut reserver) = (0, 0, usize::MAX);
        for &(_, _, t, w) in &hs {
            let expected = if w == reserver && token < ceiling {
                token + 1
            } else {
                let next = token.max(ceiling) + 1;
                reserver = w;
                ceiling = next + RESERVATION - 1;
                next
            };
            assert_eq!(t, expected, "session {session}: worker {w}");
            token = t;
        }
        let listed = flocklease::list_leases(&lease_dir, SystemTime::now()).unwrap();
        let info = listed
            .iter()
            .filter_map(|e| e.lease.as_ref().ok())
            .find(|i| i.session.as_ref().map(|s| s.as_str()) == Some(&format!("race/{session}")))
            .unwrap();
        assert_eq!(info.token.unwrap().get(), hs.last().unwrap().2);
        assert!(info.reserved.unwrap().get() >= hs.last().unwrap().2);
        winners.extend(hs.iter().map(|h| h.3));
    }
    println!("  {} distinct processes won holds", winners.len());
}

// ---- a holder killed with SIGKILL ------------------------------------------

/// Acquires, reports the token, then renews back to back until killed.
async fn child_hold() -> Result<(), String> {
    let leases = FlockLease::builder(env("DIR"))
        .ttl(Duration::from_millis(env("TTL_MS").parse().unwrap()))
        .open()
        .map_err(|e| e.to_string())?;
    let session = SessionId::new(env("SESSION")).unwrap();
    let me = OwnerId::new(env("OWNER")).unwrap();
    let mut lease = leases
        .acquire(&session, &me)
        .await
        .map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "acquired {}", lease.token()).unwrap();
    stdout.flush().unwrap();
    let mut renewals = 0u64;
    loop {
        lease = leases
            .renew(&lease)
            .await
            .map_err(|e| format!("renew: {e:?}"))?;
        renewals += 1;
        if renewals == 100 {
            writeln!(stdout, "renewing").unwrap();
            stdout.flush().unwrap();
        }
    }
}

fn sigkill_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_secs(1);
    let session = SessionId::new("killed/holder").unwrap();
    let victim = OwnerId::new("victim").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // An earlier holder, so the victim's token is not the first.
    let parent = FlockLease::builder(dir.path()).ttl(ttl).open().unwrap();
    let me = OwnerId::new("survivor").unwrap();
    let first = rt.block_on(parent.acquire(&session, &me)).unwrap();
    rt.block_on(parent.release(&first)).unwrap();

    let mut child = spawn(
        "hold",
        &[
            ("DIR", dir.path().display().to_string()),
            ("SESSION", session.to_string()),
            ("OWNER", victim.to_string()),
            ("TTL_MS", ttl.as_millis().to_string()),
        ],
        Stdio::piped(),
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let acquired = lines.next().unwrap().unwrap();
    let victim_token: u64 = acquired.strip_prefix("acquired ").unwrap().parse().unwrap();
    assert!(victim_token > first.token().get());
    // Kill it mid-run: it is renewing back to back, often inside its
    // critical section with the file lock held.
    assert_eq!(lines.next().unwrap().unwrap(), "renewing");
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());

    // The dead holder's lease, as its file records it: honoured until its
    // expiry, then taken over with a higher token; the kernel dropped its
    // file lock with the process.
    let listed = flocklease::list_leases(dir.path(), SystemTime::now()).unwrap();
    let dead = listed[0].lease.as_ref().unwrap();
    assert_eq!(dead.owner.as_ref(), Some(&victim));
    let expiry = dead.expiry.unwrap();
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut held_answers = 0;
    let mut first_try_before_expiry = None;
    let taken = loop {
        let before = SystemTime::now();
        first_try_before_expiry.get_or_insert(before < expiry);
        let answer = rt.block_on(parent.acquire(&session, &me));
        let after = SystemTime::now();
        match answer {
            Ok(lease) => {
                // No timing guess: the backend decided between `before`
                // and `after`, so a takeover ending before the recorded
                // expiry freed a dead holder's lease early.
                assert!(
                    after >= expiry,
                    "taken over before the dead holder's expiry: {:?} early",
                    expiry.duration_since(after).unwrap_or_default()
                );
                break lease;
            }
            Err(e) if e.kind() == LeaseErrorKind::Held => {
                assert_eq!(e.holder(), Some(&victim), "{e:?}");
                held_answers += 1;
            }
            Err(e) => panic!("takeover attempt failed: {e:?}"),
        }
        assert!(Instant::now() < give_up, "never taken over");
        std::thread::sleep(Duration::from_millis(20));
    };
    // A first attempt made before the expiry must have been refused (on a
    // machine so loaded that it came after, there is nothing to check).
    if first_try_before_expiry == Some(true) {
        assert!(held_answers > 0, "the dead holder's lease was not honoured");
    } else {
        println!("  note: the first attempt came after the expiry");
    }
    assert!(
        taken.token().get() > victim_token,
        "takeover token {} not above the killed holder's {victim_token}",
        taken.token()
    );
    assert!(taken.expiry() > SystemTime::now() - ttl);
    let listed = flocklease::list_leases(dir.path(), SystemTime::now()).unwrap();
    let info = listed[0].lease.as_ref().unwrap();
    assert_eq!(info.owner.as_ref(), Some(&me));
    println!("  {held_answers} Held answers before the takeover");
}

// ---- another time namespace ---------------------------------------------------

/// One acquire attempt; prints `held` or `granted TOKEN`.
async fn child_try() -> Result<(), String> {
    let leases =
        FlockLease::open(env("DIR"), Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let session = SessionId::new(env("SESSION")).unwrap();
    let me = OwnerId::new(format!("try-{}", std::process::id())).unwrap();
    match leases.acquire(&session, &me).await {
        Ok(lease) => println!("granted {}", lease.token()),
        Err(e) if e.kind() == LeaseErrorKind::Held => println!("held"),
        Err(e) => return Err(format!("acquire: {e:?}")),
    }
    Ok(())
}

/// Processes in different time namespaces (`unshare --time`, a CRIU
/// restore) share the boot id but not `CLOCK_MONOTONIC`: a competitor whose
/// monotonic clock runs 100,000 s ahead must still see the live lease as
/// live.
fn other_time_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let leases = FlockLease::open(dir.path(), Duration::from_secs(60)).unwrap();
    let session = SessionId::new("ns/1").unwrap();
    let held = rt
        .block_on(leases.acquire(&session, &OwnerId::new("parent").unwrap()))
        .unwrap();
    let out = Command::new("unshare")
        .args(["--time", "--monotonic", "100000", "--fork"])
        .arg(std::env::current_exe().expect("own executable"))
        .env(ROLE, "try")
        .env("DIR", dir.path())
        .env("SESSION", "ns/1")
        .stderr(Stdio::inherit())
        .output()
        .expect("run unshare (util-linux)");
    assert!(
        out.status.success(),
        "the competitor in a new time namespace did not run: {out:?}"
    );
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        said,
        "held",
        "a process whose monotonic clock is offset took a lease live until {:?}",
        held.expiry()
    );
}
