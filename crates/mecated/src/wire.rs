//! The wire format: every JSON body the API reads or writes, typed.
//!
//! These types serialise the responses and, through [`ToSchema`], are the
//! schemas of the OpenAPI document ([`crate::openapi`]), so the document
//! cannot say one thing while the server sends another.
//!
//! Every type refuses unknown fields (`deny_unknown_fields`): a request
//! with one is answered 400, and the schemas say `additionalProperties:
//! false`, for responses too, so a client validating against the document
//! learns of a field the server added only when the document says so.
//!
//! Fields are declared in alphabetical order: that is the order the API
//! has always written them in, and clients comparing bytes keep working.

use std::borrow::Cow;
use std::time::UNIX_EPOCH;

use lease_port::MAX_ID_LEN;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use session_store::StoredEvent;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::engine;

/// ECMA-262 (and Rust `regex`) pattern of text without control characters
/// (Unicode category Cc, what [`char::is_control`] refuses).
pub const NO_CONTROL_CHARS: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";

/// Largest page of events one read returns.
pub const MAX_PAGE: usize = 1000;

/// Events per page when the client does not say.
pub const DEFAULT_PAGE: usize = 100;

/// The largest sequence number a request may name (`after`,
/// `Last-Event-ID`): the largest `int64`, which is what the document says
/// a sequence number is. No log grows that long.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// ECMA-262 (and Rust `regex`) pattern of a run's `wait`: a whole or
/// decimal number, then `ms`, `s`, `m` or `h` (seconds without a unit).
pub const WAIT_PATTERN: &str = "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)?$";

/// A session id as it travels: text, validated into a
/// [`SessionId`](lease_port::SessionId) when it arrives so that a bad one
/// gets the id's own explanation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionIdText(pub String);

impl PartialSchema for SessionIdText {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_ID_LEN))
            .pattern(Some(NO_CONTROL_CHARS))
            .description(Some(format!(
                "A session id: not empty, at most {MAX_ID_LEN} bytes of UTF-8, no control \
                 characters (Unicode Cc). JSON Schema counts characters, not bytes, so \
                 `maxLength` is only an upper bound: an id of fewer characters whose UTF-8 \
                 exceeds {MAX_ID_LEN} bytes is refused with 400 `invalid`. In a path the id \
                 is percent-encoded, and must decode to valid UTF-8."
            )))
            .into()
    }
}

impl ToSchema for SessionIdText {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("SessionId")
    }
}

/// `POST /v1/sessions`: what to create. The body may be left out.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// Chosen by the client; a random one when absent or null.
    #[serde(default)]
    pub id: Option<SessionIdText>,
}

/// `POST /v1/sessions/{id}/runs`: the run's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Any JSON value, `null` included, handed to the agent as it is (the
    /// echo agent replies with it). Leaving `input` out is refused with
    /// 400 `invalid`: send `"input": null` to run the agent on nothing.
    #[schema(value_type = Value)]
    pub input: Value,
}

/// `GET /v1/sessions/{id}/events`: which page. Unknown parameters are
/// refused with 400 `invalid`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Return events with `seq` greater than this (0 when absent: from
    /// the first); a sequence number, at most 2^63 - 1. One past the log's
    /// end answers an empty page.
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_usize)]
    pub after: Option<u64>,
    /// At most this many events (100 when absent); a page also stops at
    /// the store's byte budget, but always holds at least one event.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Largest page of sessions one listing returns.
pub const MAX_SESSION_PAGE: usize = 1000;

/// Sessions per listing page when the client does not say.
pub const DEFAULT_SESSION_PAGE: usize = 100;

/// `GET /v1/sessions`: which page. Unknown parameters are refused with 400
/// `invalid`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SessionListQuery {
    /// At most this many sessions (100 when absent).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `continue` of the previous page: this page starts after it.
    /// Opaque; it does not expire. Left out, the listing starts at the
    /// first session. Never empty: the last page's `continue` is null, and
    /// an empty one is refused with 400 `invalid_continue`, like any token
    /// this server did not issue.
    #[serde(rename = "continue")]
    #[param(rename = "continue", min_length = 1)]
    pub continue_token: Option<String>,
}

