//! The checker on histories written by hand: each property holds on a
//! correct history and fails on one broken step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lease_history::{
    Ambiguity, Fault, FaultKind, History, Logged, Op, OpKind, Outcome, Property, Restart, Rewind,
    check, render_svg,
};

const TTL: Duration = Duration::from_millis(100);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Builds histories one operation at a time, ids in order.
#[derive(Default)]
struct H {
    history: History,
    /// The epoch of the clients the next operations go through.
    epoch: u32,
}

impl H {
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        owner: &str,
        kind: OpKind,
        token: Option<u64>,
        invoked: u64,
        completed: u64,
        outcome: Outcome,
    ) -> u64 {
        let id = self.history.ops.len() as u64;
        self.history.ops.push(Op {
            id,
            worker: owner.trim_start_matches('w').parse().unwrap_or(0),
            owner: owner.into(),
            session: "s0".into(),
            kind,
            token,
            invoked: ms(invoked),
            completed: ms(completed),
            outcome,
            epoch: self.epoch,
        });
        id
    }

    /// Every client restarted at `at`: later operations are of the next
    /// epoch.
    fn restart(&mut self, at: u64) -> u32 {
        self.epoch += 1;
        self.history.restarts.push(Restart {
            epoch: self.epoch,
            at: ms(at),
        });
        self.epoch
    }

    /// `what` (leases, store or both) went back between `from` and `to`
    /// to a copy taken between `copied` and `copied + 1`, accepted by
    /// `accepted_by`.
    fn rewind(&mut self, leases: bool, store: bool, copied: u64, from: u64, to: u64) -> usize {
        self.history.rewinds.push(Rewind {
            target: "redis".into(),
            leases,
            store,
            copy_started: ms(copied),
            copy_ended: ms(copied + 1),
            started: ms(from),
            ended: ms(to),
            accepted_by: None,
        });
        self.history.faults.push(Fault {
            kind: FaultKind::Rewind,
            target: "redis".into(),
            started: ms(from),
            ended: ms(to),
        });
        self.history.rewinds.len() - 1
    }

    fn accept(&mut self, rewind: usize, at: u64) {
        let epoch = self.restart(at);
        self.history.rewinds[rewind].accepted_by = Some(epoch);
    }

    fn acquire(&mut self, owner: &str, at: u64, token: u64) -> u64 {
        self.op(owner, OpKind::Acquire, None, at, at + 1, granted(token))
    }

    fn renew(&mut self, owner: &str, at: u64, token: u64, answered: Outcome) -> u64 {
        self.op(owner, OpKind::Renew, Some(token), at, at + 1, answered)
    }

    fn release(&mut self, owner: &str, at: u64, token: u64) -> u64 {
        self.op(
            owner,
            OpKind::Release,
            Some(token),
            at,
            at + 1,
            Outcome::Done,
        )
    }

    fn write(&mut self, owner: &str, at: u64, token: u64, outcome: Outcome) -> u64 {
        self.op(owner, OpKind::Write, Some(token), at, at + 1, outcome)
    }

    fn log(&mut self, ops: &[u64]) {
        let log = ops
            .iter()
            .enumerate()
            .map(|(i, &op)| Logged {
                seq: i as u64 + 1,
                op,
            })
            .collect();
        self.history.store_logs.insert("s0".into(), log);
    }
}

fn granted(token: u64) -> Outcome {
    Outcome::Granted {
        token,
        valid_for: TTL,
    }
}

/// A takeover after expiry, a stale write refused, a release, another
/// takeover: everything as it should be.
fn correct() -> (H, Vec<u64>) {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    let a = h.write("w1", 10, 1, Outcome::Done);
    h.renew("w1", 50, 1, granted(1));
    let b = h.write("w1", 60, 1, Outcome::Done);
    // w1 pauses; its grant (invoked at 50) ends at 150.
    h.acquire("w2", 151, 2);
    let c = h.write("w2", 160, 2, Outcome::Done);
    h.write("w1", 170, 1, Outcome::Fenced);
    h.renew("w1", 180, 1, Outcome::Held);
    h.release("w2", 200, 2);
    h.acquire("w1", 202, 3);
    let d = h.write("w1", 210, 3, Outcome::Done);
    (h, vec![a, b, c, d])
}

