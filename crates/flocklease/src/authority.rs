//! The lease directory's authority id: which token sequence its leases
//! belong to.
//!
//! Tokens are counted per directory, so two directories both issue token 1
//! for a session. The id, created once at random and kept in the directory
//! (`.authority`), lets a store refuse tokens from a directory other than
//! the one that fences it. Every instance on the directory reads the same id
//! whatever path spelling reached it (symlinks, trailing slashes), because
//! it lives in the directory itself; a second directory gets its own.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use lease_port::{AuthorityId, LeaseError};

use crate::store::boot_epoch::count_past_any_copy;
use crate::store::directory::Directory;

/// The file holding the id. Session files never start with a dot
/// (`session-filename` stems contain no `.`), so the name cannot clash.
pub const AUTHORITY_FILE: &str = ".authority";

const PREFIX: &str = "flock:";

/// Reads the directory's authority id, creating it on first use.
///
/// Creation is atomic and durable before anyone can read it: the id is
/// written and synced under a private name, then linked to
/// [`AUTHORITY_FILE`] (`link` fails if another instance won the race, and we
/// read theirs), and the directory is synced so the name survives a crash.
///
/// The file also names the directory it was created in (device and inode):
/// a copy of the directory (a restored backup, a baked image, `cp -a`)
/// carries the id but not the identity, and is refused until an operator
/// [`adopt`]s it — two copies serving beside each other would issue
/// unrelated tokens under one authority.
pub(crate) fn read_or_create(dir: &Path) -> Result<AuthorityId, LeaseError> {
    let path = dir.join(AUTHORITY_FILE);
    let here = identity(dir)?;
    match read(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        other => {
            let text = other.map_err(|e| io_error("read", &path, e))?;
            let (id, made_in) = parse(&path, &text)?;
            if let Some(made_in) = made_in.filter(|m| *m != here) {
                return Err(copy_refused(dir, made_in, here));
            }
            if made_in.is_none() {
                // Written before files named their directory: name this one
                // now, so a later copy of it is told apart.
                write_identity(dir, &id, here)?;
            }
            return Ok(id);
        }
    }
    let id = AuthorityId::new(format!("{PREFIX}{}", random_hex()?))?;
    // `link` fails when a racing creator won: then theirs is the id.
    place(dir, &id, here, |tmp, path| match fs::hard_link(tmp, path) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        other => other,
    })
    .map_err(|e| io_error("create", &path, e))?;
    let text = read(&path).map_err(|e| io_error("read", &path, e))?;
    parse(&path, &text).map(|(id, _)| id)
}

/// The refusal of a lease directory whose authority file was made in
/// another directory.
fn copy_refused(dir: &Path, made_in: Identity, here: Identity) -> LeaseError {
    LeaseError::invalid(format!(
        "{} was created in another directory (device {}, inode {}; this one is device {}, \
         inode {}): this lease directory is a copy, and a copy's tokens may lag the store's or \
         run beside the original's. If the original is retired for good, adopt the copy with \
         every server of the store stopped (`mecated leases --session-lease-dir {} adopt \
         --store-dir STORE`, or flocklease::adopt)",
        dir.join(AUTHORITY_FILE).display(),
        made_in.0,
        made_in.1,
        here.0,
        here.1,
        dir.display()
    ))
}

/// Refuses to open a copy not yet adopted, before anything is counted or
/// issued in it: an instance opened on the copy would keep the floor it
/// opened with after the copy is adopted under it. A directory without an
/// authority file yet passes.
pub(crate) fn refuse_a_copy(dir: &Path) -> Result<(), LeaseError> {
    let path = dir.join(AUTHORITY_FILE);
    let text = match read(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        other => other.map_err(|e| io_error("read", &path, e))?,
    };
    let (_, made_in) = parse(&path, &text)?;
    let here = identity(dir)?;
    match made_in.filter(|m| *m != here) {
        Some(made_in) => Err(copy_refused(dir, made_in, here)),
        None => Ok(()),
    }
}

