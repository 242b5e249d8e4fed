//! The lease directory: opening and checking it, naming, opening and reading
//! the lease files inside it.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_port::SessionId;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::LeaseFileError;
use crate::record::{RECORD_LEN, Record};

/// The lease file name of `session`: its safe stem plus `.lease`.
pub(crate) fn file_name(session: &SessionId) -> String {
    let mut name = session_filename::stem(session);
    name.push_str(".lease");
    name
}

/// Outcome of opening a lease file.
pub(crate) enum Opened {
    File(File),
    Absent,
}

pub(crate) fn kind_name(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFREG => "a regular file",
        _ => "an unknown kind of file",
    }
}

pub(crate) fn is_kind(st: &FileStat, kind: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// Opens (creating with mode 0700 when absent) and checks the lease
/// directory; returns its descriptor and identity.
pub(crate) fn open_dir(path: &Path, create: bool) -> Result<(OwnedFd, (u64, u64)), LeaseFileError> {
    match nix::sys::stat::lstat(path) {
        Ok(st) if is_kind(&st, SFlag::S_IFLNK) => {
            return Err(LeaseFileError::DirSymlink {
                path: path.to_path_buf(),
            });
        }
        Ok(st) if !is_kind(&st, SFlag::S_IFDIR) => {
            return Err(LeaseFileError::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        Ok(_) => {}
        Err(Errno::ENOENT) if create => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| {
                    LeaseFileError::io("creating lease directory", path.to_path_buf(), e)
                })?;
        }
        Err(e) => return Err(LeaseFileError::io("inspecting", path.to_path_buf(), e)),
    }
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP => LeaseFileError::DirSymlink {
            path: path.to_path_buf(),
        },
        Errno::ENOTDIR => LeaseFileError::NotADirectory {
            path: path.to_path_buf(),
        },
        e => LeaseFileError::io("opening lease directory", path.to_path_buf(), e),
    })?;
    let st = nix::sys::stat::fstat(&fd)
        .map_err(|e| LeaseFileError::io("inspecting", path.to_path_buf(), e))?;
    Ok((fd, (st.st_dev, st.st_ino)))
}

/// The name of the in-memory file system `fd` is on (tmpfs, ramfs), or
/// `None` for one that keeps its data across a reboot.
pub(crate) fn volatile_fs(
    path: &Path,
    fd: &OwnedFd,
) -> Result<Option<&'static str>, LeaseFileError> {
    const RAMFS_MAGIC: u32 = 0x8584_58f6;
    let st = nix::sys::statfs::fstatfs(fd)
        .map_err(|e| LeaseFileError::io("inspecting the file system of", path.to_path_buf(), e))?;
    let kind = st.filesystem_type();
    Ok(if kind == nix::sys::statfs::TMPFS_MAGIC {
        Some("tmpfs")
    } else if kind.0 as u32 == RAMFS_MAGIC {
        Some("ramfs")
    } else {
        None
    })
}

/// The lease directory opened at start-up: its path, its descriptor (every
/// lease file is opened relative to it) and its identity, re-checked against
/// the path at most once per check interval.
pub(crate) struct Directory {
    path: PathBuf,
    fd: OwnedFd,
    id: (u64, u64),
    check_interval: Duration,
    /// When the directory was last verified, in nanoseconds after `epoch`
    /// plus one; 0 before the first check.
    checked: AtomicU64,
    epoch: Instant,
}

