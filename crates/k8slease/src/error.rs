//! What the API server's answers mean for the lease contract.

use std::time::Duration;

use lease_port::LeaseError;

/// The API verb a request used, named in errors so an operator knows which
/// permission to grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    List,
    Create,
    Update,
}

impl Verb {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::Update => "update",
        }
    }
}

/// A failed request, sorted by what the caller does next.
#[derive(Debug)]
pub(crate) enum Failure {
    /// 404: the object (or, for a create, its namespace) does not exist.
    NotFound(kube::Error),
    /// 409 `Conflict`: the resourceVersion precondition failed.
    Conflict,
    /// 409 `AlreadyExists`: a create lost to another.
    AlreadyExists,
    /// No answer within the request timeout: a write may have committed.
    TimedOut,
    /// Anything else, already in the contract's terms.
    Lease(LeaseError),
}

/// Where a request went, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) verb: Verb,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
}

impl Target<'_> {
    fn describe(&self) -> String {
        format!(
            "{} leases.coordination.k8s.io {:?} in namespace {:?}",
            self.verb.as_str(),
            self.name,
            self.namespace
        )
    }

    /// Sorts `err`, the outcome of this request.
    pub(crate) fn classify(&self, err: kube::Error) -> Failure {
        let status = match &err {
            kube::Error::Api(status) => status,
            _ => {
                return Failure::Lease(
                    LeaseError::transient(format!("{} failed", self.describe())).with_source(err),
                );
            }
        };
        match (status.code, status.reason.as_str()) {
            (404, _) => Failure::NotFound(err),
            (409, "AlreadyExists") => Failure::AlreadyExists,
            (409, _) => Failure::Conflict,
            (403, _) => Failure::Lease(self.forbidden(err)),
            // A bad object or a refused field: retrying the same write
            // cannot help.
            (400 | 422, _) => Failure::Lease(
                LeaseError::invalid(format!("the API server refused {}", self.describe()))
                    .with_source(err),
            ),
            // 401 (credentials being rotated), 429 (throttled), 5xx and
            // anything unexpected may pass.
            _ => Failure::Lease(
                LeaseError::transient(format!("{} failed", self.describe())).with_source(err),
            ),
        }
    }

    /// A missing RBAC permission: the service account may never do this
    /// until an operator grants it, so retrying is pointless. Not
    /// `Unsupported`, which would make a server stop leasing altogether.
    fn forbidden(&self, err: kube::Error) -> LeaseError {
        LeaseError::invalid(format!(
            "forbidden: {} was refused by RBAC; grant the verbs get, list, create and update on \
             leases.coordination.k8s.io in this namespace",
            self.describe()
        ))
        .with_source(err)
    }

    /// The request's own timeout elapsed.
    pub(crate) fn timed_out(&self, after: Duration) -> LeaseError {
        LeaseError::transient(format!(
            "{} got no answer within {after:?}",
            self.describe()
        ))
    }
}

/// The API server answered from Lease storage older than what this client
/// has already seen: `what` says how it showed.
pub(crate) fn rewound(namespace: &str, name: &str, what: &str) -> LeaseError {
    LeaseError::rewound(format!(
        "the API server's Lease storage went back: {what} (Lease {name:?} in namespace \
         {namespace:?}). The etcd holding Leases (the cluster's, or one given to Leases alone \
         with --etcd-servers-overrides=coordination.k8s.io/leases#...) was wiped, restored from \
         a backup or failed over to a member missing acknowledged writes, so fencing tokens drawn \
         from its versions could repeat tokens already issued. Restore that etcd's newest state; \
         or, to go on from the older state, make sure no session store accepted tokens above its \
         versions, or have the servers acquire above their stores' marks (acquire_above), and \
         restart the lease clients"
    ))
}

/// The object exists but was not written by this crate for this session.
pub(crate) fn foreign_object(namespace: &str, name: &str, why: &str) -> LeaseError {
    LeaseError::invalid(format!(
        "Lease {name:?} in namespace {namespace:?} is not a k8slease session object ({why}); \
         it is left untouched"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_port::LeaseErrorKind;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("server says no", reason)
                .with_code(code)
                .boxed(),
        )
    }

    fn target(verb: Verb) -> Target<'static> {
        Target {
            verb,
            namespace: "team-a",
            name: "mecatl-s-x",
        }
    }

    #[test]
    fn conflicts_are_told_apart() {
        let t = target(Verb::Create);
        assert!(matches!(
            t.classify(api(409, "AlreadyExists")),
            Failure::AlreadyExists
        ));
        assert!(matches!(
            t.classify(api(409, "Conflict")),
            Failure::Conflict
        ));
        assert!(matches!(
            t.classify(api(404, "NotFound")),
            Failure::NotFound(_)
        ));
    }

    #[test]
    fn forbidden_names_verb_and_resource_and_is_not_retryable() {
        let Failure::Lease(e) = target(Verb::Update).classify(api(403, "Forbidden")) else {
            panic!("403 must become a lease error");
        };
        assert_eq!(e.kind(), LeaseErrorKind::Invalid);
        let text = e.to_string();
        assert!(text.contains("update leases.coordination.k8s.io"), "{text}");
        assert!(text.contains("team-a"), "{text}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn rewound_says_what_went_back_and_what_to_do() {
        let e = rewound("team-a", "mecatl-s-x", "a read showed version 3 after 9");
        assert_eq!(e.kind(), LeaseErrorKind::Rewound);
        assert!(!e.is_retryable());
        let text = e.to_string();
        for needle in [
            "Lease storage went back",
            "version 3 after 9",
            "--etcd-servers-overrides=coordination.k8s.io/leases",
            "tokens",
            "Restore that etcd",
            "restart the lease clients",
            "team-a",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from: {text}");
        }
    }

    #[test]
    fn server_faults_are_transient_with_source() {
        for code in [500, 503, 504, 429, 401] {
            let Failure::Lease(e) = target(Verb::Get).classify(api(code, "")) else {
                panic!("{code} must become a lease error");
            };
            assert_eq!(e.kind(), LeaseErrorKind::Transient, "{code}");
            assert!(std::error::Error::source(&e).is_some());
        }
    }
}
