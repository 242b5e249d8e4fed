//! The clock expiries are judged on within one host: this boot's
//! `CLOCK_MONOTONIC`, tagged with the clock domain (boot id and time
//! namespace) it belongs to, and the wall-clock conversions of the record.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use lease_port::LeaseError;

use crate::LeaseFileError;

/// This process's monotonic clock: which one it is (its domain id) and how
/// to map a clock's `Instant` onto it.
pub(crate) struct ClockDomain {
    /// [`read_clock_domain`]: the boot id mixed with the time namespace;
    /// zero when unknown, and then expiry is judged on the wall clock.
    id: [u8; 16],
    /// `CLOCK_MONOTONIC` in nanoseconds, read right beside `mono_anchor`:
    /// maps the clock's monotonic readings to a number every process of
    /// this boot shares.
    mono_base: u64,
    mono_anchor: Instant,
}

impl ClockDomain {
    /// The domain of this process; `dir` only names the lease directory in
    /// an error.
    pub(crate) fn of_this_process(dir: &Path) -> Result<Self, LeaseFileError> {
        let (mono_anchor, mono_base) = mono_anchor(dir)?;
        Ok(ClockDomain {
            id: read_clock_domain(),
            mono_base,
            mono_anchor,
        })
    }

    /// The domain id written into records ([`read_clock_domain`]).
    pub(crate) fn id(&self) -> [u8; 16] {
        self.id
    }

    /// A clock's monotonic reading `now` as nanoseconds of `CLOCK_MONOTONIC`
    /// (std's `Instant` is that clock on Linux): comparable between
    /// processes of one boot, and immune to wall-clock steps.
    pub(crate) fn mono_nanos(&self, now: Instant) -> u64 {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match now.checked_duration_since(self.mono_anchor) {
            Some(ahead) => self.mono_base.saturating_add(nanos(ahead)),
            None => self
                .mono_base
                .saturating_sub(nanos(self.mono_anchor.duration_since(now))),
        }
    }
}

/// One pairing of `Instant` and raw `CLOCK_MONOTONIC` per process, so every
/// instance in it maps a monotonic reading to exactly the same number.
fn mono_anchor(dir: &Path) -> Result<(Instant, u64), LeaseFileError> {
    static ANCHOR: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    if let Some(anchor) = ANCHOR.get() {
        return Ok(*anchor);
    }
    let instant = Instant::now();
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_err(|e| LeaseFileError::io("reading the monotonic clock for", dir.to_path_buf(), e))?;
    let raw = u64::try_from(t.tv_sec())
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0));
    Ok(*ANCHOR.get_or_init(|| (instant, raw)))
}

/// The id of this process's monotonic clock: the boot id mixed with the
/// time namespace. Processes share `CLOCK_MONOTONIC` only when both match:
/// a time namespace (`unshare --time`, a CRIU restore) offsets the clock
/// within one boot. All zero when the boot id cannot be read; then every
/// record is judged on the wall clock.
fn read_clock_domain() -> [u8; 16] {
    let mut id = read_boot_id();
    if id == [0; 16] {
        return id;
    }
    // Kernels without time namespaces (before 5.6) have no such link, and
    // all their processes share one monotonic clock per boot.
    if let Some(ns) = time_namespace() {
        for (byte, mix) in id[8..].iter_mut().zip(ns.to_le_bytes()) {
            *byte ^= mix;
        }
    }
    // Namespace inodes are reused once a namespace is gone; its offset
    // tells two namespaces with one inode apart (zero in the initial one).
    if let Some(offset) = monotonic_offset() {
        for (byte, mix) in id[..8].iter_mut().zip(offset.to_le_bytes()) {
            *byte ^= mix;
        }
    }
    id
}

/// This time namespace's `CLOCK_MONOTONIC` offset, folded into 64 bits,
/// from `/proc/self/timens_offsets` (`monotonic SECS NANOS`).
fn monotonic_offset() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/timens_offsets").ok()?;
    let line = text.lines().find(|l| l.starts_with("monotonic"))?;
    let mut fields = line.split_whitespace().skip(1);
    let secs: i64 = fields.next()?.parse().ok()?;
    let nanos: u64 = fields.next()?.parse().ok()?;
    Some((secs as u64).rotate_left(30) ^ nanos)
}

/// The inode of this process's time namespace (`/proc/self/ns/time` reads
/// `time:[INODE]`).
fn time_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/time").ok()?;
    let text = link.to_str()?;
    text.strip_prefix("time:[")?.strip_suffix(']')?.parse().ok()
}

/// This boot's id, from `/proc/sys/kernel/random/boot_id` (a UUID); all
/// zero when it cannot be read.
pub(crate) fn read_boot_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
        return id;
    };
    let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    if hex.len() != 32 {
        return [0; 16];
    }
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
        id[i] = digit(pair[0]) << 4 | digit(pair[1]);
    }
    id
}

/// `t` as nanoseconds since the Unix epoch, the record's wall-clock unit.
pub(crate) fn to_nanos(t: SystemTime) -> Result<u64, LeaseError> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .ok_or_else(|| {
            LeaseError::invalid("clock reads outside 1970..2554, the range of a lease record")
        })
}

/// The wall-clock time of `n` nanoseconds since the Unix epoch.
pub(crate) fn from_nanos(n: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(n)
}
