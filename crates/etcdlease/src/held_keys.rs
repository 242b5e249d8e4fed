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
//!
//! A record leaves the table only once etcd is known to hold nothing of
//! it: a read showed the key gone or another's, or a delete conditional on
//! the hold (a release's, the sweep's) was answered. A delete that failed
//! or whose call was dropped leaves it for the next sweep, which a release
//! makes due at once: otherwise a key whose delete did not land would stay
//! alive as long as the client renews anything.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The sweep took the hold as lapsed: it is being deleted, and no
    /// renewal of it may stand, even while the delete is unconfirmed.
    swept: bool,
    /// Tells this record from a later one of the same key, so that a
    /// delete confirmed for this one never drops the other.
    pub(crate) generation: u64,
}

#[derive(Debug, Default)]
struct Table {
    keys: HashMap<Vec<u8>, HeldKey>,
    next_generation: u64,
}

impl Table {
    fn record(
        &mut self,
        lease_id: i64,
        token: Option<i64>,
        value: Vec<u8>,
        until: Instant,
    ) -> HeldKey {
        self.next_generation += 1;
        HeldKey {
            lease_id,
            token,
            value,
            until,
            releasing: false,
            swept: false,
            generation: self.next_generation,
        }
    }
}

/// The client's records, by key, each kept until etcd holds nothing of it
/// (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct HeldKeys {
    table: Mutex<Table>,
    last_sweep: Mutex<Option<Instant>>,
    sweeping: AtomicBool,
}

/// How often the table is scanned for lapsed keys at most.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// One sweep under way: the records it deletes. At most one at a time per
/// client; dropping it (the call that swept was dropped) lets the next
/// sweep start, and the records it did not confirm are still in the table.
pub(crate) struct Sweep<'a> {
    keys: &'a HeldKeys,
    pub(crate) lapsed: Vec<(Vec<u8>, HeldKey)>,
}

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        self.keys.sweeping.store(false, Ordering::Release);
    }
}

