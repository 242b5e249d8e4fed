//! Serves: both — writes and compare-and-set for all; list, watch history, namespaces for kubectl.
//!
//! The Lease store: one revision counter for every write (as etcd's), atomic
//! compare-and-set on resourceVersion, and the event history watches replay.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::Time};
use tokio::sync::broadcast;

use crate::{
    selector::Selector,
    status::{ApiError, OPTIMISTIC_LOCK_MESSAGE},
    validation::{FieldError, validate_lease},
};

/// Events kept for watches that resume from an older resourceVersion;
/// older starting points get 410 Expired, as after an etcd compaction.
const HISTORY_LIMIT: usize = 10_000;
/// Events a slow watcher may fall behind before its watch is closed.
const BROADCAST_CAPACITY: usize = 4_096;
/// The alphabet the API server draws `generateName` suffixes from.
const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// What happened to an object, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) kind: EventKind,
    pub(crate) revision: u64,
    pub(crate) object: Lease,
    /// The object before a modification, so a selector-filtered watch can
    /// tell an object that stopped matching from one that changed.
    pub(crate) previous: Option<Lease>,
}

/// A namespace the emulator serves.
#[derive(Debug, Clone)]
pub(crate) struct NamespaceRecord {
    pub(crate) uid: String,
    pub(crate) created: Time,
    pub(crate) resource_version: u64,
}

/// How an update reached the store; the API server's rules differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpdateKind {
    /// PUT: creates when absent; resourceVersion required when present.
    Replace,
    /// PATCH: the object must exist; resourceVersion optional.
    Patch,
    /// Server-side apply: creates when absent; resourceVersion optional.
    Apply,
}

/// Preconditions a DELETE may carry.
#[derive(Debug, Clone, Default)]
pub(crate) struct Preconditions {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for every current object, then changes.
    WithCurrentState,
    /// Changes committed after this revision.
    After(u64),
}

/// A started watch: what to send first, the live feed, and the revision
/// the backlog reaches.
pub(crate) struct WatchStarted {
    pub(crate) backlog: Vec<Arc<Event>>,
    pub(crate) feed: broadcast::Receiver<Arc<Event>>,
    pub(crate) revision: u64,
}

struct Inner {
    revision: u64,
    leases: BTreeMap<(String, String), Lease>,
    history: VecDeque<Arc<Event>>,
    /// The newest revision dropped from `history`.
    compacted: u64,
    namespaces: BTreeMap<String, NamespaceRecord>,
}

/// The Lease objects, their event history and the revision counter at one
/// moment: what an etcd backup of the Leases holds.
#[derive(Debug, Clone)]
pub(crate) struct StoreSnapshot {
    pub(crate) revision: u64,
    leases: BTreeMap<(String, String), Lease>,
    history: VecDeque<Arc<Event>>,
    compacted: u64,
}

impl StoreSnapshot {
    pub(crate) fn lease_count(&self) -> usize {
        self.leases.len()
    }
}

/// The shared state behind every request.
pub(crate) struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
}

pub(crate) fn now_seconds() -> Time {
    // The API server stores creationTimestamp at whole seconds.
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_string(), name.to_string())
}

fn resource_version(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty())
}

/// The store's parse of a resourceVersion it is asked to compare.
fn parse_version(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version \"{text}\": resourceVersion must be a decimal integer"
        ))
    })
}

impl Store {
    pub(crate) fn new(namespaces: &[String]) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let mut inner = Inner {
            revision: 0,
            leases: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            namespaces: BTreeMap::new(),
        };
        for ns in namespaces {
            inner.revision += 1;
            let record = NamespaceRecord {
                uid: uuid::Uuid::new_v4().to_string(),
                created: now_seconds(),
                resource_version: inner.revision,
            };
            inner.namespaces.insert(ns.clone(), record);
        }
        Self {
            inner: Mutex::new(inner),
            events,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written entry
        // (every write is one insert or remove), so the data stays usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn add_namespace(&self, namespace: &str) {
        let mut inner = self.lock();
        if !inner.namespaces.contains_key(namespace) {
            inner.revision += 1;
            let record = NamespaceRecord {
                uid: uuid::Uuid::new_v4().to_string(),
                created: now_seconds(),
                resource_version: inner.revision,
            };
            inner.namespaces.insert(namespace.to_string(), record);
        }
    }

    pub(crate) fn namespace(&self, namespace: &str) -> Option<NamespaceRecord> {
        self.lock().namespaces.get(namespace).cloned()
    }

