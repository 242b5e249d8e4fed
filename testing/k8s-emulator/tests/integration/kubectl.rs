//! The real kubectl against the emulator: what a person would type.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use k8s_emulator::{Emulator, EmulatorConfig, Verb};

/// kubectl from PATH; its absence fails the test, naming what is missing.
fn kubectl_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("kubectl is not on PATH: these tests need the real kubectl installed")
        })
}

struct Kubectl {
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Kubectl {
    fn new(kubeconfig: &Path) -> Self {
        Self {
            kubeconfig: kubeconfig.to_path_buf(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(kubectl_binary());
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.home.path().join("cache"))
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        command
    }

    /// Runs kubectl off the async runtime (the emulator serves on it).
    async fn run_with(&self, mut command: Command) -> Output {
        tokio::task::spawn_blocking(move || command.output().expect("kubectl runs"))
            .await
            .unwrap()
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.run_with(self.command(args)).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }
}

fn write_manifest(dir: &Path, holder: &str) -> PathBuf {
    let path = dir.join(format!("lease-{holder}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: demo\n  labels:\n    app: demo\nspec:\n  holderIdentity: {holder}\n  leaseDurationSeconds: 15\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_get_describe_edit_and_delete() {
    let emulator = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(emulator.kubeconfig_path());
    let files = tempfile::tempdir().unwrap();

    let out = kubectl
        .ok(&[
            "apply",
            "-f",
            write_manifest(files.path(), "alice").to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.trim(), "lease.coordination.k8s.io/demo created");

    let table = kubectl.ok(&["get", "leases"]).await;
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "HOLDER", "AGE"], "{table}");
    assert_eq!(lines[1][..2], ["demo", "alice"], "{table}");

    let yaml = kubectl.ok(&["get", "lease", "demo", "-o", "yaml"]).await;
    assert!(yaml.contains("kind: Lease"), "{yaml}");
    assert!(yaml.contains("holderIdentity: alice"), "{yaml}");
    assert!(yaml.contains("resourceVersion:"), "{yaml}");

    let described = kubectl.ok(&["describe", "lease", "demo"]).await;
    assert!(described.contains("Name:         demo"), "{described}");
    assert!(described.contains("Holder Identity:"), "{described}");

    // Client-side apply: GET, then a strategic merge patch.
    let out = kubectl
        .ok(&[
            "apply",
            "-f",
            write_manifest(files.path(), "bob").to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.trim(), "lease.coordination.k8s.io/demo configured");
    let holder = kubectl
        .ok(&[
            "get",
            "lease",
            "demo",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .await;
    assert_eq!(holder, "bob");
    assert!(emulator.requests().get(Verb::Patch, "leases") >= 1);

    // edit: the editor is a script that rewrites the holder in place.
    let editor = files.path().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/holderIdentity: bob/holderIdentity: edited/' \"$1\"\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut edit = kubectl.command(&["edit", "lease", "demo"]);
    edit.env("KUBE_EDITOR", &editor).env("EDITOR", &editor);
    let output = kubectl.run_with(edit).await;
    assert!(
        output.status.success(),
        "kubectl edit failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "lease.coordination.k8s.io/demo edited"
    );
    let holder = kubectl
        .ok(&[
            "get",
            "lease",
            "demo",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .await;
    assert_eq!(holder, "edited");

    // Server-side apply.
    let out = kubectl
        .ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            write_manifest(files.path(), "carol").to_str().unwrap(),
        ])
        .await;
    assert_eq!(
        out.trim(),
        "lease.coordination.k8s.io/demo serverside-applied"
    );
    let holder = kubectl
        .ok(&[
            "get",
            "lease",
            "demo",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .await;
    assert_eq!(holder, "carol");

    // Validation happens on the server and kubectl shows its message.
    let bad = files.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: bad\nspec:\n  leaseDurationSeconds: 0\n",
    )
    .unwrap();
    let output = kubectl.run(&["create", "-f", bad.to_str().unwrap()]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"),
        "{stderr}"
    );

    let out = kubectl.ok(&["delete", "lease", "demo"]).await;
    assert_eq!(out.trim(), "lease.coordination.k8s.io \"demo\" deleted");
    let output = kubectl.run(&["get", "lease", "demo"]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "Error from server (NotFound): leases.coordination.k8s.io \"demo\" not found"
        ),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_the_forbidden_message_for_a_missing_verb() {
    let emulator = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let admin = Kubectl::new(emulator.kubeconfig_path());
    let files = tempfile::tempdir().unwrap();
    admin
        .ok(&[
            "create",
            "-f",
            write_manifest(files.path(), "alice").to_str().unwrap(),
        ])
        .await;

    let viewer = Kubectl::new(&emulator.kubeconfig_for("viewer").unwrap());
    emulator
        .rbac()
        .allow("viewer", &[Verb::Get, Verb::List], "leases");
    let table = viewer.ok(&["get", "leases"]).await;
    assert!(table.contains("demo"), "{table}");
    let output = viewer.run(&["delete", "lease", "demo"]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "leases.coordination.k8s.io \"demo\" is forbidden: User \"viewer\" cannot delete resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\""
        ),
        "{stderr}"
    );
    assert!(admin.ok(&["get", "lease", "demo"]).await.contains("demo"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_writes_a_kubeconfig_kubectl_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_k8s-emulator"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--namespace",
            "team",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the emulator binary starts");
    let stdout = child.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        first.starts_with("listening on http://127.0.0.1:"),
        "{first}"
    );

    let kubectl = Kubectl::new(&kubeconfig);
    let output = kubectl.run(&["get", "leases"]).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "No resources found in team namespace."
    );
}
