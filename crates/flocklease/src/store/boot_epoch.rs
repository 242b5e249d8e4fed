//! The token floor of this boot, for unsynced lease files.
//!
//! Unsynced, a power loss may take back a lease file (and the store's
//! writes under its tokens), and the next boot would then issue the same
//! tokens again. Within the store that harms nobody, but a token is also
//! what outside systems key effects on: the same (session, token) must
//! never name two runs. So every boot of the host gets an epoch, counted
//! in `.boot-epoch` and synced before any token of that boot is issued,
//! and every token an unsynced instance issues lies above
//! `epoch << EPOCH_SHIFT`. One sync per boot per directory buys what a
//! sync per session would.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

use super::directory::Directory;
use crate::LeaseFileError;

/// The file, in the lease directory, counting the host's boots.
pub(crate) const BOOT_EPOCH_FILE: &str = ".boot-epoch";

/// Tokens one session can be issued in one boot before it would reach the
/// next boot's floor: four billion.
pub(crate) const EPOCH_SHIFT: u32 = 32;

/// The record's fixed length: written whole at offset 0, it fits one
/// sector, which a power loss leaves old or new, never torn.
const RECORD_LEN: usize = 128;

/// The count as the file holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count {
    epoch: u64,
    /// The boot that counted it; all zero when unknown.
    boot: [u8; 16],
    /// The wall clock's second (after the Unix epoch) when it was written;
    /// `None` in a record of version 1, which did not say.
    written: Option<u64>,
}

fn encode(count: Count) -> [u8; RECORD_LEN] {
    let hex: String = count.boot.iter().map(|b| format!("{b:02x}")).collect();
    let written = count.written.unwrap_or(0);
    let text = format!("mecatl-boot-epoch 2 {} {hex} {written}", count.epoch);
    let mut out = [b' '; RECORD_LEN];
    out[..text.len()].copy_from_slice(text.as_bytes());
    out[RECORD_LEN - 1] = b'\n';
    out
}

/// The count `bytes` hold (version 1 or 2); `None` for an empty file.
fn decode(path: &Path, bytes: &[u8]) -> Result<Option<Count>, LeaseFileError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let bad = |detail: &str| LeaseFileError::BootEpoch {
        path: path.to_path_buf(),
        detail: detail.to_owned(),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not text"))?;
    let mut words = text.split_ascii_whitespace();
    let version = match (words.next(), words.next()) {
        (Some("mecatl-boot-epoch"), Some("1")) => 1,
        (Some("mecatl-boot-epoch"), Some("2")) => 2,
        _ => return Err(bad("no `mecatl-boot-epoch 1` or `2` header")),
    };
    let epoch = words
        .next()
        .and_then(|w| w.parse::<u64>().ok())
        .filter(|e| *e < 1 << (64 - EPOCH_SHIFT - 1))
        .ok_or_else(|| bad("no epoch, or one past the token range"))?;
    let hex = words.next().filter(|h| h.len() == 32);
    let mut boot = [0u8; 16];
    for (i, pair) in hex
        .ok_or_else(|| bad("no boot id"))?
        .as_bytes()
        .chunks(2)
        .enumerate()
    {
        let pair = std::str::from_utf8(pair).map_err(|_| bad("a boot id that is not hex"))?;
        boot[i] = u8::from_str_radix(pair, 16).map_err(|_| bad("a boot id that is not hex"))?;
    }
    let written = match version {
        1 => None,
        _ => Some(
            words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .ok_or_else(|| bad("no second it was written"))?,
        ),
    };
    if words.next().is_some() {
        return Err(bad("words after the record"));
    }
    Ok(Some(Count {
        epoch,
        boot,
        written,
    }))
}

/// The highest epoch: `(MAX_EPOCH + 1) << EPOCH_SHIFT` is 2^63, the top
/// of the token range.
const MAX_EPOCH: u64 = (1 << (63 - EPOCH_SHIFT)) - 1;

/// What the count says for one unsynced instance: its tokens lie above
/// `floor`, and must stay below `limit` unless the count is raised first
/// ([`raise_to_cover`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BootCount {
    pub(crate) floor: u64,
    pub(crate) limit: u64,
}

fn bounds(epoch: u64) -> BootCount {
    BootCount {
        floor: epoch << EPOCH_SHIFT,
        limit: (epoch + 1) << EPOCH_SHIFT,
    }
}