#[test]
fn a_correct_history_is_clean() {
    let (mut h, landed) = correct();
    h.log(&landed);
    let verdict = check(&h.history);
    assert!(verdict.is_clean(), "{verdict}");
    assert_eq!(verdict.ops, h.history.ops.len());
    assert!(verdict.first.is_none());
}

#[test]
fn a_takeover_before_expiry_breaks_single_holder() {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    let late = h.acquire("w2", 90, 2); // w1 holds until 100
    h.log(&[]);
    let v = check(&h.history);
    assert_eq!(v.count(Property::SingleHolder), 1, "{v}");
    let first = v.first.unwrap();
    assert_eq!(first.property, Property::SingleHolder);
    assert!(first.ops.contains(&late));
    assert!(first.context.contains(">>"), "{}", first.context);
    assert_eq!(v.ops_to_first, Some(2));
}

#[test]
fn a_hold_starts_at_completion_and_ends_at_release() {
    // w1's grant comes back at 95 although invoked at 0; w2's at 120:
    // holds 95..100 and 120.. do not overlap.
    let mut h = H::default();
    h.op("w1", OpKind::Acquire, None, 0, 95, granted(1));
    h.op("w2", OpKind::Acquire, None, 30, 120, granted(2));
    // w2 (grant counted from 30, so until 130) releases at 125; w3 takes
    // over at 126: no overlap either.
    h.release("w2", 125, 2);
    h.acquire("w3", 126, 3);
    assert!(check(&h.history).is_clean());
    // Without the release, w3 overlaps w2.
    h.history.ops.retain(|op| op.kind != OpKind::Release);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
}

#[test]
fn ambiguous_grants_are_not_holds() {
    let mut h = H::default();
    h.op(
        "w1",
        OpKind::Acquire,
        None,
        0,
        2000,
        Outcome::Ambiguous(Ambiguity::Timeout),
    );
    h.acquire("w2", 10, 2);
    assert!(check(&h.history).is_clean());
}

#[test]
fn a_forward_clock_step_shortens_holds_and_a_backward_one_lengthens_them() {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 60, 2); // 60 < 100: overlap without a step
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
    h.history.faults.push(Fault {
        kind: FaultKind::ClockForward(ms(50)),
        target: "authority".into(),
        started: ms(20),
        ended: ms(21),
    });
    // The authority's clock reached 100ms of grant at 50ms.
    let v = check(&h.history);
    assert!(v.is_clean(), "{v}");
    assert_eq!(v.faults.get("clock-forward"), Some(&1));

    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 120, 2);
    assert!(check(&h.history).is_clean());
    h.history.faults.push(Fault {
        kind: FaultKind::ClockBackward(ms(50)),
        target: "authority".into(),
        started: ms(10),
        ended: ms(20),
    });
    // Now w1's grant lasts until 150.
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
}

#[test]
fn a_step_recorded_across_a_grant_counts_only_as_it_could_shorten_the_hold() {
    let step = |kind, started, ended| Fault {
        kind,
        target: "authority".into(),
        started: ms(started),
        ended: ms(ended),
    };
    // Granted 0..1 for 100ms; w2 takes over at 120.
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 120, 2);
    assert!(check(&h.history).is_clean());
    // A backward step recorded from before the grant completed may have
    // come before the grant read the clock: it lengthens nothing.
    h.history
        .faults
        .push(step(FaultKind::ClockBackward(ms(50)), 0, 30));
    let v = check(&h.history);
    assert!(v.is_clean(), "{v}");
    // Recorded wholly after the grant, it lengthens the hold to 150.
    h.history.faults[0] = step(FaultKind::ClockBackward(ms(50)), 5, 30);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);

    // Granted 10..11 for 100ms; w2 takes over at 70.
    let mut h = H::default();
    h.acquire("w1", 10, 1);
    h.acquire("w2", 70, 2);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
    // A forward step recorded from before the invocation to after it may
    // have come after the grant read the clock: it shortens the hold.
    h.history
        .faults
        .push(step(FaultKind::ClockForward(ms(50)), 5, 12));
    let v = check(&h.history);
    assert!(v.is_clean(), "{v}");
    // Recorded wholly before the invocation, the grant already saw it.
    h.history.faults[0] = step(FaultKind::ClockForward(ms(50)), 5, 9);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
}

