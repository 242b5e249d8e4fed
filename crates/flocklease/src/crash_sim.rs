//! Host-crash simulation for the token reservation.
//!
//! Under `cfg(test)` every record write logs its bytes and whether it was
//! `fdatasync`ed (and the directory with it). A simulated power loss puts on
//! disk what one may leave behind — the last synced record, or any record
//! written after it, each write whole — drops every instance, and opens new
//! ones, as a rebooted host would. The tests then check that no token is
//! ever issued twice and that every token returned is covered by the
//! ceiling last made durable.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

struct Event {
    path: PathBuf,
    bytes: Vec<u8>,
    synced: bool,
    dir_synced: bool,
}

static LOG: Mutex<Vec<Event>> = Mutex::new(Vec::new());

fn log() -> std::sync::MutexGuard<'static, Vec<Event>> {
    LOG.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Called by `Store::apply` after each record write (and its syncs).
pub(crate) fn wrote(path: &Path, bytes: &[u8], synced: bool, dir_synced: bool) {
    log().push(Event {
        path: path.to_path_buf(),
        bytes: bytes.to_vec(),
        synced,
        dir_synced,
    });
}

mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use lease_port::{Clock, Lease, LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};

    use super::*;
    use crate::FlockLease;
    use crate::record::Record;
    use crate::store::directory::file_name;

    const TTL: Duration = Duration::from_secs(10);
    const SECTOR: usize = 512;

    /// The writes logged for `path`, oldest first: (bytes, synced, dir synced).
    fn events(path: &Path) -> Vec<(Vec<u8>, bool, bool)> {
        log()
            .iter()
            .filter(|e| e.path == path)
            .map(|e| (e.bytes.clone(), e.synced, e.dir_synced))
            .collect()
    }

    fn decode(bytes: &[u8]) -> Record {
        Record::decode(Path::new("sim"), bytes).unwrap().unwrap()
    }

    /// What a power loss may leave at `path`: `None` (the file's name was
    /// never synced), the last synced record, or any record written later.
    fn crash_states(path: &Path) -> Vec<Option<Vec<u8>>> {
        let events = events(path);
        let last_sync = events.iter().rposition(|e| e.1);
        let named = events.iter().any(|e| e.2);
        let mut states = Vec::new();
        match last_sync {
            Some(i) if named => states.push(Some(events[i].0.clone())),
            _ => states.push(None),
        }
        let later = last_sync.map_or(0, |i| i + 1);
        states.extend(events[later..].iter().map(|e| Some(e.0.clone())));
        // A write in flight when the power went may be torn at any sector
        // boundary against the record before it.
        let mut torn = Vec::new();
        for pair in states.windows(2) {
            if let [Some(old), Some(new)] = pair {
                torn.extend(tears(old, new).into_iter().map(Some));
            }
        }
        states.extend(torn);
        states
    }

    /// The reservation ceiling of the last synced record at `path`.
    fn durable_ceiling(path: &Path) -> Option<u64> {
        events(path)
            .iter()
            .rev()
            .find(|e| e.1)
            .map(|e| decode(&e.0).reserved)
    }

    /// Puts `state` on disk and forgets the history before it.
    fn restore(path: &Path, state: Option<Vec<u8>>) {
        let mut log = log();
        log.retain(|e| e.path != path);
        match state {
            Some(bytes) => {
                std::fs::write(path, &bytes).unwrap();
                log.push(Event {
                    path: path.to_path_buf(),
                    bytes,
                    synced: true,
                    dir_synced: true,
                });
            }
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
        }
    }

    /// A host with three instances (say, three processes) on one directory.
    struct Host {
        rt: tokio::runtime::Runtime,
        dir: tempfile::TempDir,
        clock: ManualClock,
        reservation: u64,
        session: SessionId,
        path: PathBuf,
        boot: u32,
        instances: Vec<FlockLease>,
        /// What each instance believes it holds.
        held: Vec<Option<Lease>>,
        /// Every token any acquire returned, across crashes.
        max_issued: u64,
        /// Crashes that put an older token back on disk.
        rollbacks: u32,
    }

    impl Host {
        fn new(reservation: u64) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let session = SessionId::new("crash/1").unwrap();
            let path = dir.path().join(file_name(&session));
            let mut host = Host {
                rt: rt(),
                dir,
                clock: ManualClock::new(),
                reservation,
                session,
                path,
                boot: 0,
                instances: Vec::new(),
                held: Vec::new(),
                max_issued: 0,
                rollbacks: 0,
            };
            host.boot();
            host
        }

        /// New instances with new owner ids, as processes started after a
        /// reboot would be.
        fn boot(&mut self) {
            self.boot += 1;
            self.instances = (0..3)
                .map(|_| {
                    FlockLease::builder(self.dir.path())
                        .ttl(TTL)
                        .clock(Arc::new(self.clock.clone()))
                        .token_reservation(self.reservation)
                        .open()
                        .unwrap()
                })
                .collect();
            self.held = vec![None; 3];
        }

        fn owner(&self, i: usize) -> OwnerId {
            OwnerId::new(format!("boot-{}/instance-{i}", self.boot)).unwrap()
        }

        fn acquire(&mut self, i: usize) {
            let owner = self.owner(i);
            let got = self
                .rt
                .block_on(self.instances[i].acquire(&self.session, &owner));
            let lease = match got {
                Ok(lease) => lease,
                Err(e) if e.kind() == LeaseErrorKind::Held => return,
                Err(e) => panic!("acquire: {e:?}"),
            };
            let t = lease.token().get();
            let reacquired = self.held[i]
                .as_ref()
                .is_some_and(|l| l.token() == lease.token());
            if !reacquired {
                assert!(
                    t > self.max_issued,
                    "token {t} issued again: {} was issued before (reservation {})",
                    self.max_issued,
                    self.reservation
                );
                self.max_issued = t;
            }
            let ceiling = durable_ceiling(&self.path);
            assert!(
                ceiling.is_some_and(|c| c >= t),
                "token {t} returned above the durable ceiling {ceiling:?}"
            );
            self.held[i] = Some(lease);
        }

        fn renew(&mut self, i: usize) {
            if let Some(l) = self.held[i].take() {
                match self.rt.block_on(self.instances[i].renew(&l)) {
                    Ok(l) => self.held[i] = Some(l),
                    Err(e) if e.kind() == LeaseErrorKind::Held => {}
                    Err(e) => panic!("renew: {e:?}"),
                }
            }
        }

        fn release(&mut self, i: usize) {
            if let Some(l) = self.held[i].take() {
                self.rt.block_on(self.instances[i].release(&l)).unwrap();
            }
        }

        /// Instance `i` wrote a new reservation and its `fdatasync` failed:
        /// the record is in the page cache, not on disk, and the acquire
        /// returned an error, no token. (A retry by the same owner finds
        /// itself the live holder.)
        fn failed_reservation(&mut self, i: usize) {
            let Ok(bytes) = std::fs::read(&self.path) else {
                return;
            };
            let r = decode(&bytes);
            let now = self
                .clock
                .now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            if r.owner.is_some() && r.expiry_nanos > now.as_nanos() as u64 {
                return; // live: that instance would have been refused
            }
            let token = r.token.max(r.reserved) + 1;
            let failed = Record {
                owner: Some(self.owner(i)),
                token,
                reserved: token + self.reservation - 1,
                expiry_nanos: (now + TTL).as_nanos() as u64,
                holder_lost: false,
                mono_expiry_nanos: 0,
                boot_id: [0; 16],
                ..r
            };
            let bytes = failed.encode();
            std::fs::write(&self.path, bytes).unwrap();
            wrote(&self.path, &bytes, false, false);
            self.held[i] = None;
        }

        /// A process created the file and synced its first record, then
        /// died before syncing the directory: the record is durable, its
        /// name is not, and no token was returned.
        fn died_before_dir_sync(&mut self) {
            if self.path.exists() {
                return;
            }
            let now = self
                .clock
                .now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let record = Record {
                session: self.session.clone(),
                owner: Some(OwnerId::new(format!("boot-{}/died", self.boot)).unwrap()),
                holder_lost: false,
                token: 1,
                reserved: self.reservation,
                expiry_nanos: (now + TTL).as_nanos() as u64,
                mono_expiry_nanos: 0,
                boot_id: [0; 16],
            };
            let bytes = record.encode();
            std::fs::write(&self.path, bytes).unwrap();
            wrote(&self.path, &bytes, true, false);
        }

        fn crash(&mut self, rng: &mut Rng) {
            let states = crash_states(&self.path);
            let pick = states[rng.below(states.len() as u64) as usize].clone();
            let token = pick.as_deref().map_or(0, |b| decode(b).token);
            if token < self.max_issued {
                self.rollbacks += 1;
            }
            self.instances.clear();
            restore(&self.path, pick);
            self.boot();
        }
    }

    fn run(reservation: u64, seed: u64, steps: usize) -> Host {
        let mut host = Host::new(reservation);
        let mut rng = Rng(seed);
        for _ in 0..steps {
            // Mostly one instance, as a session mostly stays with one
            // process, so reservations get used before others jump them.
            let i = [0, 0, 0, 0, 1, 2][rng.below(6) as usize];
            match rng.below(100) {
                0..=34 => host.acquire(i),
                35..=54 => host.renew(i),
                55..=74 => host.release(i),
                75..=84 => host.clock.advance(TTL / 2),
                85..=89 => host.clock.advance(TTL * 2),
                90..=91 => host.failed_reservation(i),
                92..=93 => host.died_before_dir_sync(),
                _ => host.crash(&mut rng),
            }
        }
        host
    }

    #[test]
    fn tokens_rise_across_simulated_power_losses() {
        for reservation in [1, 2, 5, 1024] {
            let mut rollbacks = 0;
            let mut issued = 0;
            for seed in 1..=8u64 {
                let host = run(reservation, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 400);
                rollbacks += host.rollbacks;
                issued = issued.max(host.max_issued);
            }
            eprintln!("reservation {reservation}: {rollbacks} rollbacks, tokens up to {issued}");
            assert!(issued > 0);
            // With a reservation above one, the simulation did put records
            // of older tokens back on disk, repeatedly; with one, every new
            // token is synced, so none can be lost.
            if reservation > 1 {
                assert!(rollbacks >= 10, "reservation {reservation}: {rollbacks}");
            } else {
                assert_eq!(rollbacks, 0);
            }
        }
    }

    /// A writer died after syncing a new file's record but before syncing
    /// the directory; a later acquire's reservation must make the name
    /// durable, or a power loss takes the file — and the tokens — away.
    #[test]
    fn a_name_a_dead_writer_left_unsynced_is_synced_by_the_next_reservation() {
        for reservation in [1, 4] {
            let states = {
                let mut host = Host::new(reservation);
                host.died_before_dir_sync();
                host.clock.advance(TTL * 2);
                host.acquire(0);
                crash_states(&host.path).len()
            };
            for pick in 0..states {
                let mut host = Host::new(reservation);
                host.died_before_dir_sync();
                host.clock.advance(TTL * 2);
                host.acquire(0);
                assert!(host.max_issued > 1, "the dead writer's token is skipped");
                let state = crash_states(&host.path)[pick].clone();
                host.instances.clear();
                restore(&host.path, state);
                host.boot();
                host.clock.advance(TTL * 2);
                host.acquire(1);
            }
        }
    }

    /// Sector boundaries inside a record: a power cut may persist any
    /// prefix of whole sectors of a write in flight, in any order.
    fn tears(old: &[u8], new: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if old.len() != new.len() {
            return out;
        }
        for cut in (SECTOR..old.len()).step_by(SECTOR) {
            let mut a = new[..cut].to_vec();
            a.extend_from_slice(&old[cut..]);
            let mut b = old[..cut].to_vec();
            b.extend_from_slice(&new[cut..]);
            out.push(a);
            out.push(b);
        }
        out
    }

    /// Every write of a session's history torn against the one before it,
    /// at every sector boundary: a fresh host recovers and issues a token
    /// above every token issued before, never an error for ever.
    #[test]
    fn a_record_torn_at_any_sector_boundary_recovers_past_its_ceiling() {
        for reservation in [1, 4] {
            let history = {
                let mut host = Host::new(reservation);
                for i in [0, 0, 1, 0, 2] {
                    host.acquire(i);
                    host.renew(i);
                    host.release(i);
                }
                host.acquire(1);
                host.renew(1);
                events(&host.path)
            };
            let mut torn = 0;
            for (k, pair) in history.windows(2).enumerate() {
                // Torn while writing history[k + 1]: that write's acquire
                // had not returned; every token before it had.
                let issued = history[..=k].iter().map(|e| decode(&e.0).token).max();
                for bytes in tears(&pair[0].0, &pair[1].0) {
                    torn += 1;
                    let mut host = Host::new(reservation);
                    host.max_issued = issued.unwrap_or(0);
                    host.instances.clear();
                    restore(&host.path, Some(bytes));
                    host.boot();
                    host.clock.advance(TTL * 2);
                    host.acquire(0);
                    assert!(host.held[0].is_some(), "not granted after a tear");
                }
            }
            assert!(torn > 0);
        }
    }

    /// One instance taking over a session again and again.
    fn takeovers(leases: &FlockLease, rt: &tokio::runtime::Runtime, n: usize) -> Vec<u64> {
        let s = SessionId::new("sync/count").unwrap();
        let o = OwnerId::new("o").unwrap();
        (0..n)
            .map(|_| {
                let l = rt.block_on(leases.acquire(&s, &o)).unwrap();
                let l = rt.block_on(leases.renew(&l)).unwrap();
                rt.block_on(leases.release(&l)).unwrap();
                l.token().get()
            })
            .collect()
    }

    fn synced_tokens(path: &Path) -> Vec<u64> {
        events(path)
            .iter()
            .filter(|e| e.1)
            .map(|e| decode(&e.0).token)
            .collect()
    }

    #[test]
    fn only_reservations_are_synced() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(file_name(&SessionId::new("sync/count").unwrap()));
        let leases = FlockLease::builder(dir.path())
            .token_reservation(3)
            .open()
            .unwrap();
        assert_eq!(takeovers(&leases, &rt, 7), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(synced_tokens(&path), [1, 4, 7]);
        assert_eq!(events(&path).len(), 7 * 3, "acquire, renew, release");
        assert_eq!(
            events(&path).iter().filter(|e| e.2).count(),
            1,
            "the directory only for the first record"
        );

        // A second instance starts past the first one's ceiling (9) and
        // syncs that; the first then no longer owns the ceiling.
        let other = FlockLease::builder(dir.path())
            .token_reservation(3)
            .open()
            .unwrap();
        assert_eq!(takeovers(&other, &rt, 2), [10, 11]);
        assert_eq!(takeovers(&leases, &rt, 1), [13]);
        assert_eq!(synced_tokens(&path), [1, 4, 7, 10, 13]);

        let every = FlockLease::builder(dir.path())
            .token_reservation(1)
            .open()
            .unwrap();
        assert_eq!(takeovers(&every, &rt, 3), [16, 17, 18]);
        assert_eq!(synced_tokens(&path), [1, 4, 7, 10, 13, 16, 17, 18]);
    }

    #[test]
    fn a_re_acquire_syncs_unless_the_ceiling_is_this_instances() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let s = SessionId::new("re/acquire").unwrap();
        let o = OwnerId::new("o").unwrap();
        let path = dir.path().join(file_name(&s));
        let a = FlockLease::open(dir.path(), TTL).unwrap();
        let b = FlockLease::open(dir.path(), TTL).unwrap();
        let first = rt.block_on(a.acquire(&s, &o)).unwrap();
        let again = rt.block_on(a.acquire(&s, &o)).unwrap();
        assert_eq!(again.token(), first.token());
        assert_eq!(synced_tokens(&path), [1], "armed: no sync");
        // Same owner through another instance: the token may come from a
        // reservation whose sync failed, so it is synced again.
        let via_b = rt.block_on(b.acquire(&s, &o)).unwrap();
        assert_eq!(via_b.token(), first.token());
        assert_eq!(synced_tokens(&path), [1, 1]);
        // That sync did not arm b: its next new token still jumps.
        rt.block_on(b.release(&via_b)).unwrap();
        let next = rt.block_on(b.acquire(&s, &o)).unwrap();
        assert_eq!(next.token().get(), crate::DEFAULT_TOKEN_RESERVATION + 1);
    }

    /// `acquire_above` makes its raised ceiling durable before it answers:
    /// whatever a power loss leaves of the file afterwards, the next
    /// takeover is still above the floor.
    #[test]
    fn a_floor_is_durable_before_its_token_is_returned() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let open = || {
            FlockLease::builder(dir.path())
                .ttl(TTL)
                .clock(Arc::new(clock.clone()))
                .token_reservation(16)
                .open()
                .unwrap()
        };
        let s = SessionId::new("floor/durable").unwrap();
        let path = dir.path().join(file_name(&s));
        let floor = lease_port::FencingToken::new(50_000);
        let leases = open();
        // Armed within a reservation far below the floor first.
        let early = rt
            .block_on(leases.acquire(&s, &OwnerId::new("o").unwrap()))
            .unwrap();
        rt.block_on(leases.release(&early)).unwrap();
        let lease = rt
            .block_on(leases.acquire_above(&s, &OwnerId::new("a").unwrap(), floor))
            .unwrap();
        assert!(lease.token() > floor);
        let (bytes, synced, _) = events(&path).last().cloned().unwrap();
        assert!(synced, "the raised record was not synced");
        assert_eq!(decode(&bytes).token, lease.token().get());
        assert!(durable_ceiling(&path).unwrap() >= lease.token().get());
        // Unsynced writes after it (renew, release) may be lost: every state
        // a power loss may leave still takes over above the floor.
        let lease = rt.block_on(leases.renew(&lease)).unwrap();
        rt.block_on(leases.release(&lease)).unwrap();
        drop(leases);
        let states = crash_states(&path);
        assert!(states.len() > 1, "{} states", states.len());
        for state in states {
            let state = state.expect("the file's name was synced");
            if Record::decode(&path, &state).is_err() {
                continue; // a torn header: an error, never a lower token
            }
            std::fs::write(&path, &state).unwrap();
            // Past any hold a lost release left behind.
            clock.advance(TTL * 2);
            let after = open();
            let next = rt
                .block_on(after.acquire(&s, &OwnerId::new("b").unwrap()))
                .unwrap();
            assert!(next.token() > lease.token(), "{next:?} after {lease:?}");
            rt.block_on(after.release(&next)).unwrap();
        }
    }

    /// Unsynced leases in `dir` on `clock` as boot `id` opens them.
    fn booted(dir: &Path, clock: &ManualClock, id: u8) -> FlockLease {
        unsynced(dir, clock).boot_id([id; 16]).open().unwrap()
    }

    /// Unsynced leases in `dir` on `clock`, three tokens a reservation.
    fn unsynced(dir: &Path, clock: &ManualClock) -> crate::FlockLeaseBuilder {
        FlockLease::builder(dir)
            .ttl(TTL)
            .clock(Arc::new(clock.clone()))
            .token_reservation(3)
            .durability(crate::Durability::Unsynced)
    }

    /// Unsynced: no sync at all, tokens still rising within the boot; and
    /// whatever a power loss leaves of the file (nothing, or any record
    /// ever written), an acquire above the store's surviving mark is above
    /// it, and so is every later takeover.
    #[test]
    fn unsynced_files_sync_nothing_and_recover_above_the_stores_mark() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let open = || unsynced(dir.path(), &clock).open().unwrap();
        let path = dir
            .path()
            .join(file_name(&SessionId::new("sync/count").unwrap()));
        let leases = open();
        // Above this boot's floor: the count of the boot, the clock's
        // second since 2025, times 2^32.
        let f = epoch_now(&clock) << 32;
        let above = |t: &[u64]| t.iter().map(|t| f + t).collect::<Vec<_>>();
        assert_eq!(takeovers(&leases, &rt, 7), above(&[1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(takeovers(&open(), &rt, 2), above(&[10, 11]));
        assert_eq!(takeovers(&leases, &rt, 1), above(&[13]));
        let events = events(&path);
        assert_eq!(events.len(), 10 * 3);
        assert!(
            events.iter().all(|e| !e.1 && !e.2),
            "a record or the directory was synced"
        );
        drop(leases);

        let s = SessionId::new("sync/count").unwrap();
        let states = crash_states(&path);
        // Lost, any record written, or one torn between two of them.
        assert!(states[0].is_none() && states.len() > 1 + 30);
        for mark in [f | 1, f | 7, f | 13] {
            for state in &states {
                match state {
                    Some(bytes) if Record::decode(&path, bytes).is_err() => {
                        continue; // a torn header: an error, never a lower token
                    }
                    Some(bytes) => std::fs::write(&path, bytes).unwrap(),
                    None => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
                clock.advance(TTL * 2);
                let floor = lease_port::FencingToken::new(mark);
                let after = open();
                let a = OwnerId::new("after/a").unwrap();
                let lease = rt.block_on(after.acquire_above(&s, &a, floor)).unwrap();
                assert!(lease.token() > floor, "{lease:?} not above {mark}");
                rt.block_on(after.release(&lease)).unwrap();
                let next = open();
                let b = OwnerId::new("after/b").unwrap();
                let taken = rt.block_on(next.acquire(&s, &b)).unwrap();
                assert!(taken.token() > lease.token(), "{taken:?} after {lease:?}");
                rt.block_on(next.release(&taken)).unwrap();
            }
        }
    }

    /// Unsynced, a power loss that takes back a session's lease file (and
    /// the store's writes with it, so no mark is left to refuse a repeat)
    /// still never repeats a token: the next boot's tokens start above
    /// every token of the boots before it, whatever state the file is left
    /// in.
    #[test]
    fn unsynced_tokens_never_repeat_across_a_reboot_that_lost_the_lease_file() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let boot = |id: u8| booted(dir.path(), &clock, id);
        let path = dir
            .path()
            .join(file_name(&SessionId::new("sync/count").unwrap()));
        let mut issued = takeovers(&boot(1), &rt, 5);
        issued.extend(takeovers(&boot(1), &rt, 2));
        let states = crash_states(&path);
        assert!(states[0].is_none() && states.len() > 2);
        for (n, state) in states.into_iter().enumerate() {
            match state {
                Some(bytes) if Record::decode(&path, &bytes).is_err() => continue,
                Some(bytes) => std::fs::write(&path, bytes).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&path);
                }
            }
            clock.advance(TTL * 2);
            let after = takeovers(&boot(2 + n as u8), &rt, 2);
            let before = *issued.iter().max().unwrap();
            assert!(
                after.iter().all(|t| *t > before),
                "after a reboot that left {path:?} as state {n}: {after:?}, not above {before}"
            );
            issued.extend(after);
        }
    }

    /// A boot whose tokens reach the next boot's floor (here through
    /// reservations of 2^31 tokens) counts itself further first: after a
    /// reboot that lost the lease file, the next token is still above
    /// every one before.
    #[test]
    fn a_boot_whose_tokens_reach_the_next_floor_counts_itself_further() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let boot = |id: u8| {
            unsynced(dir.path(), &clock)
                .token_reservation(1 << 31)
                .boot_id([id; 16])
                .open()
                .unwrap()
        };
        let path = dir
            .path()
            .join(file_name(&SessionId::new("sync/count").unwrap()));
        // Each instance reserves anew: 2^31 further each time.
        let issued: Vec<u64> = (0..4).flat_map(|_| takeovers(&boot(1), &rt, 1)).collect();
        assert!(
            issued.last().unwrap() >> 32 > 1,
            "{issued:x?} stayed in one epoch"
        );
        std::fs::remove_file(&path).unwrap();
        clock.advance(TTL * 2);
        let after = takeovers(&boot(2), &rt, 1);
        assert!(
            after[0] > *issued.iter().max().unwrap(),
            "{after:x?} after {issued:x?}"
        );
    }

    /// A synced instance on a directory unsynced ones used keeps above
    /// what they may have issued and lost: a record they wrote that is
    /// rolled back does not make it repeat their tokens.
    #[test]
    fn a_synced_instance_keeps_above_the_unsynced_ones_boot() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let path = dir
            .path()
            .join(file_name(&SessionId::new("sync/count").unwrap()));
        let issued = takeovers(
            &unsynced(dir.path(), &clock)
                .boot_id([1; 16])
                .open()
                .unwrap(),
            &rt,
            3,
        );
        std::fs::remove_file(&path).unwrap();
        clock.advance(TTL * 2);
        let synced = FlockLease::builder(dir.path())
            .ttl(TTL)
            .clock(Arc::new(clock.clone()))
            .boot_id([1; 16])
            .open()
            .unwrap();
        let after = takeovers(&synced, &rt, 1);
        assert!(
            after[0] > *issued.iter().max().unwrap(),
            "{after:x?} after {issued:x?}"
        );
    }

    /// Copies every regular file of `from` into `to` (created), as a
    /// backup restored elsewhere would be.
    fn copy_files(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }

    /// `n` takeovers of `session` through `leases`, their tokens.
    fn takeovers_of(
        leases: &FlockLease,
        rt: &tokio::runtime::Runtime,
        session: &str,
        n: usize,
    ) -> Vec<u64> {
        let s = SessionId::new(session).unwrap();
        let o = OwnerId::new("o").unwrap();
        (0..n)
            .map(|_| {
                let l = rt.block_on(leases.acquire(&s, &o)).unwrap();
                rt.block_on(leases.release(&l)).unwrap();
                l.token().get()
            })
            .collect()
    }

    /// The boot count put back from an older copy (here, by hand) while a
    /// lease file shows a later boot's token: the next boot counts past
    /// that token with a margin, so a session whose file was lost does
    /// not get a token of the boots the count forgot.
    #[test]
    fn a_boot_count_put_back_behind_the_lease_files_never_repeats_a_token() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let boot = |id: u8| booted(dir.path(), &clock, id);
        let count = dir.path().join(crate::store::boot_epoch::BOOT_EPOCH_FILE);
        let mut issued = takeovers_of(&boot(1), &rt, "kept", 1);
        let old_count = std::fs::read(&count).unwrap();
        for id in 2..=3 {
            let leases = boot(id);
            issued.extend(takeovers_of(&leases, &rt, "kept", 1));
            issued.extend(takeovers_of(&leases, &rt, "lost", 2));
            clock.advance(TTL * 2);
        }
        std::fs::write(&count, old_count).unwrap();
        std::fs::remove_file(dir.path().join(file_name(&SessionId::new("lost").unwrap()))).unwrap();
        let after = takeovers_of(&boot(4), &rt, "lost", 1);
        let before = *issued.iter().max().unwrap();
        assert!(after[0] > before, "{after:x?} not above {issued:x?}");
    }

    /// A deleted boot count (as a damaged one's error advises) restarts
    /// past every token the lease files show, with a margin: the last
    /// boot's sessions may have lost their files with it.
    #[test]
    fn a_deleted_boot_count_restarts_past_the_lease_files_with_a_margin() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let boot = |id: u8| booted(dir.path(), &clock, id);
        let mut issued = takeovers_of(&boot(1), &rt, "kept", 2);
        issued.extend(takeovers_of(&boot(2), &rt, "lost", 2));
        clock.advance(TTL * 2);
        std::fs::remove_file(dir.path().join(crate::store::boot_epoch::BOOT_EPOCH_FILE)).unwrap();
        std::fs::remove_file(dir.path().join(file_name(&SessionId::new("lost").unwrap()))).unwrap();
        let after = takeovers_of(&boot(3), &rt, "lost", 1);
        let before = *issued.iter().max().unwrap();
        assert!(after[0] > before, "{after:x?} not above {issued:x?}");
    }

    /// A copy adopted after its original went on issuing tokens (the copy
    /// is a backup): every token the adopted copy issues, synced or not,
    /// is above every token the original issued, with no repair; until it
    /// is adopted, no instance opens on it.
    #[test]
    fn an_adopted_copy_issues_tokens_above_everything_its_original_did() {
        let rt = rt();
        let root = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        for durability in [crate::Durability::Synced, crate::Durability::Unsynced] {
            let (original, copy) = (
                root.path().join(format!("{durability:?}")),
                root.path().join(format!("{durability:?}-copy")),
            );
            let open = |dir: &Path| {
                unsynced(dir, &clock)
                    .durability(durability)
                    .boot_id([1; 16])
                    .open()
            };
            let leases = open(&original).unwrap();
            rt.block_on(leases.authority()).unwrap();
            let mut issued = takeovers_of(&leases, &rt, "s", 2);
            copy_files(&original, &copy);
            // After the backup: more tokens, a session the copy never saw.
            issued.extend(takeovers_of(&leases, &rt, "s", 40));
            issued.extend(takeovers_of(&leases, &rt, "new", 3));
            drop(leases);

            let refused = open(&copy).unwrap_err();
            assert!(refused.message().contains("is a copy"), "{refused}");
            clock.advance(Duration::from_secs(1));
            crate::authority::adopt_at(&copy, clock.now()).unwrap();
            let adopted = open(&copy).unwrap();
            rt.block_on(adopted.authority()).unwrap();
            let before = *issued.iter().max().unwrap();
            for session in ["s", "new"] {
                let after = takeovers_of(&adopted, &rt, session, 1);
                assert!(
                    after[0] > before,
                    "{durability:?}, {session}: {after:x?} not above {issued:x?}"
                );
            }
        }
    }

    /// One backup restored twice, each adopted in its own second: the two
    /// restores never issue one token, and the second is above the first.
    /// So is a copy adopted after its original jumped (its count deleted
    /// and recounted) since the copy was taken.
    #[test]
    fn copies_adopted_apart_never_share_a_token() {
        let rt = rt();
        let root = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let open = |dir: &Path, boot: u8| booted(dir, &clock, boot);
        let (original, backup) = (root.path().join("original"), root.path().join("backup"));
        let leases = open(&original, 1);
        rt.block_on(leases.authority()).unwrap();
        takeovers_of(&leases, &rt, "s", 2);
        drop(leases);
        copy_files(&original, &backup);

        // The original recounts (its count deleted) and boots twice more.
        std::fs::remove_file(original.join(crate::store::boot_epoch::BOOT_EPOCH_FILE)).unwrap();
        let mut issued = Vec::new();
        for boot in 2..=3 {
            issued.extend(takeovers_of(&open(&original, boot), &rt, "s", 1));
            clock.advance(TTL * 2);
        }
        for restore in ["first", "second"] {
            clock.advance(Duration::from_secs(1));
            let dir = root.path().join(restore);
            copy_files(&backup, &dir);
            crate::authority::adopt_at(&dir, clock.now()).unwrap();
            let after = takeovers_of(&open(&dir, 9), &rt, "s", 2);
            let before = *issued.iter().max().unwrap();
            assert!(
                after.iter().all(|t| *t > before),
                "{restore}: {after:x?} not above {issued:x?}"
            );
            issued.extend(after);
        }
    }

    /// A count ahead of the clock (here, a floor from a repair far above
    /// it): two restores of one backup adopted an hour apart still count
    /// apart, by the seconds since the backup's count was written.
    #[test]
    fn copies_of_a_count_ahead_of_the_clock_adopted_apart_never_share_a_token() {
        let rt = rt();
        let root = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let open = |dir: &Path, boot: u8| booted(dir, &clock, boot);
        let (original, backup) = (root.path().join("original"), root.path().join("backup"));
        rt.block_on(open(&original, 1).authority()).unwrap();
        crate::repair(&original, &SessionId::new("x").unwrap(), 1 << 60).unwrap();
        drop(open(&original, 2));
        copy_files(&original, &backup);
        let mut issued: Vec<u64> = Vec::new();
        for restore in ["first", "second"] {
            clock.advance(Duration::from_secs(3600));
            let dir = root.path().join(restore);
            copy_files(&backup, &dir);
            crate::authority::adopt_at(&dir, clock.now()).unwrap();
            let after = takeovers_of(&open(&dir, 3), &rt, "s", 2);
            assert!(
                after
                    .iter()
                    .all(|t| t >> 32 > 1 << 28 && !issued.contains(t)),
                "{restore}: {after:x?} beside {issued:x?}"
            );
            issued.extend(after);
        }
    }

    /// A count put back by one boot, with a lease file of the boot it
    /// forgot lost: the next boot counts past the tokens the other files
    /// show, so the lost session's token is not issued again.
    #[test]
    fn a_count_put_back_by_one_boot_never_repeats_a_token() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let boot = |id: u8| booted(dir.path(), &clock, id);
        let count = dir.path().join(crate::store::boot_epoch::BOOT_EPOCH_FILE);
        drop(boot(1));
        drop(boot(2));
        let old_count = std::fs::read(&count).unwrap();
        let third = boot(3);
        takeovers_of(&third, &rt, "other", 1);
        let first = takeovers_of(&third, &rt, "lost", 1)[0];
        drop(third);
        std::fs::remove_file(dir.path().join(file_name(&SessionId::new("lost").unwrap()))).unwrap();
        std::fs::write(&count, old_count).unwrap();
        let again = takeovers_of(&boot(4), &rt, "lost", 1)[0];
        assert!(again > first, "{again:#x} after {first:#x}");
    }

    /// An adoption with the wall clock behind the second the copy's count
    /// was written is refused: the margin it counts by would be negative.
    #[test]
    fn an_adoption_on_a_clock_behind_the_counts_last_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let leases = unsynced(dir.path(), &clock).open().unwrap();
        rt().block_on(leases.authority()).unwrap();
        let behind = clock.now() - Duration::from_secs(60);
        let e = crate::authority::adopt_at(dir.path(), behind).unwrap_err();
        assert!(e.message().contains("set the clock"), "{e}");
    }

    /// An adoption with the wall clock before 2025 is refused: its jump
    /// would not tell two copies apart.
    #[test]
    fn an_adoption_on_a_clock_before_2025_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let leases = unsynced(dir.path(), &clock).open().unwrap();
        rt().block_on(leases.authority()).unwrap();
        let e = crate::authority::adopt_at(dir.path(), std::time::UNIX_EPOCH).unwrap_err();
        assert!(e.message().contains("before 2025"), "{e}");
        crate::authority::adopt_at(dir.path(), clock.now()).unwrap();
    }

    /// The clock's second since 2025: the least epoch a boot counts.
    fn epoch_now(clock: &ManualClock) -> u64 {
        let secs = clock.now().duration_since(std::time::UNIX_EPOCH).unwrap();
        secs.as_secs() - 1_735_689_600
    }

    /// Synced instances issue tokens one epoch past the unsynced count;
    /// each boot still counts the clock's second, never running ahead of
    /// it, however many boots.
    #[test]
    fn synced_tokens_beside_unsynced_boots_keep_the_count_on_the_clock() {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let mut seconds = Vec::new();
        let epochs: Vec<u64> = (1..=4)
            .map(|boot| {
                seconds.push(epoch_now(&clock));
                let unsynced = unsynced(dir.path(), &clock)
                    .boot_id([boot; 16])
                    .open()
                    .unwrap();
                let synced = FlockLease::builder(dir.path())
                    .ttl(TTL)
                    .clock(Arc::new(clock.clone()))
                    .boot_id([boot; 16])
                    .open()
                    .unwrap();
                takeovers_of(&synced, &rt, "synced", 1);
                clock.advance(TTL * 2);
                takeovers_of(&unsynced, &rt, "unsynced", 1)[0] >> 32
            })
            .collect();
        assert_eq!(epochs, seconds);
    }
}
