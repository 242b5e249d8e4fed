//! Why a file or a backend could not be opened, with a kind to match on.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};

use lease_port::LeaseError;

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// What was wrong with a file the configuration names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FileErrorKind {
    /// It could not be read (absent, not permitted, a directory); the
    /// `std::io::Error` is the source.
    Unreadable,
    /// It is not UTF-8 text where text is expected (a token, a password).
    NotText,
    /// It holds nothing once its line ending or surrounding whitespace is
    /// dropped: no certificate, token or password can be meant.
    Empty,
    /// It holds text the rule for its kind of file refuses (a password file
    /// of more than one line); the source says which rule.
    Refused,
}

/// A file named by the configuration (TLS material, a token, a password)
/// that cannot be used. The message names the file and what it is for.
#[derive(Debug, thiserror::Error)]
#[error("the {what} {}: {detail}", path.display())]
pub struct FileError {
    kind: FileErrorKind,
    what: String,
    path: PathBuf,
    detail: String,
    #[source]
    source: Option<Source>,
}

impl FileError {
    pub(crate) fn new(kind: FileErrorKind, what: &str, path: &Path, detail: String) -> Self {
        FileError {
            kind,
            what: what.to_owned(),
            path: path.to_path_buf(),
            detail,
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What was wrong.
    pub fn kind(&self) -> FileErrorKind {
        self.kind
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What kept a backend from opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpenErrorKind {
    /// A file the configuration names cannot be used; the source is the
    /// [`FileError`], or for a password file or a kubeconfig the backend's
    /// own [`LeaseError`] naming the file.
    File,
    /// The lease directory is on a file system kept in memory (tmpfs,
    /// ramfs) and volatile directories were not allowed: a reboot would
    /// empty it, and the tokens it issued would start again below the
    /// stores' marks.
    VolatileDir,
    /// The backend's client refused the configuration or could not reach
    /// the backend; the source is its [`LeaseError`], whose kind tells a
    /// configuration that can never work (`Invalid`) from a passing fault
    /// (`Transient`); for a store, its own error (a `StoreError`).
    Backend,
}

/// A backend that could not be opened: which one, why (the
/// [`kind`](Self::kind)), and the error underneath as
/// [`source`](StdError::source).
///
/// The message repeats the source's, so a log line that prints only this
/// error still names the file or the backend's answer.
#[derive(Debug, thiserror::Error)]
#[error("{backend}: {source}")]
pub struct OpenError {
    kind: OpenErrorKind,
    backend: String,
    path: Option<PathBuf>,
    #[source]
    source: Source,
}

impl OpenError {
    // Only the network backends read files of their own.
    #[cfg_attr(not(any(feature = "etcd", feature = "grpc")), allow(dead_code))]
    pub(crate) fn file(backend: String, source: FileError) -> Self {
        OpenError {
            kind: OpenErrorKind::File,
            backend,
            path: Some(source.path.clone()),
            source: Box::new(source),
        }
    }

    pub(crate) fn new(kind: OpenErrorKind, backend: String, source: LeaseError) -> Self {
        OpenError {
            kind,
            backend,
            path: None,
            source: Box::new(source),
        }
    }

    /// A refusal of a client whose error is not a [`LeaseError`] (a
    /// store's).
    #[cfg_attr(not(feature = "postgres-store"), allow(dead_code))]
    pub(crate) fn other(
        kind: OpenErrorKind,
        backend: String,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        OpenError {
            kind,
            backend,
            path: None,
            source: Box::new(source),
        }
    }

    pub(crate) fn at(mut self, path: &Path) -> Self {
        self.path = Some(path.to_path_buf());
        self
    }

    /// What kept the backend from opening.
    pub fn kind(&self) -> OpenErrorKind {
        self.kind
    }

    /// The backend, as its configuration's `describe` names it (`etcd at
    /// http://a:2379`, `file leases in /var/lib/leases`).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The file at fault ([`OpenErrorKind::File`]), or the lease directory
    /// ([`OpenErrorKind::VolatileDir`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

/// For callers that report every backend failure as a [`LeaseError`]: the
/// backend's own error as it answered, a file error as `Invalid` (a start
/// with it can never succeed) with the [`FileError`] as its source.
impl From<OpenError> for LeaseError {
    fn from(e: OpenError) -> Self {
        match e.source.downcast::<LeaseError>() {
            Ok(lease) => *lease,
            Err(other) => LeaseError::invalid(other.to_string()).with_source(other),
        }
    }
}
