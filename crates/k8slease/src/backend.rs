//! The `SessionLease` implementation: every decision made from the object
//! as stored, every write conditional on its resourceVersion.

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use lease_port::{
    AuthorityId, Clock, FencingToken, Lease, LeaseError, OwnerId, SessionId, SessionLease,
    SystemClock,
};

use crate::error::{Failure, Target, Verb, foreign_object, rewound};
use crate::expiry::ExpiryJudgement;
use crate::name::{AUTHORITY_OBJECT, object_name};
use crate::observe::{Observations, Observed};
use crate::owner::{Fresh, Liveness, Owners, Proof};
use crate::record::{self, StoredToken};

/// The TTL when none is set: client-go leader election's default duration.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// How many sessions an owner holds on one client before their proof after
/// each renewal comes from a watch instead of a list: see
/// [`Builder::watch_from`].
pub const DEFAULT_WATCH_FROM: usize = 100;

/// The longest request timeout the builder picks by itself.
const DEFAULT_TIMEOUT_CAP: Duration = Duration::from_secs(5);

/// How many times one operation re-reads after losing a race or a reply
/// before it gives up as `Transient`. Each round lost means another writer
/// changed the object in between; under a storm of writers on one session
/// (a take is a create and an update) a client can lose several in a row,
/// and six gave up about once in a hundred conformance runs. Sixteen keeps
/// the bound while making a loss to pure contention rare.
const MAX_ROUNDS: usize = 16;

/// Of those rounds, how many may end in a write whose outcome is unknown
/// (a timeout, a 5xx) before the operation gives up as `Transient`: an API
/// server failing every write is reported soon, not after every round.
const MAX_FAULT_ROUNDS: usize = 6;

/// Requests about sessions' objects (acquires, releases, reads) one client
/// has in flight at once: fewer than the connections a client of
/// [`client_from_config`](crate::client_from_config) keeps by default, so
/// two stay free for the requests that keep every session held.
const SESSION_REQUESTS_IN_FLIGHT: usize = crate::DEFAULT_MAX_CONNECTIONS - 2;

tokio::task_local! {
    /// Set while a renewal, or this client's own owner lease being made
    /// or renewed, runs: its requests, whatever object they are about,
    /// keep sessions held and never wait for a turn.
    pub(crate) static RENEWING: ();
}

/// Leases on sessions as `coordination.k8s.io/v1` Lease objects in one
/// namespace. Cheap to clone; clones share one connection pool and one
/// memory of the objects seen (see [`ExpiryJudgement::SkewSafe`]).
#[derive(Clone)]
pub struct K8sLease {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) api: Api<LeaseObject>,
    pub(crate) namespace: String,
    pub(crate) ttl: Duration,
    pub(crate) request_timeout: Duration,
    /// See [`Builder::watch_from`].
    pub(crate) watch_from: usize,
    pub(crate) expiry: ExpiryJudgement,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) seen: Observations,
    /// This client's owner leases, one per owner id it acts for.
    pub(crate) owners: Owners,
    /// Requests about sessions' objects in flight, at most
    /// [`SESSION_REQUESTS_IN_FLIGHT`]; see [`K8sLease::call`].
    session_requests: tokio::sync::Semaphore,
    /// See [`Builder::broken_trust_remembered_owner_lease`].
    #[cfg(feature = "broken")]
    pub(crate) trust_remembered: bool,
    authority: OnceLock<AuthorityId>,
}

impl std::fmt::Debug for K8sLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K8sLease")
            .field("namespace", &self.inner.namespace)
            .field("ttl", &self.inner.ttl)
            .field("request_timeout", &self.inner.request_timeout)
            .field("expiry", &self.inner.expiry)
            .finish_non_exhaustive()
    }
}

/// Configures a [`K8sLease`]; see [`K8sLease::builder`].
#[must_use]
pub struct Builder {
    client: kube::Client,
    namespace: String,
    ttl: Duration,
    request_timeout: Option<Duration>,
    watch_from: usize,
    expiry: ExpiryJudgement,
    clock: Option<Arc<dyn Clock>>,
    #[cfg(feature = "broken")]
    trust_remembered: bool,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("request_timeout", &self.request_timeout)
            .field("watch_from", &self.watch_from)
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// How long a grant lasts without renewal: whole seconds, at least one
    /// (`leaseDurationSeconds` cannot say less, and rounding would quietly
    /// change the promise). Default [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long one API request may take before it counts as failed (a
    /// timed-out write is then re-read, since it may have committed).
    /// Must be non-zero and at most a third of the TTL, so that a renewal
    /// sent every TTL/3 can fail, be re-read and be retried before the
    /// lease lapses. Default: a quarter of the TTL, at most 5 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// How many sessions an owner must hold on this client before the
    /// proof that they are still its own, after each renewal of its owner
    /// lease, comes from a watch rather than a list (see the crate docs,
    /// "Holding many sessions"). Default [`DEFAULT_WATCH_FROM`];
    /// `usize::MAX` never watches, zero counts as one.
    ///
    /// The watch holds one connection to the API server for as long as it
    /// runs, and one owner per client watches: the first to get there.
    /// Give a client that watches a connection bound of at least the
    /// default (see the crate docs, "Connections"); with fewer, turn
    /// watching off, or the watch may hold the connection a renewal needs.
    pub fn watch_from(mut self, sessions: usize) -> Self {
        self.watch_from = sessions;
        self
    }

