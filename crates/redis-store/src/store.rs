//! The session store: events in a stream per session, the fence checked
//! and the events written by one script.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use lease_port::{AuthorityId, FencingToken, OwnerId, SessionId, SessionLease};
use redis::Value;
use serde_json::Value as Json;
use session_store::{
    AppendReceipt, CancelRequest, ListCursor, Page, SessionPage, SessionStore, StoreError,
    StoreErrorKind, StoredEvent, WriteFence, check_list_limit,
};

use crate::appends::{Appends, CANCEL_MESSAGE_MARK, FALLBACK_READ};
use crate::conn::{
    Conn, ConnectError, DEFAULT_POLICY_CHECK_INTERVAL, DEFAULT_REQUEST_TIMEOUT, Refusal,
    RequestError, Target, text,
};
use crate::keys::DEFAULT_PREFIX;
use crate::{RedisLease, scripts};

/// The largest event accepted when none is configured, serialised.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;
/// The most bytes of events one page holds when none is configured (a page
/// always holds at least one event).
pub const DEFAULT_MAX_PAGE_BYTES: usize = 4 << 20;
/// The most events one page holds, whatever the caller's limit.
pub const MAX_PAGE_EVENTS: usize = 10_000;

/// Configures and connects a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    target: Target,
    lease_ttl: Option<Duration>,
    allow_unfenced: bool,
    max_event_bytes: usize,
    max_page_bytes: usize,
}

impl RedisStoreBuilder {
    /// The prefix of every key (default [`DEFAULT_PREFIX`]). Two stores in
    /// one database with different prefixes are independent.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.target.prefix = prefix.into();
        self
    }

    /// The deadline of each request (default [`DEFAULT_REQUEST_TIMEOUT`]).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.target.request_timeout = timeout;
        self
    }

    /// How often the server's `maxmemory-policy` is read again after
    /// connecting (default [`DEFAULT_POLICY_CHECK_INTERVAL`]). Anything but
    /// `noeviction` is refused at connect and, once seen later, refuses
    /// every request until it is set back.
    pub fn policy_check_interval(mut self, interval: Duration) -> Self {
        self.target.policy_check_interval = interval;
        self
    }

    /// Offer this Redis's own leases, with this TTL, through
    /// [`SessionStore::session_lease`] (default: none, so the server
    /// picks a lease backend itself).
    pub fn leases(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// Accept unfenced writes to sessions that never accepted a fenced one
    /// (default false). Only for a deployment that proves a single writer.
    pub fn allow_unfenced(mut self, allow: bool) -> Self {
        self.allow_unfenced = allow;
        self
    }

    /// The largest event accepted, serialised (default
    /// [`DEFAULT_MAX_EVENT_BYTES`]).
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// The most bytes of events a page holds (default
    /// [`DEFAULT_MAX_PAGE_BYTES`]).
    pub fn max_page_bytes(mut self, bytes: usize) -> Self {
        self.max_page_bytes = bytes;
        self
    }

    /// Connects. A bad URL, prefix or option is
    /// [`Invalid`](session_store::StoreErrorKind::Invalid); a server that
    /// cannot be reached (or answers too late) is
    /// [`Unavailable`](session_store::StoreErrorKind::Unavailable); any
    /// other failure (a refused password, say) is
    /// [`Io`](session_store::StoreErrorKind::Io). A server whose
    /// `maxmemory-policy` is not `noeviction`, or that lets this user read
    /// neither `CONFIG GET maxmemory-policy` nor `INFO memory`, is
    /// [`Rewound`](session_store::StoreErrorKind::Rewound), naming the fix.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let conn = Conn::connect(&self.target).await.map_err(|e| match e {
            ConnectError::Invalid(message) => StoreError::Invalid { message },
            ConnectError::Unsafe(detail) => {
                StoreError::rewound(crate::conn::redacted(&self.target.url), detail)
            }
            ConnectError::Unreachable(e) => {
                let unavailable = e.is_transient();
                let location = crate::conn::redacted(&self.target.url);
                request_failed("connecting to Redis", &location, e, unavailable)
            }
        })?;
        let lease = match self.lease_ttl {
            Some(ttl) => {
                Some(
                    RedisLease::over(conn.clone(), ttl).map_err(|e| StoreError::Invalid {
                        message: e.message().to_owned(),
                    })?,
                )
            }
            None => None,
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                appends: Appends::new(
                    conn.client().clone(),
                    conn.keys().appends_channel(),
                    conn.timeout(),
                ),
                conn,
                lease,
                allow_unfenced: self.allow_unfenced,
                max_event_bytes: self.max_event_bytes,
                max_page_bytes: self.max_page_bytes,
                bound: OnceLock::new(),
                seen: Mutex::default(),
            }),
        })
    }
}

