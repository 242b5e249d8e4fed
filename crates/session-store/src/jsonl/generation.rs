//! The store directory's generation: a counter that only grows, kept in
//! the directory (`.store-generation`) with the directory's identity, and
//! mirrored in a witness file in another directory (the lease directory),
//! so that a directory that comes back older — a copy, a restored backup,
//! an older disk image put back in place while the witness, elsewhere,
//! kept its newer generation — is refused instead of served with
//! high-water marks below tokens already used.
//!
//! Every write of either file is a private temporary file, synced, renamed
//! over the old one, and the directory synced: a reader sees the old
//! record or the new one, never a mix, and the store's record is durable
//! before the witness is written, so after any crash the witness is never
//! ahead of the store it guards. A record that fails its checksum or its
//! strict parse is `Corrupt`, never taken for "none".

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{DEFAULT_LOCK_TIMEOUT, StoreCore, lock, open_flags, tmp_name};
use crate::StoreError;

/// The generation record in the store directory: `<store>/.store-generation`.
pub const GENERATION_FILE_NAME: &str = ".store-generation";

/// The subdirectory of a witness directory holding one witness file per
/// store, named by the store's id: `<witness>/.store-generations/<id>`.
/// `flocklease` leaves it alone when the witness directory is a lease
/// directory.
pub const WITNESS_DIR_NAME: &str = ".store-generations";

/// The largest record read (a record is about 200 bytes plus a path).
const MAX_RECORD_BYTES: u64 = 16 * 1024;

/// How a store opened for writing guards against its directory coming back
/// older ([`JsonlOptions::generation`](super::JsonlOptions::generation)).
///
/// With a check on, [`JsonlStore::open`](super::JsonlStore::open) reads
/// the store's generation record, refuses the directory when it is older
/// than it should be (`StoreErrorKind::Rewound`), and advances the
/// generation durably. See the crate docs, "The store's generation".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GenerationCheck {
    /// Nothing is read or written (the default: readers, operator tools,
    /// tests). A server writing to the store turns a check on.
    #[default]
    Off,
    /// The store's own record only: a copy of the directory (a new inode:
    /// `cp -a`, a restore into a new directory, another disk) is refused.
    /// An older copy put back into the same directory is not noticed.
    InStore,
    /// The store's own record, mirrored in a witness file in this other
    /// directory — the lease directory — which a restore of the store
    /// directory does not reach. Refuses a copy, and also a store whose
    /// generation is below its witness's (an older copy put back in place,
    /// the generation record lost). A missing witness is created.
    Witness(PathBuf),
}

impl GenerationCheck {
    /// [`Witness`](Self::Witness) in `dir`.
    pub fn witness(dir: impl Into<PathBuf>) -> Self {
        GenerationCheck::Witness(dir.into())
    }

    fn witness_dir(&self) -> Option<&Path> {
        match self {
            GenerationCheck::Witness(dir) => Some(dir),
            _ => None,
        }
    }
}

/// A store directory's generation: which store (its id, created at random
/// with the first record and kept by copies) and how far its counter went.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreGeneration {
    store: String,
    generation: u64,
}

impl StoreGeneration {
    /// The store's id (32 hexadecimal digits), the name of its witness file.
    pub fn store_id(&self) -> &str {
        &self.store
    }

    /// The counter: advanced at every open with a check on, by
    /// [`JsonlStore::advance_generation`](super::JsonlStore::advance_generation)
    /// and by [`adopt_store_dir`]; never lower for one store.
    pub fn get(&self) -> u64 {
        self.generation
    }
}

impl std::fmt::Display for StoreGeneration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "generation {} of store {}", self.generation, self.store)
    }
}

/// Both files hold one JSON line of this, `crc` being the CRC-32 of the
/// same line written without it ([`Unsealed`]).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct Record {
    v: u64,
    store: String,
    generation: u64,
    /// The store directory's identity when the record was written: its
    /// file system's id and its inode.
    fs: u64,
    ino: u64,
    /// The store directory's path then (for messages and for finding the
    /// witness of a store that lost its record).
    path: String,
    crc: u32,
}

/// A record's fields in their written order, without the checksum; then
/// with it. Serialised from structs, so the text never depends on how
/// `serde_json` orders maps.
#[derive(Serialize)]
struct Unsealed<'a> {
    v: u64,
    store: &'a str,
    generation: u64,
    fs: u64,
    ino: u64,
    path: &'a str,
}

