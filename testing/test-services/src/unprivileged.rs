//! Who a server that refuses root runs as, when the tests run as root.
//!
//! PostgreSQL and PgBouncer both refuse to start as root, and CI runs as
//! root. Their processes then run as `nobody`: every Debian system has it,
//! so nothing is created on the machine (no `useradd`, no entry in
//! `/etc/passwd` left behind, no race between test processes creating the
//! same account), and nothing is installed for it either. The privileges
//! are dropped by the standard library's own `CommandExt::uid`/`gid`: in
//! the forked child, before `exec`, it clears the supplementary groups,
//! calls `setgid` and then `setuid`. The server is exec'd directly, so the
//! pid the test holds is the server's own and signals reach it (`runuser`
//! would stand between them as a parent waiting on a PAM session; `setpriv`
//! would do but is one more binary to find). The parent-death signal set in
//! [`ServerProcess::start`](crate::ServerProcess) survives: the standard
//! library runs `pre_exec` hooks after changing the credentials, and the
//! kernel clears the signal only on a change of credentials, not on an
//! `exec` of a plain binary.
//!
//! The server's directory is made `nobody`'s; the directories above it
//! (`$TMPDIR`, normally `/tmp`) must let `nobody` through.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::unistd::{Gid, Uid, User};

use crate::ServiceError;

/// The account unprivileged servers run as when the tests run as root.
pub(crate) const ACCOUNT: &str = "nobody";

/// An account to run a server as, or none: run as the test process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunAs {
    uid: Uid,
    gid: Gid,
}

impl RunAs {
    /// [`ACCOUNT`] when this process is root, else `None`.
    pub(crate) fn when_root() -> Result<Option<RunAs>, ServiceError> {
        if !Uid::effective().is_root() {
            return Ok(None);
        }
        let user = User::from_name(ACCOUNT)
            .map_err(|e| ServiceError::io(format!("look up the user {ACCOUNT}"), e.into()))?
            .ok_or_else(|| {
                ServiceError::io(
                    format!("look up the user {ACCOUNT}"),
                    std::io::Error::other(format!(
                        "no such account: PostgreSQL and PgBouncer refuse to run as root, \
                         and the tests run them as {ACCOUNT} when they run as root"
                    )),
                )
            })?;
        Ok(Some(RunAs {
            uid: user.uid,
            gid: user.gid,
        }))
    }

    /// Makes `dir` this account's and checks the account can reach it.
    pub(crate) fn own(self, dir: &Path) -> Result<(), ServiceError> {
        std::os::unix::fs::chown(dir, Some(self.uid.as_raw()), Some(self.gid.as_raw()))
            .map_err(|e| ServiceError::io(format!("give {} to {ACCOUNT}", dir.display()), e))?;
        for ancestor in dir.ancestors().skip(1) {
            let meta = std::fs::metadata(ancestor)
                .map_err(|e| ServiceError::io(format!("stat {}", ancestor.display()), e))?;
            let mode = meta.mode();
            let searchable = mode & 0o001 != 0
                || (meta.uid() == self.uid.as_raw() && mode & 0o100 != 0)
                || (meta.gid() == self.gid.as_raw() && mode & 0o010 != 0);
            if !searchable {
                return Err(ServiceError::io(
                    format!("prepare {} for {ACCOUNT}", dir.display()),
                    std::io::Error::other(format!(
                        "{ACCOUNT} cannot enter {}: point TMPDIR at a directory it can \
                         reach, such as /tmp",
                        ancestor.display()
                    )),
                ));
            }
        }
        Ok(())
    }

    /// Makes `file` this account's.
    pub(crate) fn own_file(self, file: &Path) -> Result<(), ServiceError> {
        std::os::unix::fs::chown(file, Some(self.uid.as_raw()), Some(self.gid.as_raw()))
            .map_err(|e| ServiceError::io(format!("give {} to {ACCOUNT}", file.display()), e))
    }

    /// Has `cmd` run as this account.
    pub(crate) fn apply(self, cmd: &mut Command) {
        cmd.uid(self.uid.as_raw()).gid(self.gid.as_raw());
    }
}

/// Has `cmd` run as `run_as`, if any.
pub(crate) fn apply(run_as: Option<RunAs>, cmd: &mut Command) {
    if let Some(run_as) = run_as {
        run_as.apply(cmd);
    }
}