/// The count's file, locked (exclusively to write it); `None` when it does
/// not exist and `create` is false.
fn open_locked(
    dir: &Directory,
    create: bool,
    exclusive: bool,
) -> Result<Option<Flock<File>>, LeaseFileError> {
    let path = dir.file_path(BOOT_EPOCH_FILE);
    let mut flags = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    flags |= if create {
        OFlag::O_RDWR | OFlag::O_CREAT
    } else {
        OFlag::O_RDONLY
    };
    let fd: OwnedFd = match nix::fcntl::openat(
        dir.fd(),
        BOOT_EPOCH_FILE,
        flags,
        Mode::S_IRUSR | Mode::S_IWUSR,
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) if !create => return Ok(None),
        Err(e) => return Err(LeaseFileError::io("opening", path, e)),
    };
    let how = if exclusive {
        FlockArg::LockExclusive
    } else {
        FlockArg::LockShared
    };
    Flock::lock(File::from(fd), how)
        .map(Some)
        .map_err(|(_, e)| LeaseFileError::io("locking", path, e))
}

/// The count's file, created when absent, locked exclusively.
fn open_to_write(dir: &Directory) -> Result<Flock<File>, LeaseFileError> {
    open_locked(dir, true, true)?.ok_or_else(|| {
        LeaseFileError::io(
            "creating",
            dir.file_path(BOOT_EPOCH_FILE),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })
}

fn read_count(dir: &Directory, file: &File) -> Result<Option<Count>, LeaseFileError> {
    let path = dir.file_path(BOOT_EPOCH_FILE);
    let mut bytes = vec![0u8; RECORD_LEN + 1];
    let n = file
        .read_at(&mut bytes, 0)
        .map_err(|e| LeaseFileError::io("reading", path.clone(), e))?;
    decode(&path, &bytes[..n])
}

/// Writes the count and makes it, and its file's name, durable by this
/// instance's own syncs: a count another instance wrote but that was
/// never seen synced (it died first, or its sync failed with the page
/// still cached) could be taken back by a power loss.
fn write_synced(
    dir: &Directory,
    file: &File,
    epoch: u64,
    boot: [u8; 16],
    now: SystemTime,
) -> Result<(), LeaseFileError> {
    let path = dir.file_path(BOOT_EPOCH_FILE);
    if epoch > MAX_EPOCH {
        return Err(LeaseFileError::BootEpoch {
            path,
            detail: format!("the count would pass {MAX_EPOCH}, the top of the token range"),
        });
    }
    let written = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let count = Count {
        epoch,
        boot,
        written: Some(written),
    };
    file.write_all_at(&encode(count), 0)
        .map_err(|e| LeaseFileError::io("writing", path.clone(), e))?;
    file.sync_data()
        .map_err(|e| LeaseFileError::io("syncing", path, e))?;
    // The file's name too: a count that a power loss could take back
    // with its name would let the next boot count this one again.
    dir.sync()
}

/// 2025-01-01T00:00:00Z, in seconds after the Unix epoch: where
/// [`epoch_of_time`] starts. 2^31 seconds later, in 2093, it reaches
/// [`MAX_EPOCH`].
const TIME_BASE_SECS: u64 = 1_735_689_600;

/// The epoch a count that cannot be trusted jumps to at least: one per
/// second of the wall clock since [`TIME_BASE_SECS`]. A count is jumped
/// when it was lost, found behind the lease files, or its directory
/// adopted as a copy. The boots it forgot, and copies of the directory
/// that went on counting apart from it, counted one epoch per boot (or
/// instance start) from an epoch no later than their own last jump, so
/// unless one of them counted more boots than seconds went by, all their
/// epochs are below this. A jump computed from the directory's contents
/// alone would not do: two copies of one backup would jump to the same
/// epoch.
fn epoch_of_time(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().saturating_sub(TIME_BASE_SECS))
        .min(MAX_EPOCH)
}

/// Where a jumped count goes: past the last count, every token the lease
/// files show, and the wall clock's epoch.
fn jump_target(counted: u64, in_use: Option<u64>, now: SystemTime) -> u64 {
    (counted.max(in_use.unwrap_or(0)) + 1).max(epoch_of_time(now))
}