#[derive(Serialize)]
struct Sealed<'a> {
    #[serde(flatten)]
    body: Unsealed<'a>,
    crc: u32,
}

impl Record {
    fn unsealed(&self) -> Unsealed<'_> {
        Unsealed {
            v: self.v,
            store: &self.store,
            generation: self.generation,
            fs: self.fs,
            ino: self.ino,
            path: &self.path,
        }
    }

    /// The CRC-32 of the record's line without its checksum.
    fn checksum(&self) -> u32 {
        let text = serde_json::to_string(&self.unsealed()).unwrap_or_default();
        crc32fast::hash(text.as_bytes())
    }

    /// The record's file content: one line, sealed.
    fn text(&self) -> String {
        let sealed = Sealed {
            body: self.unsealed(),
            crc: self.checksum(),
        };
        format!("{}\n", serde_json::to_string(&sealed).unwrap_or_default())
    }

    fn identity(&self) -> Identity {
        (self.fs, self.ino)
    }

    fn generation(&self) -> StoreGeneration {
        StoreGeneration {
            store: self.store.clone(),
            generation: self.generation,
        }
    }
}

/// A directory's file system id and inode.
type Identity = (u64, u64);

fn damaged(path: &Path, what: &str, remedy: &str) -> StoreError {
    StoreError::corrupt(path, None, format!("{what}; {remedy}"))
}

const OWN_REMEDY: &str = "the store's generation is unknown. Restore the file from the \
    newest copy of the store, or adopt the directory as it is \
    (session_store::adopt_store_dir) with every server of the store stopped";

const WITNESS_REMEDY: &str = "the generation this store directory must have reached is \
    unknown. Restore the file, or adopt the store directory as it is \
    (session_store::adopt_store_dir, given this witness directory) with every server of \
    the store stopped";

