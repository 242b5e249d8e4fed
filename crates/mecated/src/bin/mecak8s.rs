//! `mecak8s`: the session server configured for a Kubernetes deployment —
//! sessions in Redis, leases as Lease objects in the pod's namespace.
//!
//! It is `mecated` with these flags filled in from the pod's environment
//! (the downward API and the deployment's env), unless given explicitly:
//!
//! | flag | from |
//! |---|---|
//! | `--session-lease-k8s-namespace` | `POD_NAMESPACE` |
//! | `--owner` | `POD_NAME` (each container start adds its own suffix) |
//! | `--store-redis` | `REDIS_URL` |
//! | `--listen` | `0.0.0.0:8080` |
//!
//! Every other `mecated` flag (and its `MECATED_*` variable) works as is;
//! `mecak8s --help` lists them. Listening beyond loopback, it needs
//! `--token-file` (`MECATED_TOKEN_FILE`; the manifests mount it from a
//! Secret) or refuses to start.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use mecated::config::Cli;

/// `(flag, environment variable, default)`: a flag not on the command line
/// is filled from the variable, else the default.
const FROM_ENVIRONMENT: &[(&str, &str, Option<&str>)] = &[
    ("--session-lease-k8s-namespace", "POD_NAMESPACE", None),
    ("--owner", "POD_NAME", None),
    ("--store-redis", "REDIS_URL", None),
    ("--listen", "MECATED_LISTEN", Some("0.0.0.0:8080")),
];

fn main() -> ExitCode {
    let given: Vec<OsString> = std::env::args_os().collect();
    let mut args = given.clone();
    let asks_for_help = given
        .iter()
        .any(|a| matches!(a.to_str(), Some("-h" | "--help" | "-V" | "--version")));
    for (flag, var, default) in FROM_ENVIRONMENT {
        if asks_for_help {
            break;
        }
        let present = given.iter().any(|a| {
            a.to_str()
                .is_some_and(|a| a == *flag || a.starts_with(&format!("{flag}=")))
        });
        if present {
            continue;
        }
        let value = std::env::var_os(var).or_else(|| default.map(OsString::from));
        match value {
            Some(v) => {
                args.push(OsString::from(flag));
                args.push(v);
            }
            None => {
                eprintln!("mecak8s: set {var} (the deployment's env) or pass {flag}");
                return ExitCode::from(2);
            }
        }
    }
    mecated::cli::main_with(Cli::parse_from(args))
}