    /// How other holders' expiry is judged. Default
    /// [`ExpiryJudgement::SkewSafe`].
    pub fn expiry(mut self, judgement: ExpiryJudgement) -> Self {
        self.expiry = judgement;
        self
    }

    /// The clock for timestamps written into objects, the expiries reported
    /// and observation times. Default: the system clocks.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Breaks the contract, for the fault runs to catch: renewals judge a
    /// session live from what this client remembers of its owner lease,
    /// sending nothing — a session judged live by a stale owner record.
    /// A holder paused past its TTL then renews a session another owner
    /// took meanwhile.
    #[cfg(feature = "broken")]
    #[doc(hidden)]
    pub fn broken_trust_remembered_owner_lease(mut self) -> Self {
        self.trust_remembered = true;
        self
    }

    /// Checks the settings. A TTL that is not a whole number of seconds (or
    /// is zero, or beyond `i32::MAX` seconds), a request timeout outside
    /// (0, TTL/3], or a namespace that is not a DNS-1123 label is
    /// [`Invalid`](lease_port::LeaseErrorKind::Invalid). Makes no request.
    pub fn build(self) -> Result<K8sLease, LeaseError> {
        let ttl = self.ttl;
        if ttl.subsec_nanos() != 0 || ttl.as_secs() == 0 || ttl.as_secs() > i32::MAX as u64 {
            return Err(LeaseError::invalid(format!(
                "TTL {ttl:?} is not a whole number of seconds between 1 and {}: \
                 leaseDurationSeconds cannot express it",
                i32::MAX
            )));
        }
        let request_timeout = self
            .request_timeout
            .unwrap_or_else(|| (ttl / 4).min(DEFAULT_TIMEOUT_CAP));
        if request_timeout.is_zero() || request_timeout > ttl / 3 {
            return Err(LeaseError::invalid(format!(
                "request timeout {request_timeout:?} must be above zero and at most a third \
                 of the TTL ({ttl:?}), so a renewal can be retried before the lease lapses"
            )));
        }
        if !is_dns_label(&self.namespace) {
            return Err(LeaseError::invalid(format!(
                "{:?} is not a valid namespace name",
                self.namespace
            )));
        }
        Ok(K8sLease {
            inner: Arc::new(Inner {
                api: Api::namespaced(self.client, &self.namespace),
                namespace: self.namespace,
                ttl,
                request_timeout,
                watch_from: self.watch_from.max(1),
                expiry: self.expiry,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                seen: Observations::default(),
                owners: Owners::default(),
                session_requests: tokio::sync::Semaphore::new(SESSION_REQUESTS_IN_FLIGHT),
                #[cfg(feature = "broken")]
                trust_remembered: self.trust_remembered,
                authority: OnceLock::new(),
            }),
        })
    }
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A kube client for the cluster and user of the current context of the
/// kubeconfig file at `path`. An unreadable or unusable file is
/// [`Invalid`](lease_port::LeaseErrorKind::Invalid).
pub async fn client_from_kubeconfig(path: impl AsRef<Path>) -> Result<kube::Client, LeaseError> {
    let path = path.as_ref();
    let bad = |what: &str| LeaseError::invalid(format!("kubeconfig {}: {what}", path.display()));
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| bad("cannot be read").with_source(e))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| bad("cannot be used").with_source(e))?;
    crate::client_from_config(config, crate::DEFAULT_MAX_CONNECTIONS)
}

/// A kube client configured the way Kubernetes tools find their cluster:
/// inside a pod, its service account; elsewhere, `$KUBECONFIG` or
/// `~/.kube/config` and its current context. Nothing usable found is
/// [`Invalid`](lease_port::LeaseErrorKind::Invalid).
pub async fn client_infer() -> Result<kube::Client, LeaseError> {
    let config = kube::Config::infer().await.map_err(|e| {
        LeaseError::invalid(
            "no Kubernetes configuration found (neither in-cluster service account nor kubeconfig)",
        )
        .with_source(e)
    })?;
    crate::client_from_config(config, crate::DEFAULT_MAX_CONNECTIONS)
}

/// What an acquire does next with the session's object it looked at.
enum Judged {
    /// Ours already, on our owner lease, under this token.
    Keep(FencingToken),
    /// Take it with this token.
    Take(FencingToken),
    /// Look at the same object again (its owner lease was just revoked).
    Again,
    /// Read the object again first.
    Reread,
    Refuse(LeaseError),
}

/// How an acquire looked at the session's object.
#[derive(Clone, Copy)]
struct Look {
    /// The object was just read, not remembered.
    fresh: bool,
    /// Its owner lease must be read, not remembered, before a refusal.
    read_owner: bool,
    distrust_own_token: bool,
}

/// What became of a write.
pub(crate) enum Written {
    Done(Observed),
    /// Another write came first (409 `Conflict` or `AlreadyExists`).
    Lost,
    /// The object is gone (404 on an update), or for a create the namespace.
    Gone(kube::Error),
    /// No reply in time, a broken connection or a 5xx: the write may or
    /// may not have committed. Carries the cause.
    Unknown(LeaseError),
    /// The update landed on an object created anew: the one read had been
    /// deleted meanwhile and the server created ours in its place (Leases
    /// allow create-on-update). What we wrote was decided from an object
    /// that no longer exists, so it must not stand as decided.
    Recreated(Observed),
}