/// Makes a copied lease directory (refused by the authority check) its authority's
/// directory: keeps the id and records this directory's identity. For an
/// operator whose original directory is retired for good (moved to another
/// disk, restored from a backup), with every instance on the copy stopped;
/// never while the original still serves.
///
/// A copy's lease files may lag the tokens the original issued after the
/// copy was taken, and a store or an outside system may have seen those.
/// So before the copy is named, its count of boots (`.boot-epoch`,
/// synced) jumps: past every token its files show, to the wall clock's
/// second since 2025 at least, and past the copy's own count by the
/// seconds since that count was written. Every token issued from it after
/// that, by synced and unsynced instances alike, lies above the new count.
/// The original counted on from the copy's count by at most one epoch a
/// boot, each at least the clock's second, so its later tokens lie below
/// unless it counted more boots than seconds went by, or its clock ran
/// ahead of the adopter's; two copies of one directory adopted in
/// different seconds count apart. An adoption on a clock before 2025, or
/// behind the second the copy's count was written, is refused: set the
/// clock first. After an adoption `.boot-epoch` holds the floor of synced
/// instances too: never delete it; adopting again repairs a damaged one.
///
/// Instances opened on a copy are refused when they open, so none is left
/// with an older floor once the copy is adopted.
pub fn adopt(dir: impl AsRef<Path>) -> Result<AuthorityId, LeaseError> {
    adopt_at(dir.as_ref(), SystemTime::now())
}

/// [`adopt`], the wall clock reading `now`.
pub(crate) fn adopt_at(dir: &Path, now: SystemTime) -> Result<AuthorityId, LeaseError> {
    let path = dir.join(AUTHORITY_FILE);
    let text = read(&path).map_err(|e| io_error("read", &path, e))?;
    let (id, _) = parse(&path, &text)?;
    // The floor first: interrupted between the two, the copy is still
    // refused, and adopting it again raises the floor once more.
    let lease_dir = Directory::open(dir.to_path_buf(), Duration::from_secs(1))?;
    count_past_any_copy(&lease_dir, now)?;
    write_identity(dir, &id, identity(dir)?)?;
    Ok(id)
}

/// Rewrites `dir`'s authority file as `id` made in `here`; readers read
/// the file whole, so replacing it is atomic for them.
fn write_identity(dir: &Path, id: &AuthorityId, here: Identity) -> Result<(), LeaseError> {
    place(dir, id, here, |tmp, path| fs::rename(tmp, path))
        .map_err(|e| io_error("rewrite", &dir.join(AUTHORITY_FILE), e))
}

/// Writes the authority file's content to a private file, syncs it, puts
/// it in place with `put(private, final)`, and syncs the directory so the
/// name is durable before anyone relies on it.
fn place(
    dir: &Path,
    id: &AuthorityId,
    here: Identity,
    put: impl FnOnce(&Path, &Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let path = dir.join(AUTHORITY_FILE);
    // Private to this call: random, so racing writers in this process or
    // another never share it.
    let suffix = random_hex().map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = dir.join(format!("{AUTHORITY_FILE}.{suffix}.tmp"));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(content(id.as_str(), here).as_bytes())?;
        f.sync_all()?;
        put(&tmp, &path)?;
        File::open(dir)?.sync_all()
    })();
    let _ = fs::remove_file(&tmp);
    result
}

/// A directory's identity: device and inode.
type Identity = (u64, u64);

fn identity(dir: &Path) -> Result<Identity, LeaseError> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir).map_err(|e| io_error("inspect", dir, e))?;
    Ok((meta.dev(), meta.ino()))
}

fn content(id: &str, (dev, ino): Identity) -> String {
    format!("{id}\ndir {dev} {ino}\n")
}