    pub(crate) fn namespaces(&self) -> (Vec<(String, NamespaceRecord)>, u64) {
        let inner = self.lock();
        let all = inner
            .namespaces
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (all, inner.revision)
    }

    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.lock().leases.get(&key(namespace, name)).cloned()
    }

    /// Every lease in `namespace` (all namespaces when `None`) that the
    /// selector matches, in key order, with the store's revision.
    pub(crate) fn list(&self, namespace: Option<&str>, selector: &Selector) -> (Vec<Lease>, u64) {
        let inner = self.lock();
        let items = inner
            .leases
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
            .map(|(_, lease)| lease)
            .filter(|lease| selector.matches(lease))
            .cloned()
            .collect();
        (items, inner.revision)
    }

    pub(crate) fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// The Leases, their history and the revision counter as they are now.
    pub(crate) fn snapshot(&self) -> StoreSnapshot {
        let inner = self.lock();
        StoreSnapshot {
            revision: inner.revision,
            leases: inner.leases.clone(),
            history: inner.history.clone(),
            compacted: inner.compacted,
        }
    }

    /// Puts the Leases, their history and the revision counter back to
    /// `snapshot`, in one step: the next write gets `snapshot.revision + 1`.
    /// Namespaces are not touched (they live in the main etcd).
    pub(crate) fn restore(&self, snapshot: &StoreSnapshot) {
        let mut inner = self.lock();
        inner.revision = snapshot.revision;
        inner.leases = snapshot.leases.clone();
        inner.history = snapshot.history.clone();
        inner.compacted = snapshot.compacted;
    }

    /// No Leases and no history; the next write gets revision 1.
    pub(crate) fn wipe(&self) {
        let mut inner = self.lock();
        inner.revision = 0;
        inner.leases.clear();
        inner.history.clear();
        inner.compacted = 0;
    }

    fn commit(&self, inner: &mut Inner, event: Event) {
        let event = Arc::new(event);
        inner.history.push_back(event.clone());
        while inner.history.len() > HISTORY_LIMIT {
            if let Some(dropped) = inner.history.pop_front() {
                inner.compacted = dropped.revision;
            }
        }
        // No receiver is not an error: nobody watches.
        let _ = self.events.send(event);
    }

    /// POST: store a new lease in `namespace`.
    pub(crate) fn create(
        &self,
        namespace: &str,
        lease: Lease,
        dry_run: bool,
    ) -> Result<Lease, ApiError> {
        let mut inner = self.lock();
        if resource_version(&lease).is_some() {
            return Err(ApiError::unknown_internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.create_locked(&mut inner, namespace, lease, dry_run)
    }

    fn create_locked(
        &self,
        inner: &mut Inner,
        namespace: &str,
        mut lease: Lease,
        dry_run: bool,
    ) -> Result<Lease, ApiError> {
        let meta = &mut lease.metadata;
        meta.namespace = Some(namespace.to_string());
        meta.deletion_timestamp = None;
        meta.deletion_grace_period_seconds = None;
        meta.managed_fields = None;
        meta.resource_version = None;
        meta.uid = Some(uuid::Uuid::new_v4().to_string());
        meta.creation_timestamp = Some(now_seconds());
        if meta.name.as_deref().is_none_or(str::is_empty)
            && let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty())
        {
            meta.name = Some(generated_name(prefix));
        }
        let name = meta.name.clone().unwrap_or_default();
        let errors = validate_lease(&lease);
        if !errors.is_empty() {
            return Err(ApiError::invalid("Lease", &name, &errors));
        }
        if !inner.namespaces.contains_key(namespace) {
            return Err(ApiError::namespace_not_found(namespace));
        }
        let k = key(namespace, &name);
        if inner.leases.contains_key(&k) {
            return Err(ApiError::already_exists(&name));
        }
        if dry_run {
            lease.metadata.resource_version = Some(inner.revision.to_string());
            return Ok(lease);
        }
        inner.revision += 1;
        let revision = inner.revision;
        lease.metadata.resource_version = Some(revision.to_string());
        inner.leases.insert(k, lease.clone());
        self.commit(
            inner,
            Event {
                kind: EventKind::Added,
                revision,
                object: lease.clone(),
                previous: None,
            },
        );
        Ok(lease)
    }

    /// PUT, PATCH and apply: `make` turns the current object (if any) into
    /// the desired one while the store is locked, so reading, checking the
    /// resourceVersion and writing are one atomic step. Returns the stored
    /// object and whether it was created.
    pub(crate) fn update(
        &self,
        namespace: &str,
        name: &str,
        kind: UpdateKind,
        dry_run: bool,
        make: impl FnOnce(Option<&Lease>) -> Result<Lease, ApiError>,
    ) -> Result<(Lease, bool), ApiError> {
        let mut inner = self.lock();
        let k = key(namespace, name);
        let existing = inner.leases.get(&k).cloned();
        if existing.is_none() && kind == UpdateKind::Patch {
            return Err(ApiError::lease_not_found(name));
        }
        let mut lease = make(existing.as_ref())?;
        check_identity(&mut lease, namespace, name)?;
        let Some(old) = existing else {
            // A uid in a PUT body is a precondition (the API server's
            // `Preconditions.UID`), checked against what is stored before
            // anything is created: an object that is gone has no uid, so the
            // update of a deleted object is a conflict, never a re-creation.
            if kind == UpdateKind::Replace
                && let Some(uid) = lease.metadata.uid.as_deref().filter(|u| !u.is_empty())
            {
                return Err(ApiError::conflict(
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    ),
                ));
            }
            let created = self.create_locked(&mut inner, namespace, lease, dry_run)?;
            return Ok((created, true));
        };

        let old_uid = old.metadata.uid.clone().unwrap_or_default();
        if let Some(uid) = lease.metadata.uid.as_deref().filter(|u| !u.is_empty())
            && uid != old_uid
        {
            return Err(ApiError::conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        let old_version = resource_version(&old).unwrap_or_default().to_string();
        match resource_version(&lease) {
            None if kind == UpdateKind::Replace => {
                // Leases do not allow unconditional updates.
                let error = FieldError::invalid(
                    "metadata.resourceVersion",
                    "0x0".to_string(),
                    "must be specified for an update",
                );
                return Err(ApiError::invalid("leases", name, &[error]));
            }
            None => {}
            Some(version) => {
                parse_version(version)?;
                if version != old_version {
                    return Err(ApiError::conflict(name, OPTIMISTIC_LOCK_MESSAGE));
                }
            }
        }

        // What an update may not change is taken from the stored object.
        let meta = &mut lease.metadata;
        meta.uid = Some(old_uid);
        meta.creation_timestamp = old.metadata.creation_timestamp.clone();
        meta.generation = old.metadata.generation;
        meta.managed_fields = None;
        if old.metadata.deletion_timestamp.is_some() {
            meta.deletion_timestamp = old.metadata.deletion_timestamp.clone();
            meta.deletion_grace_period_seconds = old.metadata.deletion_grace_period_seconds;
        } else {
            meta.deletion_timestamp = None;
            meta.deletion_grace_period_seconds = None;
        }
        meta.resource_version = Some(old_version);
        let errors = validate_lease(&lease);
        if !errors.is_empty() {
            return Err(ApiError::invalid("Lease", name, &errors));
        }

        let finalized = lease.metadata.deletion_timestamp.is_some()
            && lease.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
        if finalized {
            if !dry_run {
                self.remove_locked(&mut inner, &k, old);
            }
            return Ok((lease, false));
        }
        // Like etcd3's GuaranteedUpdate: an update that changes nothing is
        // not written, keeps its resourceVersion and makes no event.
        if lease == old || dry_run {
            return Ok((lease, false));
        }
        inner.revision += 1;
        let revision = inner.revision;
        lease.metadata.resource_version = Some(revision.to_string());
        inner.leases.insert(k, lease.clone());
        self.commit(
            &mut inner,
            Event {
                kind: EventKind::Modified,
                revision,
                object: lease.clone(),
                previous: Some(old),
            },
        );
        Ok((lease, false))
    }

    fn remove_locked(&self, inner: &mut Inner, k: &(String, String), old: Lease) {
        inner.leases.remove(k);
        inner.revision += 1;
        let revision = inner.revision;
        let mut gone = old.clone();
        gone.metadata.resource_version = Some(revision.to_string());
        self.commit(
            inner,
            Event {
                kind: EventKind::Deleted,
                revision,
                object: gone,
                previous: Some(old),
            },
        );
    }

    /// DELETE. Returns the object as it was last stored and whether it is
    /// gone (false: it has finalizers and is only marked for deletion).
    pub(crate) fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<(Lease, bool), ApiError> {
        let mut inner = self.lock();
        let k = key(namespace, name);
        let Some(old) = inner.leases.get(&k).cloned() else {
            return Err(ApiError::lease_not_found(name));
        };
        check_preconditions(&old, preconditions, name)?;
        let has_finalizers = old
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if old.metadata.deletion_timestamp.is_some() || dry_run {
                return Ok((old, false));
            }
            let mut marked = old.clone();
            marked.metadata.deletion_timestamp = Some(now_seconds());
            marked.metadata.deletion_grace_period_seconds = Some(0);
            inner.revision += 1;
            let revision = inner.revision;
            marked.metadata.resource_version = Some(revision.to_string());
            inner.leases.insert(k, marked.clone());
            self.commit(
                &mut inner,
                Event {
                    kind: EventKind::Modified,
                    revision,
                    object: marked.clone(),
                    previous: Some(old),
                },
            );
            return Ok((marked, false));
        }
        if !dry_run {
            self.remove_locked(&mut inner, &k, old.clone());
        }
        Ok((old, true))
    }

    /// DELETE on the collection: every matching lease, each as one delete.
    pub(crate) fn delete_collection(
        &self,
        namespace: &str,
        selector: &Selector,
        dry_run: bool,
    ) -> Vec<Lease> {
        let (victims, _) = self.list(Some(namespace), selector);
        victims
            .into_iter()
            .filter_map(|lease| {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.delete(namespace, &name, &Preconditions::default(), dry_run)
                    .ok()
                    .map(|(old, _)| old)
            })
            .collect()
    }

    /// Starts a watch: the events to send first and the live feed, taken
    /// under one lock so no change falls between them.
    pub(crate) fn watch(&self, start: WatchStart) -> Result<WatchStarted, ApiError> {
        let inner = self.lock();
        let receiver = self.events.subscribe();
        let backlog = match start {
            WatchStart::WithCurrentState => inner
                .leases
                .values()
                .map(|lease| {
                    let revision = resource_version(lease)
                        .and_then(|rv| rv.parse().ok())
                        .unwrap_or(0);
                    Arc::new(Event {
                        kind: EventKind::Added,
                        revision,
                        object: lease.clone(),
                        previous: None,
                    })
                })
                .collect(),
            WatchStart::After(revision) => {
                if revision < inner.compacted {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {revision} ({})",
                        inner.compacted + 1
                    )));
                }
                inner
                    .history
                    .iter()
                    .filter(|e| e.revision > revision)
                    .cloned()
                    .collect()
            }
        };
        Ok(WatchStarted {
            backlog,
            feed: receiver,
            revision: inner.revision,
        })
    }
}