impl K8sLease {
    /// Configures leases in `namespace` reached through `client`.
    pub fn builder(client: kube::Client, namespace: impl Into<String>) -> Builder {
        Builder {
            client,
            namespace: namespace.into(),
            ttl: DEFAULT_TTL,
            request_timeout: None,
            watch_from: DEFAULT_WATCH_FROM,
            expiry: ExpiryJudgement::default(),
            clock: None,
            #[cfg(feature = "broken")]
            trust_remembered: false,
        }
    }

    /// The namespace holding the Lease objects.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The TTL of every grant.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The timeout of each API request.
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    pub(crate) fn target<'a>(&'a self, verb: Verb, name: &'a str) -> Target<'a> {
        Target {
            verb,
            namespace: &self.inner.namespace,
            name,
        }
    }

    /// Runs one request under the request timeout. Requests take turns, a
    /// few at a time, except those of a renewal or of this client's own
    /// owner lease — what keeps every session held — which then find a
    /// connection free in a pool of
    /// [`DEFAULT_MAX_CONNECTIONS`](crate::DEFAULT_MAX_CONNECTIONS) however
    /// many acquires are waiting, instead of queueing behind them past
    /// their deadline.
    pub(crate) async fn call<T>(
        &self,
        target: Target<'_>,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Failure> {
        // The turn is waited for before the request's time starts: a
        // request that never left the queue was not sent, and must not
        // count as a write that may have landed.
        let _turn = if RENEWING.try_with(|()| ()).is_ok() {
            None
        } else {
            // Never closed: the semaphore lives as long as the client.
            self.inner.session_requests.acquire().await.ok()
        };
        match tokio::time::timeout(self.inner.request_timeout, request).await {
            Err(_) => Err(Failure::TimedOut),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(target.classify(e)),
        }
    }

    /// Reads the object as stored now. `None` when it does not exist.
    ///
    /// A version below the highest this client saw of the object before
    /// the read was sent is [`Rewound`](lease_port::LeaseErrorKind::Rewound):
    /// a GET is answered from the newest state (a quorum read), which
    /// includes every write seen before it was sent. A reply overtaken by
    /// a later one is no such case: only what was seen before sending
    /// counts.
    pub(crate) async fn read(&self, name: &str) -> Result<Option<Observed>, LeaseError> {
        let target = self.target(Verb::Get, name);
        let floor = self.inner.seen.floor(name);
        match self.call(target, self.inner.api.get(name)).await {
            Ok(object) => {
                let version = record::resource_version(&object)?;
                if version < floor {
                    return Err(rewound(
                        &self.inner.namespace,
                        name,
                        &format!(
                            "a read answered resourceVersion {version}, older than version \
                             {floor} of the same object, which this client had already seen"
                        ),
                    ));
                }
                self.note(name, object).map(Some)
            }
            Err(Failure::NotFound(_)) => {
                self.inner.seen.forget(name);
                Ok(None)
            }
            Err(Failure::TimedOut) => Err(target.timed_out(self.inner.request_timeout)),
            Err(Failure::Lease(e)) => Err(e),
            Err(Failure::Conflict | Failure::AlreadyExists) => Err(LeaseError::transient(format!(
                "reading Lease {name:?} answered a conflict"
            ))),
        }
    }

    fn note(&self, name: &str, object: LeaseObject) -> Result<Observed, LeaseError> {
        let version = record::resource_version(&object)?;
        let arrived = self.inner.clock.instant();
        Ok(self.inner.seen.note(name, object, version, arrived))
    }

    /// Writes `object`: a create when `verb` is [`Verb::Create`], else a
    /// replace conditional on the resourceVersion the object carries.
    pub(crate) async fn write(
        &self,
        verb: Verb,
        name: &str,
        object: &LeaseObject,
    ) -> Result<Written, LeaseError> {
        let target = self.target(verb, name);
        let params = PostParams::default();
        // Every write lands after everything seen before it was sent, so
        // its version must exceed all of those.
        let newest = self.inner.seen.newest();
        let outcome = match verb {
            Verb::Create => {
                self.call(target, self.inner.api.create(&params, object))
                    .await
            }
            Verb::Update | Verb::Get | Verb::List => {
                self.call(target, self.inner.api.replace(name, &params, object))
                    .await
            }
        };
        match outcome {
            Ok(stored) => {
                let stored = self.check_written(verb, name, object, stored, newest)?;
                if verb == Verb::Update && stored.metadata.uid != object.metadata.uid {
                    self.note(name, stored).map(Written::Recreated)
                } else {
                    self.note(name, stored).map(Written::Done)
                }
            }
            Err(Failure::Conflict | Failure::AlreadyExists) => Ok(Written::Lost),
            Err(Failure::NotFound(e)) => {
                self.inner.seen.forget(name);
                Ok(Written::Gone(e))
            }
            Err(Failure::TimedOut) => Ok(Written::Unknown(
                target.timed_out(self.inner.request_timeout),
            )),
            // A server fault or a lost connection says nothing about
            // whether the write landed (a 504 often follows a commit).
            Err(Failure::Lease(e)) if e.is_retryable() => Ok(Written::Unknown(e)),
            Err(Failure::Lease(e)) => Err(e),
        }
    }

