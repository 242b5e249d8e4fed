//! The file-system side: an instance's state on one lease directory, and the
//! driver that runs an operation on a lease file — open, lock, read, decide,
//! write, sync, unlock.
//!
//! The seams, one module each: [`directory`] (the directory's checks,
//! opening and reading lease files), [`clock_domain`] (the boot and
//! time-namespace monotonic clock), [`owner_lock`], [`file_lock`], and
//! [`decision`], the pure decision taken under the lock.

pub(crate) mod boot_epoch;
pub(crate) mod clock_domain;
pub(crate) mod decision;
pub(crate) mod directory;
pub(crate) mod file_lock;
pub(crate) mod owner_lock;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lease_port::{Clock, LeaseError, OwnerId};
use nix::fcntl::Flock;

use crate::{Durability, LeaseFileError};
use clock_domain::ClockDomain;
use decision::{Now, Plan, Terms};
use directory::{Directory, Opened, file_name};

pub(crate) use decision::{Op, Reply};

pub(crate) struct Store {
    dir: Directory,
    pub(crate) ttl: Duration,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) lock_timeout: Duration,
    pub(crate) inline_fast_path: bool,
    /// How many tokens one synced reservation covers (≥ 1).
    pub(crate) reservation: u64,
    pub(crate) durability: Durability,
    /// Every token this instance issues exceeds it ([`boot_epoch`]): this
    /// boot's floor when unsynced; when synced, the limit of the last boot
    /// an unsynced instance counted here (0 if none ever did).
    pub(crate) boot_floor: u64,
    /// Unsynced: tokens of this boot stay below it, the next boot's floor
    /// as the count stands; a grant reaching it raises the count first.
    boot_limit: AtomicU64,
    boot_id: [u8; 16],
    /// The in-memory file system (tmpfs, ramfs) the directory is on.
    pub(crate) volatile: Option<&'static str>,
    /// This process's monotonic clock and its domain; see [`clock_domain`].
    domain: ClockDomain,
    /// The sessions this instance may issue tokens for without a sync: lease
    /// file name → the reservation ceiling this instance wrote there and saw
    /// `fdatasync` confirm. See the crate docs, "Durability".
    armed: Mutex<HashMap<String, u64>>,
    /// Lease file name → the inode whose name this instance made durable
    /// (synced the directory after the file existed).
    named: Mutex<HashMap<String, u64>>,
}

/// An instance's settings, checked by the builder.
pub(crate) struct Settings {
    pub(crate) ttl: Duration,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) lock_timeout: Duration,
    pub(crate) inline_fast_path: bool,
    pub(crate) dir_check_interval: Duration,
    pub(crate) reservation: u64,
    pub(crate) durability: Durability,
    /// The host's boot id as this instance sees it (all zero when
    /// unknown); only tests set another.
    pub(crate) boot_id: [u8; 16],
}

/// The most sessions an instance keeps armed; past it the set is cleared,
/// which costs each session one more synced reservation and nothing else.
const MAX_ARMED: usize = 65_536;

impl Store {
    pub(crate) fn new(dir: PathBuf, settings: Settings) -> Result<Self, LeaseFileError> {
        debug_assert!(settings.reservation >= 1);
        let dir = Directory::open(dir, settings.dir_check_interval)?;
        file_lock::probe_locks(dir.path(), dir.fd())?;
        let domain = ClockDomain::of_this_process(dir.path())?;
        let volatile = directory::volatile_fs(dir.path(), dir.fd())?;
        let (boot_floor, boot_limit) = match settings.durability {
            Durability::Synced => (boot_epoch::floor_for_synced(&dir)?, u64::MAX),
            Durability::Unsynced => {
                let count =
                    boot_epoch::count_this_boot(&dir, settings.boot_id, settings.clock.now())?;
                (count.floor, count.limit)
            }
        };
        Ok(Store {
            boot_floor,
            boot_limit: AtomicU64::new(boot_limit),
            boot_id: settings.boot_id,
            dir,
            ttl: settings.ttl,
            clock: settings.clock,
            lock_timeout: settings.lock_timeout,
            inline_fast_path: settings.inline_fast_path,
            reservation: settings.reservation,
            durability: settings.durability,
            volatile,
            domain,
            armed: Mutex::new(HashMap::new()),
            named: Mutex::new(HashMap::new()),
        })
    }

