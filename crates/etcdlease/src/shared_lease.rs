//! The one etcd lease a client attaches all its session keys to, and the
//! keep-alive stream that refreshes it.
//!
//! One etcd lease per client means one keep-alive refreshes every session
//! the client holds: a process renewing a thousand sessions sends one
//! keep-alive, not a thousand. Keep-alives of this lease are coalesced: a
//! renewal that starts while another is on the wire waits for it, and uses
//! its answer when it was sent after the renewal started.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::EtcdError;
use crate::wire::{EtcdClient, KeepAliveStream};

/// What one grant or keep-alive of an etcd lease established, judged from
/// the moment the request was sent: etcd counts the TTL from when it served
/// the request, which is later, so this view never outlives etcd's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) sent_at: Instant,
    pub(crate) sent_wall: SystemTime,
    pub(crate) ttl: Duration,
    /// The raft term of the member that answered. A keep-alive counts only
    /// when a later linearizable answer comes from the same term: a leader
    /// that was frozen and has not yet learnt it was replaced still answers
    /// keep-alives from its own memory (etcd 3.4), refreshing nothing the
    /// real leader knows of.
    pub(crate) term: u64,
}

impl Grant {
    fn start() -> (Instant, SystemTime) {
        (Instant::now(), SystemTime::now())
    }

    pub(crate) fn expiry(&self) -> SystemTime {
        self.sent_wall + self.ttl
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.sent_at + self.ttl
    }
}

#[derive(Debug, Clone, Copy)]
struct Current {
    id: i64,
    newest: Grant,
}

pub(crate) struct SharedLease {
    client: EtcdClient,
    /// The TTL asked of etcd: the reported TTL plus the grace.
    etcd_ttl_secs: i64,
    reported_ttl: Duration,
    grace: Duration,
    current: Mutex<Option<Current>>,
    granting: tokio::sync::Mutex<()>,
    stream: tokio::sync::Mutex<KeepAliveStream>,
}

impl SharedLease {
    pub(crate) fn new(client: EtcdClient, reported_ttl: Duration, grace: Duration) -> Self {
        let etcd_ttl_secs = i64::try_from((reported_ttl + grace).as_secs()).unwrap_or(i64::MAX);
        SharedLease {
            stream: tokio::sync::Mutex::new(client.keep_alive_stream()),
            client,
            etcd_ttl_secs,
            reported_ttl,
            grace,
            current: Mutex::new(None),
            granting: tokio::sync::Mutex::new(()),
        }
    }

    /// The TTL this client reports for an etcd answer of `etcd_ttl`
    /// seconds: the grace less, never more than configured.
    fn reported(&self, etcd_ttl: i64) -> Duration {
        Duration::from_secs(etcd_ttl.unsigned_abs())
            .saturating_sub(self.grace)
            .min(self.reported_ttl)
    }

    fn current(&self) -> Option<Current> {
        *self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The etcd lease new keys are attached to, while this client still
    /// counts it live.
    pub(crate) fn current_id(&self) -> Option<i64> {
        self.current()
            .filter(|c| c.newest.deadline() > Instant::now())
            .map(|c| c.id)
    }

    /// Whether `id` is this client's etcd lease, live or not.
    pub(crate) fn is_ours(&self, id: i64) -> bool {
        self.current().is_some_and(|c| c.id == id)
    }

    /// Drops `id` as the current lease: etcd said it is gone.
    pub(crate) fn forget(&self, id: i64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.is_some_and(|c| c.id == id) {
            *current = None;
        }
    }

    fn record(&self, id: i64, grant: Grant) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match current.as_mut() {
            Some(c) if c.id == id && grant.sent_at > c.newest.sent_at => c.newest = grant,
            _ => {}
        }
    }

    /// The current etcd lease and its newest grant. When this client's
    /// view of it has lapsed, a keep-alive tells whether etcd still has it
    /// (within the grace); only a lease etcd no longer has is replaced.
    pub(crate) async fn ensure(&self) -> Result<(i64, Grant), EtcdError> {
        let live = |c: &Current| c.newest.deadline() > Instant::now();
        if let Some(c) = self.current().filter(live) {
            return Ok((c.id, c.newest));
        }
        let _one_grant_at_a_time = self.granting.lock().await;
        match self.current() {
            Some(c) if live(&c) => return Ok((c.id, c.newest)),
            Some(c) => {
                if let Some(grant) = self.keep_alive(c.id, Instant::now()).await? {
                    return Ok((c.id, grant));
                }
            }
            None => {}
        }
        let (sent_at, sent_wall) = Grant::start();
        let answer = self.client.lease_grant(self.etcd_ttl_secs).await?;
        let grant = Grant {
            sent_at,
            sent_wall,
            ttl: self.reported(answer.ttl),
            term: answer.header.as_ref().map_or(0, |h| h.raft_term),
        };
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(Current {
            id: answer.id,
            newest: grant,
        });
        Ok((answer.id, grant))
    }

    /// How much longer than reported etcd keeps a key.
    pub(crate) fn grace(&self) -> std::time::Duration {
        self.grace
    }

    /// Until when etcd keeps a key renewed by `grant`, as this client counts.
    pub(crate) fn etcd_deadline(&self, grant: &Grant) -> Instant {
        grant.deadline() + self.grace
    }

    /// Refreshes etcd lease `id` with a keep-alive sent no earlier than
    /// `not_before`; `None` when etcd says the lease is gone.
    ///
    /// For the current lease, a keep-alive already sent after `not_before`
    /// answers for this call too. Any other lease (a key attached by another
    /// client of the same owner) gets a stream of its own for one exchange.
    pub(crate) async fn keep_alive(
        &self,
        id: i64,
        not_before: Instant,
    ) -> Result<Option<Grant>, EtcdError> {
        if self.current().is_none_or(|c| c.id != id) {
            let mut stream = self.client.keep_alive_stream();
            return self.exchange(&mut stream, id).await;
        }
        let mut stream = self.stream.lock().await;
        if let Some(c) = self.current().filter(|c| c.id == id)
            && c.newest.sent_at >= not_before
        {
            return Ok(Some(c.newest));
        }
        self.exchange(&mut stream, id).await
    }

    async fn exchange(
        &self,
        stream: &mut KeepAliveStream,
        id: i64,
    ) -> Result<Option<Grant>, EtcdError> {
        let (sent_at, sent_wall) = Grant::start();
        let answer = stream.keep_alive(id).await?;
        if answer.ttl <= 0 {
            self.forget(id);
            return Ok(None);
        }
        let grant = Grant {
            sent_at,
            sent_wall,
            ttl: self.reported(answer.ttl),
            term: answer.header.as_ref().map_or(0, |h| h.raft_term),
        };
        self.record(id, grant);
        Ok(Some(grant))
    }
}
