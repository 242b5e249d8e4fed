//! Tidy: the workspace rules nobody should have to remember, checked on every
//! `cargo test`. Each rule is a function from a snapshot of the workspace to
//! the list of what breaks it, so the tests below can also feed it broken
//! snapshots and prove it reports them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::backends::BACKENDS;

/// Crates allowed to depend on backends: the shipped servers choose one.
const SERVERS: &[&str] = &["mecated", "mecatl-leased"];

/// Libraries allowed to depend on backends besides the servers:
/// `lease-backends` is the wiring the servers share (their flags turned
/// into backends), each backend behind a cargo feature, so it drags in only
/// what a server enables.
const WIRING: &[&str] = &["lease-backends"];

/// The crate that defines the trait (its blanket impls are not a backend).
const PORT: &str = "lease-port";

/// The store contract's behaviour suite, which every store runs.
const STORE_SUITE: &str = "storeconformance";

#[derive(Debug, Clone)]
struct Package {
    name: String,
    dir: PathBuf,
    publish: bool,
    description: bool,
    readme: Option<PathBuf>,
    repository: Option<String>,
    documentation: Option<String>,
    keywords: Vec<String>,
    /// Names of normal and build dependencies (not dev-dependencies).
    runtime_deps: Vec<String>,
    /// Names of dev-dependencies.
    dev_deps: Vec<String>,
}

#[derive(Debug)]
struct Workspace {
    packages: Vec<Package>,
}

impl Workspace {
    fn load() -> Workspace {
        let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(crate::workspace_root())
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .output()
            .expect("run cargo metadata");
        assert!(out.status.success(), "cargo metadata failed: {out:?}");
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        let packages = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| {
                let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest"));
                let dir = manifest.parent().expect("crate dir").to_path_buf();
                Package {
                    name: p["name"].as_str().expect("name").to_owned(),
                    publish: !p["publish"].as_array().is_some_and(|a| a.is_empty()),
                    description: p["description"].as_str().is_some_and(|d| !d.is_empty()),
                    readme: p["readme"].as_str().map(|r| dir.join(r)),
                    repository: p["repository"].as_str().map(str::to_owned),
                    documentation: p["documentation"].as_str().map(str::to_owned),
                    keywords: p["keywords"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|k| k.as_str().map(str::to_owned))
                        .collect(),
                    runtime_deps: deps_of(p, |kind| kind != Some("dev")),
                    dev_deps: deps_of(p, |kind| kind == Some("dev")),
                    dir,
                }
            })
            .collect();
        Workspace { packages }
    }

    /// Crates whose library implements `SessionLease`. Test support (never
    /// published) wraps backends to break them or drive them, and is none.
    fn backends(&self) -> Vec<&Package> {
        self.packages
            .iter()
            .filter(|p| p.publish)
            .filter(|p| p.name != PORT && !SERVERS.contains(&p.name.as_str()))
            .filter(|p| {
                rust_files(&p.dir.join("src"))
                    .iter()
                    .any(|f| implements(f, "SessionLease"))
            })
            .collect()
    }

    /// Crates whose library implements `SessionStore`. Test support (never
    /// published) wraps stores to break them, tests/ holds test wrappers,
    /// and the servers wrap the store they are given (to watch it): none
    /// of them offers a store.
    fn stores(&self) -> Vec<&Package> {
        self.packages
            .iter()
            .filter(|p| p.publish && !SERVERS.contains(&p.name.as_str()))
            .filter(|p| {
                rust_files(&p.dir.join("src"))
                    .iter()
                    .any(|f| implements(f, "SessionStore"))
            })
            .collect()
    }
}

