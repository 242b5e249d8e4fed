//! The Kubernetes deployment of mecak8s (`deploy/kubernetes`), rendered by
//! the real `kubectl kustomize` and read back as typed Kubernetes objects:
//! what the manifests promise is checked, not eyeballed, the token file
//! mounted from a Secret included.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// `kubectl kustomize DIR`, split into its documents.
fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl is installed (it renders the kustomization)");
    assert!(
        out.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap())
        .expect("kustomize renders YAML documents")
}

fn one<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    serde_json::from_value(found[0].clone())
        .unwrap_or_else(|e| panic!("{kind} is not a valid {kind}: {e}"))
}

#[test]
fn the_rendered_deployment_is_what_mecak8s_needs() {
    let docs = render(&deploy_dir());
    let kinds: std::collections::BTreeSet<&str> =
        docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Deployment",
            "Namespace",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "StatefulSet"
        ]
        .into_iter()
        .collect()
    );
    let _: Namespace = one(&docs, "Namespace");
    let sa: ServiceAccount = one(&docs, "ServiceAccount");
    let role: Role = one(&docs, "Role");
    let binding: RoleBinding = one(&docs, "RoleBinding");
    let deployment: Deployment = one(&docs, "Deployment");
    let pdb: PodDisruptionBudget = one(&docs, "PodDisruptionBudget");
    // The Redis for trying it out keeps what it confirmed: an fsynced
    // append-only file, and no eviction (mecak8s refuses any other policy).
    let redis: StatefulSet = one(&docs, "StatefulSet");
    let redis_args = redis
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap_or_default();
    for pair in [
        ["--appendonly", "yes"],
        ["--appendfsync", "always"],
        ["--maxmemory-policy", "noeviction"],
    ] {
        assert!(
            redis_args.windows(2).any(|w| w == pair),
            "redis runs without {pair:?}: {redis_args:?}"
        );
    }
    let services: Vec<Service> = docs
        .iter()
        .filter(|d| d["kind"] == "Service")
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .collect();
    assert!(
        services
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("mecak8s"))
    );

    // RBAC: exactly get, list, watch, create, update on leases, bound to the pods' account.
    let rules = role.rules.expect("the Role has rules");
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["coordination.k8s.io".to_owned()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["leases".to_owned()][..])
    );
    let mut verbs = rules[0].verbs.clone();
    verbs.sort();
    assert_eq!(verbs, ["create", "get", "list", "update", "watch"]);
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subject = &binding.subjects.expect("a subject")[0];
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(Some(&subject.name), sa.metadata.name.as_ref());

    // The Deployment: three replicas on that account, configured from the
    // downward API, probed on the server's endpoints, given more time to
    // stop than the server takes to give its leases back.
    let spec = deployment.spec.expect("a spec");
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.expect("a pod spec");
    assert_eq!(pod.service_account_name, sa.metadata.name);
    let container = &pod.containers[0];
    let env = container.env.clone().unwrap_or_default();
    let field = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(
        field("POD_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"));
    assert!(env.iter().any(|e| e.name == "REDIS_URL"));
    let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(path(&container.readiness_probe).as_deref(), Some("/readyz"));
    assert_eq!(path(&container.liveness_probe).as_deref(), Some("/healthz"));
    let seconds = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.strip_suffix('s'))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("{name} is stated in seconds"))
    };
    // A rolling deploy loses no run: what the drain cannot wait for runs
    // again on the next owner.
    assert!(
        env.iter()
            .any(|e| e.name == "MECATED_RESUME_INTERRUPTED" && e.value.as_deref() == Some("true")),
        "the pods resume interrupted runs"
    );
    let drain = seconds("MECATED_DRAIN_TIMEOUT");
    let shutdown = seconds("MECATED_SHUTDOWN_TIMEOUT");
    let pre_stop = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.sleep.as_ref())
        .map_or(0, |s| s.seconds);
    let grace = pod
        .termination_grace_period_seconds
        .expect("a grace period");
    assert!(
        grace > pre_stop + drain + shutdown,
        "grace {grace}s must exceed the preStop pause {pre_stop}s, the drain {drain}s and \
         the shutdown bound {shutdown}s together"
    );
    // The default drain is what the manifest states, so a deployment that
    // drops the variable still fits its grace period.
    assert_eq!(
        std::time::Duration::from_secs(drain.unsigned_abs()),
        mecated::server::DEFAULT_DRAIN_TIMEOUT
    );

    // Callers authenticate: the token file comes from a Secret the
    // operator creates (none is rendered, so no token ships with the
    // manifests), mounted read-only where MECATED_TOKEN_FILE points, and
    // nothing turns authentication off.
    let value = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let token_file = value("MECATED_TOKEN_FILE").expect("the pods are given a token file");
    assert!(
        value("MECATED_ALLOW_UNAUTHENTICATED").is_none(),
        "authentication is turned off"
    );
    assert!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "a Secret is rendered"
    );
    let mount = container
        .volume_mounts
        .as_ref()
        .and_then(|m| {
            m.iter()
                .find(|m| token_file.starts_with(&format!("{}/", m.mount_path)))
        })
        .expect("the token file is on a mounted volume");
    assert_eq!(mount.read_only, Some(true));
    assert!(
        mount.sub_path.is_none(),
        "a subPath mount never sees the Secret's updates"
    );
    let volume = pod
        .volumes
        .as_ref()
        .and_then(|v| v.iter().find(|v| v.name == mount.name))
        .expect("the mount's volume");
    let secret = volume.secret.as_ref().expect("the volume is a Secret");
    assert_eq!(secret.secret_name.as_deref(), Some("mecak8s-tokens"));
    let file = token_file
        .strip_prefix(&format!("{}/", mount.mount_path))
        .unwrap();
    assert!(
        secret
            .items
            .as_ref()
            .is_some_and(|items| items.iter().any(|i| i.path == file && i.key == "tokens")),
        "the Secret's key `tokens` is not at {token_file}"
    );
    // The probes' paths are open routes of the server.
    for probe in [&container.readiness_probe, &container.liveness_probe] {
        let probed = path(probe).unwrap();
        let route = mecated::http::route_table()
            .into_iter()
            .find(|r| r.path == probed && r.method == "GET")
            .expect("the probe's path is a route");
        assert_eq!(route.access, mecated::http::Access::Open, "{probed}");
    }
    // Metrics on their own port, scraped without a token.
    let metrics: std::net::SocketAddr = value("MECATED_METRICS_LISTEN")
        .expect("metrics on their own listener")
        .parse()
        .unwrap();
    let ports = container.ports.clone().unwrap_or_default();
    assert!(
        ports.iter().any(|p| p.name.as_deref() == Some("metrics")
            && p.container_port == i32::from(metrics.port())),
        "{ports:?}"
    );

    // The disruption budget covers these pods.
    let selector = pdb
        .spec
        .expect("a spec")
        .selector
        .expect("a selector")
        .match_labels;
    assert_eq!(selector, spec.selector.match_labels);
}

#[test]
fn an_overlay_moves_everything_to_its_namespace_and_image() {
    let overlay = tempfile::tempdir().unwrap();
    // kustomize takes resources by relative path only.
    let base = relative(overlay.path(), &deploy_dir());
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             namespace: chat\nresources:\n  - {}\nimages:\n  - name: mecak8s\n    \
             newName: registry.example.com/mecak8s\n    newTag: \"1.2.3\"\n",
            base.display()
        ),
    )
    .unwrap();
    let docs = render(overlay.path());
    for d in docs.iter().filter(|d| d["kind"] != "Namespace") {
        assert_eq!(d["metadata"]["namespace"], "chat", "{}", d["kind"]);
    }
    let deployment: Deployment = one(&docs, "Deployment");
    let image = deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("registry.example.com/mecak8s:1.2.3"));
}

/// The path of `to` relative to the directory `from`.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in from.components().skip(common) {
        out.push("..");
    }
    out.extend(to.components().skip(common));
    out
}
