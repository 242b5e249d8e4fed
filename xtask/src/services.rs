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
    /// PostgreSQL's `initdb` and `postgres`, from Debian's `postgresql`
    /// package (`/usr/lib/postgresql/VERSION/bin`, off `PATH`). Tests make
    /// clusters of their own (`test_services::PostgresServer`); the
    /// package's own cluster is never started.
    Postgres,
    /// `pgbouncer`, from Debian's `pgbouncer` package (in `/usr/sbin`):
    /// transaction pooling in front of a test's PostgreSQL
    /// (`test_services::PgBouncer`).
    PgBouncer,
    /// `faketime`, from Debian's `faketime` package: runs a command with
    /// its clocks sped up, as a far slower machine would see them (the
    /// simulation's replay test).
    Faketime,
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
    /// A binary Debian keeps off `PATH`, one copy per major version:
    /// `ROOT/VERSION/bin/BINARY`, the highest version counting.
    DebianVersioned {
        root: &'static str,
        binary: &'static str,
        package: &'static str,
    },
}

impl Provision {
    /// The Debian package that ships it.
    pub(crate) fn package(self) -> &'static str {
        match self {
            Provision::Debian { package, .. } | Provision::DebianVersioned { package, .. } => {
                package
            }
        }
    }

    /// What is looked for, as a message names it.
    pub(crate) fn binary(self) -> &'static str {
        match self {
            Provision::Debian { binary, .. } | Provision::DebianVersioned { binary, .. } => binary,
        }
    }

    /// Where it is installed, if it is.
    pub(crate) fn locate(self) -> Option<PathBuf> {
        match self {
            Provision::Debian { binary, .. } => on_path(binary).or_else(|| in_sbin(binary)),
            Provision::DebianVersioned { root, binary, .. } => {
                newest_versioned(Path::new(root), binary)
            }
        }
    }
}

impl Service {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::Etcd => "etcd",
            Service::Chromium => "chromium",
            Service::Iproute2 => "iproute2",
            Service::Postgres => "postgres",
            Service::PgBouncer => "pgbouncer",
            Service::Faketime => "faketime",
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
            Service::Postgres => Provision::DebianVersioned {
                root: "/usr/lib/postgresql",
                binary: "postgres",
                package: "postgresql",
            },
            Service::PgBouncer => Provision::Debian {
                binary: "pgbouncer",
                package: "pgbouncer",
            },
            Service::Faketime => Provision::Debian {
                binary: "faketime",
                package: "faketime",
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

/// Where root's `PATH` has daemons that a user's may lack.
const SBIN: &[&str] = &["/usr/sbin", "/sbin"];

fn in_sbin(name: &str) -> Option<PathBuf> {
    SBIN.iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| is_executable(candidate))
}

/// `root/VERSION/bin/binary` for the highest VERSION (`15`, `16`; `9.6`
/// before PostgreSQL 10) that has it.
pub(crate) fn newest_versioned(root: &Path, binary: &str) -> Option<PathBuf> {
    let mut found: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(root)
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version = name
                .split('.')
                .map(|part| part.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            let candidate = entry.path().join("bin").join(binary);
            is_executable(&candidate).then_some((version, candidate))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, path)| path)
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
    let mut missing: Vec<Provision> = Vec::new();
    for s in wanted {
        let provision = s.provision();
        match provision.locate() {
            Some(found) => println!("service {}: {}", s.name(), found.display()),
            None if !missing.contains(&provision) => missing.push(provision),
            None => {}
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing.iter().map(|p| p.package()).collect();
    if !is_root() {
        return Err(format!(
            "tests need {} which {} not installed; run as root: \
             apt-get update && apt-get install -y {}",
            missing
                .iter()
                .map(|p| p.binary())
                .collect::<Vec<_>>()
                .join(", "),
            if missing.len() == 1 { "is" } else { "are" },
            packages.join(" ")
        ));
    }
    apt_install(&packages)?;
    for provision in &missing {
        let package = provision.package();
        match provision.locate() {
            Some(found) => println!("installed {package}: {}", found.display()),
            None => {
                return Err(format!(
                    "installed Debian package {package}, but {} is still not found",
                    provision.binary()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "").unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_highest_version_with_the_binary_counts() {
        let root = tempfile::tempdir().unwrap();
        for version in ["9.6", "13", "15"] {
            executable(&root.path().join(version).join("bin/postgres"));
        }
        // Only a client of a newer version, and a directory that is no
        // version.
        executable(&root.path().join("16/bin/psql"));
        executable(&root.path().join("extra/bin/postgres"));
        assert_eq!(
            newest_versioned(root.path(), "postgres"),
            Some(root.path().join("15/bin/postgres"))
        );
        assert_eq!(newest_versioned(root.path(), "initdb"), None);
        assert_eq!(
            newest_versioned(&root.path().join("none"), "postgres"),
            None
        );
    }

    #[test]
    fn every_service_names_a_package_and_a_binary() {
        for s in [
            Service::Redis,
            Service::Etcd,
            Service::Chromium,
            Service::Iproute2,
            Service::Postgres,
            Service::PgBouncer,
            Service::Faketime,
        ] {
            let p = s.provision();
            assert!(!p.package().is_empty() && !p.binary().is_empty(), "{s:?}");
        }
        assert_eq!(Service::Postgres.provision().package(), "postgresql");
        assert_eq!(Service::PgBouncer.provision().package(), "pgbouncer");
    }
}
