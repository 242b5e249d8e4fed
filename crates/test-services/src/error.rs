//! Why a service could not be started.

use std::path::PathBuf;

/// A service failed to start or to answer.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The binary is not installed.
    #[error(
        "{binary} is not installed: install the Debian package {package} \
         (`cargo xtask services` does it), or set {env_var} to its path"
    )]
    NotInstalled {
        /// The binary looked for.
        binary: &'static str,
        /// The Debian package that ships it.
        package: &'static str,
        /// The variable that overrides where it is.
        env_var: &'static str,
    },
    /// An I/O error while preparing or starting the service.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The process started but never became ready; its log is attached.
    #[error("{binary} did not become ready: {reason}\n--- log {log}:\n{tail}")]
    NotReady {
        /// The binary started.
        binary: &'static str,
        /// What went wrong (exited, timed out).
        reason: String,
        /// The log file.
        log: PathBuf,
        /// The end of the log.
        tail: String,
    },
}

impl ServiceError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ServiceError::Io {
            what: what.into(),
            source,
        }
    }
}
