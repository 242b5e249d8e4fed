//! Our view of a Lease object: who holds it, under which token, and the
//! edits our writes make (always to the object as read, so fields and
//! annotations we do not own survive).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use lease_port::{FencingToken, LeaseError, OwnerId, SessionId};

/// The original session id, checked on every read so that a foreign object,
/// or two ids meeting on one name, is never mistaken for ours.
pub(crate) const SESSION_ANNOTATION: &str = "mecatl.dev/session-id";
/// The fencing token of the current holder.
pub(crate) const TOKEN_ANNOTATION: &str = "mecatl.dev/fencing-token";
/// `app.kubernetes.io/managed-by`, so `kubectl get leases -l` finds ours.
pub(crate) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub(crate) const MANAGED_BY: &str = "mecatl-k8slease";
/// On a session object: the name of the owner lease its hold hangs on. A
/// label, so the holder proves in one list which sessions are still its own.
pub(crate) const OWNER_LEASE_LABEL: &str = "mecatl.dev/owner-lease";
/// `owner` on owner leases, so neither `kubectl` nor a reader mistakes one
/// for a session.
pub(crate) const ROLE_LABEL: &str = "mecatl.dev/role";
pub(crate) const OWNER_ROLE: &str = "owner";

/// The holder of `object`, if any. Empty and absent both mean free.
pub(crate) fn holder(object: &LeaseObject) -> Option<&str> {
    object
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// The resourceVersion as the integer every etcd-backed API server uses.
///
/// Tokens are derived from it (see the crate docs, "Fencing tokens"); a
/// server whose versions are not integers cannot give us tokens that
/// survive deletion, so it cannot be used at all.
pub(crate) fn resource_version(object: &LeaseObject) -> Result<u64, LeaseError> {
    let rv = object.metadata.resource_version.as_deref().unwrap_or("");
    rv.parse::<u64>().map_err(|_| {
        LeaseError::unsupported(format!(
            "the API server's resourceVersion {rv:?} is not an unsigned integer; \
             k8slease derives fencing tokens from it"
        ))
    })
}

/// What the object says about the token of its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoredToken {
    /// Written in the annotation by the write that made the holder.
    Known(FencingToken),
    /// No annotation. This crate writes the token in every write that
    /// makes a holder, so a holder without one was set by someone else —
    /// by hand, or by an older k8slease, whose create of an object with its
    /// holder granted that create's resourceVersion and stated it nowhere
    /// (provable only while the object is unchanged since, which no reader
    /// can tell). Its token is unknown; a takeover still exceeds it, since
    /// that create's version is at most the version a takeover is
    /// conditioned on.
    Unstated,
    /// An annotation we cannot read: someone else wrote it.
    Unreadable,
}

pub(crate) fn stored_token(object: &LeaseObject) -> StoredToken {
    match annotation(object, TOKEN_ANNOTATION) {
        None => StoredToken::Unstated,
        Some(text) => text
            .parse::<u64>()
            .map(|t| StoredToken::Known(FencingToken::new(t)))
            .unwrap_or(StoredToken::Unreadable),
    }
}

/// True when `object`, whose token is `stored`, is held by `owner` under
/// `token`.
pub(crate) fn held_by(
    object: &LeaseObject,
    stored: StoredToken,
    owner: &OwnerId,
    token: FencingToken,
) -> bool {
    if holder(object) != Some(owner.as_str()) {
        return false;
    }
    match stored {
        StoredToken::Known(t) => t == token,
        // Nobody can prove which token such a holder has, so no lease
        // value renews or releases it; it lapses, or a takeover replaces it.
        StoredToken::Unstated | StoredToken::Unreadable => false,
    }
}

/// The duration the record itself grants, falling back to `ours` when the
/// field is missing or nonsensical (someone else wrote the object).
pub(crate) fn duration(object: &LeaseObject, ours: Duration) -> Duration {
    object
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(ours, Duration::from_secs)
}

/// When the holder last wrote, on the holder's clock.
pub(crate) fn renewed_at(object: &LeaseObject) -> Option<SystemTime> {
    let spec = object.spec.as_ref()?;
    spec.renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| SystemTime::from(t.0))
}

/// The owner lease a session object's hold hangs on; `None` for an object
/// whose holder renews the object itself (written by an older k8slease).
pub(crate) fn owner_lease_of(object: &LeaseObject) -> Option<&str> {
    label(object, OWNER_LEASE_LABEL).filter(|l| !l.is_empty())
}

/// True for an owner lease this crate created.
pub(crate) fn is_owner_lease(object: &LeaseObject) -> bool {
    label(object, ROLE_LABEL) == Some(OWNER_ROLE)
}

fn label<'a>(object: &'a LeaseObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The session id the object says it belongs to.
pub(crate) fn session_of(object: &LeaseObject) -> Option<&str> {
    annotation(object, SESSION_ANNOTATION)
}

fn annotation<'a>(object: &'a LeaseObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn micro_time(at: SystemTime) -> Result<MicroTime, LeaseError> {
    jiff::Timestamp::try_from(at).map(MicroTime).map_err(|e| {
        LeaseError::invalid(format!(
            "the wall clock reads {at:?}, which Kubernetes cannot store"
        ))
        .with_source(e)
    })
}