/// The store's error for a failed request to Redis at `location`.
fn request_failed(
    op: &'static str,
    location: &str,
    e: RequestError,
    unavailable: bool,
) -> StoreError {
    let (path, source) = (PathBuf::from(location), e.into_io());
    if unavailable {
        StoreError::Unavailable { op, path, source }
    } else {
        StoreError::Io { op, path, source }
    }
}

/// [`SessionStore`] in one Redis database (see the [crate
/// documentation](crate) for the rules and the layout).
///
/// Cheap to clone: clones share one connection.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    /// Wakes this process's waiters when any process appends.
    appends: Appends,
    lease: Option<RedisLease>,
    allow_unfenced: bool,
    max_event_bytes: usize,
    max_page_bytes: usize,
    /// The authority this instance bound, and the record Redis kept of it
    /// (the authority and a marker of the dataset, made when the record
    /// was first written). Every fenced write checks that Redis still
    /// records exactly that: after Redis lost its data a new binding of the
    /// same authority gets a new marker, so an instance bound before the
    /// loss, whose marks are gone, can never write again.
    bound: OnceLock<(AuthorityId, String)>,
    /// The highest sequence number and mark this instance saw of each
    /// session it touched: a session's record never goes back, so a record
    /// below them is Redis gone back, even when other processes' writes
    /// since carried the prefix's counter past this process's floor.
    seen: Mutex<HashMap<SessionId, SessionFloor>>,
}

/// What one instance saw of one session's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SessionFloor {
    seq: u64,
    mark: u64,
}