/// `201` of `POST /v1/sessions`: the new session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatedSession {
    /// Events in the session: 0, it is new.
    pub events: u64,
    /// The session's id (the generated one when none was asked for).
    #[schema(value_type = SessionIdText)]
    pub id: String,
}

/// One entry of the session list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// The session's id.
    #[schema(value_type = SessionIdText)]
    pub id: String,
}

/// `200` of `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionList {
    /// Pass as `continue` for the next page; null when this page is the
    /// last.
    #[serde(rename = "continue")]
    #[schema(required = true)]
    pub continue_token: Option<String>,
    /// One page of sessions, sorted by id. Paging through while sessions
    /// are created and deleted lists every session that exists throughout
    /// exactly once.
    pub sessions: Vec<SessionRef>,
}

/// `200` of `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// The highest fencing token the store accepted for the session; null
    /// when no fenced write ever was. A stale owner's writes carry less.
    #[schema(required = true)]
    pub high_water_token: Option<u64>,
    /// The session's id.
    #[schema(value_type = SessionIdText)]
    pub id: String,
}

impl From<&engine::SessionInfo> for SessionInfo {
    fn from(s: &engine::SessionInfo) -> Self {
        Self {
            high_water_token: s.high_water.map(|t| t.get()),
            id: s.id.as_str().to_owned(),
        }
    }
}

/// One event of a session's log. The same in a paged read, in a run's
/// result, and in a run's Server-Sent Events (`event: event`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The event, as the agent wrote it, or the server for a run's claim
    /// (`run_started`: its owner, its token and the run's input, as the
    /// client sent it) and its end (`run_ended`). A run whose process died
    /// before recording its end is ended by the session's next owner,
    /// before that owner's own claim: a `takeover` (its owner and token:
    /// from here the earlier owner cannot write), then a `run_ended` with
    /// status `interrupted`, the interrupted run's `run_seq` (its
    /// `run_started`) and `run_token`, written under the new owner's token.
    /// With `--resume-interrupted` that end may say `resumed: {attempt}`,
    /// and the next event is a `run_started` of the same `input` with
    /// `resumes: {run_seq, attempt, after_seq, run_token}` (the run whose
    /// input it first ran, the how-manieth run again, the interrupted run
    /// and its token; and `shutdowns`, how many of those attempts followed
    /// a shutdown rather than a crash). A run cut off by shutdown ends its events with a
    /// `run_cut_off` (`reason`, `error`), not an end: the next owner
    /// writes that. With resumption on, a `run_started` also records
    /// `cancel_serial`, the store's count of cancel requests before it.
    /// Agents cannot write these types.
    #[schema(value_type = Value)]
    pub payload: Value,
    /// Position in the session, from 1, strictly increasing, never reused.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// When the store accepted it, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// Fencing token of the lease the event was written under (0 when
    /// unleased).
    pub token: u64,
}

impl From<&StoredEvent> for Event {
    fn from(e: &StoredEvent) -> Self {
        Self {
            payload: e.payload.clone(),
            seq: e.seq,
            // Before the epoch only with a clock set far back: 0 says so.
            time_ms: e
                .at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            token: e.token.map_or(0, |t| t.get()),
        }
    }
}