#[test]
fn a_renewal_replaces_the_expiry_it_renews_even_when_sooner() {
    // Granted 0..1 for 100ms; the authority's clock then steps back 200ms,
    // so that grant would last until 300.
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.history.faults.push(Fault {
        kind: FaultKind::ClockBackward(ms(200)),
        target: "authority".into(),
        started: ms(5),
        ended: ms(6),
    });
    h.acquire("w2", 200, 2);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
    // Renewed at 50, on the stepped clock, for 100ms: the lease now ends
    // at 150, and w2's takeover at 200 is the backend's right.
    h.renew("w1", 50, 1, granted(1));
    let v = check(&h.history);
    assert!(v.is_clean(), "{v}");
}

#[test]
fn a_fast_authority_clock_shortens_holds_and_a_slow_one_lengthens_them() {
    let rate = |per_mille, started, ended| Fault {
        kind: FaultKind::ClockRate(per_mille),
        target: "authority".into(),
        started: ms(started),
        ended: ms(ended),
    };
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 60, 2);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
    // At twice real time, 100ms of grant passed by 50ms.
    h.history.faults.push(rate(2000, 0, 200));
    let v = check(&h.history);
    assert!(v.is_clean(), "{v}");
    assert_eq!(v.faults.get("clock-fast"), Some(&1));
    // A spell that ended at 30 leaves 40ms of grant at the normal rate,
    // up to 70.
    h.history.faults[0] = rate(2000, 0, 30);
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);

    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 120, 2);
    assert!(check(&h.history).is_clean());
    // At half real time from 10ms, the last 90ms of grant take 180ms.
    h.history.faults.push(rate(500, 10, 1000));
    let v = check(&h.history);
    assert_eq!(v.count(Property::SingleHolder), 1, "{v}");
    assert_eq!(v.faults.get("clock-slow"), Some(&1));
}

#[test]
fn tokens_must_rise_on_takeover() {
    let mut h = H::default();
    h.acquire("w1", 0, 5);
    h.release("w1", 10, 5);
    h.acquire("w2", 20, 5);
    let v = check(&h.history);
    assert_eq!(v.count(Property::TokenOrder), 1, "{v}");
    assert!(v.first.unwrap().message.contains("token 5 granted to w2"));

    let mut h = H::default();
    h.acquire("w1", 0, 5);
    h.release("w1", 10, 5);
    h.acquire("w2", 20, 4);
    assert_eq!(check(&h.history).count(Property::TokenOrder), 1);

    // Concurrent grants are not ordered: nothing to say.
    let mut h = H::default();
    h.op("w1", OpKind::Acquire, None, 0, 30, Outcome::Held);
    h.op("w2", OpKind::Acquire, None, 0, 30, granted(4));
    h.op("w1", OpKind::Acquire, None, 10, 200, granted(3));
    assert_eq!(check(&h.history).count(Property::TokenOrder), 0);
}

#[test]
fn a_renewal_keeps_its_token_and_fails_after_a_takeover() {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.renew("w1", 10, 1, granted(2));
    let v = check(&h.history);
    assert_eq!(v.count(Property::TokenOrder), 1, "{v}");

    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 150, 2);
    h.renew("w1", 160, 1, granted(1)); // loss ignored
    let v = check(&h.history);
    assert!(v.count(Property::TokenOrder) >= 1, "{v}");
    assert!(v.count(Property::SingleHolder) >= 1, "{v}");
}

#[test]
fn an_owner_never_goes_back_to_a_lower_token() {
    let mut h = H::default();
    h.acquire("w1", 0, 7);
    h.acquire("w1", 10, 3);
    assert_eq!(check(&h.history).count(Property::TokenOrder), 1);
}

#[test]
fn the_store_must_refuse_lower_and_foreign_equal_tokens() {
    // A lower token after a higher one.
    let (mut h, mut landed) = correct();
    let stale = h.write("w2", 220, 2, Outcome::Done);
    landed.push(stale);
    h.log(&landed);
    let v = check(&h.history);
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
    assert!(v.first.unwrap().message.contains("after accepting token 3"));

    // An equal token from another owner.
    let (mut h, mut landed) = correct();
    landed.push(h.write("w9", 220, 3, Outcome::Done));
    h.log(&landed);
    let v = check(&h.history);
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
    assert!(v.first.unwrap().message.contains("belongs to w1"));

    // The same owner again with the mark's token is fine.
    let (mut h, mut landed) = correct();
    landed.push(h.write("w1", 220, 3, Outcome::Done));
    h.log(&landed);
    assert!(check(&h.history).is_clean());
}

