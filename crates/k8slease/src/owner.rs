//! Owner leases: the one Lease object a client renews for every session it
//! holds as one owner, so that holding many sessions costs one write per
//! renewal period rather than one per session.
//!
//! A session's object names, in its `mecatl.dev/owner-lease` label, the
//! owner lease its hold hangs on; the hold is live while that owner lease
//! is (held by the session's holder and not expired by the reader's
//! [`ExpiryJudgement`](crate::ExpiryJudgement)). Each client makes its own
//! owner lease per owner id, under a name no other client uses: a restarted
//! process never renews the owner lease of its previous incarnation, so it
//! never brings that incarnation's sessions back to life.
//!
//! Whoever takes over a session because its owner lease expired first
//! revokes that owner lease (clears its holder, conditional on the version
//! judged expired). The holder's renewal is conditional on the version it
//! last wrote, so after a revocation it fails and every session on it is
//! lost; before one, the taker's revocation fails and it must look again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::api::ListParams;
use lease_port::{FencingToken, Lease, LeaseError, OwnerId, SessionId};
use sha2::{Digest, Sha256};

use crate::backend::{K8sLease, Written};
use crate::error::{Failure, Verb, rewound};
use crate::observe::Observed;
use crate::record;
use crate::sessions_watch::{Held, SessionsWatch, held_entry};

/// Names of owner leases: the prefix differs from every session prefix and
/// from the authority object's name before the ninth character.
pub(crate) const OWNER_PREFIX: &str = "mecatl-o-";

/// How many sessions written since the previous renewal a proof by the
/// watch reads again one by one; more, and one list costs less.
const READS_BEFORE_A_LIST: usize = 32;

/// How many times one owner-lease renewal re-reads after a lost race or
/// reply before it gives up as `Transient`.
const OWNER_ROUNDS: usize = 6;

/// What this client knows of its owner lease for one owner id.
#[derive(Debug)]
struct OwnerLease {
    name: String,
    /// The object as our last write left it: a renewal is conditional on
    /// this version, never on a later sighting (which may be a revocation).
    object: LeaseObject,
    /// The write sequence number (see [`Owners::writes`]) of the write that
    /// made `object`.
    seq: u64,
    /// When the write that made `object` was sent.
    sent_wall: SystemTime,
    sent_mono: Instant,
    /// Sessions on this owner lease proven ours, with their tokens and when
    /// the proof was taken: by the list after the latest renewal, or by our
    /// own acquire since.
    held: HashMap<String, (FencingToken, Instant)>,
    /// The version the latest renewal was conditional on: everything
    /// written up to it is still stored, or the renewal would have failed.
    renewed_from: u64,
    /// True once the sessions were proven after the latest renewal.
    listed: bool,
    /// Shows the sessions on it without a list each renewal period, once
    /// it holds [`Builder::watch_from`](crate::Builder::watch_from) of them.
    watch: Option<SessionsWatch>,
}

impl OwnerLease {
    fn fresh(&self, ttl: Duration) -> Fresh {
        Fresh {
            name: self.name.clone(),
            expiry: self.sent_wall + ttl,
        }
    }
}

/// This client's owner leases, by owner id. One lock: owner-lease writes
/// are rare (one per owner per renewal period), and serialising them keeps
/// two tasks from making two owner leases for one owner.
#[derive(Debug, Default)]
pub(crate) struct Owners {
    by_owner: tokio::sync::Mutex<HashMap<String, OwnerLease>>,
    /// Tells apart the owner-lease names this client makes.
    made: AtomicU64,
    /// Counts owner-lease writes as they are sent: a write numbered above
    /// what an operation read when it began was sent after it began.
    writes: AtomicU64,
    /// Taken by the one owner lease whose sessions are watched: each watch
    /// holds a connection for as long as it runs.
    watch_slot: Arc<AtomicBool>,
}

/// An owner lease renewed recently enough to hang a session on.
#[derive(Debug, Clone)]
pub(crate) struct Fresh {
    pub(crate) name: String,
    /// When every hold on it lapses unless it is renewed: the send time of
    /// its latest renewal plus the TTL.
    pub(crate) expiry: SystemTime,
}

/// What a renewal of the owner lease proved for a batch, lease by lease
/// in the order asked: only the batch's own leases are looked up, so a
/// batch costs what it carries, not what the owner holds.
pub(crate) enum Proof {
    /// Renewed: whether each lease asked about is still on it under its
    /// token, and the expiry those now have.
    Held {
        proven: Vec<bool>,
        expiry: SystemTime,
    },
    /// Revoked, deleted, or never made by this client: whether each lease
    /// asked about was hung on it under its token, and is lost with it.
    Lost(Vec<bool>),
}