/// The names of `package`'s dependencies whose kind (`None` for normal,
/// `"dev"`, `"build"`) `keep` accepts.
fn deps_of(package: &serde_json::Value, keep: impl Fn(Option<&str>) -> bool) -> Vec<String> {
    package["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| keep(d["kind"].as_str()))
        .map(|d| d["name"].as_str().expect("dep name").to_owned())
        .collect()
}

pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Whether `file` implements the trait named `name` (`impl Name for`,
/// `impl path::Name for`, with or without generics).
fn implements(file: &Path, name: &str) -> bool {
    let (plain, qualified) = (format!(" {name} for "), format!("::{name} for "));
    fs::read_to_string(file).is_ok_and(|text| {
        text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("impl") && (l.contains(&plain) || l.contains(&qualified))
        })
    })
}

/// Every backend crate is in xtask's table, every row is a backend crate, and
/// each has a conformance test target that expands the shared suite.
fn check_backend_table(ws: &Workspace, table: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let found = ws.backends();
    for b in &found {
        if !table.contains(&b.name.as_str()) {
            problems.push(format!(
                "{} implements SessionLease but is not in xtask/src/backends.rs",
                b.name
            ));
        }
        let targets: Vec<PathBuf> = rust_files(&b.dir.join("tests"))
            .into_iter()
            .filter(|f| {
                f.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("conformance"))
            })
            .collect();
        let runs_suite = targets
            .iter()
            .any(|f| fs::read_to_string(f).is_ok_and(|t| t.contains("leaseconformance::suite!")));
        if !runs_suite {
            problems.push(format!(
                "{} has no tests/conformance*.rs expanding leaseconformance::suite!",
                b.name
            ));
        }
    }
    for row in table {
        if !found.iter().any(|b| b.name == *row) {
            problems.push(format!(
                "xtask's backend table lists {row}, which is not a crate implementing SessionLease"
            ));
        }
    }
    problems
}

/// Every store crate runs the store contract's suite: `storeconformance`
/// is among its dev-dependencies, and a test under `tests/` expands its
/// `suite!`.
fn check_stores_run_the_suite(ws: &Workspace) -> Vec<String> {
    let mut problems = Vec::new();
    for store in ws.stores() {
        if !store.dev_deps.iter().any(|d| d == STORE_SUITE) {
            problems.push(format!(
                "{} implements SessionStore but has no dev-dependency on {STORE_SUITE}",
                store.name
            ));
        }
        let invocation = format!("{STORE_SUITE}::suite!");
        let expands = rust_files(&store.dir.join("tests"))
            .iter()
            .any(|f| fs::read_to_string(f).is_ok_and(|t| t.contains(&invocation)));
        if !expands {
            problems.push(format!(
                "{} implements SessionStore but no test under tests/ expands \
                 storeconformance::suite!",
                store.name
            ));
        }
    }
    problems
}

/// Publishable crates carry a description and a README, and their crate
/// documentation opens the root module with a runnable example.
fn check_publishable_docs(ws: &Workspace) -> Vec<String> {
    let mut problems = Vec::new();
    for p in ws.packages.iter().filter(|p| p.publish) {
        if !p.description {
            problems.push(format!("{}: no description in Cargo.toml", p.name));
        }
        match &p.readme {
            Some(r) if r.is_file() => {}
            Some(r) => problems.push(format!("{}: readme {} does not exist", p.name, r.display())),
            None => problems.push(format!("{}: no readme in Cargo.toml", p.name)),
        }
        let root = ["src/lib.rs", "src/main.rs"]
            .iter()
            .map(|f| p.dir.join(f))
            .find(|f| f.is_file());
        let Some(root) = root else {
            problems.push(format!("{}: no src/lib.rs or src/main.rs", p.name));
            continue;
        };
        let text = fs::read_to_string(&root).unwrap_or_default();
        let docs: Vec<&str> = text
            .lines()
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .filter(|l| l.starts_with("//!"))
            .collect();
        if docs.is_empty() {
            problems.push(format!(
                "{}: {} does not open with crate docs",
                p.name,
                root.display()
            ));
            continue;
        }
        let runnable = opening_fences(&docs).any(|info| {
            let attrs: Vec<&str> = info.split(',').map(str::trim).collect();
            !attrs.iter().any(|a| {
                matches!(
                    *a,
                    "text" | "ignore" | "compile_fail" | "sh" | "toml" | "json"
                )
            })
        });
        let is_lib = root.ends_with("src/lib.rs");
        if is_lib && !runnable {
            problems.push(format!(
                "{}: crate docs have no runnable example (a ``` or ```no_run block)",
                p.name
            ));
        }
    }
    problems
}

