//! Serves: both — kube-rs (k8slease) and kubectl read the files written here.
//!
//! Kubeconfig files that point kubectl and kube-rs at the emulator.

use std::{fs, io, path::Path};

/// Names the cluster and context entries of every kubeconfig written.
pub(crate) const CONTEXT: &str = "k8s-emulator";

/// A YAML double-quoted scalar (JSON string syntax is valid YAML there).
fn scalar(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// The text of a kubeconfig for `user` holding `token`.
pub(crate) fn render(
    server: &str,
    ca_pem: Option<&str>,
    user: &str,
    token: &str,
    namespace: &str,
) -> String {
    let authority = ca_pem.map_or_else(String::new, |pem| {
        format!(
            "    certificate-authority-data: {}\n",
            crate::tls::base64(pem.as_bytes())
        )
    });
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {context}\n  cluster:\n    server: {server}\n{authority}\
         users:\n\
         - name: {user}\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: {context}\n  context:\n    cluster: {context}\n    user: {user}\n    namespace: {namespace}\n\
         current-context: {context}\n\
         preferences: {{}}\n",
        context = scalar(CONTEXT),
        server = scalar(server),
        user = scalar(user),
        token = scalar(token),
        namespace = scalar(namespace),
    )
}

/// Writes the kubeconfig readable by its owner only: it holds a token.
pub(crate) fn write(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let partial = path.with_extension("partial");
    fs::write(&partial, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o600))?;
    }
    // A reader never sees half a file.
    fs::rename(&partial, path)
}