/// How a session's owner lease stands, as this client judges it now.
pub(crate) enum Liveness {
    /// Gone, revoked, held by someone other than the session's holder, or
    /// not an owner lease at all: the session's hold is void.
    Void,
    /// Live for this long yet.
    Live(Duration),
    /// Held by the session's holder, but not renewed for its duration:
    /// revoke it (conditional on this version) before taking the session.
    Expired(Box<Observed>),
}

/// Whether each of `asked` is `owner`'s and on `held` under its token.
fn on_it(
    held: &HashMap<String, (FencingToken, Instant)>,
    owner: &OwnerId,
    asked: &[Lease],
) -> Vec<bool> {
    asked
        .iter()
        .map(|lease| {
            lease.owner() == owner
                && held
                    .get(lease.session_id().as_str())
                    .is_some_and(|(token, _)| *token == lease.token())
        })
        .collect()
}

/// How long an owner lease holds without renewal, for grants of `ttl`: a
/// third longer, in whole seconds (none for a TTL under three seconds).
///
/// A batch renewal answered from the owner lease's last renewal, sent up
/// to the difference earlier, must still give its leases a whole TTL from
/// when the call was sent (what [`granted_ttl`](lease_port::SessionLease::granted_ttl)
/// promises, and what the lease keeper counts on): the difference is how
/// long one renewal serves every batch, so a process sends one renewal per
/// third of a TTL, and a crashed holder's sessions are taken over once its
/// owner lease has been seen unchanged for this longer hold.
pub(crate) fn owner_hold(ttl: Duration) -> Duration {
    ttl + Duration::from_secs(ttl.as_secs() / 3)
}