    /// Refuses the reply to a write of `sent` that shows storage older than
    /// `newest`, the highest version seen before the write was sent. An
    /// update answered with the version it was conditioned on wrote nothing
    /// (it changed nothing, so the API server kept the object as it was);
    /// any other write made a new version, which must be above `newest`.
    fn check_written(
        &self,
        verb: Verb,
        name: &str,
        sent: &LeaseObject,
        stored: LeaseObject,
        newest: u64,
    ) -> Result<LeaseObject, LeaseError> {
        let version = record::resource_version(&stored)?;
        let unchanged = verb == Verb::Update
            && stored.metadata.uid == sent.metadata.uid
            && sent.metadata.resource_version.as_deref()
                == stored.metadata.resource_version.as_deref();
        if unchanged || version > newest {
            return Ok(stored);
        }
        Err(rewound(
            &self.inner.namespace,
            name,
            &format!(
                "a write ({}) was answered with resourceVersion {version}, not above version \
                 {newest}, which this client had already seen",
                verb.as_str()
            ),
        ))
    }

    /// The object we last saw, or the stored one when we have seen none.
    /// The flag says whether it was just read.
    pub(crate) async fn latest(&self, name: &str) -> Result<(Option<Observed>, bool), LeaseError> {
        match self.inner.seen.get(name) {
            Some(seen) => Ok((Some(seen), false)),
            None => Ok((self.read(name).await?, true)),
        }
    }

    /// Refuses objects this crate did not write for `session`.
    pub(crate) fn check_session(
        &self,
        observed: &Observed,
        session: &SessionId,
    ) -> Result<(), LeaseError> {
        let name = observed.object.metadata.name.as_deref().unwrap_or("");
        match record::session_of(&observed.object) {
            Some(id) if id == session.as_str() => Ok(()),
            Some(other) => Err(foreign_object(
                &self.inner.namespace,
                name,
                &format!("it belongs to session {other:?}"),
            )),
            None => Err(foreign_object(
                &self.inner.namespace,
                name,
                "it has no mecatl.dev/session-id annotation",
            )),
        }
    }

    /// Counts a write whose outcome is unknown, keeping its cause; the
    /// operation's error once there were [`MAX_FAULT_ROUNDS`] of them.
    pub(crate) fn unknown_write(
        &self,
        name: &str,
        faults: &mut usize,
        last: &mut Option<LeaseError>,
        cause: LeaseError,
    ) -> Result<(), LeaseError> {
        *faults += 1;
        if *faults == MAX_FAULT_ROUNDS {
            return Err(self.out_of_rounds(name, Some(cause)));
        }
        *last = Some(cause);
        Ok(())
    }

    pub(crate) fn out_of_rounds(&self, name: &str, last: Option<LeaseError>) -> LeaseError {
        let error = LeaseError::transient(format!(
            "Lease {name:?} in namespace {:?} kept changing or answering late, attempt after \
             attempt",
            self.inner.namespace
        ));
        match last {
            Some(cause) => error.with_source(cause),
            None => error,
        }
    }

    pub(crate) fn lost(object: &LeaseObject) -> LeaseError {
        match record::holder(object).and_then(|h| OwnerId::new(h).ok()) {
            Some(holder) => LeaseError::held(Some(holder)),
            None => LeaseError::held(None),
        }
    }

    /// Acquires `session` for `owner` with a token above `floor` (zero for
    /// a plain acquire, which every token exceeds), hanging it on this
    /// client's owner lease for `owner`.
    async fn acquire_object(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        // (A floor is bounded by `acquire_above`, before anything is sent.)
        let began = self.inner.owners.sequence();
        // Our owner lease, renewed for this grant (which lives as long as
        // it) once the grant is decided on: a refusal writes nothing.
        let mut mine: Option<Fresh> = None;
        let name = object_name(session);
        let (mut current, mut fresh) = self.latest(&name).await?;
        let mut last_fault = None;
        // Set once we have seen an object recreated under our write: the
        // token it carries was chosen before the deletion, so only a fresh
        // takeover token may stand.
        let mut distrust_own_token = false;
        let mut faults = 0;
        // Set right after a revocation, whose outcome was just seen: the
        // owner lease need not be read again.
        let mut owner_seen = false;
        for _ in 0..MAX_ROUNDS {
            let Some(observed) = current.take() else {
                current = self
                    .create_free(session, &mut faults, &mut last_fault)
                    .await?;
                fresh = true;
                continue;
            };
            self.check_session(&observed, session)?;
            let look = Look {
                fresh,
                read_owner: fresh && !std::mem::take(&mut owner_seen),
                distrust_own_token,
            };
            let mine_name = match &mine {
                Some(m) => Some(m.name.clone()),
                None => self.inner.owners.current(owner).await,
            };
            let judged = self
                .judge(&observed, owner, mine_name.as_deref(), floor, look)
                .await?;
            let (token, keep) = match judged {
                Judged::Keep(token) => (token, true),
                Judged::Take(token) => (token, false),
                Judged::Again => {
                    (current, owner_seen) = (Some(observed), true);
                    continue;
                }
                Judged::Reread => {
                    (current, fresh) = (self.read(&name).await?, true);
                    continue;
                }
                Judged::Refuse(e) => return Err(e),
            };
            let mine = match &mine {
                Some(m) => m.clone(),
                None => {
                    let renewed = self.owner_lease(owner, began).await?;
                    let replaced = Some(&renewed.name) != mine_name.as_ref();
                    mine = Some(renewed.clone());
                    if replaced {
                        // Ours was lost meanwhile: judge again against the
                        // new one.
                        (current, owner_seen) = (Some(observed), false);
                        continue;
                    }
                    renewed
                }
            };
            if keep {
                return self.kept(session, owner, token, &mine).await;
            }
            let now = self.inner.clock.now();
            let next = record::taken_over(
                &observed.object,
                owner,
                token,
                &mine.name,
                self.inner.ttl,
                now,
            )?;
            match self.write(Verb::Update, &name, &next).await? {
                Written::Done(_) => return self.kept(session, owner, token, &mine).await,
                Written::Recreated(created) => {
                    (current, fresh, distrust_own_token) = (Some(created), true, true);
                }
                // A timed-out write may have committed: the object as
                // stored decides (ours with our token: it did).
                Written::Lost => (current, fresh) = (self.read(&name).await?, true),
                Written::Unknown(cause) => {
                    self.unknown_write(&name, &mut faults, &mut last_fault, cause)?;
                    (current, fresh) = (self.read(&name).await?, true);
                }
                Written::Gone(_) => (current, fresh) = (None, true),
            }
        }
        Err(self.out_of_rounds(&name, last_fault))
    }

