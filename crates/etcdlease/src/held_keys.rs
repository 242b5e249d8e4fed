//! The keys this client attached to its etcd lease, and until when each
//! holder renewed it.
//!
//! One keep-alive refreshes every key on the client's etcd lease, so a key
//! whose holder stopped renewing it without releasing it (its renewals
//! failed until it counted the lease lost, or its release failed) would
//! otherwise live as long as the client renews anything. The client
//! deletes such a key itself once the holder's last renewal is older than
//! the TTL plus the grace — when etcd would have deleted it had the key had
//! an etcd lease of its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What is known of one key on the client's etcd lease.
#[derive(Debug, Clone)]
pub(crate) struct HeldKey {
    pub(crate) lease_id: i64,
    /// The key's revision when known; `None` when a write timed out and may
    /// or may not have happened.
    pub(crate) token: Option<i64>,
    pub(crate) value: Vec<u8>,
    until: Instant,
    /// A release of this hold was sent: it may land at any time, even
    /// after it failed here, so the hold is no longer anyone's to renew or
    /// to re-acquire as live.
    releasing: bool,
}

#[derive(Debug, Default)]
pub(crate) struct HeldKeys {
    keys: Mutex<HashMap<Vec<u8>, HeldKey>>,
    last_sweep: Mutex<Option<Instant>>,
}

/// How often the table is scanned for lapsed keys at most.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

impl HeldKeys {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, HeldKey>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key` is on `lease_id` and renewed until `until`.
    pub(crate) fn hold(
        &self,
        key: Vec<u8>,
        lease_id: i64,
        token: Option<i64>,
        value: Vec<u8>,
        until: Instant,
    ) {
        self.map().insert(
            key,
            HeldKey {
                lease_id,
                token,
                value,
                until,
                releasing: false,
            },
        );
    }

    /// `key` may be written on `lease_id` by a call still under way: known
    /// with no token, unless this client already knows it (a hold it may
    /// re-acquire keeps its record).
    pub(crate) fn hold_if_unknown(
        &self,
        key: &[u8],
        lease_id: i64,
        value: Vec<u8>,
        until: Instant,
    ) {
        self.map().entry(key.to_vec()).or_insert(HeldKey {
            lease_id,
            token: None,
            value,
            until,
            releasing: false,
        });
    }

    /// Drops the record [`hold_if_unknown`](Self::hold_if_unknown) made for
    /// `key` once the call's answer showed it wrote nothing.
    pub(crate) fn forget_unknown(&self, key: &[u8]) {
        let mut map = self.map();
        if map.get(key).is_some_and(|h| h.token.is_none()) {
            map.remove(key);
        }
    }

    /// The holder of `key` at `token` renewed it until `until`. False when
    /// this client knows no such hold: released, or taken by the sweep, in
    /// which case the key is being deleted and the renewal must not stand.
    /// The table's lock orders the two: a renewal recorded here first is
    /// never swept.
    pub(crate) fn renewed(&self, key: &[u8], token: i64, until: Instant) -> bool {
        match self.map().get_mut(key) {
            Some(held) if held.token == Some(token) && !held.releasing => {
                held.until = held.until.max(until);
                true
            }
            _ => false,
        }
    }

    /// A release of `key` at `token` is about to be sent. Until it is known
    /// to have landed, the hold stays here for the sweep (which removes it
    /// as the release would), but counts as neither live nor renewable.
    pub(crate) fn releasing(&self, key: &[u8], token: i64) {
        if let Some(held) = self.map().get_mut(key)
            && held.token == Some(token)
        {
            held.releasing = true;
        }
    }

    /// `key` at `token` is released or lost: nothing left to sweep.
    pub(crate) fn forget(&self, key: &[u8], token: i64) {
        let mut map = self.map();
        if map.get(key).is_some_and(|h| h.token == Some(token)) {
            map.remove(key);
        }
    }

    /// Whether the holder of `key` at `token` last renewed it until after
    /// `at`.
    pub(crate) fn renewed_past(&self, key: &[u8], token: i64, at: Instant) -> bool {
        self.map()
            .get(key)
            .is_some_and(|h| h.token == Some(token) && !h.releasing && h.until > at)
    }

    /// Takes out the keys whose holders stopped renewing before `now`, at
    /// most once per [`SWEEP_EVERY`].
    pub(crate) fn take_lapsed(&self, now: Instant) -> Vec<(Vec<u8>, HeldKey)> {
        {
            let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < SWEEP_EVERY) {
                return Vec::new();
            }
            *last = Some(now);
        }
        let mut map = self.map();
        let lapsed: Vec<Vec<u8>> = map
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        lapsed
            .into_iter()
            .filter_map(|k| map.remove_entry(&k))
            .collect()
    }

    /// Puts back a lapsed key whose deletion failed, for the next sweep.
    pub(crate) fn retry(&self, key: Vec<u8>, held: HeldKey) {
        self.map().entry(key).or_insert(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_not_renewed_in_time_lapse() {
        let keys = HeldKeys::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        keys.hold(
            b"a".to_vec(),
            1,
            Some(5),
            vec![],
            t0 + Duration::from_secs(1),
        );
        keys.hold(
            b"b".to_vec(),
            1,
            Some(6),
            vec![],
            t0 + Duration::from_secs(1),
        );
        keys.renewed(b"b", 6, t0 + Duration::from_secs(20));
        // A renewal under another token is not the holder's.
        keys.renewed(b"a", 99, t0 + Duration::from_secs(20));
        let lapsed = keys.take_lapsed(later);
        assert_eq!(lapsed.len(), 1);
        assert_eq!(lapsed[0].0, b"a");
        keys.forget(b"b", 6);
        assert!(keys.map().is_empty());
    }
}