/// The name of a new owner lease for `owner`: a hash of the owner id, for
/// telling owners apart at a glance, and a part unique to this client.
fn owner_lease_name(owner: &OwnerId, unique: u64) -> String {
    let digest = Sha256::digest(owner.as_str().as_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("{OWNER_PREFIX}{hex}-{unique:012x}")
}

impl Owners {
    /// The number of owner-lease writes sent so far; see
    /// [`K8sLease::owner_lease`].
    pub(crate) fn sequence(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    fn next_write(&self) -> u64 {
        self.writes.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The name of this client's owner lease for `owner`, if it has one.
    pub(crate) async fn current(&self, owner: &OwnerId) -> Option<String> {
        self.by_owner
            .lock()
            .await
            .get(owner.as_str())
            .map(|s| s.name.clone())
    }
}

impl K8sLease {
    /// This client's owner lease for `owner`, proven unrevoked by a write
    /// sent after the caller began (when it read [`Owners::sequence`] as
    /// `began`): the last renewal, if it was, else a new one. Made anew
    /// when it was lost (or never made).
    ///
    /// Never a remembered renewal from before: the owner lease may have
    /// been revoked or deleted since, and a session hung on it would be
    /// free for anyone from the start. Concurrent callers share one write.
    pub(crate) async fn owner_lease(
        &self,
        owner: &OwnerId,
        began: u64,
    ) -> Result<Fresh, LeaseError> {
        // Whoever asks (an acquire too), this renews every session on the
        // owner lease: its requests go first.
        crate::backend::RENEWING
            .scope((), self.fresh_owner_lease(owner, began))
            .await
    }

    async fn fresh_owner_lease(&self, owner: &OwnerId, began: u64) -> Result<Fresh, LeaseError> {
        let inner = &self.inner;
        let mut owners = inner.owners.by_owner.lock().await;
        if let Some(state) = owners.get_mut(owner.as_str()) {
            if state.seq > began {
                return Ok(state.fresh(inner.ttl));
            }
            if self.renew_owner_lease(owner, state).await? {
                return Ok(state.fresh(inner.ttl));
            }
            owners.remove(owner.as_str());
        }
        let state = self.make_owner_lease(owner).await?;
        let fresh = state.fresh(inner.ttl);
        owners.insert(owner.as_str().to_owned(), state);
        Ok(fresh)
    }

    /// Creates an owner lease for `owner` under a name nobody uses yet.
    async fn make_owner_lease(&self, owner: &OwnerId) -> Result<OwnerLease, LeaseError> {
        let inner = &self.inner;
        let mut unknown = false;
        for _ in 0..OWNER_ROUNDS {
            let unique = self.unique_part();
            let name = owner_lease_name(owner, unique);
            let seq = inner.owners.next_write();
            let (sent_wall, sent_mono) = (inner.clock.now(), inner.clock.instant());
            let object = record::new_owner_lease(&name, owner, owner_hold(inner.ttl), sent_wall)?;
            match self.write(Verb::Create, &name, &object).await? {
                Written::Done(made) | Written::Recreated(made) => {
                    return Ok(OwnerLease {
                        name,
                        object: made.object,
                        seq,
                        sent_wall,
                        sent_mono,
                        held: HashMap::new(),
                        renewed_from: 0,
                        listed: true,
                        watch: None,
                    });
                }
                // Someone has that name: take another.
                Written::Lost => {}
                // It may have been made: it then holds no session and
                // lapses. Another name once; a second fault is the answer.
                Written::Unknown(cause) if unknown => return Err(cause),
                Written::Unknown(_) => unknown = true,
                Written::Gone(e) => {
                    return Err(LeaseError::invalid(format!(
                        "cannot create Leases in namespace {:?}: it does not exist",
                        inner.namespace
                    ))
                    .with_source(e));
                }
            }
        }
        Err(self.out_of_rounds(OWNER_PREFIX, None))
    }

    /// A part of an owner-lease name that no other client picks: the
    /// clock, the process and a count, hashed. A clash is still harmless
    /// (the create answers `AlreadyExists` and another is tried).
    fn unique_part(&self) -> u64 {
        let count = self.inner.owners.made.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let here = std::ptr::from_ref(&*self.inner) as usize;
        let seed = format!("{nanos}/{}/{here}/{count}", std::process::id());
        let digest = Sha256::digest(seed.as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(bytes) & 0xffff_ffff_ffff
    }

    /// Renews `state`'s owner lease: true when it is still ours, false when
    /// it was revoked or deleted (every session on it is lost).
    async fn renew_owner_lease(
        &self,
        owner: &OwnerId,
        state: &mut OwnerLease,
    ) -> Result<bool, LeaseError> {
        let inner = &self.inner;
        let name = state.name.clone();
        let mut base = state.object.clone();
        let mut last_fault = None;
        let mut faults = 0;
        for _ in 0..OWNER_ROUNDS {
            let seq = inner.owners.next_write();
            let (sent_wall, sent_mono) = (inner.clock.now(), inner.clock.instant());
            let next = record::owner_renewed(&base, owner_hold(inner.ttl), sent_wall)?;
            match self.write(Verb::Update, &name, &next).await? {
                Written::Done(renewed) => {
                    state.renewed_from = record::resource_version(&base)?;
                    (state.object, state.seq, state.sent_wall, state.sent_mono) =
                        (renewed.object, seq, sent_wall, sent_mono);
                    state.listed = false;
                    return Ok(true);
                }
                Written::Recreated(made) => {
                    // Deleted under us: the sessions on it were free for the
                    // taking. Give back the hold our write made anew.
                    let _ = self
                        .write(Verb::Update, &name, &record::released(&made.object))
                        .await;
                    return Ok(false);
                }
                Written::Gone(_) => return Ok(false),
                Written::Lost => {}
                Written::Unknown(cause) => {
                    self.unknown_write(&name, &mut faults, &mut last_fault, cause)?;
                }
            }
            // Changed since our last write: still ours only if nobody
            // revoked it (someone may have edited a label), and then the
            // renewal is made again on what is stored now.
            match self.read(&name).await? {
                Some(now) if record::holder(&now.object) == Some(owner.as_str()) => {
                    base = now.object;
                }
                _ => return Ok(false),
            }
        }
        Err(self.out_of_rounds(&name, last_fault))
    }

    /// Renews `owner`'s owner lease if it is due (its last renewal was
    /// sent as long ago as its hold exceeds the TTL, see [`owner_hold`]),
    /// then, if its sessions were not proven since that renewal, lists
    /// them, or has its watch show them (see `sessions_watch`): at most two
    /// requests per renewal period, one while the watch runs, however many
    /// sessions and batches. `None` when this client has no owner lease for
    /// `owner`.
    /// Answers for each of `asked`; a lease of another owner is neither
    /// proven nor lost.
    pub(crate) async fn prove(
        &self,
        owner: &OwnerId,
        asked: &[Lease],
    ) -> Result<Option<Proof>, LeaseError> {
        let inner = &self.inner;
        let mut owners = inner.owners.by_owner.lock().await;
        let Some(state) = owners.get_mut(owner.as_str()) else {
            return Ok(None);
        };
        let reuse = owner_hold(inner.ttl) - inner.ttl;
        let elapsed = inner
            .clock
            .instant()
            .saturating_duration_since(state.sent_mono);
        let elapsed = if elapsed < reuse {
            elapsed
        } else if self.renew_owner_lease(owner, state).await? {
            Duration::ZERO
        } else {
            let lost = on_it(&state.held, owner, asked);
            owners.remove(owner.as_str());
            return Ok(Some(Proof::Lost(lost)));
        };
        if !state.listed {
            let sent = inner.clock.instant();
            let shown = self.shown_after_renewal(state, owner).await?;
            let mut held: HashMap<String, (FencingToken, Instant)> =
                shown.into_iter().map(|(s, t)| (s, (t, sent))).collect();
            // Acquired while the proof was on its way: proven by their own
            // write, which the proof may not show.
            for (session, (token, at)) in state.held.drain() {
                if at > sent {
                    held.insert(session, (token, at));
                }
            }
            state.held = held;
            state.listed = true;
            if state.watch.is_none() && state.held.len() >= inner.watch_from {
                state.watch =
                    SessionsWatch::start(self, &state.name, owner, &inner.owners.watch_slot);
            }
        }
        // A TTL from now: within what the owner lease's longer hold still
        // covers, since its renewal was sent less than the difference ago.
        Ok(Some(Proof::Held {
            proven: on_it(&state.held, owner, asked),
            expiry: state.sent_wall + elapsed + inner.ttl,
        }))
    }

    /// The sessions `owner` holds on `state`'s owner lease as of its latest
    /// renewal or later, session id to token: from the watch when it shows
    /// them within a quarter of a request timeout, else from a list.
    async fn shown_after_renewal(
        &self,
        state: &OwnerLease,
        owner: &OwnerId,
    ) -> Result<HashMap<String, FencingToken>, LeaseError> {
        if let Some(watch) = &state.watch
            && let Ok(renewal) = record::resource_version(&state.object)
            // A renewal that changed nothing kept its version and sent no
            // event to wait for.
            && renewal > state.renewed_from
            && let Some(shown) = watch.held_at(renewal, self.request_timeout() / 4).await
            && let Some(proven) = self.confirm_since(shown, state, owner).await
        {
            return Ok(proven);
        }
        let (_, held) = self.list_on(&state.name, owner).await?;
        Ok(held.into_values().map(|(s, t, _)| (s, t)).collect())
    }

    /// The sessions of `shown` (the watch's view) proven ours, when the
    /// renewal was conditional on version `from` (`state.renewed_from`).
    /// Everything written up to `from` is still stored; a session written
    /// since (an acquire after the previous renewal) may have been lost to
    /// storage that went back past its write but not past `from`, which no
    /// watch event shows, so each is read again, and a read older than what
    /// this client saw of it is refused as `Rewound` (by
    /// [`read`](K8sLease::read)) as a list would have it. `None` when so
    /// many were written since that one list is cheaper.
    async fn confirm_since(
        &self,
        shown: Held,
        state: &OwnerLease,
        owner: &OwnerId,
    ) -> Option<HashMap<String, FencingToken>> {
        let from = state.renewed_from;
        let (settled, since): (Vec<_>, Vec<_>) = shown
            .into_iter()
            .partition(|(_, (_, _, version))| *version <= from);
        if since.len() > READS_BEFORE_A_LIST {
            return None;
        }
        let reads = since.iter().map(|(name, _)| self.read(name));
        let read = futures_util::future::join_all(reads).await;
        let confirmed = since
            .into_iter()
            .zip(read)
            .filter_map(|((_, entry), read)| {
                let (session, token, _) = entry;
                let object = read.ok()??.object;
                let now = held_entry(&object, owner)?;
                // Unconfirmed sessions are decided on their own objects.
                let on_it = record::owner_lease_of(&object) == Some(state.name.as_str());
                (on_it && now.0 == session && now.1 == token).then_some((session, token))
            });
        Some(
            settled
                .into_iter()
                .map(|(_, (session, token, _))| (session, token))
                .chain(confirmed)
                .collect(),
        )
    }

    /// The sessions labelled with owner lease `name` and held by `owner`,
    /// by object name, and the list's version (`None` when it is not an
    /// integer): one consistent list.
    pub(crate) async fn list_on(
        &self,
        name: &str,
        owner: &OwnerId,
    ) -> Result<(Option<u64>, Held), LeaseError> {
        let inner = &self.inner;
        let target = self.target(Verb::List, name);
        let newest = inner.seen.newest();
        let params = ListParams::default().labels(&format!("{}={name}", record::OWNER_LEASE_LABEL));
        let list = match self.call(target, inner.api.list(&params)).await {
            Ok(list) => list,
            Err(Failure::TimedOut) => return Err(target.timed_out(self.request_timeout())),
            Err(Failure::Lease(e)) => return Err(e),
            Err(Failure::NotFound(_) | Failure::Conflict | Failure::AlreadyExists) => {
                return Err(LeaseError::transient(format!(
                    "listing the sessions on owner lease {name:?} answered no list"
                )));
            }
        };
        // A consistent list includes every write seen before it was sent.
        let version = list.metadata.resource_version.as_deref().unwrap_or("");
        let version = version.parse::<u64>().ok();
        if let Some(version) = version {
            if version < newest {
                return Err(rewound(
                    &inner.namespace,
                    name,
                    &format!(
                        "a list answered resourceVersion {version}, older than version \
                         {newest}, which this client had already seen"
                    ),
                ));
            }
            inner.seen.saw_version(version);
        }
        let held = list
            .items
            .iter()
            .filter_map(|o| Some((o.metadata.name.clone()?, held_entry(o, owner)?)))
            .collect();
        Ok((version, held))
    }

    /// Counts `session`, just taken or confirmed under `token` on owner
    /// lease `name`, as proven ours.
    pub(crate) async fn note_held(
        &self,
        owner: &OwnerId,
        name: &str,
        session: &SessionId,
        token: FencingToken,
    ) {
        let mut owners = self.inner.owners.by_owner.lock().await;
        if let Some(state) = owners.get_mut(owner.as_str())
            && state.name == name
        {
            let at = self.inner.clock.instant();
            state.held.insert(session.as_str().to_owned(), (token, at));
        }
    }

    /// The broken renewal of [`Builder::broken_trust_remembered_owner_lease`](crate::Builder::broken_trust_remembered_owner_lease):
    /// live for a whole TTL from now if this client remembers `lease` on
    /// its owner lease, whatever became of either since.
    #[cfg(feature = "broken")]
    pub(crate) async fn remembered_renewal(
        &self,
        lease: &lease_port::Lease,
    ) -> Option<lease_port::Lease> {
        if !self.inner.trust_remembered {
            return None;
        }
        let owners = self.inner.owners.by_owner.lock().await;
        let state = owners.get(lease.owner().as_str())?;
        let (token, _) = state.held.get(lease.session_id().as_str())?;
        (*token == lease.token())
            .then(|| lease.with_expiry(self.inner.clock.now() + self.inner.ttl))
    }

    /// `session` is no longer ours under `owner`.
    pub(crate) async fn forget_held(&self, owner: &OwnerId, session: &SessionId) {
        let mut owners = self.inner.owners.by_owner.lock().await;
        if let Some(state) = owners.get_mut(owner.as_str()) {
            state.held.remove(session.as_str());
        }
    }

    /// How owner lease `name` stands for a session held by `holder`, from
    /// what was seen of it (read now when `fresh` or never seen).
    pub(crate) async fn owner_liveness(
        &self,
        name: &str,
        holder: &str,
        fresh: bool,
    ) -> Result<Liveness, LeaseError> {
        let inner = &self.inner;
        let seen = match inner.seen.get(name) {
            Some(seen) if !fresh => Some(seen),
            _ => self.read(name).await?,
        };
        let Some(seen) = seen else {
            return Ok(Liveness::Void);
        };
        let object = &seen.object;
        if !record::is_owner_lease(object) || record::holder(object) != Some(holder) {
            return Ok(Liveness::Void);
        }
        let left = inner.expiry.time_left(
            object,
            seen.seen,
            inner.ttl,
            inner.clock.now(),
            inner.clock.instant(),
        );
        Ok(if left.is_zero() {
            Liveness::Expired(Box::new(seen))
        } else {
            Liveness::Live(left)
        })
    }

    /// Revokes the owner lease `expired` shows, conditional on that very
    /// version: if its holder renewed since, nothing changes. Either way the
    /// caller judges again from what is stored.
    pub(crate) async fn revoke(&self, expired: &Observed) -> Result<(), LeaseError> {
        let name = expired.object.metadata.name.clone().unwrap_or_default();
        let next = record::released(&expired.object);
        match self.write(Verb::Update, &name, &next).await? {
            Written::Done(_) | Written::Gone(_) => Ok(()),
            Written::Recreated(made) => {
                // A deleted owner lease voids its sessions already; ours
                // recreated it holding nothing, which voids them too.
                let _ = made;
                Ok(())
            }
            Written::Lost | Written::Unknown(_) => self.read(&name).await.map(|_| ()),
        }
    }
}