    /// The grant of `session` to `owner` under `token`, on owner lease
    /// `mine`, counted as proven ours.
    async fn kept(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        token: FencingToken,
        mine: &Fresh,
    ) -> Result<Lease, LeaseError> {
        self.note_held(owner, &mine.name, session, token).await;
        Ok(Lease::new(
            session.clone(),
            owner.clone(),
            token,
            mine.expiry,
        ))
    }

    /// Creates `session`'s object free, to be taken next round like any
    /// free one: the token is written with the holder, in the same update.
    /// What is stored afterwards.
    async fn create_free(
        &self,
        session: &SessionId,
        faults: &mut usize,
        last_fault: &mut Option<LeaseError>,
    ) -> Result<Option<Observed>, LeaseError> {
        let name = object_name(session);
        let object = record::new_free(&name, session);
        match self.write(Verb::Create, &name, &object).await? {
            Written::Done(created) | Written::Recreated(created) => Ok(Some(created)),
            // Someone else created it first: decide on theirs.
            Written::Lost => self.read(&name).await,
            Written::Unknown(cause) => {
                self.unknown_write(&name, faults, last_fault, cause)?;
                self.read(&name).await
            }
            Written::Gone(e) => Err(LeaseError::invalid(format!(
                "cannot create Leases in namespace {:?}: it does not exist",
                self.inner.namespace
            ))
            .with_source(e)),
        }
    }

    /// What an acquire by `owner` does with `observed`, its session's object
    /// (`fresh`: just read), hanging it on `mine`.
    async fn judge(
        &self,
        observed: &Observed,
        owner: &OwnerId,
        mine: Option<&str>,
        floor: FencingToken,
        look: Look,
    ) -> Result<Judged, LeaseError> {
        let Look {
            fresh,
            read_owner,
            distrust_own_token,
        } = look;
        let inner = &self.inner;
        let object = &observed.object;
        let stored = record::stored_token(object);
        let take = || next_token(observed.version, stored, floor).map(Judged::Take);
        let Some(holder) = record::holder(object) else {
            return take();
        };
        let ours = holder == owner.as_str();
        let refuse = || {
            // What we remember may be stale: the holder may have released
            // since. Ask before refusing.
            Ok(if fresh {
                Judged::Refuse(Self::lost(object))
            } else {
                Judged::Reread
            })
        };
        let Some(owner_lease) = record::owner_lease_of(object) else {
            // A hold renewed on the object itself, by an older k8slease:
            // judged by the object, and moved onto our owner lease when
            // taken (by its own owner too, with a new token).
            let live = !inner.expiry.expired(
                object,
                observed.seen,
                inner.ttl,
                inner.clock.now(),
                inner.clock.instant(),
            );
            return if live && !ours { refuse() } else { take() };
        };
        if ours && Some(owner_lease) == mine {
            return match stored {
                // Our own hold on our live owner lease: nothing to write,
                // but only on a fresh look (we may have lost it by hand).
                StoredToken::Known(token) if token > floor && !distrust_own_token => Ok(if fresh {
                    Judged::Keep(token)
                } else {
                    Judged::Reread
                }),
                _ => take(),
            };
        }
        match self.owner_liveness(owner_lease, holder, read_owner).await? {
            Liveness::Void => take(),
            // The same owner's hold from another client (a previous
            // incarnation): moved onto ours with a new token; that client
            // finds it gone at its next renewal.
            Liveness::Live(_) if ours => take(),
            Liveness::Live(_) => refuse(),
            Liveness::Expired(seen) => {
                self.revoke(&seen).await?;
                Ok(Judged::Again)
            }
        }
    }

    /// Renews `lease`: one read shows whether its object still hangs on
    /// this client's owner lease, which is then renewed. A hold on another
    /// client's owner lease (a previous incarnation's) is not renewed here:
    /// only an acquire moves it.
    async fn renew_one(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        #[cfg(feature = "broken")]
        if let Some(renewed) = self.remembered_renewal(lease).await {
            return Ok(renewed);
        }
        let name = object_name(lease.session_id());
        let Some(observed) = self.read(&name).await? else {
            return Err(LeaseError::held(None));
        };
        self.check_session(&observed, lease.session_id())?;
        let object = &observed.object;
        let stored = record::stored_token(object);
        if !record::held_by(object, stored, lease.owner(), lease.token()) {
            return Err(Self::lost(object));
        }
        let Some(on) = record::owner_lease_of(object) else {
            // Renewed on the object itself, as an older k8slease did.
            return self.renew_object(lease).await;
        };
        if self.inner.owners.current(lease.owner()).await.as_deref() != Some(on) {
            return Err(LeaseError::held(None));
        }
        let began = self.inner.owners.sequence();
        let mine = self.owner_lease(lease.owner(), began).await?;
        if mine.name != on {
            // Ours was lost (revoked or deleted), and with it this hold.
            return Err(LeaseError::held(None));
        }
        self.note_held(lease.owner(), on, lease.session_id(), lease.token())
            .await;
        Ok(lease.with_expiry(mine.expiry))
    }