    /// The directory holding the lease files.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Takes this owner id's lock ([`owner_lock::lock_owner`]).
    pub(crate) fn lock_owner(&self, owner: &OwnerId) -> Result<Flock<File>, LeaseFileError> {
        owner_lock::lock_owner(&self.dir, owner)
    }

    /// The reservation ceiling this instance last synced on file `name`.
    fn armed_ceiling(&self, name: &str) -> Option<u64> {
        let armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        armed.get(name).copied()
    }

    fn arm(&self, name: &str, ceiling: u64) {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        if armed.len() >= MAX_ARMED && !armed.contains_key(name) {
            armed.clear();
        }
        armed.insert(name.to_owned(), ceiling);
    }

    /// Whether this instance synced the directory after lease file `name`
    /// (inode `ino`) existed.
    fn name_durable(&self, name: &str, ino: u64) -> bool {
        let named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        named.get(name) == Some(&ino)
    }

    fn mark_name_durable(&self, name: &str, ino: u64) {
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if named.len() >= MAX_ARMED && !named.contains_key(name) {
            named.clear();
        }
        named.insert(name.to_owned(), ino);
    }

    fn terms(&self) -> Terms {
        Terms {
            ttl: self.ttl,
            reservation: self.reservation,
            clock_domain: self.domain.id(),
        }
    }

    /// Under the lock: checks the directory still is the one opened, reads
    /// the record and the clock, and decides what to write and answer
    /// ([`decision::decide`]).
    fn plan(&self, file: &File, name: &str, op: &Op) -> Result<Plan, LeaseError> {
        self.dir.check_if_due()?;
        let read = self.dir.read_record(file, name, op.session());
        let now = Now {
            wall: self.clock.now(),
            mono: self.domain.mono_nanos(self.clock.instant()),
        };
        let mut plan = decision::decide(&self.terms(), read, self.armed_ceiling(name), op, now)?;
        if let Some(record) = &plan.write {
            let highest = record.token.max(record.reserved);
            if highest >= self.boot_limit.load(Ordering::Acquire) {
                let count =
                    boot_epoch::raise_to_cover(&self.dir, self.boot_id, highest, self.clock.now())?;
                self.boot_limit.fetch_max(count.limit, Ordering::AcqRel);
            }
        }
        if self.durability == Durability::Unsynced {
            // The reservation is still written and armed: within one boot
            // the page cache every process shares is the record, and a
            // machine crash ends every holder of the tokens it may lose.
            plan.sync = false;
        }
        Ok(plan)
    }

    /// Writes the planned record in place (fdatasync when planned) and
    /// returns the planned answer. The lock is released when `file` drops.
    fn apply(&self, file: &File, name: &str, plan: Plan) -> Result<Reply, LeaseError> {
        if let Some(record) = &plan.write {
            let bytes = record.encode();
            file.write_all_at(&bytes, 0)
                .map_err(|e| LeaseFileError::io("writing", self.dir.file_path(name), e))?;
            let dir_synced = plan.sync && self.sync(file, name)?;
            #[cfg(test)]
            crate::crash_sim::wrote(&self.dir.file_path(name), &bytes, plan.sync, dir_synced);
            #[cfg(not(test))]
            let _ = dir_synced;
            if let Some(ceiling) = plan.arm {
                // Still under the lock: nobody can have written since.
                self.arm(name, ceiling);
            }
        }
        plan.reply
    }

