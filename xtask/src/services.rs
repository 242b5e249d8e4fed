//! The real services tests start (DESIGN.md §6), and how to get each onto
//! this kind of machine. Tests start their own instances on free loopback
//! ports through the `test-services` crate; this module only makes sure the
//! binaries are installed, and fails naming the package when they cannot be.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Result;

/// A service some test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Service {
    /// `redis-server`, from Debian's `redis-server` package.
    Redis,
    /// `etcd`, from Debian's `etcd-server` package.
    Etcd,
    /// Headless `chromium`, from Debian's `chromium` package: the browser
    /// mecated's operator page is tested in.
    Chromium,
    /// `ip`, from Debian's `iproute2` package: the network namespaces,
    /// veth links and bridge of partition tests (`test_services::netns`).
    Iproute2,
}

/// Where a service's binary comes from. A service built from the workspace
/// (the Kubernetes API emulator, when it lands) is a new variant here: cargo
/// builds it, nothing is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provision {
    /// A binary on `PATH`, installed from a Debian package.
    Debian {
        binary: &'static str,
        package: &'static str,
    },
}

impl Service {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::Etcd => "etcd",
            Service::Chromium => "chromium",
            Service::Iproute2 => "iproute2",
        }
    }

    pub(crate) fn provision(self) -> Provision {
        match self {
            Service::Redis => Provision::Debian {
                binary: "redis-server",
                package: "redis-server",
            },
            Service::Etcd => Provision::Debian {
                binary: "etcd",
                package: "etcd-server",
            },
            Service::Chromium => Provision::Debian {
                binary: "chromium",
                package: "chromium",
            },
            Service::Iproute2 => Provision::Debian {
                binary: "ip",
                package: "iproute2",
            },
        }
    }
}

/// The first `name` on `PATH`, as a command would find it.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii() == b"0")
}

/// Makes sure every service in `wanted` can be started by the tests:
/// installs missing Debian packages when running as root, and otherwise
/// fails with the exact command to run.
pub(crate) fn ensure(wanted: &[Service]) -> Result {
    let mut missing: Vec<(&'static str, &'static str)> = Vec::new();
    for s in wanted {
        match s.provision() {
            Provision::Debian { binary, package } => match on_path(binary) {
                Some(found) => println!("service {}: {}", s.name(), found.display()),
                None => missing.push((binary, package)),
            },
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing.iter().map(|(_, p)| *p).collect();
    if !is_root() {
        return Err(format!(
            "tests need {} which {} not installed; run as root: \
             apt-get update && apt-get install -y {}",
            missing
                .iter()
                .map(|(b, _)| *b)
                .collect::<Vec<_>>()
                .join(", "),
            if missing.len() == 1 { "is" } else { "are" },
            packages.join(" ")
        ));
    }
    apt_install(&packages)?;
    for (binary, package) in &missing {
        match on_path(binary) {
            Some(found) => println!("installed {package}: {}", found.display()),
            None => {
                return Err(format!(
                    "installed Debian package {package}, but {binary} is still not on PATH"
                ));
            }
        }
    }
    Ok(())
}

/// Debian's mechanism for "install, but start no daemon": while this file
/// exists and exits 101, maintainer scripts start no services. Tests start
/// their own instances; a system-wide one would be left running.
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

fn apt_install(packages: &[&str]) -> Result {
    let placed_policy = if Path::new(POLICY_RC_D).exists() {
        false
    } else {
        fs::write(POLICY_RC_D, "#!/bin/sh\nexit 101\n")
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(POLICY_RC_D, fs::Permissions::from_mode(0o755))
            })
            .map_err(|e| format!("cannot write {POLICY_RC_D}: {e}"))?;
        true
    };
    let result = (|| {
        crate::run(
            "apt-get update",
            Command::new("apt-get")
                .args(["update", "-q"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        crate::run(
            &format!("apt-get install {}", packages.join(" ")),
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(packages)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    })();
    if placed_policy {
        let _ = fs::remove_file(POLICY_RC_D);
    }
    result.map_err(|e| {
        format!(
            "{e}: the tests cannot run without Debian package(s) {}",
            packages.join(", ")
        )
    })
}