    /// Renews `leases` with one owner-lease renewal and one list per owner
    /// and renewal period; a lease the proof does not cover (taken since,
    /// or never hung on our owner lease) is decided on its own object.
    async fn renew_batch(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        #[cfg(feature = "broken")]
        if self.inner.trust_remembered {
            let mut out = Vec::with_capacity(leases.len());
            for lease in leases {
                out.push(self.renew_one(lease).await);
            }
            return out;
        }
        let mut answers: Vec<Option<Result<Lease, LeaseError>>> =
            leases.iter().map(|_| None).collect();
        let mut owners: Vec<&OwnerId> = Vec::new();
        for lease in leases {
            if !owners.contains(&lease.owner()) {
                owners.push(lease.owner());
            }
        }
        for owner in owners {
            let proof = self.prove(owner, leases).await;
            for (i, (lease, answer)) in leases.iter().zip(answers.iter_mut()).enumerate() {
                if lease.owner() != owner {
                    continue;
                }
                *answer = match &proof {
                    Ok(Some(Proof::Held { proven, expiry })) if proven[i] => {
                        Some(Ok(lease.with_expiry(*expiry)))
                    }
                    Ok(Some(Proof::Lost(lost))) if lost[i] => Some(Err(LeaseError::held(None))),
                    Err(e) => Some(Err(LeaseError::new(e.kind(), e.message().to_owned()))),
                    Ok(_) => None,
                };
            }
        }
        let mut out = Vec::with_capacity(leases.len());
        for (lease, answer) in leases.iter().zip(answers) {
            out.push(match answer {
                Some(answer) => answer,
                None => self.renew_one(lease).await,
            });
        }
        out
    }

    async fn renew_object(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let inner = &self.inner;
        let name = object_name(lease.session_id());
        let (mut current, mut fresh) = self.latest(&name).await?;
        let mut last_fault = None;
        let mut faults = 0;
        for _ in 0..MAX_ROUNDS {
            let Some(observed) = current.take() else {
                if !fresh {
                    (current, fresh) = (self.read(&name).await?, true);
                    continue;
                }
                return Err(LeaseError::held(None));
            };
            self.check_session(&observed, lease.session_id())?;
            let object = &observed.object;
            let stored = record::stored_token(object);
            if !record::held_by(object, stored, lease.owner(), lease.token()) {
                if !fresh {
                    (current, fresh) = (self.read(&name).await?, true);
                    continue;
                }
                return Err(Self::lost(object));
            }
            // Ours, live or lapsed: the write is conditional on this very
            // version, so it succeeds only if nobody took over meanwhile.
            let now = inner.clock.now();
            let next = record::renewed(object, lease.token(), inner.ttl, now)?;
            match self.write(Verb::Update, &name, &next).await? {
                Written::Done(_) => return Ok(lease.with_expiry(now + inner.ttl)),
                Written::Recreated(created) => {
                    // The object was deleted under us: the lease is lost.
                    // Give back the hold our write re-created, so others
                    // need not wait for it to lapse.
                    let cleared = record::released(&created.object);
                    let _ = self.write(Verb::Update, &name, &cleared).await;
                    return Err(LeaseError::held(None));
                }
                Written::Lost => (current, fresh) = (self.read(&name).await?, true),
                Written::Unknown(cause) => {
                    self.unknown_write(&name, &mut faults, &mut last_fault, cause)?;
                    (current, fresh) = (self.read(&name).await?, true);
                }
                Written::Gone(_) => return Err(LeaseError::held(None)),
            }
        }
        Err(self.out_of_rounds(&name, last_fault))
    }

    async fn release_object(&self, lease: &Lease) -> Result<(), LeaseError> {
        let name = object_name(lease.session_id());
        let (mut current, mut fresh) = self.latest(&name).await?;
        let mut last_fault = None;
        let mut faults = 0;
        for _ in 0..MAX_ROUNDS {
            let Some(observed) = current.take() else {
                if !fresh {
                    (current, fresh) = (self.read(&name).await?, true);
                    continue;
                }
                return Ok(());
            };
            self.check_session(&observed, lease.session_id())?;
            let stored = record::stored_token(&observed.object);
            if !record::held_by(&observed.object, stored, lease.owner(), lease.token()) {
                if !fresh {
                    (current, fresh) = (self.read(&name).await?, true);
                    continue;
                }
                return Ok(());
            }
            // Clear the holder under the version read; never delete, which
            // would make the object's history (and a racing writer's
            // precondition) disappear.
            let next = record::released(&observed.object);
            match self.write(Verb::Update, &name, &next).await? {
                // A recreated object got our body, which holds nothing.
                Written::Done(_) | Written::Gone(_) | Written::Recreated(_) => return Ok(()),
                Written::Lost => (current, fresh) = (self.read(&name).await?, true),
                Written::Unknown(cause) => {
                    self.unknown_write(&name, &mut faults, &mut last_fault, cause)?;
                    (current, fresh) = (self.read(&name).await?, true);
                }
            }
        }
        Err(self.out_of_rounds(&name, last_fault))
    }