/// How many sessions' floors an instance keeps; beyond it one is
/// forgotten (that session's check then rests on the prefix's counter).
const MAX_SESSION_FLOORS: usize = 100_000;

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.inner.conn.location())
            .field("leases", &self.inner.lease.as_ref().map(RedisLease::ttl))
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store in the Redis at `url` (`redis://[user:password@]host:port/db`,
    /// or `rediss://` with the `tls` feature).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target: Target {
                url: url.into(),
                prefix: DEFAULT_PREFIX.to_owned(),
                request_timeout: DEFAULT_REQUEST_TIMEOUT,
                policy_check_interval: DEFAULT_POLICY_CHECK_INTERVAL,
            },
            lease_ttl: None,
            allow_unfenced: false,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_page_bytes: DEFAULT_MAX_PAGE_BYTES,
        }
    }

    /// This store's own leases, when configured
    /// ([`RedisStoreBuilder::leases`]).
    pub fn lease(&self) -> Option<&RedisLease> {
        self.inner.lease.as_ref()
    }

    /// A failed read changed nothing: a transient failure is
    /// `Unavailable`, safe to retry.
    fn read_failed(&self, op: &'static str) -> impl Fn(RequestError) -> StoreError + '_ {
        move |e| {
            let unavailable = e.is_transient();
            request_failed(op, self.inner.conn.location(), e, unavailable)
        }
    }

    /// A failed write is `Unavailable` only when Redis certainly did not
    /// act on it; otherwise (no answer in time, a connection broken with
    /// the request sent) it may have been done, and it is `Io`: a script
    /// that timed out can still run once Redis gets to it.
    fn write_failed(&self, op: &'static str) -> impl Fn(RequestError) -> StoreError + '_ {
        move |e| {
            let unavailable = e.refused_before_acting();
            request_failed(op, self.inner.conn.location(), e, unavailable)
        }
    }

    /// A refused clocked write: Redis went back or may evict (the store's
    /// `Rewound`), or the request failed as [`write_failed`](Self::write_failed) says.
    fn write_refused(&self, op: &'static str) -> impl Fn(Refusal) -> StoreError + '_ {
        move |r| self.refused(r, op, false)
    }

    /// A refused clocked read: as [`write_refused`](Self::write_refused),
    /// with a failed request judged as [`read_failed`](Self::read_failed).
    fn read_refused(&self, op: &'static str) -> impl Fn(Refusal) -> StoreError + '_ {
        move |r| self.refused(r, op, true)
    }

    fn refused(&self, r: Refusal, op: &'static str, read: bool) -> StoreError {
        let location = self.inner.conn.location();
        let e = match r.request_or_explain(location) {
            Ok(e) => e,
            Err(detail) => return StoreError::rewound(location, detail),
        };
        if read {
            self.read_failed(op)(e)
        } else {
            self.write_failed(op)(e)
        }
    }

    fn corrupt(&self, key: &str, message: String) -> StoreError {
        StoreError::Corrupt {
            path: PathBuf::from(key),
            line: None,
            message,
            source: None,
        }
    }

    fn floor(&self, session: &SessionId) -> SessionFloor {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session)
            .copied()
            .unwrap_or_default()
    }

    /// Raises what this instance saw of `session` to `seen`.
    fn saw(&self, session: &SessionId, seen: SessionFloor) {
        let mut all = self
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !all.contains_key(session) && all.len() >= MAX_SESSION_FLOORS {
            let any = all.keys().next().cloned();
            if let Some(any) = any {
                all.remove(&any);
            }
        }
        let floor = all.entry(session.clone()).or_default();
        floor.seq = floor.seq.max(seen.seq);
        floor.mark = floor.mark.max(seen.mark);
    }

    /// The refusal of a session record below what this instance saw.
    fn session_went_back(&self, session: &SessionId, now: SessionFloor) -> StoreError {
        let seen = self.floor(session);
        let location = self.inner.conn.location();
        StoreError::rewound(
            location,
            format!(
                "session {session} went back in Redis at {location}: its record holds sequence \
                 number {} and mark {}, but this process already saw {} and {}. Redis lost \
                 acknowledged writes (an older snapshot, a lagging replica promoted, keys \
                 removed by hand); nothing was done. Restore the newer data if it exists; \
                 otherwise restart this process to accept the older state",
                now.seq, now.mark, seen.seq, seen.mark
            ),
        )
    }

    fn bound_arg(&self) -> &str {
        self.inner
            .bound
            .get()
            .map_or("", |(_, record)| record.as_str())
    }

    /// The refusal of a write whose token the store's own leases never
    /// issued (`issued` is what their record says).
    fn never_issued(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        issued: Option<String>,
    ) -> StoreError {
        let location = self.inner.conn.location();
        StoreError::rewound(
            location,
            format!(
                "token {} was never issued for session {session} by the leases of Redis \
                 at {location} (their record says {}): Redis lost the grant that issued \
                 it and could issue it again, or the token came from elsewhere. Nothing \
                 was done. Restore the newer data if it exists; otherwise restart this \
                 process to accept the older state",
                match fence {
                    WriteFence::Fenced(f) => f.token().get(),
                    WriteFence::Unfenced => 0,
                },
                issued.unwrap_or_default()
            ),
        )
    }

    /// Runs a fenced script (append or delete) and turns its refusals into
    /// the store's errors; the `ok` reply's parts on success.
    async fn fenced(
        &self,
        session: &SessionId,
        fence: &WriteFence,
        op: &'static str,
        script: &redis::Script,
        extra_key: Option<String>,
        extra: &[&str],
    ) -> Result<Vec<Value>, StoreError> {
        let keys = self.inner.conn.keys();
        let mut call = self.inner.conn.prepare(script);
        // Fenced by its own leases, the store knows which tokens were
        // issued: one above the record was issued by a state Redis lost.
        let own = self
            .inner
            .lease
            .as_ref()
            .and_then(RedisLease::known_authority_now);
        let tokens = match (own, self.inner.bound.get()) {
            (Some(own), Some((bound, _))) if own == bound => keys.lease_tokens(session),
            _ => String::new(),
        };
        call.key(keys.record(session))
            .key(keys.events(session))
            .key(keys.fencing_authority())
            .key(tokens);
        if let Some(k) = extra_key {
            call.key(k);
        }
        let (mode, token, owner) = match fence {
            WriteFence::Fenced(f) => ("f", f.token().get().to_string(), f.owner().as_str()),
            WriteFence::Unfenced => ("u", String::new(), ""),
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis()
            .to_string();
        call.arg(mode)
            .arg(token)
            .arg(owner)
            .arg(if self.inner.allow_unfenced { "1" } else { "0" })
            .arg(self.bound_arg())
            .arg(now_ms);
        let floor = self.floor(session);
        call.arg(floor.seq).arg(floor.mark);
        for a in extra {
            call.arg(*a);
        }
        let reply = self
            .inner
            .conn
            .clocked(&call)
            .await
            .map_err(self.write_refused(op))?;
        let Value::Array(mut parts) = reply else {
            return Err(self.corrupt(&keys.record(session), format!("{op}: reply {reply:?}")));
        };
        let tag = parts.first().and_then(text).unwrap_or("").to_owned();
        let field = |i: usize| parts.get(i).and_then(text).map(str::to_owned);
        match tag.as_str() {
            "ok" => {
                if let WriteFence::Fenced(f) = fence {
                    // Accepted: the mark is at least this token now.
                    let mark = f.token().get();
                    self.saw(session, SessionFloor { seq: 0, mark });
                }
                parts.remove(0);
                Ok(parts)
            }
            "notfound" => Err(StoreError::NotFound {
                session: session.clone(),
            }),
            // A conditional append onto a log that moved on: nothing
            // written, nothing raised.
            "moved" => {
                let seq = field(1)
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        self.corrupt(&keys.record(session), format!("{op}: reply {parts:?}"))
                    })?;
                self.saw(session, SessionFloor { seq, mark: 0 });
                Ok(Vec::new())
            }
            "unissued" => Err(self.never_issued(session, fence, field(1))),
            "rewound" => {
                let now = record_floor(field(1), field(2)).ok_or_else(|| {
                    self.corrupt(&keys.record(session), format!("{op}: reply {parts:?}"))
                })?;
                Err(self.session_went_back(session, now))
            }
            "fenced" => {
                let WriteFence::Fenced(f) = fence else {
                    return Err(self.corrupt(
                        &keys.record(session),
                        format!("{op}: an unfenced write refused as fenced"),
                    ));
                };
                let mark = field(1)
                    .and_then(|t| t.parse::<u64>().ok())
                    .ok_or_else(|| {
                        self.corrupt(&keys.record(session), "unreadable high-water mark".into())
                    })?;
                Err(StoreError::Fenced {
                    session: session.clone(),
                    presented: f.token(),
                    presented_by: f.owner().clone(),
                    high_water: FencingToken::new(mark),
                    high_water_owner: field(2).and_then(|o| OwnerId::new(o).ok()),
                })
            }
            "unfenced" => Err(StoreError::Unfenced {
                session: session.clone(),
                high_water: field(1)
                    .and_then(|t| t.parse::<u64>().ok())
                    .map(FencingToken::new),
            }),
            "authority" => {
                let Some(offered) = self.inner.bound.get().map(|(a, _)| a.clone()) else {
                    return Err(self.corrupt(
                        &keys.fencing_authority(),
                        format!("{op}: an authority check this unbound store never asked for"),
                    ));
                };
                match field(1).and_then(|r| AuthorityId::new(authority_of(&r)).ok()) {
                    Some(recorded) if recorded == offered => Err(self.corrupt(
                        &keys.fencing_authority(),
                        format!(
                            "Redis lost its data since this process bound {offered} (the record \
                             was written anew), and with it the high-water marks; this process \
                             refuses to write until restarted"
                        ),
                    )),
                    Some(recorded) => Err(StoreError::authority_mismatch(
                        self.inner.conn.location(),
                        recorded,
                        offered,
                    )),
                    None => Err(self.corrupt(
                        &keys.fencing_authority(),
                        format!(
                            "the record of the fencing authority ({offered}) is gone: Redis lost \
                             its data (a flush, or a restart without persistence), and with it the \
                             high-water marks; this process refuses to write until restarted"
                        ),
                    )),
                }
            }
            "corrupt" => Err(self.corrupt(
                &keys.events(session),
                format!(
                    "the stream refused entry {:?} ({:?}): it does not end where the session's \
                     record says; nothing was written",
                    field(2),
                    field(1)
                ),
            )),
            _ => Err(self.corrupt(
                &keys.record(session),
                format!("{op}: unexpected reply {:?}", parts),
            )),
        }
    }
}

fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        message: message.into(),
    }
}