/// What crates.io allows a keyword to be: ASCII, at most 20 characters,
/// an alphanumeric first, then alphanumerics, `_`, `-` or `+`.
fn valid_keyword(k: &str) -> bool {
    k.len() <= 20
        && k.starts_with(|c: char| c.is_ascii_alphanumeric())
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
}

/// Publishable crates name the repository and their documentation, and
/// carry keywords of their own (crates.io's limits kept): a set copied
/// from another crate, or the workspace's, says nothing about this one.
fn check_publishable_metadata(ws: &Workspace) -> Vec<String> {
    let mut problems = Vec::new();
    let published: Vec<&Package> = ws.packages.iter().filter(|p| p.publish).collect();
    for (i, p) in published.iter().enumerate() {
        if p.repository.as_deref().is_none_or(str::is_empty) {
            problems.push(format!(
                "{}: no repository in Cargo.toml (`repository.workspace = true`)",
                p.name
            ));
        }
        let own_docs = format!("https://docs.rs/{}", p.name);
        match p.documentation.as_deref() {
            None | Some("") => problems.push(format!(
                "{}: no documentation in Cargo.toml (`documentation = \"{own_docs}\"`)",
                p.name
            )),
            Some(d) if d.starts_with("https://docs.rs/") && d != own_docs => {
                problems.push(format!(
                    "{}: documentation is {d}, another crate's; use {own_docs}",
                    p.name
                ))
            }
            Some(_) => {}
        }
        if p.keywords.is_empty() || p.keywords.len() > 5 {
            problems.push(format!(
                "{}: {} keywords; crates.io takes 1 to 5",
                p.name,
                p.keywords.len()
            ));
        }
        for k in p.keywords.iter().filter(|k| !valid_keyword(k)) {
            problems.push(format!(
                "{}: keyword {k:?} is not one crates.io accepts (at most 20 ASCII \
                 alphanumerics, `_`, `-` or `+`, starting with an alphanumeric)",
                p.name
            ));
        }
        let mut own: Vec<&String> = p.keywords.iter().collect();
        own.sort();
        for q in &published[i + 1..] {
            let mut theirs: Vec<&String> = q.keywords.iter().collect();
            theirs.sort();
            if !own.is_empty() && own == theirs {
                problems.push(format!(
                    "{} and {} have the same keywords {own:?}: give each its own",
                    p.name, q.name
                ));
            }
        }
    }
    problems
}

/// The info strings of the code blocks opened in doc lines (closing fences
/// skipped).
fn opening_fences<'a>(docs: &'a [&'a str]) -> impl Iterator<Item = &'a str> + 'a {
    let mut open = false;
    docs.iter().filter_map(move |l| {
        let info = l.trim_start_matches("//!").trim().strip_prefix("```")?;
        open = !open;
        open.then_some(info)
    })
}

/// Only the servers (and the wiring they share) pick backends: a backend
/// or library that depends on another backend would drag it into every
/// consumer.
fn check_backend_isolation(ws: &Workspace) -> Vec<String> {
    let backends: Vec<String> = ws.backends().iter().map(|b| b.name.clone()).collect();
    let mut problems = Vec::new();
    for p in &ws.packages {
        // The servers choose a backend, and their shared wiring opens it;
        // test support (never published) drives them all.
        let name = p.name.as_str();
        if SERVERS.contains(&name) || WIRING.contains(&name) || !p.publish {
            continue;
        }
        for dep in &p.runtime_deps {
            if backends.contains(dep) {
                problems.push(format!(
                    "{} depends on backend {dep} (only {} and {} may; use a dev-dependency \
                     for tests)",
                    p.name,
                    SERVERS.join(", "),
                    WIRING.join(", ")
                ));
            }
        }
    }
    problems
}