fn read(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// The id, and the identity of the directory it was made in when the file
/// names one.
fn parse(path: &Path, text: &str) -> Result<(AuthorityId, Option<Identity>), LeaseError> {
    let mut lines = text.lines();
    let id = lines.next().unwrap_or_default();
    let made_in = match lines.next() {
        None => None,
        Some(line) => {
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some("dir"), Some(dev), Some(ino), None) => dev.parse().ok().zip(ino.parse().ok()),
                _ => None,
            }
            .ok_or_else(|| {
                LeaseError::invalid(format!(
                    "{} has a damaged directory line ({line:?}); restore it",
                    path.display()
                ))
            })
            .map(Some)?
        }
    };
    let well_formed = id
        .strip_prefix(PREFIX)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed {
        // Never replaced: a new id would let tokens of two sequences meet
        // in one store. The operator restores it from the store's record.
        return Err(LeaseError::invalid(format!(
            "{} does not hold a lease authority id ({id:?}); restore it \
             (the store directory's record names the authority it expects)",
            path.display()
        )));
    }
    Ok((AuthorityId::new(id)?, made_in))
}

fn random_hex() -> Result<String, LeaseError> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| io_error("read", Path::new("/dev/urandom"), e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> LeaseError {
    LeaseError::transient(format!("cannot {what} {}", path.display())).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_directory_one_id_whatever_the_spelling_two_directories_two() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        std::os::unix::fs::symlink(&a, root.path().join("link")).unwrap();
        let first = read_or_create(&a).unwrap();
        assert_eq!(read_or_create(&a).unwrap(), first);
        assert_eq!(read_or_create(&root.path().join("link/")).unwrap(), first);
        assert_ne!(read_or_create(&b).unwrap(), first);
    }

    #[test]
    fn racing_creators_agree() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<AuthorityId> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| read_or_create(dir.path()).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [AUTHORITY_FILE], "temporary files left behind");
    }

    #[test]
    fn a_copied_directory_is_refused_until_adopted() {
        let root = tempfile::tempdir().unwrap();
        let (original, copy) = (root.path().join("a"), root.path().join("copy"));
        fs::create_dir(&original).unwrap();
        fs::create_dir(&copy).unwrap();
        let id = read_or_create(&original).unwrap();
        fs::copy(original.join(AUTHORITY_FILE), copy.join(AUTHORITY_FILE)).unwrap();

        let err = read_or_create(&copy).unwrap_err();
        assert_eq!(err.kind(), lease_port::LeaseErrorKind::Invalid);
        assert!(err.message().contains("is a copy"), "{err}");
        // The original is not disturbed.
        assert_eq!(read_or_create(&original).unwrap(), id);

        assert_eq!(adopt(&copy).unwrap(), id);
        assert_eq!(read_or_create(&copy).unwrap(), id);
        // A directory moved within its file system keeps its identity.
        let moved = root.path().join("moved");
        fs::rename(&original, &moved).unwrap();
        assert_eq!(read_or_create(&moved).unwrap(), id);
    }

    #[test]
    fn a_file_naming_no_directory_is_given_this_one() {
        let root = tempfile::tempdir().unwrap();
        let (original, copy) = (root.path().join("a"), root.path().join("copy"));
        fs::create_dir(&original).unwrap();
        fs::create_dir(&copy).unwrap();
        let id = "flock:0123456789abcdef0123456789abcdef";
        fs::write(original.join(AUTHORITY_FILE), format!("{id}\n")).unwrap();
        assert_eq!(read_or_create(&original).unwrap().as_str(), id);
        fs::copy(original.join(AUTHORITY_FILE), copy.join(AUTHORITY_FILE)).unwrap();
        assert!(
            read_or_create(&copy).is_err(),
            "a copy made after the upgrade passed"
        );
    }

    #[test]
    fn a_damaged_id_is_refused_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(AUTHORITY_FILE), "flock:12\n").unwrap();
        let err = read_or_create(dir.path()).unwrap_err();
        assert_eq!(err.kind(), lease_port::LeaseErrorKind::Invalid);
        assert!(err.message().contains("restore"), "{err}");
        assert_eq!(
            fs::read_to_string(dir.path().join(AUTHORITY_FILE)).unwrap(),
            "flock:12\n"
        );
    }
}