/// A session record's sequence number and mark, as a script answered them.
fn record_floor(seq: Option<String>, mark: Option<String>) -> Option<SessionFloor> {
    Some(SessionFloor {
        seq: seq?.parse().ok()?,
        mark: mark?.parse().ok()?,
    })
}

fn parse_seq(value: &Value) -> Option<u64> {
    text(value)?.parse().ok()
}

impl RedisStore {
    /// The session's record (its last number and mark, checked against
    /// what this client saw) and up to `count` stream entries from
    /// `from_seq`. `NotFound` for a session that does not exist.
    async fn read_entries(
        &self,
        session: &SessionId,
        from_seq: u64,
        count: usize,
    ) -> Result<(SessionFloor, Vec<Value>), StoreError> {
        let conn = &self.inner.conn;
        let keys = conn.keys();
        let floor = self.floor(session);
        let reply = conn
            .clocked(
                conn.prepare(&scripts::READ)
                    .key(keys.record(session))
                    .key(keys.events(session))
                    .arg(format!("{from_seq}-0"))
                    .arg(count)
                    .arg(floor.seq)
                    .arg(floor.mark),
            )
            .await
            .map_err(self.read_refused("reading a session"))?;
        let unexpected = |reply: &Value| {
            self.corrupt(
                &keys.events(session),
                format!("read: unexpected reply {reply:?}"),
            )
        };
        let mut parts = match reply {
            Value::Nil => {
                return Err(StoreError::NotFound {
                    session: session.clone(),
                });
            }
            Value::Array(parts) => parts,
            other => return Err(unexpected(&other)),
        };
        let tag = parts.first().and_then(text).map(str::to_owned);
        let record = record_floor(
            parts.get(1).and_then(text).map(str::to_owned),
            parts.get(2).and_then(text).map(str::to_owned),
        );
        match (tag.as_deref(), record, parts.len()) {
            (Some("rewound"), Some(now), 3) => Err(self.session_went_back(session, now)),
            (Some("page"), Some(now), 4) => match parts.pop() {
                Some(Value::Array(entries)) => {
                    self.saw(session, now);
                    Ok((now, entries))
                }
                _ => Err(unexpected(&Value::Array(parts))),
            },
            _ => Err(unexpected(&Value::Array(parts))),
        }
    }
}