impl HeldKeys {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut table = self.table();
        let record = table.record(lease_id, token, value, until);
        table.keys.insert(key, record);
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
        let mut table = self.table();
        if !table.keys.contains_key(key) {
            let record = table.record(lease_id, None, value, until);
            table.keys.insert(key.to_vec(), record);
        }
    }

    /// Drops the record [`hold_if_unknown`](Self::hold_if_unknown) made for
    /// `key` once the call's answer showed it wrote nothing.
    pub(crate) fn forget_unknown(&self, key: &[u8]) {
        let mut table = self.table();
        if table.keys.get(key).is_some_and(|h| h.token.is_none()) {
            table.keys.remove(key);
        }
    }

    /// The holder of `key` at `token` renewed it until `until`. False when
    /// this client knows no such hold: released, or taken by the sweep, in
    /// which case the key is being deleted and the renewal must not stand.
    /// The table's lock orders the two: a renewal recorded here first is
    /// never swept.
    pub(crate) fn renewed(&self, key: &[u8], token: i64, until: Instant) -> bool {
        match self.table().keys.get_mut(key) {
            Some(held) if held.token == Some(token) && !held.releasing && !held.swept => {
                held.until = held.until.max(until);
                true
            }
            _ => false,
        }
    }

    /// A release of `key` at `token` is about to be sent. Until it is known
    /// to have landed, the hold stays here, due for the next sweep (which
    /// removes it as the release would: should the release fail or be
    /// dropped, the sweep completes it), and counts as neither live nor
    /// renewable.
    pub(crate) fn releasing(&self, key: &[u8], token: i64, now: Instant) {
        if let Some(held) = self.table().keys.get_mut(key)
            && held.token == Some(token)
        {
            held.releasing = true;
            held.until = held.until.min(now);
        }
    }

    /// `key` at `token` is released or lost: etcd holds nothing of it any
    /// more, nothing left to sweep.
    pub(crate) fn forget(&self, key: &[u8], token: i64) {
        let mut table = self.table();
        if table.keys.get(key).is_some_and(|h| h.token == Some(token)) {
            table.keys.remove(key);
        }
    }

    /// Whether the holder of `key` at `token` last renewed it until after
    /// `at`.
    pub(crate) fn renewed_past(&self, key: &[u8], token: i64, at: Instant) -> bool {
        self.table()
            .keys
            .get(key)
            .is_some_and(|h| h.token == Some(token) && !h.releasing && !h.swept && h.until > at)
    }

    /// Starts a sweep of the keys whose holders stopped renewing before
    /// `now` (or that are being released), at most once per
    /// [`SWEEP_EVERY`] and never while another sweep is under way. The
    /// records stay in the table, marked as swept, until
    /// [`deleted`](Self::deleted) confirms each.
    pub(crate) fn sweep(&self, now: Instant) -> Option<Sweep<'_>> {
        {
            let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < SWEEP_EVERY) {
                return None;
            }
            if self.sweeping.swap(true, Ordering::AcqRel) {
                return None;
            }
            *last = Some(now);
        }
        let mut table = self.table();
        let lapsed = table
            .keys
            .iter_mut()
            .filter(|(_, h)| h.until <= now)
            .map(|(k, h)| {
                h.swept = true;
                (k.clone(), h.clone())
            })
            .collect();
        Some(Sweep { keys: self, lapsed })
    }

    /// A delete of the record `generation` of `key` was answered: etcd
    /// holds nothing of it any more. A later record of the key stays.
    pub(crate) fn deleted(&self, key: &[u8], generation: u64) {
        let mut table = self.table();
        if table
            .keys
            .get(key)
            .is_some_and(|h| h.generation == generation)
        {
            table.keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(keys: &HeldKeys) -> usize {
        keys.table().keys.len()
    }

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
        let sweep = keys.sweep(later).unwrap();
        assert_eq!(sweep.lapsed.len(), 1);
        assert_eq!(sweep.lapsed[0].0, b"a");
        keys.deleted(b"a", sweep.lapsed[0].1.generation);
        keys.forget(b"b", 6);
        assert_eq!(len(&keys), 0);
    }

    #[test]
    fn a_swept_key_stays_until_its_delete_is_confirmed() {
        let keys = HeldKeys::default();
        let t0 = Instant::now();
        keys.hold(b"a".to_vec(), 1, Some(5), vec![], t0);
        let at = |n| t0 + SWEEP_EVERY * n;
        // A sweep whose delete failed, or whose call was dropped, leaves the
        // record for the next one, and its hold can no longer be renewed.
        let first = keys.sweep(at(1)).unwrap();
        assert_eq!(first.lapsed.len(), 1);
        assert!(keys.sweep(at(2)).is_none(), "one sweep at a time");
        drop(first);
        assert!(!keys.renewed(b"a", 5, at(10)));
        assert!(!keys.renewed_past(b"a", 5, t0));
        let second = keys.sweep(at(3)).unwrap();
        assert_eq!(second.lapsed.len(), 1);
        let generation = second.lapsed[0].1.generation;
        // Re-acquired meanwhile: the confirmed delete was of the old hold.
        keys.hold(b"a".to_vec(), 1, Some(9), vec![], at(20));
        keys.deleted(b"a", generation);
        assert_eq!(len(&keys), 1);
        assert!(keys.renewed(b"a", 9, at(20)));
        drop(second);
        assert!(keys.sweep(at(4)).unwrap().lapsed.is_empty());
    }

    #[test]
    fn a_release_is_due_for_the_sweep_at_once() {
        let keys = HeldKeys::default();
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(30);
        keys.hold(b"a".to_vec(), 1, Some(5), vec![], until);
        keys.hold(b"b".to_vec(), 1, Some(6), vec![], until);
        keys.releasing(b"a", 5, t0);
        // Another token's release leaves the hold alone.
        keys.releasing(b"b", 7, t0);
        assert!(!keys.renewed(b"a", 5, until));
        let sweep = keys.sweep(t0 + SWEEP_EVERY).unwrap();
        let swept: Vec<&[u8]> = sweep.lapsed.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(swept, [b"a".as_slice()]);
        assert!(keys.renewed(b"b", 6, until));
    }
}
