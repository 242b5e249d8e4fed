//! Renew: one keep-alive of the etcd lease a key is on, then a read that
//! proves the key is still the caller's hold and the keep-alive counted
//! (see the crate docs, "How it maps to etcd"); `renew_many` shares the
//! keep-alive and batches the reads.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use lease_port::{Lease, LeaseError, OwnerId};

use crate::keys::decode_owner;
use crate::shared_lease::Grant;
use crate::txn::{raft_term, read_each, read_kv, token_revision};
use crate::wire::messages::{KeyValue, RangeRequest};
use crate::{EtcdError, Inner};

/// The keep-alive of this client's etcd lease made for a renewal, shared
/// by every lease of a batch.
type OurKeepAlive = Option<(i64, Result<Option<Grant>, Arc<EtcdError>>)>;

/// Whether a stored key is the grant `lease` describes.
enum Verdict {
    /// Ours, attached to this etcd lease.
    Ours(i64),
    /// Gone or someone else's; the holder when the key names one.
    Lost(Option<OwnerId>),
}

fn judge(kv: Option<&KeyValue>, lease: &Lease) -> Verdict {
    let Some(kv) = kv else {
        return Verdict::Lost(None);
    };
    let holder = decode_owner(&kv.value);
    let ours = holder.as_ref() == Some(lease.owner())
        && token_revision(lease.token()) == Some(kv.mod_revision);
    if ours {
        Verdict::Ours(kv.lease)
    } else {
        Verdict::Lost(holder)
    }
}

fn unproven(keep_alive_term: u64, read_term: Option<u64>) -> LeaseError {
    LeaseError::transient("renew: the keep-alive is not proven").with_source(EtcdError::Malformed {
        call: "LeaseKeepAlive",
        detail: format!(
            "answered in raft term {keep_alive_term}, the read after it in {read_term:?}: \
             a replaced leader may have answered it, so it extends nothing"
        ),
    })
}

/// The sweep took the hold as lapsed (its last renewal was a TTL and a
/// grace ago) while a renewal read it: it is being deleted, as etcd would
/// have deleted it.
fn swept() -> LeaseError {
    LeaseError::held(None).with_source(EtcdError::Malformed {
        call: "Txn",
        detail: "the hold lapsed and was swept while this renewal read it".into(),
    })
}

fn lost_by_etcd() -> LeaseError {
    LeaseError::held(None).with_source(EtcdError::Malformed {
        call: "LeaseKeepAlive",
        detail: "the etcd lease holding the key has expired".into(),
    })
}

impl Inner {
    /// Turns a verdict and the keep-alive of its etcd lease into the answer
    /// of one renewal.
    async fn conclude(
        &self,
        lease: &Lease,
        verdict: Verdict,
        ours: &OurKeepAlive,
        started: Instant,
        read_term: Option<u64>,
    ) -> Result<Lease, LeaseError> {
        let key = self.keys.session_key(lease.session_id());
        let token = token_revision(lease.token()).unwrap_or(0);
        let id = match verdict {
            Verdict::Lost(holder) => {
                self.held.forget(&key, token);
                return Err(LeaseError::held(holder));
            }
            Verdict::Ours(id) => id,
        };
        let refreshed =
            match ours {
                Some((our_id, result)) if *our_id == id => match result {
                    Ok(grant) => Ok(*grant),
                    Err(e) => Err(LeaseError::transient("renew: keep-alive failed")
                        .with_source(Arc::clone(e))),
                },
                _ => return self.renew_on_other(id, lease, &key, token, started).await,
            }?;
        if let Some(grant) = &refreshed
            && read_term != Some(grant.term)
        {
            return Err(unproven(grant.term, read_term));
        }
        match refreshed {
            Some(grant) => {
                if !self
                    .held
                    .renewed(&key, token, self.shared.etcd_deadline(&grant))
                {
                    return Err(swept());
                }
                Ok(lease.with_expiry(grant.expiry()))
            }
            None => {
                self.held.forget(&key, token);
                Err(lost_by_etcd())
            }
        }
    }