fn table() -> Vec<&'static str> {
    BACKENDS.iter().map(|b| b.name).collect()
}

#[track_caller]
fn assert_clean(rule: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{rule}:\n  {}", problems.join("\n  "));
}

#[test]
fn every_backend_is_in_the_table_and_runs_conformance() {
    let ws = Workspace::load();
    assert!(
        ws.backends().len() >= 2,
        "backend detection found {:?}",
        ws.backends()
    );
    assert_clean("backend table", check_backend_table(&ws, &table()));
}

#[test]
fn every_store_runs_the_conformance_suite() {
    let ws = Workspace::load();
    let stores: Vec<&str> = ws.stores().iter().map(|p| p.name.as_str()).collect();
    assert!(
        stores.contains(&"session-store") && stores.contains(&"redis-session-store"),
        "store detection found {stores:?}"
    );
    assert_clean("store conformance", check_stores_run_the_suite(&ws));
}

#[test]
fn every_publishable_crate_has_readme_and_docs() {
    assert_clean(
        "publishable docs",
        check_publishable_docs(&Workspace::load()),
    );
}

#[test]
fn every_publishable_crate_has_repository_docs_and_its_own_keywords() {
    assert_clean(
        "publishable metadata",
        check_publishable_metadata(&Workspace::load()),
    );
}

#[test]
fn only_servers_depend_on_backends() {
    assert_clean(
        "backend isolation",
        check_backend_isolation(&Workspace::load()),
    );
}

#[test]
fn no_function_runs_past_the_budget() {
    let ws = Workspace::load();
    let dirs: Vec<PathBuf> = ws.packages.iter().map(|p| p.dir.clone()).collect();
    assert_clean(
        "function length",
        crate::fn_length::check(&crate::workspace_root(), &dirs, crate::fn_length::ALLOWED),
    );
}

/// The rules catch what they are for: each is fed the real workspace with
/// one thing broken.
mod rules_can_fail {
    use super::*;