    /// `fdatasync`s lease file `name`, and the directory unless this instance
    /// already made the file's name durable; whether it synced the directory.
    fn sync(&self, file: &File, name: &str) -> Result<bool, LeaseFileError> {
        file.sync_data()
            .map_err(|e| LeaseFileError::io("syncing", self.dir.file_path(name), e))?;
        // The name must be durable too, or a power loss takes the file and
        // its tokens away. Whoever created the file may have died (or
        // failed) before syncing the directory, so every synced write syncs
        // it until this instance has done so itself for this file.
        let ino = nix::sys::stat::fstat(file)
            .map_err(|e| LeaseFileError::io("inspecting", self.dir.file_path(name), e))?
            .st_ino;
        if self.name_durable(name, ino) {
            return Ok(false);
        }
        self.dir.sync()?;
        self.mark_name_durable(name, ino);
        Ok(true)
    }

    /// Opens the operation's lease file: `None` when it does not exist and
    /// the operation does not create it.
    fn open(&self, name: &str, op: &Op) -> Result<Option<File>, LeaseFileError> {
        Ok(
            match self
                .dir
                .open_file(name, op.creates_file(), !op.reads_only())?
            {
                Opened::File(f) => Some(f),
                Opened::Absent => None,
            },
        )
    }

    /// The whole operation on the calling thread, waiting for the lock as
    /// long as the lock timeout allows.
    pub(crate) fn run_blocking(
        &self,
        op: &Op,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        let name = file_name(op.session());
        let Some(file) = self.open(&name, op)? else {
            return op.reply_without_file();
        };
        self.wait_plan_apply(file, &name, op, abandoned)
    }

    /// Waits for the lock, decides and writes — unless the caller gave up
    /// first: then nothing is written.
    fn wait_plan_apply(
        &self,
        file: File,
        name: &str,
        op: &Op,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        let shared = op.reads_only();
        let waited =
            file_lock::wait_lock(&self.dir, file, name, shared, self.lock_timeout, abandoned)?;
        let Some(locked) = waited else {
            return Err(abandoned_error());
        };
        let plan = self.plan(&locked, name, op)?;
        self.apply_unless_abandoned(&locked, name, plan, abandoned)
    }

    fn apply_unless_abandoned(
        &self,
        file: &File,
        name: &str,
        plan: Plan,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        // Under the lock: a caller that gave up before this point never
        // sees a write land after it stopped waiting.
        if abandoned.load(Ordering::Acquire) {
            return Err(abandoned_error());
        }
        self.apply(file, name, plan)
    }

    /// The fast path: everything up to the point where the thread would have
    /// to wait (for the lock, or for fdatasync). Returns what is left.
    pub(crate) fn run_until_wait(&self, op: &Op) -> Result<Step, LeaseError> {
        let name = file_name(op.session());
        let Some(file) = self.open(&name, op)? else {
            return op.reply_without_file().map(Step::Done);
        };
        let locked = match file_lock::try_lock(&self.dir, file, &name, op.reads_only())? {
            Ok(locked) => locked,
            Err(file) => return Ok(Step::WaitLock(file, name)),
        };
        let plan = self.plan(&locked, &name, op)?;
        if plan.needs_sync() {
            return Ok(Step::Sync(locked, name, plan));
        }
        self.apply(&locked, &name, plan).map(Step::Done)
    }

    /// Finishes what [`run_until_wait`](Self::run_until_wait) left; blocks.
    pub(crate) fn finish(
        &self,
        step: Step,
        op: &Op,
        abandoned: &AtomicBool,
    ) -> Result<Reply, LeaseError> {
        match step {
            Step::Done(reply) => Ok(reply),
            Step::WaitLock(file, name) => self.wait_plan_apply(file, &name, op, abandoned),
            Step::Sync(locked, name, plan) => {
                self.apply_unless_abandoned(&locked, &name, plan, abandoned)
            }
        }
    }
}

/// What an operation whose caller gave up answers (to nobody).
fn abandoned_error() -> LeaseError {
    LeaseError::transient("lease file operation abandoned by its caller")
}

/// Where the fast path stopped.
pub(crate) enum Step {
    Done(Reply),
    WaitLock(File, String),
    Sync(Flock<File>, String, Plan),
}