#[test]
fn the_store_keeps_what_it_acknowledged_and_nothing_it_refused() {
    let (mut h, mut landed) = correct();
    landed.pop();
    h.log(&landed);
    let v = check(&h.history);
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
    assert!(v.first.unwrap().message.contains("acknowledged"));

    let (mut h, mut landed) = correct();
    let refused = h.write("w1", 220, 3, Outcome::Fenced);
    landed.push(refused);
    h.log(&landed);
    let v = check(&h.history);
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
}

#[test]
fn an_ambiguous_write_counts_exactly_when_it_landed() {
    // w1's write timed out; it landed after w2's (token 2) was accepted.
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    let lost = h.op(
        "w1",
        OpKind::Write,
        Some(1),
        10,
        2010,
        Outcome::Ambiguous(Ambiguity::Timeout),
    );
    h.acquire("w2", 200, 2);
    let ok = h.write("w2", 210, 2, Outcome::Done);
    h.log(&[lost, ok]);
    assert!(check(&h.history).is_clean());
    h.log(&[ok]);
    assert!(check(&h.history).is_clean());
    h.log(&[ok, lost]);
    assert_eq!(check(&h.history).count(Property::StoreFencing), 1);
}

#[test]
fn the_store_order_must_agree_with_real_time() {
    let (mut h, landed) = correct();
    let mut swapped = landed.clone();
    swapped.swap(0, 1);
    h.log(&swapped);
    let v = check(&h.history);
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
    assert!(v.first.unwrap().message.contains("began only after"));
}

