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
    /// A command that sets up or changes a service's environment (such as
    /// `ip`, for a [`Network`](crate::netns::Network)) failed.
    #[error("{what} failed ({status}): {stderr}")]
    Command {
        /// The command, as run.
        what: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it wrote to standard error.
        stderr: String,
    },
    /// A host name a [`Network`](crate::netns::Network) cannot take, or a
    /// host of another network.
    #[error("host {name:?} {reason}")]
    InvalidHost {
        /// The name given.
        name: String,
        /// Why it was refused.
        reason: String,
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