/// This boot's bounds for the directory, for an unsynced instance: every
/// token it issues must exceed the floor. The first instance of a boot
/// counts the boot (under the file's lock, so racing instances agree);
/// every instance syncs the count itself before answering. `boot` is this
/// boot's id; all zero when it cannot be read, and then every instance
/// counts a boot of its own, as it cannot tell a reboot from a restart.
///
/// Every new boot jumps ([`jump_target`]): past the last count, past
/// every token the lease files show (a count put back from an older copy,
/// or deleted, is behind them), and to the wall clock's second at least,
/// so that boots counted without a boot id, one per instance start, stay
/// pinned to the clock rather than running ahead of it.
pub(crate) fn count_this_boot(
    dir: &Directory,
    boot: [u8; 16],
    now: SystemTime,
) -> Result<BootCount, LeaseFileError> {
    let file = open_to_write(dir)?;
    let epoch = match read_count(dir, &file)? {
        Some(count) if count.boot == boot && boot != [0; 16] => count.epoch,
        counted => jump_target(
            counted.map_or(0, |count| count.epoch),
            highest_epoch_in_use(dir.path())?,
            now,
        ),
    };
    write_synced(dir, &file, epoch, boot, now)?;
    Ok(bounds(epoch))
}

/// Jumps the count for a directory adopted as a copy of a retired one
/// ([`crate::adopt`]): the original may have issued tokens after the copy
/// was taken, synced or not. The new count is past every token the lease
/// files show and the wall clock's epoch ([`epoch_of_time`]), and past the
/// copy's count by the seconds since that count was written: the original
/// counted on from it at most one epoch a second (one a boot, and each at
/// least the clock's second), so that margin keeps above it even where
/// the count ran ahead of the clock (a floor from a store's mark, a clock
/// that was ahead). Two copies of one backup adopted in different seconds
/// get different counts for the same reason. Every token issued after
/// this, by synced instances too ([`floor_for_synced`]), lies above the
/// new count. A damaged count is replaced: this is how one is repaired.
/// Returns the new floor.
pub(crate) fn count_past_any_copy(dir: &Directory, now: SystemTime) -> Result<u64, LeaseFileError> {
    let refused = |detail: String| LeaseFileError::BootEpoch {
        path: dir.file_path(BOOT_EPOCH_FILE),
        detail,
    };
    if epoch_of_time(now) == 0 {
        // Without the clock term two copies adopted apart would jump to
        // the same count: refused, not guessed at.
        return Err(refused(
            "the wall clock reads before 2025, so an adoption cannot count past the copies of \
             this directory; set the clock, then adopt"
                .to_owned(),
        ));
    }
    let file = open_to_write(dir)?;
    let counted = read_count(dir, &file).ok().flatten();
    let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let since = match counted.and_then(|c| c.written) {
        Some(written) if written > now_secs => {
            return Err(refused(format!(
                "the wall clock reads {now_secs}, before the count was last written \
                 ({written}, seconds after 1970); set the clock, then adopt"
            )));
        }
        Some(written) => (now_secs - written).max(1),
        None => 1,
    };
    let epoch = jump_target(0, highest_epoch_in_use(dir.path())?, now)
        .max(counted.map_or(0, |c| c.epoch).saturating_add(since));
    // No boot is named: the next unsynced instance counts a boot of its
    // own, above this one.
    write_synced(dir, &file, epoch, [0; 16], now)?;
    Ok(bounds(epoch).floor)
}

/// Raises the count so that `token` lies below this boot's limit, and
/// returns the new bounds: a boot whose tokens (a long uptime's
/// reservations, a floor from a store's mark) reach the next boot's floor
/// counts itself further first, so the next boot still starts above them.
pub(crate) fn raise_to_cover(
    dir: &Directory,
    boot: [u8; 16],
    token: u64,
    now: SystemTime,
) -> Result<BootCount, LeaseFileError> {
    let file = open_to_write(dir)?;
    let needed = token >> EPOCH_SHIFT;
    let epoch = read_count(dir, &file)?.map_or(0, |c| c.epoch);
    if epoch >= needed {
        return Ok(bounds(epoch));
    }
    write_synced(dir, &file, needed, boot, now)?;
    Ok(bounds(needed))
}

/// The floor a synced instance keeps on a directory unsynced instances
/// also use: the limit of the last boot counted, above every token they
/// may have issued and lost, this boot or an earlier one. Reads only; 0
/// where no unsynced instance ever counted a boot.
pub(crate) fn floor_for_synced(dir: &Directory) -> Result<u64, LeaseFileError> {
    let Some(file) = open_locked(dir, false, false)? else {
        return Ok(0);
    };
    Ok(read_count(dir, &file)?.map_or(0, |c| bounds(c.epoch.min(MAX_EPOCH)).limit))
}

