//! Serves: both — tokens for every client; grants for k8slease's and kubectl's forbidden tests.
//!
//! Who a request is (bearer token → user) and what that user may do.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
};

use crate::verb::Verb;

/// The user of requests that carry no token, as the API server names it.
pub const ANONYMOUS: &str = "system:anonymous";

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Identity {
    User(String),
    /// A token that names nobody: 401.
    Unknown,
}

/// Bearer tokens and an allow-list per user of (verb, resource).
///
/// The administrator named in the configuration may do everything, like a
/// member of `system:masters`. Every other user, and requests without a
/// token ([`ANONYMOUS`]), may do only what [`Rbac::allow`] granted; anything
/// else is 403 Forbidden with the authorizer's message. A token nobody
/// holds is 401. Clones share the rules; changes apply to the next request.
#[derive(Debug, Clone)]
pub struct Rbac {
    inner: Arc<Mutex<Rules>>,
}

#[derive(Debug)]
struct Rules {
    admin: String,
    tokens: HashMap<String, String>,
    grants: HashMap<String, BTreeSet<(Verb, String)>>,
}

impl Rbac {
    pub(crate) fn new(admin: &str, admin_token: &str) -> Self {
        let mut tokens = HashMap::new();
        tokens.insert(admin_token.to_string(), admin.to_string());
        Self {
            inner: Arc::new(Mutex::new(Rules {
                admin: admin.to_string(),
                tokens,
                grants: HashMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Rules> {
        // Every change is a single insert or remove: a panic elsewhere
        // cannot leave the rules half-changed.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `user` a fresh bearer token (users may hold several) and
    /// returns it. The user starts with no permissions.
    pub fn add_user(&self, user: &str) -> String {
        let token = format!("emu-{}", uuid::Uuid::new_v4().simple());
        self.lock().tokens.insert(token.clone(), user.to_string());
        token
    }

    /// The user a bearer token authenticates as, if any.
    pub fn user_of(&self, token: &str) -> Option<String> {
        self.lock().tokens.get(token).cloned()
    }

    /// The administrator, who is never refused.
    pub fn admin(&self) -> String {
        self.lock().admin.clone()
    }

    /// Lets `user` use `verbs` on `resource` (for example `"leases"`) in
    /// every namespace.
    pub fn allow(&self, user: &str, verbs: &[Verb], resource: &str) {
        let mut rules = self.lock();
        let granted = rules.grants.entry(user.to_string()).or_default();
        for verb in verbs {
            granted.insert((*verb, resource.to_string()));
        }
    }

    /// Takes `verbs` on `resource` away from `user`.
    pub fn revoke(&self, user: &str, verbs: &[Verb], resource: &str) {
        let mut rules = self.lock();
        if let Some(granted) = rules.grants.get_mut(user) {
            for verb in verbs {
                granted.remove(&(*verb, resource.to_string()));
            }
        }
    }

    /// Whether `user` may use `verb` on `resource`.
    pub fn permits(&self, user: &str, verb: Verb, resource: &str) -> bool {
        let rules = self.lock();
        user == rules.admin
            || rules
                .grants
                .get(user)
                .is_some_and(|g| g.contains(&(verb, resource.to_string())))
    }

    pub(crate) fn identify(&self, authorization: Option<&str>) -> Identity {
        let Some(header) = authorization else {
            return Identity::User(ANONYMOUS.to_string());
        };
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim);
        match token.and_then(|t| self.user_of(t)) {
            Some(user) => Identity::User(user),
            None => Identity::Unknown,
        }
    }
}