impl Directory {
    /// Opens the directory at `path`, creating it when absent
    /// ([`open_dir`]).
    pub(crate) fn open(path: PathBuf, check_interval: Duration) -> Result<Self, LeaseFileError> {
        let (fd, id) = open_dir(&path, true)?;
        Ok(Directory {
            path,
            fd,
            id,
            check_interval,
            checked: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// The directory's path, as given at start-up.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor opened at start-up.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The path of the file `name` in the directory, for messages.
    pub(crate) fn file_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// [`check`](Self::check), at most once per check interval.
    pub(crate) fn check_if_due(&self) -> Result<(), LeaseFileError> {
        let now = u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let last = self.checked.load(Ordering::Relaxed);
        let interval = u64::try_from(self.check_interval.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < interval {
            return Ok(());
        }
        self.check()?;
        self.checked.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// The directory path must still name the directory opened at start-up:
    /// processes resolving the path now must meet the same lock files.
    fn check(&self) -> Result<(), LeaseFileError> {
        match nix::sys::stat::lstat(&self.path) {
            Ok(st) if (st.st_dev, st.st_ino) == self.id => Ok(()),
            Ok(st) => Err(LeaseFileError::DirReplaced {
                path: self.path.clone(),
                detail: format!("it is now {}", kind_name(&st)),
            }),
            Err(e) => Err(LeaseFileError::DirReplaced {
                path: self.path.clone(),
                detail: e.desc().to_owned(),
            }),
        }
    }

    /// `fsync`s the directory, making the names of the files in it durable.
    pub(crate) fn sync(&self) -> Result<(), LeaseFileError> {
        nix::unistd::fsync(&self.fd)
            .map_err(|e| LeaseFileError::io("syncing", self.path.clone(), e))
    }

    /// Opens the lease file `name` inside the directory opened at start-up,
    /// never following a symlink, and checks it is a regular file.
    /// Only `write` opens it for writing; only `create` creates it.
    pub(crate) fn open_file(
        &self,
        name: &str,
        create: bool,
        write: bool,
    ) -> Result<Opened, LeaseFileError> {
        let access = if write {
            OFlag::O_RDWR
        } else {
            OFlag::O_RDONLY
        };
        let mut flags = access | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        if create {
            flags |= OFlag::O_CREAT;
        }
        let fd = match nix::fcntl::openat(&self.fd, name, flags, Mode::S_IRUSR | Mode::S_IWUSR) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if !create => return Ok(Opened::Absent),
            Err(Errno::ELOOP) => {
                return Err(LeaseFileError::NotRegular {
                    path: self.file_path(name),
                    what: "a symbolic link",
                });
            }
            Err(Errno::EISDIR) => {
                return Err(LeaseFileError::NotRegular {
                    path: self.file_path(name),
                    what: "a directory",
                });
            }
            Err(Errno::ENXIO) => {
                return Err(LeaseFileError::NotRegular {
                    path: self.file_path(name),
                    what: "a socket or device",
                });
            }
            Err(e) => return Err(LeaseFileError::io("opening", self.file_path(name), e)),
        };
        // The file type is checked lazily, in `read`: only a regular file
        // yields a valid record, so the common case needs no fstat.
        Ok(Opened::File(File::from(fd)))
    }

    /// Reads the record of lease file `name` (opened as `file`), which must
    /// be `session`'s: `Ok(None)` for a file created but never written; the
    /// record of another session is an error, as is anything that does not
    /// decode.
    pub(crate) fn read_record(
        &self,
        file: &File,
        name: &str,
        session: &SessionId,
    ) -> Result<Option<Record>, LeaseFileError> {
        let record = self.read(file, name)?;
        if let Some(r) = &record
            && r.session != *session
        {
            return Err(LeaseFileError::SessionMismatch {
                path: self.file_path(name),
                found: r.session.to_string(),
                expected: session.to_string(),
            });
        }
        Ok(record)
    }

    fn read(&self, file: &File, name: &str) -> Result<Option<Record>, LeaseFileError> {
        let mut buf = [0u8; RECORD_LEN + 1];
        let mut len = 0;
        let read = loop {
            match file.read_at(&mut buf[len..], len as u64) {
                // A short read of a regular file is its end: a whole record
                // needs no second call to see EOF.
                Ok(n) if len + n == RECORD_LEN => break Ok(len + n),
                Ok(0) => break Ok(len),
                Ok(n) => {
                    len += n;
                    if len == buf.len() {
                        break Ok(len);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let decoded = match read {
            Ok(len) => Record::decode(&self.file_path(name), &buf[..len]),
            Err(e) => Err(LeaseFileError::io("reading", self.file_path(name), e)),
        };
        match decoded {
            Ok(Some(record)) => Ok(Some(record)),
            // Empty, unreadable or undecodable: make sure it is a regular
            // file before trusting (or blaming) its contents.
            other => {
                let st = nix::sys::stat::fstat(file)
                    .map_err(|e| LeaseFileError::io("inspecting", self.file_path(name), e))?;
                if !is_kind(&st, SFlag::S_IFREG) {
                    return Err(LeaseFileError::NotRegular {
                        path: self.file_path(name),
                        what: kind_name(&st),
                    });
                }
                other
            }
        }
    }
}