/// `200` of `GET /v1/sessions/{id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventPage {
    /// The page's events, in order.
    pub events: Vec<Event>,
    /// Pass as `after` for the next page; null when this page is the last.
    #[schema(required = true)]
    pub next_after: Option<u64>,
    /// The session's file ends in a torn (incomplete) line left by a
    /// crash: it is not an event, is ignored, and the next write to the
    /// session removes it.
    pub torn_tail: bool,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The agent finished and every event was recorded.
    Completed,
    /// The agent failed or an event could not be recorded.
    Failed,
    /// Cancelled by a client, or by shutdown when resumption is off.
    Cancelled,
    /// The lease was lost (or a write was fenced off): the run stopped.
    LeaseLost,
    /// The server shut down before the run finished, with
    /// `--resume-interrupted`: no end is recorded here; the session's next
    /// owner ends the run as `interrupted` and runs its input again.
    Interrupted,
}

impl From<&engine::RunStatus> for RunStatus {
    fn from(s: &engine::RunStatus) -> Self {
        match s {
            engine::RunStatus::Completed => Self::Completed,
            engine::RunStatus::Failed(_) => Self::Failed,
            engine::RunStatus::Cancelled => Self::Cancelled,
            engine::RunStatus::LeaseLost(_) => Self::LeaseLost,
            engine::RunStatus::Interrupted(_) => Self::Interrupted,
        }
    }
}

/// The end of a run: the data of its Server-Sent Event `end`, sent once
/// the run's lease has been released (or lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunEnd {
    /// What went wrong; present for `failed`, `lease_lost` and `interrupted` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<String>,
    /// Live forwarding stopped before the end (the client fell behind, or
    /// an event could not be read back for it); every event is in the log.
    pub lagged: bool,
    /// Sequence number of the last event the agent recorded; null when it
    /// recorded none.
    #[schema(required = true)]
    pub last_seq: Option<u64>,
    /// How the run ended.
    pub status: RunStatus,
    /// The lease token the run wrote under; null when unleased.
    #[schema(required = true)]
    pub token: Option<u64>,
}

impl From<&engine::RunEnd> for RunEnd {
    fn from(e: &engine::RunEnd) -> Self {
        Self {
            error: e.status.error().map(str::to_owned),
            lagged: e.lagged,
            last_seq: e.last_seq,
            status: RunStatus::from(&e.status),
            token: e.token,
        }
    }
}

/// `200` of `POST /v1/sessions/{id}/runs` without `Accept:
/// text/event-stream`: the run's end and its events read back from the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunResult {
    /// What went wrong; present for `failed`, `lease_lost` and `interrupted` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<String>,
    /// The run's events, from its `run_started` to `last_seq`.
    pub events: Vec<Event>,
    /// Always false here: a waiting client reads nothing live.
    pub lagged: bool,
    /// Sequence number of the last event the agent recorded; null when it
    /// recorded none.
    #[schema(required = true)]
    pub last_seq: Option<u64>,
    /// How the run ended.
    pub status: RunStatus,
    /// The lease token the run wrote under; null when unleased.
    #[schema(required = true)]
    pub token: Option<u64>,
}

impl RunResult {
    /// The run's end with its events.
    pub fn new(end: RunEnd, events: Vec<Event>) -> Self {
        let RunEnd {
            error,
            lagged,
            last_seq,
            status,
            token,
        } = end;
        Self {
            error,
            events,
            lagged,
            last_seq,
            status,
            token,
        }
    }
}