fn ttl_seconds(ttl: Duration) -> i32 {
    // The builder accepts only whole seconds that fit.
    i32::try_from(ttl.as_secs()).unwrap_or(i32::MAX)
}

/// A new object for `session`, held by nobody. The first holder takes it
/// with an update, which writes its token with it like every takeover: a
/// create cannot state the token it grants (its own resourceVersion is
/// known only from its reply), so no holder is ever created.
pub(crate) fn new_free(name: &str, session: &SessionId) -> LeaseObject {
    LeaseObject {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                SESSION_ANNOTATION.to_owned(),
                session.as_str().to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    }
}

fn set_token(object: &mut LeaseObject, token: FencingToken) {
    object
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TOKEN_ANNOTATION.to_owned(), token.get().to_string());
}

/// `object` taken by `owner` under `token`: holder and token change in this
/// one write, and `leaseTransitions` counts the change of holder so standard
/// tooling shows it.
pub(crate) fn taken_over(
    object: &LeaseObject,
    owner: &OwnerId,
    token: FencingToken,
    owner_lease: &str,
    ttl: Duration,
    now: SystemTime,
) -> Result<LeaseObject, LeaseError> {
    let at = micro_time(now)?;
    let mut next = object.clone();
    next.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(OWNER_LEASE_LABEL.to_owned(), owner_lease.to_owned());
    let changes_hands = holder(object) != Some(owner.as_str());
    let spec = next.spec.get_or_insert_with(LeaseSpec::default);
    match spec.lease_transitions {
        // The first holder of an object that never had one.
        None if holder(object).is_none() => spec.lease_transitions = Some(0),
        transitions if changes_hands => {
            let transitions = transitions.unwrap_or(0).max(0);
            spec.lease_transitions = Some(transitions.saturating_add(1));
        }
        _ => {}
    }
    spec.holder_identity = Some(owner.as_str().to_owned());
    spec.lease_duration_seconds = Some(ttl_seconds(ttl));
    spec.acquire_time = Some(at.clone());
    spec.renew_time = Some(at);
    set_token(&mut next, token);
    Ok(next)
}

/// `object`, still held under `token`, renewed at `now`. The token is
/// written too: an object whose holder had none stated gets it here.
pub(crate) fn renewed(
    object: &LeaseObject,
    token: FencingToken,
    ttl: Duration,
    now: SystemTime,
) -> Result<LeaseObject, LeaseError> {
    let at = micro_time(now)?;
    let mut next = object.clone();
    let spec = next.spec.get_or_insert_with(LeaseSpec::default);
    spec.lease_duration_seconds = Some(ttl_seconds(ttl));
    spec.renew_time = Some(at);
    set_token(&mut next, token);
    Ok(next)
}

/// `object` with no holder. The token annotation stays as a record of the
/// last grant; the next takeover replaces it.
pub(crate) fn released(object: &LeaseObject) -> LeaseObject {
    let mut next = object.clone();
    if let Some(spec) = next.spec.as_mut() {
        spec.holder_identity = None;
    }
    if let Some(labels) = next.metadata.labels.as_mut() {
        labels.remove(OWNER_LEASE_LABEL);
    }
    next
}

/// A new owner lease `name`, held by `owner` from `now`: the one object a
/// process renews for every session it holds as `owner`.
pub(crate) fn new_owner_lease(
    name: &str,
    owner: &OwnerId,
    ttl: Duration,
    now: SystemTime,
) -> Result<LeaseObject, LeaseError> {
    let at = micro_time(now)?;
    Ok(LeaseObject {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                (ROLE_LABEL.to_owned(), OWNER_ROLE.to_owned()),
                // Its own name, so that a watch of the sessions on it
                // delivers its renewals too (see `sessions_watch`).
                (OWNER_LEASE_LABEL.to_owned(), name.to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                "mecatl.dev/purpose".to_owned(),
                "The owner lease of one k8slease client: every session Lease labelled \
                 mecatl.dev/owner-lease with this name is live while this one is renewed."
                    .to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(owner.as_str().to_owned()),
            lease_duration_seconds: Some(ttl_seconds(ttl)),
            acquire_time: Some(at.clone()),
            renew_time: Some(at),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    })
}

/// An owner lease renewed at `now`.
pub(crate) fn owner_renewed(
    object: &LeaseObject,
    ttl: Duration,
    now: SystemTime,
) -> Result<LeaseObject, LeaseError> {
    let at = micro_time(now)?;
    let mut next = object.clone();
    // Back if someone removed it: the watch of its sessions counts on
    // seeing each renewal.
    if let Some(name) = next.metadata.name.clone() {
        next.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(OWNER_LEASE_LABEL.to_owned(), name);
    }
    let spec = next.spec.get_or_insert_with(LeaseSpec::default);
    spec.lease_duration_seconds = Some(ttl_seconds(ttl));
    spec.renew_time = Some(at);
    Ok(next)
}
