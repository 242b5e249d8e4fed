//! The etcd transactions the operations send, and what is read from their
//! answers. Building a request does no I/O; each operation sends its own.

use lease_port::FencingToken;

use crate::wire::messages::{
    Compare, DeleteRangeRequest, KeyValue, PutRequest, RangeRequest, Request, RequestOp, Response,
    ResponseHeader, TargetUnion, TxnRequest, TxnResponse, compare_result, compare_target,
};

fn range_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::Range(RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

fn put_op(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::Put(PutRequest { key, value, lease })),
    }
}

fn delete_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::DeleteRange(DeleteRangeRequest {
            key,
            range_end: vec![],
        })),
    }
}

fn compare(key: &[u8], target: i32, union: TargetUnion) -> Compare {
    Compare {
        result: compare_result::EQUAL,
        target,
        key: key.to_vec(),
        target_union: Some(union),
    }
}

/// The writes that take a session: its key on etcd lease `id`, and its
/// guard, on no etcd lease, so the guard's revision is the hold's token.
fn take_ops(key: &[u8], guard: &[u8], value: &[u8], id: i64) -> Vec<RequestOp> {
    vec![
        put_op(key.to_vec(), value.to_vec(), id),
        put_op(guard.to_vec(), value.to_vec(), 0),
    ]
}

/// Acquire's first step: if neither the session key nor its guard exists,
/// takes the session (see [`take_ops`]); otherwise reads both, the key as
/// the answer's first operation, the guard as its second.
pub(crate) fn take_if_free(key: &[u8], guard: &[u8], value: &[u8], id: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![
            compare(key, compare_target::CREATE, TargetUnion::CreateRevision(0)),
            compare(
                guard,
                compare_target::CREATE,
                TargetUnion::CreateRevision(0),
            ),
        ],
        success: take_ops(key, guard, value, id),
        failure: vec![range_op(key.to_vec()), range_op(guard.to_vec())],
    }
}

/// Takes the session (see [`take_ops`]) if `unchanged` holds; reads
/// nothing otherwise.
pub(crate) fn take_if_unchanged(
    key: &[u8],
    guard: &[u8],
    value: &[u8],
    id: i64,
    unchanged: Vec<Compare>,
) -> TxnRequest {
    TxnRequest {
        compare: unchanged,
        success: take_ops(key, guard, value, id),
        failure: vec![],
    }
}

/// A hold that lapsed is unchanged while its key is still gone and its
/// guard is still at `guard_revision`.
pub(crate) fn lapsed_unchanged(key: &[u8], guard: &[u8], guard_revision: i64) -> Vec<Compare> {
    vec![
        compare(key, compare_target::CREATE, TargetUnion::CreateRevision(0)),
        compare(
            guard,
            compare_target::MOD,
            TargetUnion::ModRevision(guard_revision),
        ),
    ]
}

/// A held key is unchanged while it is still at `revision`.
pub(crate) fn held_unchanged(key: &[u8], revision: i64) -> Vec<Compare> {
    vec![compare(
        key,
        compare_target::MOD,
        TargetUnion::ModRevision(revision),
    )]
}

/// Deletes the hold `token` of `value`'s owner: its key and its guard,
/// each only if it is still this hold's (written at revision `token`, with
/// that value), each on its own compare, in one atomic step. Every write
/// that takes a session writes both at one revision, so a key or guard at
/// another revision belongs to another hold and stays. Either may be gone
/// already: the key when its etcd lease ended (a lapsed hold: the guard
/// still goes), the guard when it was deleted by hand (the key still
/// goes: it is on an etcd lease the client may keep alive for ever).
///
/// Once etcd has answered, neither is this hold's any more, whichever
/// compares held.
pub(crate) fn release_if_ours(key: &[u8], guard: &[u8], token: i64, value: &[u8]) -> TxnRequest {
    let if_ours = |k: &[u8]| RequestOp {
        request: Some(Request::Txn(TxnRequest {
            compare: vec![
                compare(k, compare_target::MOD, TargetUnion::ModRevision(token)),
                compare(k, compare_target::VALUE, TargetUnion::Value(value.to_vec())),
            ],
            success: vec![delete_op(k.to_vec())],
            failure: vec![],
        })),
    };
    TxnRequest {
        compare: vec![],
        success: vec![if_ours(key), if_ours(guard)],
        failure: vec![],
    }
}

/// Deletes `key` only while it is still on etcd lease `lease_id` with
/// `value`; its guard stays.
pub(crate) fn delete_if_on(key: &[u8], lease_id: i64, value: &[u8]) -> TxnRequest {
    TxnRequest {
        compare: vec![
            compare(key, compare_target::LEASE, TargetUnion::Lease(lease_id)),
            compare(
                key,
                compare_target::VALUE,
                TargetUnion::Value(value.to_vec()),
            ),
        ],
        success: vec![delete_op(key.to_vec())],
        failure: vec![],
    }
}

/// Reads every key of `keys` in one transaction, one operation each, in
/// order.
pub(crate) fn read_each(keys: impl Iterator<Item = Vec<u8>>) -> TxnRequest {
    TxnRequest {
        compare: vec![],
        success: keys.map(range_op).collect(),
        failure: vec![],
    }
}

/// Puts `marker` under `key` (on no etcd lease) unless the key exists;
/// reads it otherwise.
pub(crate) fn create_or_read(key: Vec<u8>, marker: Vec<u8>) -> TxnRequest {
    TxnRequest {
        compare: vec![compare(
            &key,
            compare_target::CREATE,
            TargetUnion::CreateRevision(0),
        )],
        success: vec![put_op(key.clone(), marker, 0)],
        failure: vec![range_op(key)],
    }
}

/// The key read by the `n`th operation of a transaction's answer.
pub(crate) fn read_kv(answer: &mut TxnResponse, n: usize) -> Option<KeyValue> {
    match answer.responses.get_mut(n)?.response.as_mut()? {
        Response::Range(range) => range.kvs.pop(),
        _ => None,
    }
}

pub(crate) fn revision(answer: &TxnResponse) -> Option<i64> {
    answer
        .header
        .as_ref()
        .map(|h| h.revision)
        .filter(|&r| r > 0)
}

pub(crate) fn raft_term(header: &Option<ResponseHeader>) -> Option<u64> {
    header.as_ref().map(|h| h.raft_term).filter(|&t| t > 0)
}

/// A token as etcd stores revisions; `None` for values etcd never issues.
pub(crate) fn token_revision(token: FencingToken) -> Option<i64> {
    i64::try_from(token.get()).ok().filter(|&r| r > 0)
}

pub(crate) fn token_of(revision: i64) -> FencingToken {
    FencingToken::new(revision.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_outside_etcd_revisions_match_nothing() {
        assert_eq!(token_revision(FencingToken::new(0)), None);
        assert_eq!(token_revision(FencingToken::new(u64::MAX)), None);
        assert_eq!(token_revision(FencingToken::new(1 << 63)), None);
        assert_eq!(token_revision(FencingToken::new(42)), Some(42));
    }
}
