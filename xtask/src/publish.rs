//! `cargo xtask publish --dry-run`: the order the publishable crates reach
//! crates.io in, and proof that each builds from its package.
//!
//! None of them is on crates.io yet, so `cargo package -p lease-keeper`
//! alone cannot resolve `lease-port`. Packaged together, cargo (since
//! 1.90) packages them in dependency order into a temporary local
//! registry laid over crates.io, and writes each crate's `Cargo.lock`
//! against the packages made before it. Verification then unpacks each
//! `.crate` into a workspace of its own and builds its library and
//! binaries with default features, its workspace dependencies coming from
//! their `.crate` files in that registry (never from the source tree) and
//! everything else from crates.io. That is what `cargo publish` checks,
//! one crate at a time, once the ones before it are out.
//!
//! A crate must come after what it depends on (normal and build
//! dependencies) and after its dev-dependencies that carry a version: the
//! registry lists those, so they must exist when it is published (cargo
//! cannot even write the lock file without them). Path-only
//! dev-dependencies are stripped from the package and bind nothing.
//!
//! Cargo orders the packages itself, by the same rule; the dry run checks
//! that it packaged exactly the crates of the printed order, each after
//! every crate it needs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::{Result, cargo};

const USAGE: &str = "usage: cargo xtask publish --dry-run";

pub(crate) fn publish(args: &[String]) -> Result {
    match args {
        [flag] if flag == "--dry-run" => dry_run(),
        // Publishing itself stays a person's act: `cargo publish -p NAME`
        // in the order the dry run prints.
        _ => Err(USAGE.into()),
    }
}

/// Prints the publish order, then packages and verifies every publishable
/// crate in it.
pub(crate) fn dry_run() -> Result {
    require_cargo(MULTI_PACKAGE_CARGO)?;
    let ws = Workspace::load()?;
    let order = publish_order(&ws.crates)?;
    println!("\npublish order (each crate after the ones it needs):");
    for (i, name) in order.iter().enumerate() {
        let needs = ws.crates[name].needs();
        if needs.is_empty() {
            println!("  {:>2}. {name}", i + 1);
        } else {
            let needs: Vec<&str> = needs.iter().map(String::as_str).collect();
            println!("  {:>2}. {name}  (after {})", i + 1, needs.join(", "));
        }
    }
    forget_unpacked_packages()?;
    let mut package = cargo();
    package
        .args(["package", "--locked", "--allow-dirty", "--color", "never"])
        .env("CARGO_TARGET_DIR", verify_dir());
    for name in &order {
        package.args(["-p", name]);
    }
    let packaged = run_watching_packaging(
        "package the publishable crates, each verified against the packages before it",
        &mut package,
    )?;
    check_cargo_order(&ws.crates, &order, &packaged)?;
    println!(
        "publish dry run: {} crates packaged and verified",
        order.len()
    );
    Ok(())
}

/// The first cargo whose `cargo package` takes several interdependent
/// crates at once (multi-package publishing, stabilised in 1.90). Older
/// ones package each alone and fail on the first workspace dependency.
const MULTI_PACKAGE_CARGO: (u32, u32) = (1, 90);

/// Where the packages are built: a target directory of their own, made
/// anew each run. Cargo takes a registry crate of one name and version to
/// be unchanged, so in a shared target directory it reuses the build of a
/// package made by an earlier run — a crate changed since would be checked
/// against its old self.
fn verify_dir() -> std::path::PathBuf {
    crate::workspace_root().join("target/publish-check")
}

/// Starts the packages afresh: their build directory (which holds the
/// temporary registry too), and their sources as cargo unpacked them under
/// `$CARGO_HOME/registry/src/-<hash of the registry's path>` (the
/// `-`-prefixed directories there are local registries; forgetting their
/// unpacked sources costs only unpacking them again).
fn forget_unpacked_packages() -> Result {
    let dir = verify_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let Ok(entries) = std::fs::read_dir(home.join("registry").join("src")) else {
        return Ok(()); // nothing unpacked yet
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('-') {
            std::fs::remove_dir_all(entry.path())
                .map_err(|e| format!("cannot clear {}: {e}", entry.path().display()))?;
        }
    }
    Ok(())
}