    async fn current_object(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        let inner = &self.inner;
        let name = object_name(session);
        let Some(observed) = self.read(&name).await? else {
            return Ok(None);
        };
        self.check_session(&observed, session)?;
        let object = &observed.object;
        let Some(holder) = record::holder(object) else {
            return Ok(None);
        };
        let now = inner.clock.now();
        // The judgement a takeover by this process would make now: live
        // here means its acquire for another owner would be refused.
        let left = match record::owner_lease_of(object) {
            Some(on) => match self.owner_liveness(on, holder, true).await? {
                Liveness::Live(left) => left,
                Liveness::Void | Liveness::Expired(_) => Duration::ZERO,
            },
            None => {
                inner
                    .expiry
                    .time_left(object, observed.seen, inner.ttl, now, inner.clock.instant())
            }
        };
        if left.is_zero() {
            return Ok(None);
        }
        let foreign = |why: &str| foreign_object(&inner.namespace, &name, why);
        let owner = OwnerId::new(holder)
            .map_err(|e| foreign("its holderIdentity is not an owner id").with_source(e))?;
        let token = match record::stored_token(object) {
            StoredToken::Known(token) => token,
            // Never guessed: the object's version is no token anyone was
            // granted once anything else changed it.
            StoredToken::Unstated => {
                return Err(LeaseError::transient(format!(
                    "Lease {name:?} in namespace {:?} is held by {holder:?} without a \
                     mecatl.dev/fencing-token annotation (given by an older k8slease's create, \
                     or by hand): its token is unknown until the holder renews or the hold lapses",
                    inner.namespace
                )));
            }
            StoredToken::Unreadable => {
                return Err(foreign(
                    "its mecatl.dev/fencing-token annotation is not a number",
                ));
            }
        };
        Ok(Some(Lease::new(session.clone(), owner, token, now + left)))
    }

    async fn authority_object(&self) -> Result<AuthorityId, LeaseError> {
        if let Some(known) = self.inner.authority.get() {
            return Ok(known.clone());
        }
        let name = AUTHORITY_OBJECT;
        let mut object = self.read_plain(name).await?;
        if object.is_none() {
            let fresh = LeaseObject {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some(
                        [(
                            record::MANAGED_BY_LABEL.to_owned(),
                            record::MANAGED_BY.to_owned(),
                        )]
                        .into(),
                    ),
                    annotations: Some(
                        [(
                            "mecatl.dev/purpose".to_owned(),
                            "Its uid names the lease authority of this namespace: fencing tokens \
                         of k8slease are comparable only under one authority. Deleting it \
                         makes every store fenced by this namespace refuse its servers."
                                .to_owned(),
                        )]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            let target = self.target(Verb::Create, name);
            match self
                .call(
                    target,
                    self.inner.api.create(&PostParams::default(), &fresh),
                )
                .await
            {
                Ok(created) => {
                    if let Ok(version) = record::resource_version(&created) {
                        self.inner.seen.saw_version(version);
                    }
                    object = Some(created);
                }
                Err(Failure::AlreadyExists | Failure::Conflict | Failure::TimedOut) => {
                    object = self.read_plain(name).await?;
                }
                Err(Failure::NotFound(e)) => {
                    return Err(LeaseError::invalid(format!(
                        "namespace {:?} does not exist",
                        self.inner.namespace
                    ))
                    .with_source(e));
                }
                Err(Failure::Lease(e)) => return Err(e),
            }
        }
        let uid = object
            .and_then(|o| o.metadata.uid)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                LeaseError::transient(format!(
                    "Lease {name:?} in namespace {:?} has no uid yet",
                    self.inner.namespace
                ))
            })?;
        let id = AuthorityId::new(format!("k8s:{}:{uid}", self.inner.namespace))?;
        Ok(self.inner.authority.get_or_init(|| id).clone())
    }

    async fn read_plain(&self, name: &str) -> Result<Option<LeaseObject>, LeaseError> {
        let target = self.target(Verb::Get, name);
        match self.call(target, self.inner.api.get(name)).await {
            Ok(object) => {
                if let Ok(version) = record::resource_version(&object) {
                    self.inner.seen.saw_version(version);
                }
                Ok(Some(object))
            }
            Err(Failure::NotFound(_)) => Ok(None),
            Err(Failure::TimedOut) => Err(target.timed_out(self.inner.request_timeout)),
            Err(Failure::Lease(e)) => Err(e),
            Err(Failure::Conflict | Failure::AlreadyExists) => Err(LeaseError::transient(format!(
                "reading Lease {name:?} answered a conflict"
            ))),
        }
    }
}

/// The token of a takeover conditioned on `version`: above `version`
/// itself (every token this crate wrote was at most the version of the
/// write that set it, or at most its stored token, and versions only
/// grow), above the stored token (which a floor may have raised past the
/// versions, and which every later takeover must exceed in turn), and
/// above `floor`.
fn next_token(
    version: u64,
    stored: StoredToken,
    floor: FencingToken,
) -> Result<FencingToken, LeaseError> {
    let highest = match stored {
        StoredToken::Known(t) => t.get().max(version),
        StoredToken::Unstated | StoredToken::Unreadable => version,
    }
    .max(floor.get());
    let token = highest
        .checked_add(1)
        .map(FencingToken::new)
        .ok_or_else(|| {
            LeaseError::invalid("the fencing token has reached u64::MAX and cannot rise")
        })?;
    debug_assert!(
        token.get() > version
            && token > floor
            && !matches!(stored, StoredToken::Known(t) if token <= t),
        "takeover token {token} not above version {version}, {stored:?} and floor {floor}"
    );
    Ok(token)
}

