//! How a client decides that another holder's lease has lapsed.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;

use crate::record;

/// Which clock judges whether another holder's lease has expired.
///
/// Only a takeover depends on it: a holder's own renewals and releases are
/// compare-and-set writes on the object's resourceVersion and need no clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExpiryJudgement {
    /// A lease has expired when this client has seen the object unchanged
    /// for the object's own `leaseDurationSeconds`, measured on this
    /// process's monotonic clock from the moment the read or write that
    /// first showed this version of the object was *sent* — client-go's
    /// leader-election rule.
    ///
    /// Immune to wall-clock skew and steps between hosts: no timestamp
    /// written by another host is ever compared with ours. The price: a
    /// client that has never seen the object change must wait one full
    /// duration after its first look before taking it over, even if the
    /// holder died long ago. A freshly started process therefore takes over
    /// abandoned sessions one TTL late; clones of one [`K8sLease`](crate::K8sLease)
    /// share what they have seen.
    #[default]
    SkewSafe,
    /// A lease has expired when this host's wall clock has passed the
    /// holder's `renewTime` plus `leaseDurationSeconds`.
    ///
    /// A takeover needs no waiting period, but exclusion holds only while
    /// the hosts' clocks agree to well within the TTL: a reader whose clock
    /// runs ahead of the holder's by `d` sees the lease expire `d` early,
    /// and takes over a live lease once `d` exceeds the holder's renewal
    /// margin. Choose it only for clusters with synchronised clocks (NTP
    /// with a bounded offset), and keep the TTL large against that offset.
    RecordTime,
}

/// When a version of an object was first seen by this process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) at: Instant,
}

impl ExpiryJudgement {
    /// True when the hold recorded in `object` has lapsed. `seen` is when
    /// this process first saw this version of it; `ttl` stands in for a
    /// missing duration.
    pub(crate) fn expired(
        self,
        object: &LeaseObject,
        seen: Seen,
        ttl: Duration,
        now_wall: SystemTime,
        now_mono: Instant,
    ) -> bool {
        self.time_left(object, seen, ttl, now_wall, now_mono)
            .is_zero()
    }

    /// How long the hold recorded in `object` stays live by this judgement;
    /// zero once it has lapsed (see [`expired`](Self::expired)).
    pub(crate) fn time_left(
        self,
        object: &LeaseObject,
        seen: Seen,
        ttl: Duration,
        now_wall: SystemTime,
        now_mono: Instant,
    ) -> Duration {
        let duration = record::duration(object, ttl);
        let by_observation =
            || duration.saturating_sub(now_mono.saturating_duration_since(seen.at));
        match self {
            ExpiryJudgement::SkewSafe => by_observation(),
            ExpiryJudgement::RecordTime => match record::renewed_at(object) {
                Some(renewed) => (renewed + duration)
                    .duration_since(now_wall)
                    .unwrap_or(Duration::ZERO),
                // Written by something that keeps no time: only our own
                // observation can tell.
                None => by_observation(),
            },
        }
    }
}