#[test]
fn the_first_violation_is_the_earliest_and_drawn() {
    let mut h = H::default();
    h.acquire("w1", 0, 5);
    h.acquire("w2", 50, 6); // overlap at 51
    h.release("w2", 60, 6);
    h.acquire("w3", 200, 6); // token reuse at 201
    h.log(&[]);
    let v = check(&h.history);
    assert_eq!(v.total(), 2, "{v}");
    let first = v.first.as_ref().unwrap();
    assert_eq!(first.property, Property::SingleHolder);
    assert_eq!(first.at, ms(51));
    let text = v.to_string();
    assert!(text.contains("first violation (single-holder"), "{text}");
    assert!(text.contains("violations: 2"), "{text}");

    let svg = render_svg(&h.history, &v);
    assert!(svg.starts_with("<svg"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains(r#"stroke="red""#));
    assert!(!svg.contains("http://") || svg.matches("http://").count() == 1);
    let lanes = ["s0 w1", "s0 w2", "s0 w3"];
    for lane in lanes {
        assert!(svg.contains(lane), "lane {lane} missing");
    }
}

#[test]
fn sessions_are_checked_apart() {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 10, 1);
    h.history.ops[1].session = Arc::from("s1");
    h.history.store_logs = BTreeMap::new();
    assert!(check(&h.history).is_clean());
}

#[test]
fn the_report_lists_the_faults_around_the_first_violation() {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.acquire("w2", 60, 2);
    h.history.faults.push(Fault {
        kind: FaultKind::ServiceKill,
        target: "etcd-0 (leader)".into(),
        started: ms(30),
        ended: ms(40),
    });
    h.history.faults.push(Fault {
        kind: FaultKind::ProxyDrop,
        target: "long before".into(),
        started: Duration::ZERO,
        ended: Duration::ZERO,
    });
    h.history.ops.iter_mut().for_each(|op| {
        op.invoked += Duration::from_secs(10);
        op.completed += Duration::from_secs(10);
    });
    h.history.faults[0].started += Duration::from_secs(10);
    h.history.faults[0].ended += Duration::from_secs(10);
    let v = check(&h.history);
    let context = &v.first.as_ref().unwrap().context;
    assert!(
        context.contains("service-kill on etcd-0 (leader)"),
        "{context}"
    );
    assert!(!context.contains("long before"), "{context}");
}

#[test]
fn a_write_the_store_holds_twice_is_caught() {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    let a = h.write("w1", 10, 1, Outcome::Done);
    let b = h.write("w1", 20, 1, Outcome::Done);
    h.log(&[a, b]);
    assert!(check(&h.history).is_clean());
    h.log(&[a, a, b]);
    let v = check(&h.history);
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
    assert!(v.first.unwrap().message.contains("twice"));
}

#[test]
fn a_release_in_doubt_may_end_the_same_lease_acquired_again() {
    // w1 releases token 1 without an answer, acquires its live lease again
    // (same token), and w2 takes over: the late release may have landed
    // after the re-acquire, which then held nothing.
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.op(
        "w1",
        OpKind::Release,
        Some(1),
        10,
        40,
        Outcome::Ambiguous(Ambiguity::Timeout),
    );
    h.op("w1", OpKind::Acquire, None, 41, 42, granted(1));
    h.acquire("w2", 60, 2);
    let v = check(&h.history);
    assert!(v.is_clean(), "{v}");
    // Answered before the re-acquire, the release cannot land after it.
    h.history.ops[1].outcome = Outcome::Done;
    assert_eq!(check(&h.history).count(Property::SingleHolder), 1);
}

/// Redis, holding leases and store, restarted from a snapshot taken at 40:
/// the old clients are refused, then restarted to accept the older state,
/// whose tokens and marks are below what they had used.
fn rewound_and_accepted() -> (H, Vec<u64>, usize) {
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    let a = h.write("w1", 10, 1, Outcome::Done);
    h.release("w1", 20, 1);
    h.acquire("w2", 30, 2);
    let b = h.write("w2", 35, 2, Outcome::Done);
    // The snapshot (40..41) holds a and b; c, d and token 3 come after it.
    let c = h.write("w2", 45, 2, Outcome::Done);
    h.release("w2", 50, 2);
    h.acquire("w1", 60, 3);
    let d = h.write("w1", 70, 3, Outcome::Done);
    let rewind = h.rewind(true, true, 40, 80, 90);
    // The clients that saw token 3 are refused by the older state.
    h.write("w1", 95, 3, Outcome::Rewound);
    h.renew("w1", 96, 3, Outcome::Rewound);
    h.op("w2", OpKind::Acquire, None, 97, 98, Outcome::Rewound);
    h.accept(rewind, 100);
    // The new clients start from the snapshot: token 3 is issued again.
    h.acquire("w2", 110, 3);
    let e = h.write("w2", 120, 3, Outcome::Done);
    let _ = (c, d);
    (h, vec![a, b, e], rewind)
}

#[test]
fn a_rewind_accepted_by_restarted_clients_is_clean() {
    let (mut h, landed, _) = rewound_and_accepted();
    h.log(&landed);
    let verdict = check(&h.history);
    assert!(verdict.is_clean(), "{verdict}");
    assert_eq!(verdict.faults["rewind"], 1);
}

#[test]
fn a_client_from_before_the_rewind_must_not_succeed_after_it() {
    let (mut h, mut landed, _) = rewound_and_accepted();
    // An old client's write lands on the older state between the rewind
    // and the restart: it presented token 3, which the older state never
    // issued.
    h.epoch = 0;
    let stale = h.write("w1", 92, 3, Outcome::Done);
    landed.insert(2, stale);
    h.log(&landed);
    let verdict = check(&h.history);
    assert_eq!(verdict.count(Property::Rewound), 1, "{verdict}");
    let first = verdict.first.expect("a violation");
    assert_eq!(first.property, Property::Rewound);
    assert_eq!(first.ops, vec![stale]);
    assert!(first.message.contains("epoch 0"), "{}", first.message);

    // So must its lease calls; a refusal or an unknown fate is no success.
    let (mut h, landed, _) = rewound_and_accepted();
    h.epoch = 0;
    let renewed = h.renew("w1", 93, 3, granted(3));
    h.renew("w1", 94, 3, Outcome::Ambiguous(Ambiguity::Timeout));
    h.log(&landed);
    let verdict = check(&h.history);
    assert_eq!(verdict.count(Property::Rewound), 1, "{verdict}");
    assert_eq!(verdict.first.expect("a violation").ops, vec![renewed]);
}

#[test]
fn a_call_begun_before_the_rewind_ended_may_succeed_on_the_newer_state() {
    let (mut h, landed, _) = rewound_and_accepted();
    // Invoked at 85, while Redis was going back: it may have been done
    // before, and its loss is the accepted one.
    h.epoch = 0;
    h.op(
        "w1",
        OpKind::Renew,
        Some(3),
        85,
        86,
        Outcome::Granted {
            token: 3,
            valid_for: TTL,
        },
    );
    // A release gives up the caller's own hold: where the older state has
    // none it succeeds doing nothing.
    h.op("w2", OpKind::Release, Some(2), 91, 92, Outcome::Done);
    h.log(&landed);
    let verdict = check(&h.history);
    assert!(verdict.is_clean(), "{verdict}");
}

#[test]
fn only_an_accepted_store_rewind_excuses_lost_writes() {
    // Accepted: c and d, done after the copy began, may be gone.
    let (mut h, landed, rewind) = rewound_and_accepted();
    h.log(&landed);
    assert!(check(&h.history).is_clean());
    // Never accepted (nobody noticed the store went back): they count.
    h.history.rewinds[rewind].accepted_by = None;
    let verdict = check(&h.history);
    assert!(verdict.count(Property::StoreFencing) >= 2, "{verdict}");
    // A write done before the copy began must be kept, accepted or not.
    let (mut h, landed, _) = rewound_and_accepted();
    h.log(&landed[1..]);
    let verdict = check(&h.history);
    assert_eq!(verdict.count(Property::StoreFencing), 1, "{verdict}");
    assert!(
        verdict
            .first
            .expect("a violation")
            .message
            .contains("acknowledged but the store does not hold it")
    );
    // A rewind of the lease authority alone excuses no lost write.
    let (mut h, landed, rewind) = rewound_and_accepted();
    h.history.rewinds[rewind].store = false;
    h.log(&landed);
    let verdict = check(&h.history);
    assert!(verdict.count(Property::StoreFencing) >= 2, "{verdict}");
}

#[test]
fn holds_and_tokens_are_judged_per_era_between_accepted_rewinds() {
    // Token 3 issued again after the accepted rewind: no token-order
    // violation, since the clients that saw it are gone.
    let (h, _, rewind) = rewound_and_accepted();
    assert!(check(&h.history).is_clean());
    // The same history with the restart accepting nothing: one era, and
    // token 3 issued twice to two owners is caught.
    let mut h = h;
    h.history.rewinds[rewind].accepted_by = None;
    let verdict = check(&h.history);
    assert!(verdict.count(Property::TokenOrder) >= 1, "{verdict}");
    // A restart alone (no rewind) splits nothing: a takeover before expiry
    // across it is still two holders.
    let mut h = H::default();
    h.acquire("w1", 0, 1);
    h.restart(20);
    h.acquire("w2", 30, 2);
    let verdict = check(&h.history);
    assert_eq!(verdict.count(Property::SingleHolder), 1, "{verdict}");
}

#[test]
fn nothing_may_succeed_while_the_authority_may_evict() {
    let evicting = |h: &mut H| {
        h.history.faults.push(Fault {
            kind: FaultKind::EvictingPolicy,
            target: "redis (allkeys-lru)".into(),
            started: ms(100),
            ended: ms(200),
        });
    };
    // Refused throughout; a call invoked just before may still succeed.
    let mut h = H::default();
    evicting(&mut h);
    h.acquire("w1", 95, 1);
    let a = h.write("w1", 99, 1, Outcome::Done);
    h.write("w1", 120, 1, Outcome::Rewound);
    h.renew("w1", 130, 1, Outcome::Rewound);
    h.op("w2", OpKind::Acquire, None, 150, 151, Outcome::Rewound);
    h.acquire("w2", 300, 2);
    h.log(&[a]);
    let verdict = check(&h.history);
    assert!(verdict.is_clean(), "{verdict}");
    assert_eq!(verdict.faults["evicting-policy"], 1);
    // One grant in the window is one violation.
    let mut h = H::default();
    evicting(&mut h);
    let taken = h.acquire("w2", 150, 2);
    let verdict = check(&h.history);
    assert_eq!(verdict.count(Property::Rewound), 1, "{verdict}");
    assert_eq!(verdict.first.expect("a violation").ops, vec![taken]);
}

#[test]
fn a_grant_to_the_same_owner_under_a_new_token_replaces_its_earlier_one() {
    // w3 holds token 17; an acquire above a store's mark answers it token
    // 38 for the same session: the authority keeps one grant per owner,
    // so 17 ends there, and w1 may take over once 38 is released.
    let mut h = H::default();
    h.acquire("w3", 0, 17);
    h.acquire("w3", 10, 38);
    h.release("w3", 20, 38);
    h.acquire("w1", 30, 39);
    let verdict = check(&h.history);
    assert!(verdict.is_clean(), "{verdict}");
    // Another owner's grant still overlaps it.
    let mut h = H::default();
    h.acquire("w3", 0, 17);
    h.acquire("w1", 10, 18);
    let verdict = check(&h.history);
    assert_eq!(verdict.count(Property::SingleHolder), 1, "{verdict}");
}