#[async_trait]
impl SessionLease for K8sLease {
    async fn acquire(&self, session: &SessionId, owner: &OwnerId) -> Result<Lease, LeaseError> {
        self.acquire_object(session, owner, FencingToken::new(0))
            .await
    }

    /// Writes a token above `floor` in the same update as the holder; see
    /// the crate docs, "Fencing tokens". Never answers `Rewound` for a
    /// floor above the API server's versions: the token annotation carries
    /// the raise, and every later takeover exceeds it. A floor above
    /// [`FencingToken::MAX_FLOOR`] is [`Invalid`](lease_port::LeaseErrorKind::Invalid).
    async fn acquire_above(
        &self,
        session: &SessionId,
        owner: &OwnerId,
        floor: FencingToken,
    ) -> Result<Lease, LeaseError> {
        floor.check_floor()?;
        self.acquire_object(session, owner, floor).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        RENEWING.scope((), self.renew_one(lease)).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.release_object(lease).await?;
        self.forget_held(lease.owner(), lease.session_id()).await;
        Ok(())
    }

    /// One owner-lease renewal and one list per owner and renewal period,
    /// whatever the number of leases and calls; see the crate docs, "Owner
    /// leases".
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        RENEWING.scope((), self.renew_batch(leases)).await
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    /// One GET of the session's Lease object; see the crate docs,
    /// "Reporting the holder".
    async fn current(&self, session: &SessionId) -> Result<Option<Lease>, LeaseError> {
        self.current_object(session).await
    }

    /// `k8s:<namespace>:<uid>`, where `<uid>` is the uid of the Lease object
    /// `mecatl-authority` in the namespace, created by the first client
    /// that asks. The uid is assigned by the API server and unique across
    /// clusters and across re-creations, so the id is the same for every
    /// client of one namespace and changes if the object is deleted (stores
    /// then refuse servers until re-pointed, the safe direction).
    async fn authority(&self) -> Result<AuthorityId, LeaseError> {
        self.authority_object().await
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.ttl())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_port::LeaseErrorKind;

    fn client() -> kube::Client {
        // Never contacted: the builder makes no request.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        kube::Client::try_from(config).expect("client")
    }

    #[tokio::test]
    async fn ttl_must_be_whole_seconds_of_at_least_one() {
        for bad in [
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(i32::MAX as u64 + 1),
        ] {
            let err = K8sLease::builder(client(), "ns")
                .ttl(bad)
                .build()
                .unwrap_err();
            assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{bad:?}");
        }
        let ok = K8sLease::builder(client(), "ns")
            .ttl(Duration::from_secs(1))
            .build()
            .unwrap();
        assert_eq!(ok.ttl(), Duration::from_secs(1));
        assert_eq!(ok.request_timeout(), Duration::from_millis(250));
    }

    #[tokio::test]
    async fn request_timeout_stays_within_the_renewal_margin() {
        let build = |t| {
            K8sLease::builder(client(), "ns")
                .ttl(Duration::from_secs(9))
                .request_timeout(t)
                .build()
        };
        assert!(build(Duration::from_secs(3)).is_ok());
        for bad in [Duration::ZERO, Duration::from_millis(3001)] {
            assert_eq!(build(bad).unwrap_err().kind(), LeaseErrorKind::Invalid);
        }
        let default = K8sLease::builder(client(), "ns").build().unwrap();
        assert!(default.request_timeout() <= DEFAULT_TTL / 3);
    }

    #[tokio::test]
    async fn namespace_must_be_a_dns_label() {
        for bad in ["", "Team", "a/b", "-a", "a-", &"n".repeat(64)] {
            let err = K8sLease::builder(client(), bad).build().unwrap_err();
            assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{bad:?}");
        }
    }

    #[test]
    fn takeover_tokens_rise_above_version_stored_token_and_floor() {
        let t = FencingToken::new;
        let next = |version, stored, floor| next_token(version, stored, t(floor)).unwrap().get();
        assert_eq!(next(10, StoredToken::Unstated, 0), 11);
        assert_eq!(next(10, StoredToken::Known(t(4)), 0), 11);
        assert_eq!(next(10, StoredToken::Known(t(40)), 0), 41);
        assert_eq!(next(10, StoredToken::Unreadable, 0), 11);
        // A floor above both raises the token; below, it changes nothing.
        assert_eq!(next(10, StoredToken::Known(t(40)), 1000), 1001);
        assert_eq!(next(10, StoredToken::Unstated, 3), 11);
        // After a raise the stored token, not the version, leads.
        assert_eq!(next(12, StoredToken::Known(t(1001)), 0), 1002);
        // Exhausted tokens are a state no call can get past, never a
        // backend that cannot lease (which a keeper may run unleased on).
        let err = next_token(u64::MAX, StoredToken::Unstated, t(0)).unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
        let err = next_token(5, StoredToken::Unstated, t(u64::MAX)).unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Invalid);
    }
}