    /// Renews a key that is on another client's etcd lease (same owner):
    /// keeps that lease alive, then proves the keep-alive with a read of
    /// the key (see `Grant::term`), which must still show the grant.
    async fn renew_on_other(
        &self,
        id: i64,
        lease: &Lease,
        key: &[u8],
        token: i64,
        started: Instant,
    ) -> Result<Lease, LeaseError> {
        let Some(grant) = self
            .shared
            .keep_alive(id, started)
            .await
            .map_err(|e| e.into_lease_error("renew: keep-alive failed"))?
        else {
            self.held.forget(key, token);
            return Err(lost_by_etcd());
        };
        let read = RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        let answer = self
            .client
            .range(read)
            .await
            .map_err(|e| e.into_lease_error("renew: reading the key failed"))?;
        match judge(answer.kvs.first(), lease) {
            Verdict::Ours(on) if on == id => {}
            Verdict::Ours(_) => {
                return Err(LeaseError::transient(
                    "renew: the key moved while its etcd lease was kept alive",
                ));
            }
            Verdict::Lost(holder) => return Err(LeaseError::held(holder)),
        }
        let read_term = raft_term(&answer.header);
        if read_term != Some(grant.term) {
            return Err(unproven(grant.term, read_term));
        }
        // The sweep must count from this renewal too: the holder counts on
        // it, whichever etcd lease the key is on. A key on this client's own
        // etcd lease that the sweep has taken meanwhile is being deleted.
        let known = self
            .held
            .renewed(key, token, self.shared.etcd_deadline(&grant));
        if !known && self.shared.is_ours(id) {
            return Err(swept());
        }
        Ok(lease.with_expiry(grant.expiry()))
    }

    async fn keep_alive_ours(&self, started: Instant) -> OurKeepAlive {
        let id = self.shared.current_id()?;
        Some((
            id,
            self.shared.keep_alive(id, started).await.map_err(Arc::new),
        ))
    }

    pub(crate) async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let started = Instant::now();
        let read = RangeRequest {
            key: self.keys.session_key(lease.session_id()),
            ..Default::default()
        };
        // The keep-alive first, the read after it: the read proves the
        // keep-alive (see `Grant::term`).
        let ours = self.keep_alive_ours(started).await;
        let answer = self
            .client
            .range(read)
            .await
            .map_err(|e| e.into_lease_error("renew: reading the key failed"))?;
        let verdict = judge(answer.kvs.first(), lease);
        let read_term = raft_term(&answer.header);
        let result = self
            .conclude(lease, verdict, &ours, started, read_term)
            .await;
        self.sweep().await;
        result
    }

    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LeaseError>> {
        if leases.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let reads = leases.chunks(self.max_txn_ops).map(|chunk| {
            self.client.txn(read_each(
                chunk.iter().map(|l| self.keys.session_key(l.session_id())),
            ))
        });
        // The keep-alive first, the reads after it (see `renew`).
        let ours = self.keep_alive_ours(started).await;
        let answers = join_all(reads).await;
        let mut out = Vec::with_capacity(leases.len());
        for (chunk, answer) in leases.chunks(self.max_txn_ops).zip(answers) {
            match answer {
                Ok(mut answer) => {
                    let read_term = raft_term(&answer.header);
                    for (n, lease) in chunk.iter().enumerate() {
                        let kv = read_kv(&mut answer, n);
                        let verdict = judge(kv.as_ref(), lease);
                        out.push(
                            self.conclude(lease, verdict, &ours, started, read_term)
                                .await,
                        );
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for _ in chunk {
                        out.push(Err(LeaseError::transient("renew: reading the keys failed")
                            .with_source(Arc::clone(&e))));
                    }
                }
            }
        }
        self.sweep().await;
        out
    }
}
