//! k8slease: docs to come.

mod backend;
mod error;
mod expiry;
mod name;
mod observe;
mod record;

pub use backend::{Builder, DEFAULT_TTL, K8sLease, client_from_kubeconfig};
pub use expiry::ExpiryJudgement;
pub use name::object_name;