/// Reads the record at `path`: `None` when the file does not exist,
/// `Corrupt` for anything but a whole, well-formed, checksummed record.
fn read_record(path: &Path, remedy: &str) -> Result<Option<Record>, StoreError> {
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(open_flags())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(Errno::ELOOP as i32) => {
            return Err(damaged(path, "a symbolic link", remedy));
        }
        Err(e) => return Err(StoreError::io("opening the generation record", path, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspecting the generation record", path, e))?;
    if !meta.file_type().is_file() {
        return Err(damaged(path, "not a regular file", remedy));
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_RECORD_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| StoreError::io("reading the generation record", path, e))?;
    let record = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|text| text.strip_suffix('\n'))
        .filter(|line| !line.contains('\n'))
        .and_then(|line| serde_json::from_str::<Record>(line).ok())
        .ok_or_else(|| damaged(path, "not a complete generation record", remedy))?;
    if record.v != 1 {
        return Err(damaged(
            path,
            &format!("a generation record of version {}, not 1", record.v),
            remedy,
        ));
    }
    if record.checksum() != record.crc {
        return Err(damaged(
            path,
            "a generation record whose checksum does not match",
            remedy,
        ));
    }
    if !is_store_id(&record.store) {
        return Err(damaged(
            path,
            "a generation record without a store id",
            remedy,
        ));
    }
    Ok(Some(record))
}

fn is_store_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn random_id(dir: &Path) -> Result<String, StoreError> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| StoreError::io("reading /dev/urandom for a store id of", dir, e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Replaces `dir/name` with `text`: a private temporary file, synced,
/// renamed into place, the directory synced.
fn write_atomic(dir: &Path, dir_file: &File, name: &str, text: &str) -> Result<(), StoreError> {
    let path = dir.join(name);
    let tmp = dir.join(tmp_name("generation"));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(open_flags())
            .open(&tmp)
            .map_err(|e| StoreError::io("creating a generation record", &tmp, e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| StoreError::io("writing a generation record", &tmp, e))?;
        f.sync_all()
            .map_err(|e| StoreError::io("syncing a generation record", &tmp, e))?;
        fs::rename(&tmp, &path)
            .map_err(|e| StoreError::io("putting a generation record in place", &path, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    dir_file
        .sync_all()
        .map_err(|e| StoreError::io("syncing the directory of a generation record", dir, e))
}

fn open_dir(path: &Path, what: &'static str) -> Result<File, StoreError> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(|e| StoreError::io(what, path, e))
}

/// The directory's file system and inode. The file system is named by
/// its id (`statvfs`'s `f_fsid`, which ext4, xfs and btrfs derive from the
/// file system's UUID), not by the device number: the same file system
/// attached as another device (a reboot's device order, a re-attached
/// volume, a loop device, a container's overlay restarted) is the same
/// directory, not a copy. File systems that report no id fall back to the
/// device number.
// `f_fsid` is a C `unsigned long`: `u64` here, narrower elsewhere.
#[allow(clippy::useless_conversion)]
fn identity(dir: &Path, dir_file: &File) -> Result<Identity, StoreError> {
    let meta = dir_file
        .metadata()
        .map_err(|e| StoreError::io("inspecting the store directory", dir, e))?;
    let fs = nix::sys::statvfs::fstatvfs(dir_file)
        .map(|v| u64::from(v.filesystem_id()))
        .map_err(|e| {
            StoreError::io(
                "inspecting the store directory's file system",
                dir,
                io::Error::from(e),
            )
        })?;
    Ok((if fs == 0 { meta.dev() } else { fs }, meta.ino()))
}

/// The store directory's path as recorded: canonical when it can be.
fn recorded_path(dir: &Path) -> String {
    fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// The witness subdirectory of `witness`, created (with `witness` itself)
/// when missing and made durable; its path and an open handle.
fn witness_subdir(witness: &Path) -> Result<(PathBuf, File), StoreError> {
    let sub = witness.join(WITNESS_DIR_NAME);
    if !witness.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(witness)
            .map_err(|e| StoreError::io("creating the witness directory", witness, e))?;
        if let Some(parent) = witness.parent().filter(|p| !p.as_os_str().is_empty()) {
            open_dir(parent, "opening the witness directory's parent")?
                .sync_all()
                .map_err(|e| StoreError::io("syncing the witness directory's parent", parent, e))?;
        }
    }
    match fs::DirBuilder::new().mode(0o700).create(&sub) {
        Ok(()) => {
            open_dir(witness, "opening the witness directory")?
                .sync_all()
                .map_err(|e| StoreError::io("syncing the witness directory", witness, e))?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StoreError::io("creating the witness directory", &sub, e)),
    }
    let file = open_dir(&sub, "opening the witness directory")?;
    Ok((sub, file))
}

/// The witness files in `witness` that name the store directory `here` (by
/// identity or path), highest generation first. Damaged ones of other
/// stores are skipped with a warning: they are not this store's.
fn witnesses_naming(witness: &Path, here: Identity, path: &str) -> Vec<(PathBuf, Record)> {
    let sub = witness.join(WITNESS_DIR_NAME);
    let Ok(entries) = fs::read_dir(&sub) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Record)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(is_store_id))
        .filter_map(|e| match read_record(&e.path(), WITNESS_REMEDY) {
            Ok(r) => r.map(|r| (e.path(), r)),
            Err(err) => {
                warn!(path = %e.path().display(), error = %err, "skipping a damaged witness of another store");
                None
            }
        })
        .filter(|(_, r)| r.identity() == here || r.path == path)
        .collect();
    found.sort_by_key(|(_, r)| std::cmp::Reverse(r.generation));
    found
}

/// Holds the store directory's exclusive `flock` (on its own descriptor)
/// while the generation is read and advanced: writers in any process
/// advance one at a time.
fn lock_dir(dir: &Path, dir_file: &File, timeout: Duration) -> Result<Flock<File>, StoreError> {
    let mut file = dir_file
        .try_clone()
        .map_err(|e| StoreError::io("duplicating the store directory's descriptor", dir, e))?;
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(locked),
            Err((f, Errno::EINTR)) => file = f,
            Err((f, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = f;
                thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(StoreError::Unavailable {
                    op: "waiting for the generation lock of",
                    path: dir.to_path_buf(),
                    source: io::Error::new(
                        io::ErrorKind::WouldBlock,
                        format!("another process held it for {timeout:?}"),
                    ),
                });
            }
            Err((_, errno)) => {
                return Err(StoreError::io(
                    "locking the store directory",
                    dir,
                    errno.into(),
                ));
            }
        }
    }
}

/// Checks the store directory `dir` against its record and its witness,
/// then advances its generation. `seen`: the highest this instance saw
/// before (a record behind it went back under a running store).
fn claim(
    dir: &Path,
    dir_file: &File,
    check: &GenerationCheck,
    timeout: Duration,
    seen: Option<&StoreGeneration>,
) -> Result<StoreGeneration, StoreError> {
    let _locked = lock_dir(dir, dir_file, timeout)?;
    let here = identity(dir, dir_file)?;
    let path = recorded_path(dir);
    let own_path = dir.join(GENERATION_FILE_NAME);
    let witness = check.witness_dir();
    let location = dir.display().to_string();
    let hint = adopt_hint(dir, witness);
    let own = read_record(&own_path, OWN_REMEDY)?;
    let (store, current) = match &own {
        Some(r) if r.identity() != here => {
            return Err(StoreError::rewound(
                location,
                format!(
                    "its generation record {} was written in another directory (file system {}, \
                     inode {}; this one is file system {}, inode {}): this store directory is a \
                     copy — restored from a backup into a new directory, copied, moved to \
                     another disk — and its high-water marks may lag tokens already used, or \
                     the original may still serve beside it. If the original is retired for \
                     good, {hint}",
                    own_path.display(),
                    r.fs,
                    r.ino,
                    here.0,
                    here.1,
                ),
            ));
        }
        Some(r) => (r.store.clone(), r.generation),
        None => {
            // A new store, or one written before generations were kept
            // (upgraded now) — unless its witness remembers it.
            if let Some(w) = witness
                && let Some((wpath, r)) = witnesses_naming(w, here, &path).into_iter().next()
            {
                return Err(StoreError::rewound(
                    location,
                    format!(
                        "it has no generation record {}, but the witness {} records generation \
                         {} for this store directory: it was emptied, recreated, or put back \
                         from a copy older than its generation record, and its high-water marks \
                         may be below tokens already used. Put back its newest state; or, to \
                         serve it as it is, {hint}",
                        own_path.display(),
                        wpath.display(),
                        r.generation,
                    ),
                ));
            }
            (random_id(dir)?, 0)
        }
    };
    if let Some(seen) = seen
        && (seen.store != store || current < seen.generation)
    {
        return Err(StoreError::rewound(
            location,
            format!(
                "its generation record {} now says {}, but this process saw {seen}: the \
                 directory was replaced or put back while the store was open. Stop every \
                 server of the store; put back its newest state, or {hint}",
                own_path.display(),
                StoreGeneration {
                    store: store.clone(),
                    generation: current
                },
            ),
        ));
    }
    let witnessed = match witness {
        Some(w) => {
            let (sub, sub_file) = witness_subdir(w)?;
            let wpath = sub.join(&store);
            if let Some(r) = read_record(&wpath, WITNESS_REMEDY)? {
                if r.identity() != here {
                    return Err(StoreError::rewound(
                        location,
                        format!(
                            "its witness {} was last written by this store in another directory \
                             ({}, file system {}, inode {}; this one is file system {}, inode {}): two \
                             copies of the store share one witness. Serve only one of them; \
                             to serve this one, stop every server of both and {hint}",
                            wpath.display(),
                            r.path,
                            r.fs,
                            r.ino,
                            here.0,
                            here.1,
                        ),
                    ));
                }
                if r.generation > current {
                    return Err(StoreError::rewound(
                        location,
                        format!(
                            "this store directory is older than its witness: its generation \
                             record {} says generation {current}, the witness {} records \
                             generation {}. The directory was put back from an older copy (a \
                             backup, a disk image, an rsync), so its high-water marks may be \
                             below tokens already used and stale owners could write again. Put \
                             back its newest state; or, to serve it as it is, {hint}",
                            own_path.display(),
                            wpath.display(),
                            r.generation,
                        ),
                    ));
                }
            }
            Some((sub, sub_file))
        }
        None => None,
    };
    let next = current
        .checked_add(1)
        .ok_or_else(|| damaged(&own_path, "the generation counter is exhausted", OWN_REMEDY))?;
    let record = Record {
        v: 1,
        store,
        generation: next,
        fs: here.0,
        ino: here.1,
        path,
        crc: 0,
    };
    let text = record.text();
    // The store's own record first: a crash between the two writes leaves
    // the witness behind the store, which is accepted, never ahead of it.
    write_atomic(dir, dir_file, GENERATION_FILE_NAME, &text)?;
    if let Some((sub, sub_file)) = witnessed {
        write_atomic(&sub, &sub_file, &record.store, &text)?;
    }
    Ok(record.generation())
}

fn adopt_hint(dir: &Path, witness: Option<&Path>) -> String {
    let call = match witness {
        Some(w) => format!("session_store::adopt_store_dir({dir:?}, Some({w:?}))"),
        None => format!("session_store::adopt_store_dir({dir:?}, None)"),
    };
    format!(
        "adopt it with every server of the store stopped ({call}, or the server's command \
         that adopts a store directory); whatever was written after the copy was taken is \
         then lost for good, and the sequence numbers it used are used again"
    )
}

impl StoreCore {
    /// Checks and advances the generation as configured; remembers it.
    pub(super) fn claim_generation(&self) -> Result<StoreGeneration, StoreError> {
        let check = &self.opts.generation;
        if *check == GenerationCheck::Off {
            return Err(StoreError::invalid(
                "this store was opened without a generation check \
                 (JsonlOptions::generation): it neither checks nor advances one",
            ));
        }
        self.refuse_if_went_back()?;
        let mut seen = lock(&self.generation);
        // Writing the record changes the directory: done as a change the
        // listing index knows of, so that listings go on trusting it
        // instead of rebuilding it after every advance.
        let deadline = std::time::Instant::now() + self.opts.lock_timeout;
        let claimed = self.changing_dir(super::locking::Wait::Until(deadline), || {
            Ok(claim(
                &self.dir,
                &self.dir_file,
                check,
                self.opts.lock_timeout,
                seen.as_ref(),
            ))
        });
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(super::locking::AttemptError::Store(e))
                if e.kind() != crate::StoreErrorKind::Busy =>
            {
                return Err(e);
            }
            Err(_) => {
                return Err(StoreError::Unavailable {
                    op: "waiting for the listing index lock of",
                    path: self.dir.clone(),
                    source: io::Error::new(
                        io::ErrorKind::WouldBlock,
                        format!("another process held it for {:?}", self.opts.lock_timeout),
                    ),
                });
            }
        };
        match claimed {
            Ok(claimed) => {
                *seen = Some(claimed.clone());
                Ok(claimed)
            }
            // Found older than this instance served it: what it serves now
            // is not what it confirmed, so nothing more is served from it.
            Err(e) if e.kind() == crate::StoreErrorKind::Rewound && seen.is_some() => {
                *lock(&self.went_back) = Some(e.to_string());
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// `Rewound` once a check found the directory gone back under this
    /// instance.
    pub(super) fn refuse_if_went_back(&self) -> Result<(), StoreError> {
        match &*lock(&self.went_back) {
            Some(why) => Err(StoreError::rewound(
                self.dir.display().to_string(),
                format!(
                    "refusing every call: the directory went back while this process served \
                     it ({why})"
                ),
            )),
            None => Ok(()),
        }
    }
}

/// Accepts the store directory `dir` as it is — a copy whose original is
/// retired for good, or an older state put back on purpose — after the
/// generation check refused it (`StoreErrorKind::Rewound`).
///
/// Records this directory's identity in its generation record, keeps the
/// store's id (or, for a directory that lost its record, takes the id its
/// witness remembers for this directory, else a new one), and sets the
/// generation above everything the record and the witness in `witness`
/// (the directory the servers give as [`GenerationCheck::Witness`]) hold;
/// then writes both. A damaged record is replaced. Returns the generation
/// now recorded; the next open with the check advances past it.
///
/// Run it with every server of the store stopped, never while the original
/// of a copy still serves. It does not raise a single high-water mark: the
/// marks an older state holds may be below tokens already used, which the
/// lease backend's `acquire_above` (or a lease repair with a minimum token)
/// takes care of.
///
/// ```
/// use session_store::{GenerationCheck, JsonlOptions, JsonlStore, StoreErrorKind, adopt_store_dir};
///
/// let root = tempfile::tempdir()?;
/// let (store_dir, lease_dir) = (root.path().join("store"), root.path().join("leases"));
/// let opts = JsonlOptions::default().generation(GenerationCheck::witness(&lease_dir));
/// drop(JsonlStore::open(&store_dir, opts.clone())?);
/// // A copy of the store directory (a backup restored elsewhere) ...
/// let copy = root.path().join("copy");
/// std::fs::create_dir(&copy)?;
/// for entry in std::fs::read_dir(&store_dir)? {
///     let entry = entry?;
///     std::fs::copy(entry.path(), copy.join(entry.file_name()))?;
/// }
/// // ... is refused, until adopted.
/// let err = JsonlStore::open(&copy, opts.clone()).unwrap_err();
/// assert_eq!(err.kind(), StoreErrorKind::Rewound);
/// let adopted = adopt_store_dir(&copy, Some(lease_dir.as_path()))?;
/// let store = JsonlStore::open(&copy, opts)?;
/// assert!(store.generation().unwrap().get() > adopted.get());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn adopt_store_dir(
    dir: impl AsRef<Path>,
    witness: Option<&Path>,
) -> Result<StoreGeneration, StoreError> {
    let dir = dir.as_ref();
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_dir() => {}
        Ok(_) => {
            return Err(StoreError::invalid(format!(
                "{} is not a directory (symbolic links are refused)",
                dir.display()
            )));
        }
        Err(e) => return Err(StoreError::io("inspecting store directory", dir, e)),
    }
    let dir_file = open_dir(dir, "opening store directory")?;
    let _locked = lock_dir(dir, &dir_file, DEFAULT_LOCK_TIMEOUT)?;
    let here = identity(dir, &dir_file)?;
    let path = recorded_path(dir);
    let own_path = dir.join(GENERATION_FILE_NAME);
    let own = match read_record(&own_path, OWN_REMEDY) {
        Ok(own) => own,
        Err(e) => {
            warn!(path = %own_path.display(), error = %e, "adopting replaces a damaged generation record");
            None
        }
    };
    let remembered = match (&own, witness) {
        (None, Some(w)) => witnesses_naming(w, here, &path).into_iter().next(),
        _ => None,
    };
    let store = match (&own, &remembered) {
        (Some(r), _) => r.store.clone(),
        (None, Some((_, r))) => r.store.clone(),
        (None, None) => random_id(dir)?,
    };
    let mut floor = own
        .as_ref()
        .map_or(0, |r| r.generation)
        .max(remembered.as_ref().map_or(0, |(_, r)| r.generation));
    let witnessed = match witness {
        Some(w) => {
            let (sub, sub_file) = witness_subdir(w)?;
            if let Some(r) = read_record(&sub.join(&store), WITNESS_REMEDY)? {
                floor = floor.max(r.generation);
            }
            Some((sub, sub_file))
        }
        None => None,
    };
    let record = Record {
        v: 1,
        store,
        generation: floor
            .checked_add(1)
            .ok_or_else(|| damaged(&own_path, "the generation counter is exhausted", OWN_REMEDY))?,
        fs: here.0,
        ino: here.1,
        path,
        crc: 0,
    };
    let text = record.text();
    write_atomic(dir, &dir_file, GENERATION_FILE_NAME, &text)?;
    if let Some((sub, sub_file)) = witnessed {
        write_atomic(&sub, &sub_file, &record.store, &text)?;
    }
    Ok(record.generation())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            v: 1,
            store: "0123456789abcdef0123456789abcdef".into(),
            generation: 42,
            fs: 2049,
            ino: 1234,
            path: "/var/lib/mecated/store".into(),
            crc: 0,
        }
    }

    #[test]
    fn a_record_round_trips_and_any_changed_byte_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let text = record().text();
        fs::write(&path, &text).unwrap();
        let read = read_record(&path, OWN_REMEDY).unwrap().unwrap();
        assert_eq!(read.generation(), record().generation());
        assert_eq!(read.identity(), (2049, 1234));
        let bytes = text.as_bytes();
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x08, 0x20] {
                let mut changed = bytes.to_vec();
                changed[i] ^= flip;
                fs::write(&path, &changed).unwrap();
                match read_record(&path, OWN_REMEDY) {
                    Err(e) => assert_eq!(e.kind(), crate::StoreErrorKind::Corrupt),
                    // Only a change JSON cannot see (none in this record)
                    // could pass; the checksum covers every field.
                    Ok(r) => panic!("byte {i} ^ {flip:#x} read as {r:?}"),
                }
            }
        }
        // Torn: every prefix is corrupt, never "no record".
        for len in 0..bytes.len() {
            fs::write(&path, &bytes[..len]).unwrap();
            let err = read_record(&path, OWN_REMEDY).unwrap_err();
            assert_eq!(err.kind(), crate::StoreErrorKind::Corrupt, "{len}");
        }
    }
}