/// The stable, machine-readable code of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 409: another process holds the session's lease (`holder` names it
    /// when known), or took it between our acquire and our first write.
    SessionLeasedElsewhere,
    /// 409: a run of the session is in progress in this process.
    SessionBusy,
    /// 503: the lease backend failed or did not answer in time; retry.
    LeaseUnavailable,
    /// 404: no such session, run or route.
    NotFound,
    /// 400 (bad input) or 413 (body too large).
    Invalid,
    /// 400: a `continue` token this server did not issue.
    InvalidContinue,
    /// 409: a session with this id exists.
    SessionExists,
    /// 503: the server is shutting down; retry on another process.
    ShuttingDown,
    /// 503: the server is draining before it shuts down: its runs in
    /// progress finish, and it starts no new one. Nothing was done; send
    /// the run again (`Retry-After`), and a load balancer that has seen
    /// `/readyz` fail sends it to another replica.
    Draining,
    /// 409: unleased, and another process holds the store's lock.
    UnleasedNotExclusive,
    /// 409: unleased, and the session has fenced writes.
    UnfencedWriteRefused,
    /// 503: another process holds the session's file; retry.
    StoreBusy,
    /// 503: the session store could not be reached, or refused the
    /// request before acting on it (a Redis still loading its data, busy,
    /// read-only or out of memory): nothing was done; retry. A write whose
    /// outcome is unknown (sent, and no answer) is `internal` instead.
    StoreUnavailable,
    /// 500: the lease authority or the session store answered from older
    /// state than this server already saw (restored from a snapshot, wiped,
    /// failed over to a lagging replica, a directory put back from a
    /// backup), or is deployed so that it can lose acknowledged writes (a
    /// Redis evicting keys). Nothing was done; retrying cannot help until an
    /// operator acts on what the message names. `/readyz` fails meanwhile.
    StateRewound,
    /// 500: a fault of the server or its storage.
    Internal,
    /// 401: the server authenticates its callers (`--token-file`) and the
    /// request carried no `Authorization: Bearer` token, or one it does
    /// not know. The answer carries `WWW-Authenticate: Bearer`.
    Unauthenticated,
    /// 403: the request's token is known but lacks a role the route needs
    /// (`role` names it); or a server without authentication refused a
    /// request addressed to a name it does not answer under, or a write
    /// from another origin. Nothing was done.
    Forbidden,
    /// 429: the token holds as many follows open as the server allows one
    /// client (`--max-follows-per-client`); one of them must end first.
    TooManyFollows,
}

impl ErrorCode {
    /// True when the same request may succeed later on this process.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::LeaseUnavailable
                | ErrorCode::SessionBusy
                | ErrorCode::StoreBusy
                | ErrorCode::StoreUnavailable
                | ErrorCode::TooManyFollows
        )
    }
}

impl From<lease_http::ErrorCode> for ErrorCode {
    /// The code this API answers for one of `lease-http`'s, through which
    /// keeper and store errors are mapped: the same code wherever this API
    /// has it. The document lists the codes, so the two `lease-http` has
    /// beyond them are answered as this API always has.
    fn from(code: lease_http::ErrorCode) -> Self {
        use lease_http::ErrorCode as Shared;
        match code {
            Shared::SessionLeasedElsewhere => Self::SessionLeasedElsewhere,
            Shared::SessionBusy => Self::SessionBusy,
            Shared::LeaseUnavailable => Self::LeaseUnavailable,
            Shared::ShuttingDown => Self::ShuttingDown,
            Shared::Invalid => Self::Invalid,
            Shared::StateRewound => Self::StateRewound,
            Shared::NotFound => Self::NotFound,
            Shared::SessionExists => Self::SessionExists,
            Shared::UnfencedWriteRefused => Self::UnfencedWriteRefused,
            Shared::StoreBusy => Self::StoreBusy,
            Shared::StoreUnavailable => Self::StoreUnavailable,
            // A fenced write here means another process took the session
            // between this run's acquire and its write: that is what
            // `session_leased_elsewhere` says in this API.
            Shared::WriteFenced => Self::SessionLeasedElsewhere,
            // A write refused for a lost lease ends its run `lease_lost`
            // (the run's end says so); as an answer it is the server's.
            // So is anything `lease-http` may name later.
            _ => Self::Internal,
        }
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    /// Stable code to act on.
    pub code: ErrorCode,
    /// The live lease holder, for `session_leased_elsewhere`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub holder: Option<String>,
    /// Human-readable detail.
    pub message: String,
    /// The role the request lacked, for `forbidden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub role: Option<crate::auth::Role>,
    /// True when the same request may succeed later on this process
    /// (`session_busy`, `lease_unavailable`, `store_busy`,
    /// `store_unavailable`); a 503 that is
    /// retryable also carries `Retry-After`.
    pub retryable: bool,
}

/// `POST /v1/sessions/{id}/runs` query: how long to wait for a session
/// leased elsewhere. Unknown parameters are refused with 400 `invalid`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Wait up to this long for another process to release the session,
    /// and start the run the moment it does, instead of answering 409
    /// `session_leased_elsewhere` at once: a number, then `ms`, `s`, `m` or
    /// `h` (`250ms`, `5s`, `1.5m`; a bare number is seconds). A longer wait
    /// than 60 s is cut to 60 s; `0` and leaving `wait` out answer at once.
    #[param(value_type = Option<String>, pattern = "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)?$", example = "5s")]
    pub wait: Option<String>,
}