/// `checkName` and the namespace rule of the update handler.
fn check_identity(lease: &mut Lease, namespace: &str, name: &str) -> Result<(), ApiError> {
    let body_name = lease.metadata.name.clone().unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    match lease.metadata.namespace.as_deref() {
        None | Some("") => lease.metadata.namespace = Some(namespace.to_string()),
        Some(ns) if ns == namespace => {}
        Some(ns) => {
            return Err(ApiError::bad_request(format!(
                "the namespace of the object ({ns}) does not match the namespace on the request ({namespace})"
            )));
        }
    }
    Ok(())
}

fn check_preconditions(
    old: &Lease,
    preconditions: &Preconditions,
    name: &str,
) -> Result<(), ApiError> {
    if let Some(uid) = &preconditions.uid {
        let actual = old.metadata.uid.as_deref().unwrap_or_default();
        if uid != actual {
            return Err(ApiError::conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                ),
            ));
        }
    }
    if let Some(version) = &preconditions.resource_version {
        let actual = resource_version(old).unwrap_or_default();
        if version != actual {
            return Err(ApiError::conflict(
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {version}, ResourceVersion in object meta: {actual}"
                ),
            ));
        }
    }
    Ok(())
}

fn generated_name(prefix: &str) -> String {
    let random = uuid::Uuid::new_v4();
    let suffix: String = random.as_bytes()[..5]
        .iter()
        .map(|b| NAME_SUFFIX_ALPHABET[usize::from(*b) % NAME_SUFFIX_ALPHABET.len()] as char)
        .collect();
    // The API server trims the prefix so the result fits 63 characters.
    let cut = prefix
        .char_indices()
        .nth(58)
        .map_or(prefix.len(), |(i, _)| i);
    format!("{}{suffix}", &prefix[..cut])
}
