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

use lease_port::{AuthorityId, LeaseError};

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
pub(crate) fn read_or_create(dir: &Path) -> Result<AuthorityId, LeaseError> {
    let path = dir.join(AUTHORITY_FILE);
    match read(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        other => {
            return other
                .map_err(|e| io_error("read", &path, e))
                .and_then(|t| parse(&path, &t));
        }
    }
    let id = format!("{PREFIX}{}", random_hex()?);
    // Private to this call: the id's own randomness keeps racing creators,
    // in this process or another, off each other's file.
    let tmp = dir.join(format!("{AUTHORITY_FILE}.{}.tmp", &id[PREFIX.len()..]));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(format!("{id}\n").as_bytes())?;
        f.sync_all()?;
        match fs::hard_link(&tmp, &path) {
            Ok(()) => File::open(dir)?.sync_all(),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    })();
    let _ = fs::remove_file(&tmp);
    result.map_err(|e| io_error("create", &path, e))?;
    let text = read(&path).map_err(|e| io_error("read", &path, e))?;
    parse(&path, &text)
}

fn read(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

fn parse(path: &Path, text: &str) -> Result<AuthorityId, LeaseError> {
    let id = text.trim_end_matches('\n');
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
    AuthorityId::new(id)
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