impl RedisStore {
    /// Appends `events`; with `after`, only onto a log whose last seq it
    /// is (`None` when the log moved past it: nothing written).
    async fn append_at(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: Option<u64>,
        events: &[Json],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        if events.is_empty() {
            return Err(invalid("an append needs at least one event"));
        }
        let max = self.inner.max_event_bytes;
        let texts = events
            .iter()
            .enumerate()
            .map(|(i, ev)| {
                let text = serde_json::to_string(ev)
                    .map_err(|e| invalid(format!("event {i} cannot be serialised: {e}")))?;
                if text.len() > max {
                    return Err(invalid(format!(
                        "event {i} is {} bytes serialised, the limit is {max}",
                        text.len()
                    )));
                }
                Ok(text)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let channel = self.inner.conn.keys().appends_channel();
        let after = after.map_or_else(String::new, |a| a.to_string());
        let extra: Vec<&str> = [channel.as_str(), session.as_str(), after.as_str()]
            .into_iter()
            .chain(texts.iter().map(String::as_str))
            .collect();
        let parts = self
            .fenced(
                session,
                &fence,
                "appending to a session",
                &scripts::APPEND,
                None,
                &extra,
            )
            .await?;
        match parts.as_slice() {
            [] => Ok(None),
            [first, last] => match (parse_seq(first), parse_seq(last)) {
                (Some(first_seq), Some(last_seq)) => {
                    self.saw(
                        session,
                        SessionFloor {
                            seq: last_seq,
                            mark: 0,
                        },
                    );
                    Ok(Some(AppendReceipt {
                        first_seq,
                        last_seq,
                    }))
                }
                _ => Err(self.corrupt(
                    &self.inner.conn.keys().record(session),
                    format!("append: unexpected sequence numbers {parts:?}"),
                )),
            },
            _ => Err(self.corrupt(
                &self.inner.conn.keys().record(session),
                format!("append: unexpected reply {parts:?}"),
            )),
        }
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn create(&self, session: &SessionId) -> Result<(), StoreError> {
        let conn = &self.inner.conn;
        let keys = conn.keys();
        let reply = conn
            .clocked(
                conn.prepare(&scripts::CREATE)
                    .key(keys.record(session))
                    .key(keys.events(session))
                    .key(keys.sessions())
                    .arg(session.as_str()),
            )
            .await
            .map_err(self.write_refused("creating a session"))?;
        match text(&reply) {
            Some("ok") => Ok(()),
            Some("exists") => Err(StoreError::AlreadyExists {
                session: session.clone(),
            }),
            _ => Err(self.corrupt(
                &keys.record(session),
                format!("create: unexpected reply {reply:?}"),
            )),
        }
    }

    async fn append(
        &self,
        session: &SessionId,
        fence: WriteFence,
        events: &[Json],
    ) -> Result<AppendReceipt, StoreError> {
        self.append_at(session, fence, None, events)
            .await?
            .ok_or_else(|| {
                self.corrupt(
                    &self.inner.conn.keys().record(session),
                    "an unconditional append answered that the log moved".into(),
                )
            })
    }

    async fn append_after(
        &self,
        session: &SessionId,
        fence: WriteFence,
        after: u64,
        events: &[Json],
    ) -> Result<Option<AppendReceipt>, StoreError> {
        self.append_at(session, fence, Some(after), events).await
    }

    async fn read(
        &self,
        session: &SessionId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Page, StoreError> {
        if limit == 0 {
            return Err(invalid("a page limit must be at least 1"));
        }
        let keys = self.inner.conn.keys();
        let want = limit.min(MAX_PAGE_EVENTS);
        let (_, entries) = self
            .read_entries(session, from_seq.max(1), want + 1)
            .await?;
        let budget = self.inner.max_page_bytes;
        let mut used = 0;
        let mut events = Vec::with_capacity(entries.len().min(want));
        let mut next_seq = None;
        for entry in entries {
            let event = decode(&entry).ok_or_else(|| {
                self.corrupt(&keys.events(session), format!("unreadable entry {entry:?}"))
            })?;
            let (seq, token, ts, payload) = event;
            if events.len() == want || (!events.is_empty() && used + payload.len() > budget) {
                next_seq = Some(seq);
                break;
            }
            used += payload.len();
            let payload = serde_json::from_str(payload).map_err(|e| StoreError::Corrupt {
                path: PathBuf::from(keys.events(session)),
                line: None,
                message: format!("event {seq} cannot be parsed"),
                source: Some(e),
            })?;
            events.push(StoredEvent {
                seq,
                token: token.map(FencingToken::new),
                at: UNIX_EPOCH + Duration::from_millis(ts),
                payload,
            });
        }
        Ok(Page {
            events,
            next_seq,
            unfinished_write: false,
        })
    }

    async fn list(&self) -> Result<Vec<SessionId>, StoreError> {
        let key = self.inner.conn.keys().sessions();
        let reply = self
            .inner
            .conn
            .command(redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1))
            .await
            .map_err(self.read_failed("listing sessions"))?;
        let Value::Array(members) = reply else {
            return Err(self.corrupt(&key, format!("list: unexpected reply {reply:?}")));
        };
        let mut out = members
            .iter()
            .map(|m| {
                text(m)
                    .and_then(|s| SessionId::new(s).ok())
                    .ok_or_else(|| self.corrupt(&key, format!("not a session id: {m:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Redis sorts equal-score members by bytes, as `str` does; sorting
        // again costs little and keeps the promise whatever wrote the set.
        out.sort();
        Ok(out)
    }

    async fn list_page(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        check_list_limit(limit)?;
        let key = self.inner.conn.keys().sessions();
        // The session index has one score, so it is ordered by bytes, as
        // ids compare: a page is a lexicographic range after the cursor,
        // one more than asked to tell whether another page follows.
        let min = after.map_or_else(|| "-".to_owned(), |c| format!("({}", c.last().as_str()));
        let reply = self
            .inner
            .conn
            .command(
                redis::cmd("ZRANGEBYLEX")
                    .arg(&key)
                    .arg(min)
                    .arg("+")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit + 1),
            )
            .await
            .map_err(self.read_failed("listing sessions"))?;
        let Value::Array(members) = reply else {
            return Err(self.corrupt(&key, format!("list: unexpected reply {reply:?}")));
        };
        let mut sessions = members
            .iter()
            .map(|m| {
                text(m)
                    .and_then(|s| SessionId::new(s).ok())
                    .ok_or_else(|| self.corrupt(&key, format!("not a session id: {m:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let more = sessions.len() > limit;
        sessions.truncate(limit);
        Ok(SessionPage::new(sessions, more))
    }

    /// Returns as soon as any process appends past `after_seq` (at once
    /// when one already did), woken by the append's message on the
    /// prefix's channel: one subscription per store serves every waiter,
    /// where a blocked read would hold a connection each. Messages can be
    /// lost (a subscription being re-made), so the wait also reads the
    /// session every second, which is how it learns of a deletion
    /// (`NotFound`) too. A read Redis could not answer (it restarts, say)
    /// is tried again on that schedule; the wait fails with it only if
    /// Redis is still out of reach at its timeout. Dropping the future ends
    /// the wait and holds nothing.
    async fn wait_for_append(
        &self,
        session: &SessionId,
        after_seq: u64,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let first = after_seq.saturating_add(1);
        let waiter = self.inner.appends.register(session);
        loop {
            // Armed before the read: an append landing between the read
            // and the wait still wakes it.
            let woken = waiter.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // NotFound for a missing session, and no wait for an append made.
            let unreachable = match self.read(session, first, 1).await {
                Ok(page) if !page.events.is_empty() => return Ok(true),
                Ok(_) => None,
                Err(e) if e.kind() == StoreErrorKind::Unavailable => Some(e),
                Err(e) => return Err(e),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return unreachable.map_or(Ok(false), Err);
            }
            let until = deadline.min(now + FALLBACK_READ);
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn delete(&self, session: &SessionId, fence: WriteFence) -> Result<(), StoreError> {
        let keys = self.inner.conn.keys();
        self.fenced(
            session,
            &fence,
            "deleting a session",
            &scripts::DELETE,
            Some(keys.sessions()),
            &[session.as_str()],
        )
        .await
        .map(drop)
    }

    /// The record's number, read with the same checks as a page: no
    /// stream entry is fetched.
    async fn last_seq(&self, session: &SessionId) -> Result<u64, StoreError> {
        let (record, _) = self.read_entries(session, u64::MAX, 1).await?;
        Ok(record.seq)
    }

    async fn high_water(&self, session: &SessionId) -> Result<Option<FencingToken>, StoreError> {
        let conn = &self.inner.conn;
        let key = conn.keys().record(session);
        let reply = conn
            .clocked(conn.prepare(&scripts::HIGH_WATER).key(&key))
            .await
            .map_err(self.read_refused("reading a high-water mark"))?;
        match reply {
            Value::Nil => Ok(None),
            other => parse_seq(&other)
                .map(|t| Some(FencingToken::new(t)))
                .ok_or_else(|| self.corrupt(&key, format!("unreadable mark {other:?}"))),
        }
    }

    async fn bind_authority(&self, authority: &AuthorityId) -> Result<(), StoreError> {
        let conn = &self.inner.conn;
        let key = conn.keys().fencing_authority();
        let offered = format!("{authority} {}", dataset_marker());
        let reply = conn
            .clocked(conn.prepare(&scripts::GET_OR_SET).key(&key).arg(&offered))
            .await
            .map_err(self.write_refused("binding the fencing authority"))?;
        let record = text(&reply)
            .ok_or_else(|| self.corrupt(&key, format!("unreadable authority {reply:?}")))?
            .to_owned();
        let recorded = AuthorityId::new(authority_of(&record))
            .map_err(|_| self.corrupt(&key, format!("unreadable authority {record:?}")))?;
        if &recorded != authority {
            return Err(StoreError::authority_mismatch(
                self.inner.conn.location(),
                recorded,
                authority.clone(),
            ));
        }
        if let Err((_, _)) = self.inner.bound.set((authority.clone(), record.clone()))
            && let Some((earlier, earlier_record)) = self.inner.bound.get().cloned()
        {
            if earlier != *authority {
                // This instance was bound to another authority, which Redis
                // no longer records: its data was lost and the other is gone.
                return Err(StoreError::authority_mismatch(
                    self.inner.conn.location(),
                    earlier,
                    authority.clone(),
                ));
            }
            if earlier_record != record {
                return Err(self.corrupt(
                    &key,
                    format!(
                        "Redis lost its data since this process bound {authority}, and with it \
                         the high-water marks; this process refuses to write until restarted"
                    ),
                ));
            }
        }
        Ok(())
    }

    async fn recorded_authority(&self) -> Result<Option<AuthorityId>, StoreError> {
        let key = self.inner.conn.keys().fencing_authority();
        let reply = self
            .inner
            .conn
            .command(redis::cmd("GET").arg(&key))
            .await
            .map_err(self.read_failed("reading the fencing authority"))?;
        match reply {
            Value::Nil => Ok(None),
            other => text(&other)
                .and_then(|r| AuthorityId::new(authority_of(r)).ok())
                .map(Some)
                .ok_or_else(|| self.corrupt(&key, format!("unreadable authority {other:?}"))),
        }
    }

    fn session_lease(&self) -> Option<Arc<dyn SessionLease>> {
        self.inner
            .lease
            .clone()
            .map(|l| Arc::new(l) as Arc<dyn SessionLease>)
    }

    async fn request_cancel(
        &self,
        session: &SessionId,
        run: FencingToken,
    ) -> Result<(), StoreError> {
        // Only sessions that exist take requests.
        self.read(session, 1, 1).await?;
        let conn = &self.inner.conn;
        let key = conn.keys().cancel_requests(session);
        // One script: the token only rises, and the count grows with every
        // request for the recorded token or a later one.
        let reply = conn
            .clocked(
                conn.prepare(&scripts::RECORD_CANCEL)
                    .key(&key)
                    .arg(run.get())
                    .arg(conn.keys().appends_channel())
                    .arg(format!("{CANCEL_MESSAGE_MARK}{session}")),
            )
            .await
            .map_err(self.write_refused("recording a cancel request"))?;
        match reply {
            Value::Int(_) => Ok(()),
            other => {
                Err(self.corrupt(&key, format!("cancel requests: unexpected reply {other:?}")))
            }
        }
    }

    async fn cancel_request(
        &self,
        session: &SessionId,
    ) -> Result<Option<CancelRequest>, StoreError> {
        let conn = &self.inner.conn;
        let key = conn.keys().cancel_requests(session);
        let reply = conn
            .clocked(conn.prepare(&scripts::CANCEL_REQUEST).key(&key))
            .await
            .map_err(self.read_refused("reading cancel requests"))?;
        let Value::Array(fields) = &reply else {
            return Err(self.corrupt(&key, format!("cancel requests: unexpected reply {reply:?}")));
        };
        let number = |v: &Value| text(v).and_then(|t| t.parse::<u64>().ok());
        match fields.as_slice() {
            [Value::Nil, Value::Nil] => Ok(None),
            [run, serial] => match (number(run), number(serial)) {
                (Some(run), Some(serial)) => Ok(Some(CancelRequest {
                    run: FencingToken::new(run),
                    serial,
                })),
                _ => Err(self.corrupt(&key, format!("cancel requests: not numbers: {fields:?}"))),
            },
            _ => Err(self.corrupt(&key, format!("cancel requests: unexpected reply {reply:?}"))),
        }
    }

    /// Woken by the request's message on the appends' channel (the one
    /// subscription per store), and reading at least every second should
    /// a message be lost.
    async fn wait_for_cancel_request(
        &self,
        session: &SessionId,
        after_serial: u64,
        timeout: Duration,
    ) -> Result<Option<CancelRequest>, StoreError> {
        let waiter = self.inner.appends.register_cancels(session);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Subscribed, the notification is the wake-up and `timeout` the
            // safety read; a change of the subscription's state ends this
            // round, and the next one reads on the new state's schedule.
            let subscribed = waiter.subscribed();
            let recheck = subscribed.map_or(FALLBACK_READ, |_| timeout);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let seen =
                session_store::wait_notified(Some(waiter.notify()), left, recheck, || async {
                    if subscribed.is_some_and(|g| !waiter.still(g)) {
                        return Ok(Some(None));
                    }
                    Ok(self
                        .cancel_request(session)
                        .await?
                        .filter(|r| r.serial > after_serial)
                        .map(Some))
                })
                .await?;
            match seen {
                Some(Some(request)) => return Ok(Some(request)),
                None => return Ok(None),
                Some(None) if left.is_zero() => return Ok(None),
                Some(None) => {}
            }
        }
    }
}

/// One stream entry: `[id, [field, value, …]]` → sequence number, token,
/// time in milliseconds, payload text.
fn decode(entry: &Value) -> Option<(u64, Option<u64>, u64, &str)> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let [id, Value::Array(fields)] = parts.as_slice() else {
        return None;
    };
    let seq = text(id)?.strip_suffix("-0")?.parse().ok()?;
    let (mut token, mut ts, mut payload) = (None, None, None);
    for pair in fields.chunks(2) {
        let [name, value] = pair else { return None };
        match text(name)? {
            "k" => token = Some(text(value)?.parse().ok()?),
            "ts" => ts = Some(text(value)?.parse().ok()?),
            "p" => payload = Some(text(value)?),
            _ => {}
        }
    }
    Some((seq, token, ts?, payload?))
}

/// The authority in a fencing-authority record (`"<authority> <marker>"`).
fn authority_of(record: &str) -> &str {
    record
        .split_once(' ')
        .map_or(record, |(authority, _)| authority)
}

/// A marker of one Redis dataset: random, made when the authority record
/// is first written, so a record written again after Redis lost its data
/// differs from the one written before.
fn dataset_marker() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}