/// `GET /v1/sessions/{id}/events` with `Accept: text/event-stream`: the
/// data of the last Server-Sent Event of a follow, `event: end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FollowEnd {
    /// What went wrong; present for `failed` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<String>,
    /// `run_ended` (the followed run's end was recorded, the event just
    /// sent: by the run, or as `interrupted` by the session's next owner
    /// when the run's process died), `no_live_run` (no run was live: every stored event was sent),
    /// `run_gone` (the run stopped without recording its end: its lease
    /// lapsed or a later run took over) or `failed`.
    pub reason: String,
}

impl From<&engine::FollowEnd> for FollowEnd {
    fn from(end: &engine::FollowEnd) -> Self {
        Self {
            error: match end {
                engine::FollowEnd::Failed(e) => Some(e.clone()),
                _ => None,
            },
            reason: end.name().to_owned(),
        }
    }
}

/// `DELETE /v1/sessions/{id}/runs/current`: what the cancel found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelResult {
    /// Whether the run was in the process that answered (cancelled at
    /// once) rather than on another replica (asked through the store; it
    /// stops within about a second).
    pub here: bool,
    /// Whether a run was live; null when the lease backend cannot tell
    /// (the session's latest run was asked to stop anyway).
    #[schema(required = true)]
    pub live: Option<bool>,
    /// The lease token of the run asked to stop: a later run (a greater
    /// token) is never stopped by this request. With
    /// `--resume-interrupted`, `live` false and a token name a run left
    /// open by a process that died: it is ended by the session's next
    /// owner and, so asked, does not run again.
    #[schema(required = true)]
    pub token: Option<u64>,
}

impl From<&engine::CancelOutcome> for CancelResult {
    fn from(c: &engine::CancelOutcome) -> Self {
        Self {
            here: c.here,
            live: c.live,
            token: c.token,
        }
    }
}

/// `GET /v1/sessions/{id}/lease`: the session's lease as its backend
/// reports it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseStatus {
    /// When the hold lapses unless renewed, in milliseconds since the Unix
    /// epoch; null unless `held`.
    #[schema(required = true)]
    pub expires_ms: Option<u64>,
    /// The holding process's owner id; null unless `held`.
    #[schema(required = true)]
    pub holder: Option<String>,
    /// `held`, `free` (free, released or expired) or `unknown` (the
    /// backend does not report holders, or the server runs unleased).
    pub state: String,
    /// The holder's fencing token; null unless `held`.
    #[schema(required = true)]
    pub token: Option<u64>,
}

impl From<&crate::lease_view::HolderState> for LeaseStatus {
    fn from(s: &crate::lease_view::HolderState) -> Self {
        use crate::lease_view::HolderState;
        match s {
            HolderState::Held(h) => Self {
                expires_ms: Some(
                    h.expiry
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                ),
                holder: Some(h.owner.as_str().to_owned()),
                state: "held".into(),
                token: Some(h.token.get()),
            },
            HolderState::Free => Self {
                expires_ms: None,
                holder: None,
                state: "free".into(),
                token: None,
            },
            HolderState::Unknown => Self {
                expires_ms: None,
                holder: None,
                state: "unknown".into(),
                token: None,
            },
        }
    }
}
