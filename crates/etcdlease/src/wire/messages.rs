//! The etcd v3 messages this crate exchanges, declared by hand with their
//! field numbers from etcd's `rpc.proto`, `kv.proto`, `auth.proto` and
//! `v3lock.proto`.
//!
//! Declaring them here instead of compiling etcd's `.proto` files keeps the
//! build free of `protoc` and of a build script. Only the fields this crate
//! reads or writes are declared: protobuf skips the others on decode.
//! Field names follow etcd's own, so etcd's API reference describes them.

#![allow(missing_docs)]

/// What every etcd answer starts with.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    /// The cluster's id, fixed when the cluster was first formed.
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    /// The store's revision when the request was served; for a write, the
    /// revision of that write.
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

/// One key as stored.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    /// The etcd lease the key is attached to, 0 for none.
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    /// Serve from the local member without a quorum check. Never set by
    /// this crate: a stale read could show a key that is already gone.
    #[prost(bool, tag = "7")]
    pub serializable: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// One operation of a transaction branch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3, 4")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
    /// A transaction nested in a branch (etcd 3.3 and later): its own
    /// compares decide its own branch, within the one atomic step.
    #[prost(message, tag = "4")]
    Txn(TxnRequest),
}

/// The answer to one [`RequestOp`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 3, 4")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeResponse),
    #[prost(message, tag = "4")]
    Txn(TxnResponse),
}

/// `Compare.result`.
pub mod compare_result {
    pub const EQUAL: i32 = 0;
    pub const GREATER: i32 = 1;
    pub const LESS: i32 = 2;
    pub const NOT_EQUAL: i32 = 3;
}

/// `Compare.target`.
pub mod compare_target {
    pub const VERSION: i32 = 0;
    pub const CREATE: i32 = 1;
    pub const MOD: i32 = 2;
    pub const VALUE: i32 = 3;
    pub const LEASE: i32 = 4;
}

/// One condition of a transaction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    #[prost(int32, tag = "1")]
    pub result: i32,
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "4, 5, 6, 7, 8")]
    pub target_union: Option<TargetUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TargetUnion {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes = "vec", tag = "7")]
    Value(Vec<u8>),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// The TTL granted from now, in seconds; 0 when the lease is gone.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTimeToLiveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
    /// Whether to list the lease's keys; this crate never asks (it needs
    /// no permission that way).
    #[prost(bool, tag = "2")]
    pub keys: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTimeToLiveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// Whole seconds left (rounded down) from when etcd served the
    /// request; -1 when the lease is gone.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(int64, tag = "4")]
    pub granted_ttl: i64,
}

/// etcd's own lock service (`v3lockpb.Lock/Lock`), measured beside ours.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub name: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LockResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bytes = "vec", tag = "2")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnlockRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnlockResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `Auth.Authenticate`: a user's name and password for a token that every
/// later request carries (metadata `token`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub token: String,
}

/// `Auth.UserAdd`, for setting up a cluster with authentication.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthUserAddRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `Auth.RoleAdd`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthRoleAddRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `Auth.UserGrantRole`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthUserGrantRoleRequest {
    #[prost(string, tag = "1")]
    pub user: String,
    #[prost(string, tag = "2")]
    pub role: String,
}

/// A role's permission on a key range (`authpb.Permission`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Permission {
    /// [`permission_type`].
    #[prost(int32, tag = "1")]
    pub perm_type: i32,
    #[prost(bytes = "vec", tag = "2")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub range_end: Vec<u8>,
}

/// Values of [`Permission::perm_type`].
pub mod permission_type {
    pub const READ: i32 = 0;
    pub const WRITE: i32 = 1;
    pub const READWRITE: i32 = 2;
}

/// `Auth.RoleGrantPermission`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthRoleGrantPermissionRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub perm: Option<Permission>,
}

/// `Auth.AuthEnable`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthEnableRequest {}

/// The answer of every `Auth` administration call used here.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthAdminResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// An answer that starts with a [`ResponseHeader`].
pub trait Answer {
    /// The header, when etcd sent one.
    fn header(&self) -> Option<&ResponseHeader>;
    /// Whether the header's revision is the store's as of a linearizable
    /// read or a write (KV answers), not a member's possibly lagging view.
    const LINEARIZABLE_REVISION: bool = false;
}

macro_rules! answers {
    ($($t:ty => $linearizable:expr),* $(,)?) => {$(
        impl Answer for $t {
            fn header(&self) -> Option<&ResponseHeader> {
                self.header.as_ref()
            }
            const LINEARIZABLE_REVISION: bool = $linearizable;
        }
    )*};
}

answers!(
    RangeResponse => true,
    TxnResponse => true,
    DeleteRangeResponse => true,
    PutResponse => true,
    LeaseGrantResponse => false,
    LeaseRevokeResponse => false,
    LeaseKeepAliveResponse => false,
    LeaseTimeToLiveResponse => false,
    LockResponse => false,
    UnlockResponse => false,
    AuthenticateResponse => false,
    AuthAdminResponse => false,
);