/// The highest epoch of any token recorded in the directory's lease
/// files; `None` when no readable lease file records one.
fn highest_epoch_in_use(dir: &Path) -> Result<Option<u64>, LeaseFileError> {
    let entries = crate::inspect::list_leases(dir, std::time::SystemTime::now()).map_err(|e| {
        LeaseFileError::BootEpoch {
            path: dir.join(BOOT_EPOCH_FILE),
            detail: format!("the lease files cannot be read to check the count against: {e}"),
        }
    })?;
    Ok(entries
        .iter()
        .filter_map(|e| e.lease.as_ref().ok())
        .flat_map(|l| [l.token, l.reserved])
        .flatten()
        .map(|t| t.get() >> EPOCH_SHIFT)
        .max())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn open(dir: &Path) -> Directory {
        Directory::open(dir.to_path_buf(), Duration::from_secs(1)).unwrap()
    }

    const BOOT_A: [u8; 16] = *b"boot-a-boot-a-aa";
    const BOOT_B: [u8; 16] = *b"boot-b-boot-b-bb";

    #[test]
    fn one_epoch_per_boot_counted_once_and_rising() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open(tmp.path());
        let first = count_this_boot(&dir, BOOT_A, SystemTime::UNIX_EPOCH)
            .unwrap()
            .floor;
        assert_eq!(first, 1 << EPOCH_SHIFT);
        assert_eq!(
            count_this_boot(&open(tmp.path()), BOOT_A, SystemTime::UNIX_EPOCH)
                .unwrap()
                .floor,
            first
        );
        let next = count_this_boot(&dir, BOOT_B, SystemTime::UNIX_EPOCH)
            .unwrap()
            .floor;
        assert_eq!(next, 2 << EPOCH_SHIFT);
        // Back to an earlier boot's id (a restored file, a reused id):
        // counted again, never back.
        assert_eq!(
            count_this_boot(&dir, BOOT_A, SystemTime::UNIX_EPOCH)
                .unwrap()
                .floor,
            3 << EPOCH_SHIFT
        );
    }

    #[test]
    fn an_unknown_boot_counts_every_instance() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open(tmp.path());
        let a = count_this_boot(&dir, [0; 16], SystemTime::UNIX_EPOCH)
            .unwrap()
            .floor;
        let b = count_this_boot(&dir, [0; 16], SystemTime::UNIX_EPOCH)
            .unwrap()
            .floor;
        assert!(b > a, "{b} after {a}");
    }

    #[test]
    fn racing_instances_of_one_boot_agree() {
        let tmp = tempfile::tempdir().unwrap();
        let floors: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        count_this_boot(&open(tmp.path()), BOOT_A, SystemTime::UNIX_EPOCH)
                            .unwrap()
                            .floor
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(floors.iter().all(|f| *f == 1 << EPOCH_SHIFT), "{floors:?}");
    }

    #[test]
    fn a_damaged_count_is_refused_with_its_path() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open(tmp.path());
        count_this_boot(&dir, BOOT_A, SystemTime::UNIX_EPOCH).unwrap();
        let path = tmp.path().join(BOOT_EPOCH_FILE);
        for bad in [
            &b"garbage"[..],
            b"mecatl-boot-epoch 1 x 00",
            b"mecatl-boot-epoch 1 9999999999999 00000000000000000000000000000000",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = count_this_boot(&dir, BOOT_B, SystemTime::UNIX_EPOCH).unwrap_err();
            assert!(matches!(e, LeaseFileError::BootEpoch { .. }), "{e:?}");
            assert!(e.to_string().contains(BOOT_EPOCH_FILE), "{e}");
        }
    }

    #[test]
    fn the_record_reads_back_and_version_1_is_read() {
        let path = Path::new("/x/.boot-epoch");
        let count = Count {
            epoch: 7,
            boot: BOOT_B,
            written: Some(1_767_225_600),
        };
        assert_eq!(decode(path, &encode(count)).unwrap(), Some(count));
        assert_eq!(decode(path, b"").unwrap(), None);
        let v1 = b"mecatl-boot-epoch 1 7 626f6f742d622d626f6f742d622d6262                     \n";
        let read = decode(path, v1).unwrap().unwrap();
        assert_eq!((read.epoch, read.boot, read.written), (7, BOOT_B, None));
    }
}