    fn package(ws: &mut Workspace, name: &str) -> usize {
        ws.packages
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("workspace has {name}"))
    }

    #[test]
    fn a_backend_missing_from_the_table_is_reported() {
        let ws = Workspace::load();
        let short: Vec<&str> = table().into_iter().filter(|b| *b != "flocklease").collect();
        let problems = check_backend_table(&ws, &short);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("flocklease implements")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_stale_row_is_reported() {
        let ws = Workspace::load();
        let mut long = table();
        long.push("lease-keeper");
        let problems = check_backend_table(&ws, &long);
        assert!(
            problems.iter().any(|p| p.contains("lists lease-keeper")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_backend_without_conformance_tests_is_reported() {
        let mut ws = Workspace::load();
        let i = package(&mut ws, "memlease");
        // Point the crate at a copy of itself without tests/.
        let copy = tempfile::tempdir().expect("tempdir");
        copy_dir(&ws.packages[i].dir.join("src"), &copy.path().join("src"));
        ws.packages[i].dir = copy.path().to_path_buf();
        let problems = check_backend_table(&ws, &table());
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("memlease has no tests/conformance")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_store_not_running_the_suite_is_reported_and_wrappers_are_no_stores() {
        let mut ws = Workspace::load();
        let stores: Vec<String> = ws.stores().iter().map(|p| p.name.clone()).collect();
        // Test support wraps stores to break them; a server wraps its store
        // to watch it: neither is a store that must run the suite.
        for wrapper in ["lease-history", "mecated"] {
            assert!(!stores.iter().any(|s| s == wrapper), "{stores:?}");
        }
        let i = package(&mut ws, "redis-session-store");
        ws.packages[i].dev_deps.retain(|d| d != STORE_SUITE);
        // Point the crate at a copy of itself without tests/.
        let copy = tempfile::tempdir().expect("tempdir");
        copy_dir(&ws.packages[i].dir.join("src"), &copy.path().join("src"));
        ws.packages[i].dir = copy.path().to_path_buf();
        let problems = check_stores_run_the_suite(&ws);
        assert_eq!(
            problems,
            [
                "redis-session-store implements SessionStore but has no dev-dependency on \
                 storeconformance",
                "redis-session-store implements SessionStore but no test under tests/ expands \
                 storeconformance::suite!",
            ],
        );
    }

    #[test]
    fn a_missing_readme_or_example_is_reported() {
        let mut ws = Workspace::load();
        let i = package(&mut ws, "memlease");
        ws.packages[i].readme = None;
        let copy = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(copy.path().join("src")).expect("mkdir");
        fs::write(
            copy.path().join("src/lib.rs"),
            "//! Docs without an example.\n\n//! ```text\n//! not code\n//! ```\npub fn f() {}\n",
        )
        .expect("write");
        let j = package(&mut ws, "lease-port");
        ws.packages[j].dir = copy.path().to_path_buf();
        let problems = check_publishable_docs(&ws);
        assert!(
            problems
                .iter()
                .any(|p| p == "memlease: no readme in Cargo.toml"),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("lease-port: crate docs have no runnable example")),
            "{problems:?}"
        );
    }

    #[test]
    fn missing_links_and_shared_or_bad_keywords_are_reported() {
        let mut ws = Workspace::load();
        let before = check_publishable_metadata(&ws);
        let i = package(&mut ws, "memlease");
        ws.packages[i].repository = None;
        let i = package(&mut ws, "lease-port");
        ws.packages[i].documentation = None;
        let i = package(&mut ws, "session-store");
        ws.packages[i].documentation = Some("https://docs.rs/lease-port".into());
        let i = package(&mut ws, "memlease");
        let keywords = ws.packages[i].keywords.clone();
        let i = package(&mut ws, "flocklease");
        ws.packages[i].keywords = keywords.into_iter().rev().collect();
        let i = package(&mut ws, "lease-keeper");
        ws.packages[i].keywords = ["a-keyword-over-twenty-chars", "-dash", "ok", "x", "y", "z"]
            .map(String::from)
            .to_vec();
        let problems: Vec<String> = check_publishable_metadata(&ws)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        assert!(
            problems.iter().any(|p| p.contains("flocklease")
                && p.contains("memlease")
                && p.contains("have the same keywords")),
            "{problems:?}"
        );
        for expected in [
            "memlease: no repository",
            "lease-port: no documentation",
            "session-store: documentation is https://docs.rs/lease-port, another crate's",
            "lease-keeper: 6 keywords",
            "lease-keeper: keyword \"a-keyword-over-twenty-chars\"",
            "lease-keeper: keyword \"-dash\"",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(expected)),
                "{expected:?} not in {problems:?}"
            );
        }
        assert_eq!(problems.len(), 7, "{problems:?}");
    }

    #[test]
    fn a_library_depending_on_a_backend_is_reported() {
        let mut ws = Workspace::load();
        let i = package(&mut ws, "lease-keeper");
        ws.packages[i].runtime_deps.push("flocklease".into());
        let problems = check_backend_isolation(&ws);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("lease-keeper depends on backend flocklease")),
            "{problems:?}"
        );
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir_all(to).expect("mkdir");
        for entry in fs::read_dir(from).expect("read dir").flatten() {
            let target = to.join(entry.file_name());
            if entry.path().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                fs::copy(entry.path(), target).expect("copy");
            }
        }
    }
}