fn require_cargo(least: (u32, u32)) -> Result {
    let out = cargo()
        .arg("--version")
        .output()
        .map_err(|e| format!("cargo --version: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match cargo_version(&text) {
        Some(v) if v >= least => Ok(()),
        _ => Err(format!(
            "the publish dry run needs cargo {}.{} or newer, to package interdependent \
             crates together; this is {}",
            least.0,
            least.1,
            text.trim()
        )),
    }
}

/// `cargo 1.95.0 (f2d3ce0bd 2026-03-21)` → `(1, 95)`.
fn cargo_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.strip_prefix("cargo ")?.split(['.', ' ', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Runs `cargo package`, its messages passed through, and returns the
/// crates in the order cargo packaged them.
fn run_watching_packaging(step: &str, cmd: &mut Command) -> Result<Vec<String>> {
    println!("\n==> {step}");
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{step}: cannot start cargo: {e}"))?;
    let stderr = child.stderr.take().ok_or("cargo's stderr was not piped")?;
    let mut packaged = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.map_err(|e| format!("{step}: reading cargo's output: {e}"))?;
        eprintln!("{line}");
        if let Some(name) = line
            .trim_start()
            .strip_prefix("Packaging ")
            .and_then(|rest| rest.split(' ').next())
        {
            packaged.push(name.to_owned());
        }
    }
    let status = child.wait().map_err(|e| format!("{step}: {e}"))?;
    if status.success() {
        Ok(packaged)
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

/// Cargo orders the packages itself; it must have packaged exactly the
/// crates of the printed order, each after every crate it needs, or the
/// order printed is not one cargo would follow.
fn check_cargo_order(
    crates: &BTreeMap<String, Crate>,
    order: &[String],
    packaged: &[String],
) -> Result {
    let mut sorted = packaged.to_vec();
    sorted.sort();
    let mut expected = order.to_vec();
    expected.sort();
    if sorted != expected {
        return Err(format!(
            "cargo packaged {packaged:?}, not the crates of the order {order:?}"
        ));
    }
    for (i, name) in packaged.iter().enumerate() {
        let later: Vec<String> = crates[name]
            .needs()
            .into_iter()
            .filter(|need| !packaged[..i].contains(need))
            .collect();
        if !later.is_empty() {
            return Err(format!(
                "cargo packaged {name} before {later:?}, which it needs: the publish \
                 order and cargo's disagree"
            ));
        }
    }
    Ok(())
}

/// How a dependency is used, as `cargo metadata` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Normal,
    Build,
    Dev,
}

/// A dependency on another member of the workspace (by path).
#[derive(Debug, Clone)]
struct LocalDep {
    /// The package's name (not a rename).
    name: String,
    kind: Kind,
    /// Whether it carries a version requirement; without one, publishing
    /// strips a dev-dependency and refuses any other.
    versioned: bool,
}

#[derive(Debug, Clone)]
struct Crate {
    publish: bool,
    local_deps: Vec<LocalDep>,
}

impl Crate {
    /// The workspace crates that must be on the registry before this one.
    fn needs(&self) -> BTreeSet<String> {
        self.local_deps
            .iter()
            .filter(|d| d.kind != Kind::Dev || d.versioned)
            .map(|d| d.name.clone())
            .collect()
    }
}

#[derive(Debug)]
struct Workspace {
    crates: BTreeMap<String, Crate>,
}

impl Workspace {
    fn load() -> Result<Workspace> {
        let out = cargo()
            .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
            .output()
            .map_err(|e| format!("cargo metadata: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
        Workspace::from_metadata(&meta)
    }

    fn from_metadata(meta: &serde_json::Value) -> Result<Workspace> {
        let packages = meta["packages"]
            .as_array()
            .ok_or("cargo metadata: no packages")?;
        let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
        let mut crates = BTreeMap::new();
        for p in packages {
            let name = p["name"]
                .as_str()
                .ok_or("cargo metadata: a nameless package")?;
            let local_deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                // A path dependency on a member; path dependencies outside
                // the workspace would be caught by `cargo package` itself.
                .filter(|d| d["path"].is_string())
                .filter_map(|d| {
                    let dep = d["name"].as_str().filter(|n| members.contains(n))?;
                    Some(LocalDep {
                        name: dep.to_owned(),
                        kind: match d["kind"].as_str() {
                            Some("dev") => Kind::Dev,
                            Some("build") => Kind::Build,
                            _ => Kind::Normal,
                        },
                        versioned: d["req"].as_str().is_some_and(|r| r != "*"),
                    })
                })
                .filter(|d| d.name != name)
                .collect();
            crates.insert(
                name.to_owned(),
                Crate {
                    // `publish = false` is an empty list of registries.
                    publish: !p["publish"].as_array().is_some_and(|a| a.is_empty()),
                    local_deps,
                },
            );
        }
        Ok(Workspace { crates })
    }
}

/// The publishable crates, each after every workspace crate it needs; ties
/// broken by name, so the order is stable. Fails on what would stop a
/// publish: a dependency that is never published, or a cycle.
fn publish_order(crates: &BTreeMap<String, Crate>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut waiting: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (name, c) in crates.iter().filter(|(_, c)| c.publish) {
        for d in &c.local_deps {
            let stripped = d.kind == Kind::Dev && !d.versioned;
            if stripped || crates.get(&d.name).is_some_and(|c| c.publish) {
                if d.kind != Kind::Dev && !d.versioned {
                    problems.push(format!(
                        "{name} depends on {} by path alone: give it a version",
                        d.name
                    ));
                }
                continue;
            }
            problems.push(match d.kind {
                Kind::Dev => format!(
                    "{name} has a versioned dev-dependency on {}, which is never published: \
                     make it path-only so publishing strips it",
                    d.name
                ),
                _ => format!("{name} depends on {}, which is never published", d.name),
            });
        }
        waiting.insert(name, c.needs());
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    let mut order = Vec::new();
    while !waiting.is_empty() {
        let ready: Vec<&str> = waiting
            .iter()
            .filter(|(_, needs)| needs.is_empty())
            .map(|(name, _)| *name)
            .collect();
        let Some(&next) = ready.first() else {
            let stuck: Vec<&str> = waiting.keys().copied().collect();
            return Err(format!(
                "no publish order: these crates need each other (a cycle through \
                 normal, build or versioned dev-dependencies): {}",
                stuck.join(", ")
            ));
        };
        waiting.remove(next);
        for needs in waiting.values_mut() {
            needs.remove(next);
        }
        order.push(next.to_owned());
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(name: &str, kind: Kind, versioned: bool) -> LocalDep {
        LocalDep {
            name: name.into(),
            kind,
            versioned,
        }
    }

    fn krate(publish: bool, local_deps: Vec<LocalDep>) -> Crate {
        Crate {
            publish,
            local_deps,
        }
    }

    fn position(order: &[String], name: &str) -> usize {
        order
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("{name} missing from {order:?}"))
    }

    #[test]
    fn the_workspace_has_an_order_with_every_publishable_crate() {
        let ws = Workspace::load().expect("cargo metadata");
        let order = publish_order(&ws.crates).expect("an order");
        for (name, c) in &ws.crates {
            assert_eq!(order.contains(name), c.publish, "{name}");
            if !c.publish {
                continue;
            }
            for need in &c.needs() {
                assert!(
                    position(&order, need) < position(&order, name),
                    "{name} before {need}: {order:?}"
                );
            }
        }
        assert_eq!(order.first().map(String::as_str), Some("lease-port"));
    }

    #[test]
    fn versioned_dev_dependencies_bind_and_path_only_ones_do_not() {
        let crates = BTreeMap::from([
            ("port".into(), krate(true, vec![])),
            (
                "suite".into(),
                krate(
                    true,
                    vec![
                        dep("port", Kind::Normal, true),
                        // Stripped on publish: breaks the cycle with mem.
                        dep("mem", Kind::Dev, false),
                    ],
                ),
            ),
            (
                "mem".into(),
                krate(
                    true,
                    vec![
                        dep("port", Kind::Normal, true),
                        dep("suite", Kind::Dev, true),
                    ],
                ),
            ),
            (
                "codegen".into(),
                krate(true, vec![dep("port", Kind::Normal, true)]),
            ),
            (
                "app".into(),
                krate(true, vec![dep("codegen", Kind::Build, true)]),
            ),
        ]);
        assert_eq!(
            publish_order(&crates).unwrap(),
            ["port", "codegen", "app", "suite", "mem"]
        );
    }

    #[test]
    fn a_cycle_is_reported() {
        let crates = BTreeMap::from([
            ("a".into(), krate(true, vec![dep("b", Kind::Normal, true)])),
            ("b".into(), krate(true, vec![dep("a", Kind::Dev, true)])),
            ("c".into(), krate(true, vec![])),
        ]);
        let err = publish_order(&crates).unwrap_err();
        assert!(
            err.contains("need each other") && err.ends_with("a, b"),
            "{err}"
        );
    }

    #[test]
    fn unpublished_or_unversioned_dependencies_are_reported() {
        let crates = BTreeMap::from([
            ("support".into(), krate(false, vec![])),
            ("lib".into(), krate(true, vec![])),
            (
                "a".into(),
                krate(
                    true,
                    vec![
                        dep("support", Kind::Normal, true),
                        dep("lib", Kind::Normal, false),
                    ],
                ),
            ),
            (
                "b".into(),
                krate(
                    true,
                    vec![
                        dep("support", Kind::Dev, true),
                        // Path-only test support is fine: it is stripped.
                        dep("support", Kind::Dev, false),
                    ],
                ),
            ),
            // Unpublished crates may depend on anything.
            (
                "tests".into(),
                krate(false, vec![dep("support", Kind::Normal, false)]),
            ),
        ]);
        let err = publish_order(&crates).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(lines[0].starts_with("a depends on support, which is never published"));
        assert!(lines[1].starts_with("a depends on lib by path alone"));
        assert!(lines[2].starts_with("b has a versioned dev-dependency on support"));
    }

    #[test]
    fn cargo_packaging_out_of_order_or_short_is_reported() {
        let crates = BTreeMap::from([
            ("port".into(), krate(true, vec![])),
            (
                "mem".into(),
                krate(true, vec![dep("port", Kind::Normal, true)]),
            ),
        ]);
        let order = publish_order(&crates).unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_cargo_order(&crates, &order, &names(&["port", "mem"])).is_ok());
        let err = check_cargo_order(&crates, &order, &names(&["mem", "port"])).unwrap_err();
        assert!(
            err.starts_with("cargo packaged mem before [\"port\"]"),
            "{err}"
        );
        let err = check_cargo_order(&crates, &order, &names(&["port"])).unwrap_err();
        assert!(err.contains("not the crates of the order"), "{err}");
    }

    #[test]
    fn cargo_versions_are_read() {
        assert_eq!(
            cargo_version("cargo 1.95.0 (f2d3ce0bd 2026-03-21)\n"),
            Some((1, 95))
        );
        assert_eq!(
            cargo_version("cargo 1.92.0-nightly (abc 2025-10-01)"),
            Some((1, 92))
        );
        assert_eq!(cargo_version("rustc 1.95.0"), None);
        assert!(cargo_version("cargo 1.89.1 (x)").unwrap() < MULTI_PACKAGE_CARGO);
    }

    #[test]
    fn metadata_is_read_into_local_dependencies() {
        let meta = serde_json::json!({
            "packages": [
                {"name": "port", "version": "0.1.0", "publish": null, "dependencies": [
                    {"name": "serde", "req": "^1", "kind": null, "source": "registry+x"}
                ]},
                {"name": "mem", "version": "0.1.0", "publish": null, "dependencies": [
                    {"name": "port", "req": "^0.1.0", "kind": null, "path": "/w/port"},
                    {"name": "suite", "req": "*", "kind": "dev", "path": "/w/suite"},
                    {"name": "mem", "req": "*", "kind": "dev", "path": "/w/mem"},
                    {"name": "gen", "req": "^0.1.0", "kind": "build", "path": "/w/gen"}
                ]},
                {"name": "suite", "version": "0.1.0", "publish": [], "dependencies": []},
                {"name": "gen", "version": "0.1.0", "publish": ["crates-io"], "dependencies": []}
            ]
        });
        let ws = Workspace::from_metadata(&meta).unwrap();
        assert!(ws.crates["port"].local_deps.is_empty());
        assert!(!ws.crates["suite"].publish && ws.crates["gen"].publish);
        let mem = &ws.crates["mem"];
        let deps: Vec<(&str, Kind, bool)> = mem
            .local_deps
            .iter()
            .map(|d| (d.name.as_str(), d.kind, d.versioned))
            .collect();
        assert_eq!(
            deps,
            [
                ("port", Kind::Normal, true),
                ("suite", Kind::Dev, false),
                ("gen", Kind::Build, true)
            ]
        );
        assert_eq!(
            mem.needs(),
            BTreeSet::from(["port".to_owned(), "gen".to_owned()])
        );
    }
}
