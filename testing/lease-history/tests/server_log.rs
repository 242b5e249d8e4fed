//! The end-to-end checker on hand-made store contents: a clean log passes,
//! and each broken one is caught under the property it breaks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lease_history::server_log::{
    EffectAttempt, Request, RequestKind, SeenEvent, SeenRun, StoredEvent,
};
use lease_history::{Property, ServerHistory, check_server, server_timeline, write_svg};
use serde_json::{Value, json};

/// Builds one session's log event by event, stamping sequence numbers and
/// times in order.
struct Log {
    events: Vec<StoredEvent>,
}

impl Log {
    fn new() -> Self {
        Log { events: Vec::new() }
    }

    fn push(&mut self, token: Option<u64>, writer: &str, payload: Value) -> &mut Self {
        let seq = self.events.len() as u64 + 1;
        self.events.push(StoredEvent {
            seq,
            token,
            writer: Some(writer.into()),
            at: Duration::from_millis(10 * seq),
            payload,
        });
        self
    }

    /// A whole run of `steps` progress steps under `token` by `writer`.
    fn run(&mut self, token: u64, writer: &str, steps: u64, input: &str) -> &mut Self {
        self.push(Some(token), writer, started(token, writer));
        for step in 1..=steps {
            self.push(Some(token), writer, progress(step, steps));
        }
        self.push(Some(token), writer, message(input))
            .push(Some(token), writer, ended("completed"))
    }
}

fn started(token: u64, owner: &str) -> Value {
    json!({"type": "run_started", "owner": owner.split('#').next(), "token": token})
}

fn progress(step: u64, of: u64) -> Value {
    json!({"type": "progress", "step": step, "of": of})
}

fn message(input: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": input})
}

fn ended(status: &str) -> Value {
    json!({"type": "run_ended", "status": status})
}

fn history(log: &Log) -> ServerHistory {
    ServerHistory {
        requests: Vec::new(),
        faults: Vec::new(),
        logs: BTreeMap::from([(Arc::from("s0"), log.events.clone())]),
        effects: Vec::new(),
    }
}

/// A run request answered with the run's events `seqs` of `log`.
fn acked(log: &Log, id: u64, seqs: std::ops::RangeInclusive<u64>, token: u64) -> Request {
    let events = log
        .events
        .iter()
        .filter(|e| seqs.contains(&e.seq))
        .map(|e| SeenEvent {
            seq: e.seq,
            token: e.token,
            payload: e.payload.clone(),
        })
        .collect();
    Request {
        id,
        client: 1,
        replica: "replica-0".into(),
        session: "s0".into(),
        kind: RequestKind::Run,
        invoked: Duration::from_millis(1),
        completed: Duration::from_millis(500),
        status: Some(200),
        outcome: "completed".into(),
        events: Vec::new(),
        run: Some(SeenRun {
            token: Some(token),
            status: "completed".into(),
            events,
        }),
    }
}

#[test]
fn runs_one_after_another_under_rising_tokens_are_clean() {
    let mut log = Log::new();
    log.run(3, "a#1", 2, "one")
        .run(3, "a#1", 2, "two")
        .run(7, "b#1", 3, "three");
    // A run that lost its lease stops without its end; the next owner ends
    // it as interrupted, then runs.
    log.push(Some(8), "c#1", started(8, "c#1"))
        .push(Some(8), "c#1", progress(1, 2))
        .push(Some(9), "a#2", takeover(9, "a"))
        .push(Some(9), "a#2", interrupted(17, 8))
        .run(9, "a#2", 1, "four");
    let mut h = history(&log);
    h.requests.push(acked(&log, 1, 1..=5, 3));
    h.requests.push(acked(&log, 2, 11..=16, 7));
    let v = check_server(&h);
    assert!(v.is_clean(), "{v}");
    assert_eq!(v.ops, 2);
}

#[test]
fn a_lower_token_after_a_higher_one_is_a_fencing_violation() {
    let mut log = Log::new();
    log.run(5, "b#1", 1, "new")
        .push(Some(4), "a#1", progress(2, 2));
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
    let first = v.first.expect("a violation");
    assert_eq!(first.property, Property::StoreFencing);
    assert!(first.message.contains("below token 5"), "{}", first.message);
    assert!(first.context.contains(">> seq 5"), "{}", first.context);
}

#[test]
fn one_token_written_by_two_writers_is_a_fencing_violation() {
    let mut log = Log::new();
    log.run(5, "a#1", 1, "first").run(5, "a#2", 1, "second");
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
    assert!(v.first.as_ref().unwrap().message.contains("two writers"));
}

#[test]
fn an_earlier_runs_event_after_a_later_run_started_is_a_run_order_violation() {
    // Unfenced writers (no token, no writer recorded): only the shape of
    // the runs tells them apart.
    let mut log = Log::new();
    let mut unfenced = |payload: Value| {
        let seq = log.events.len() as u64 + 1;
        log.events.push(StoredEvent {
            seq,
            token: None,
            writer: None,
            at: Duration::from_millis(seq),
            payload,
        });
    };
    unfenced(json!({"type": "run_started", "owner": "a", "token": null}));
    unfenced(progress(1, 3));
    unfenced(json!({"type": "run_started", "owner": "b", "token": null}));
    unfenced(progress(2, 3));
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::RunOrder), 1, "{v}");
    // And the later run started while the earlier had no end.
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
    assert_eq!(v.ops_to_first_by.len(), 2, "{v}");
}

#[test]
fn an_earlier_runs_end_after_a_later_run_started_is_a_run_order_violation() {
    let mut log = Log::new();
    log.push(Some(2), "a#1", started(2, "a"))
        .push(Some(2), "a#1", progress(1, 1))
        .push(Some(3), "b#1", started(3, "b"))
        .push(Some(2), "a#1", ended("completed"));
    let v = check_server(&history(&log));
    // Also a lower token after a higher one: a fault both ways.
    assert_eq!(v.count(Property::RunOrder), 1, "{v}");
    assert_eq!(v.count(Property::StoreFencing), 1, "{v}");
}

#[test]
fn a_lost_acknowledged_run_is_a_log_integrity_violation() {
    let mut log = Log::new();
    log.run(3, "a#1", 2, "kept");
    let mut h = history(&log);
    // The client was answered with a run the store does not hold whole:
    // its last two events were lost.
    let mut run = acked(&log, 9, 1..=5, 3);
    let lost = vec![
        SeenEvent {
            seq: 6,
            token: Some(3),
            payload: message("lost"),
        },
        SeenEvent {
            seq: 7,
            token: Some(3),
            payload: ended("completed"),
        },
    ];
    run.run.as_mut().unwrap().events.extend(lost);
    h.requests.push(run);
    let v = check_server(&h);
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
    let first = v.first.unwrap();
    assert!(
        first.message.contains("not stored whole"),
        "{}",
        first.message
    );
    assert!(first.context.contains(">> req #9"), "{}", first.context);
}

#[test]
fn an_acknowledged_run_stored_with_another_runs_event_inside_is_caught() {
    let mut log = Log::new();
    log.run(3, "a#1", 1, "mine");
    let mut h = history(&log);
    let mut run = acked(&log, 4, 1..=4, 3);
    // The client saw seq 3 as its message; the store holds another one.
    run.run.as_mut().unwrap().events[2].payload = message("someone else's");
    h.requests.push(run);
    let v = check_server(&h);
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
}

#[test]
fn gaps_and_orphans_are_log_integrity_violations() {
    let mut log = Log::new();
    log.push(Some(1), "a#1", progress(1, 1));
    log.run(2, "a#1", 1, "x");
    log.events.last_mut().unwrap().seq = 9;
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::LogIntegrity), 2, "{v}");
}

#[test]
fn the_timeline_of_a_violation_is_drawn() {
    let mut log = Log::new();
    log.run(5, "b#1", 1, "new")
        .push(Some(4), "a#1", progress(2, 2));
    let mut h = history(&log);
    h.requests.push(acked(&log, 1, 1..=4, 5));
    let v = check_server(&h);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.svg");
    write_svg(&server_timeline(&h), &v, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.contains("first violation (store-fencing)"), "{svg}");
    assert!(
        svg.contains("stroke=\"red\""),
        "the violation is not outlined"
    );
}

fn takeover(token: u64, owner: &str) -> Value {
    json!({"type": "takeover", "owner": owner, "token": token})
}

fn interrupted(run_seq: u64, run_token: u64) -> Value {
    json!({"type": "run_ended", "status": "interrupted", "run_seq": run_seq, "run_token": run_token})
}

/// A run left open (its process died), then the next owner's takeover,
/// its `interrupted` end of that run, and its own run.
fn interrupted_log() -> Log {
    let mut log = Log::new();
    log.push(Some(3), "a#1", started(3, "a#1"))
        .push(Some(3), "a#1", progress(1, 4))
        .push(Some(7), "b#1", takeover(7, "b"))
        .push(Some(7), "b#1", interrupted(1, 3))
        .run(7, "b#1", 1, "next");
    log
}

#[test]
fn a_run_ended_as_interrupted_by_the_next_owner_is_clean() {
    let log = interrupted_log();
    let mut h = history(&log);
    // A follower of the first run saw it to its interrupted end.
    let mut seen = acked(&log, 1, 1..=4, 3);
    seen.kind = RequestKind::Follow;
    h.requests.push(seen);
    let v = check_server(&h);
    assert!(v.is_clean(), "{v}");
}

/// The owner of a run the next owner ended as interrupted writes on, as
/// two unfenced (unleased) replicas of one session would: that is an
/// earlier run's event after a later run started, not an orphan.
#[test]
fn an_interrupted_runs_owner_writing_on_is_a_run_order_violation() {
    let mut log = Log::new();
    log.push(
        None,
        "a#1",
        json!({"type": "run_started", "owner": "a", "token": null}),
    )
    .push(
        None,
        "b#1",
        json!({"type": "run_ended", "status": "interrupted", "run_seq": 1, "run_token": null}),
    )
    .push(
        None,
        "b#1",
        json!({"type": "run_started", "owner": "b", "token": null}),
    )
    .push(None, "b#1", progress(1, 2))
    .push(None, "a#1", progress(1, 2));
    for e in &mut log.events {
        e.writer = None;
    }
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::RunOrder), 1, "{v}");
    assert!(
        v.first
            .as_ref()
            .unwrap()
            .message
            .contains("belongs to run 0"),
        "{v}"
    );
}

#[test]
fn an_interrupted_end_of_a_run_that_ended_is_a_second_end() {
    let mut log = Log::new();
    log.run(3, "a#1", 1, "done")
        .push(Some(7), "b#1", takeover(7, "b"))
        .push(Some(7), "b#1", interrupted(1, 3))
        .run(7, "b#1", 1, "next");
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
    assert!(v.first.as_ref().unwrap().message.contains("as interrupted"));
}

#[test]
fn an_interrupted_end_naming_another_run_or_under_a_lower_token_is_caught() {
    for bad in [interrupted(2, 3), interrupted(1, 4)] {
        let mut log = interrupted_log();
        log.events[3].payload = bad;
        let v = check_server(&history(&log));
        // The end that ends nothing, and the next run starting while the
        // first still has no end.
        assert_eq!(v.count(Property::LogIntegrity), 2, "{v}");
    }
    let mut log = interrupted_log();
    log.events[3].token = Some(3);
    log.events[3].writer = Some("a#1".into());
    let v = check_server(&history(&log));
    assert!(v.count(Property::LogIntegrity) >= 1, "{v}");
}

#[test]
fn the_run_after_an_interrupted_one_ending_twice_is_caught() {
    let mut log = interrupted_log();
    log.push(Some(7), "b#1", ended("completed"));
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
}

#[test]
fn a_run_starting_while_the_last_one_has_no_end_is_caught() {
    let mut log = Log::new();
    log.push(Some(3), "a#1", started(3, "a#1"))
        .push(Some(3), "a#1", progress(1, 2))
        .run(7, "b#1", 1, "next");
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
    assert!(v.first.as_ref().unwrap().message.contains("has no end"));
}

/// A run with `input` left open, then the next owner's takeover and its
/// interrupted end announcing a resumption, and the resumption: its run
/// of the same input, to its end.
fn resumed_log() -> Log {
    let mut log = Log::new();
    let mut first = started(3, "a#1");
    first["input"] = json!("hello");
    log.push(Some(3), "a#1", first)
        .push(Some(3), "a#1", progress(1, 4))
        .push(Some(7), "b#1", takeover(7, "b"));
    let mut end = interrupted(1, 3);
    end["resumed"] = json!({"attempt": 1});
    let mut again = started(7, "b#1");
    again["input"] = json!("hello");
    again["resumes"] = json!({"run_seq": 1, "attempt": 1, "after_seq": 1, "run_token": 3});
    log.push(Some(7), "b#1", end)
        .push(Some(7), "b#1", again)
        .push(Some(7), "b#1", progress(1, 1))
        .push(Some(7), "b#1", message("hello"))
        .push(Some(7), "b#1", ended("completed"));
    log
}

#[test]
fn an_interrupted_run_resumed_once_on_its_input_is_clean() {
    let v = check_server(&history(&resumed_log()));
    assert!(v.is_clean(), "{v}");
}

#[test]
fn a_second_resumption_of_one_interruption_is_caught() {
    // A second replica that did not check whether the run was still open
    // ends it again and runs its input a second time.
    let mut log = resumed_log();
    let end = log.events[3].payload.clone();
    let again = log.events[4].payload.clone();
    log.push(Some(9), "c#1", takeover(9, "c"))
        .push(Some(9), "c#1", end)
        .push(Some(9), "c#1", again);
    let v = check_server(&history(&log));
    assert!(v.count(Property::LogIntegrity) >= 2, "{v}");
    assert!(
        v.first.as_ref().unwrap().message.contains("as interrupted"),
        "{}",
        v.first.as_ref().unwrap().message
    );
}

#[test]
fn a_resumption_on_another_input_or_attempt_or_unannounced_is_caught() {
    let tamper: [fn(&mut Log); 5] = [
        |log| log.events[4].payload["input"] = json!("other"),
        |log| log.events[4].payload["resumes"]["run_token"] = json!(2),
        |log| log.events[4].payload["resumes"]["attempt"] = json!(2),
        |log| log.events[4].payload["resumes"]["after_seq"] = json!(2),
        |log| log.events[3].payload["resumed"] = Value::Null,
    ];
    for (i, tamper) in tamper.iter().enumerate() {
        let mut log = resumed_log();
        tamper(&mut log);
        let v = check_server(&history(&log));
        assert_eq!(v.count(Property::LogIntegrity), 1, "variant {i}: {v}");
        assert!(
            v.first.as_ref().unwrap().message.contains("resume"),
            "variant {i}: {v}"
        );
    }
    // An end that announced a resumption, followed by a run of something
    // else.
    let mut log = resumed_log();
    log.events[4].payload["resumes"] = Value::Null;
    let v = check_server(&history(&log));
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
    assert!(
        v.first.as_ref().unwrap().message.contains("announced"),
        "{v}"
    );
}

#[test]
fn a_run_cut_off_by_shutdown_may_be_resumed_but_writes_nothing_after_its_cut() {
    let cut = json!({"type": "run_cut_off", "reason": "shutdown"});
    let resumed = |after_cut: bool| {
        let mut log = Log::new();
        let mut first = started(3, "a#1");
        first["input"] = json!("hello");
        log.push(Some(3), "a#1", first)
            .push(Some(3), "a#1", progress(1, 4))
            .push(Some(3), "a#1", cut.clone());
        if after_cut {
            log.push(Some(3), "a#1", progress(2, 4));
        }
        let mut end = interrupted(1, 3);
        end["resumed"] = json!({"attempt": 1});
        let mut again = started(7, "b#1");
        again["input"] = json!("hello");
        again["resumes"] =
            json!({"run_seq": 1, "attempt": 1, "after_seq": 1, "run_token": 3, "shutdowns": 1});
        log.push(Some(7), "b#1", takeover(7, "b"))
            .push(Some(7), "b#1", end)
            .push(Some(7), "b#1", again)
            .push(Some(7), "b#1", ended("completed"));
        log
    };
    let v = check_server(&history(&resumed(false)));
    assert!(v.is_clean(), "{v}");
    let v = check_server(&history(&resumed(true)));
    assert_eq!(v.count(Property::LogIntegrity), 1, "{v}");
}

/// An effect of the run at `run_id` of `s0` under `token`, judged at `at_ms`.
fn effect(token: u64, run_id: u64, key: &str, at_ms: u64, performed: bool) -> EffectAttempt {
    EffectAttempt {
        session: "s0".into(),
        token,
        run_id: Some(run_id),
        key: key.into(),
        at: Duration::from_millis(at_ms),
        performed,
        outcome: if performed { "performed" } else { "stale" }.into(),
    }
}

/// Two runs, at seq 1 (token 3) and seq 6 (token 7), and their effects.
fn two_runs_with(effects: Vec<EffectAttempt>) -> ServerHistory {
    let mut log = Log::new();
    log.run(3, "a#1", 2, "one").run(7, "b#1", 2, "two");
    ServerHistory {
        effects,
        ..history(&log)
    }
}

fn effect_violations(h: &ServerHistory) -> usize {
    check_server(h)
        .violations
        .get(&Property::EffectFencing)
        .copied()
        .unwrap_or(0)
}

#[test]
fn effects_fenced_at_their_destination_are_clean() {
    // Each key once, tokens rising; refused repeats and stale attempts
    // are what the fence is for, and the late owner's attempt that came
    // before the new owner's first one is beyond any fence.
    let h = two_runs_with(vec![
        effect(3, 1, "k3-a", 10, true),
        effect(3, 1, "k3-a", 11, false),
        effect(7, 6, "k7-a", 20, true),
        effect(3, 1, "k3-b", 21, false),
        effect(7, 6, "k7-b", 22, true),
    ]);
    assert_eq!(effect_violations(&h), 0, "{}", check_server(&h));
}

#[test]
fn a_key_performed_twice_is_caught() {
    let h = two_runs_with(vec![
        effect(7, 6, "k7-a", 20, true),
        effect(7, 6, "k7-a", 21, true),
    ]);
    let verdict = check_server(&h);
    assert_eq!(effect_violations(&h), 1, "{verdict}");
    let first = verdict.first.expect("a violation");
    assert!(
        first.message.contains("performed twice"),
        "{}",
        first.message
    );
}

#[test]
fn an_effect_of_a_lost_owner_after_a_later_ones_is_caught() {
    let h = two_runs_with(vec![
        effect(7, 6, "k7-a", 20, true),
        effect(3, 1, "k3-b", 21, true),
    ]);
    let verdict = check_server(&h);
    assert_eq!(effect_violations(&h), 1, "{verdict}");
    let first = verdict.first.expect("a violation");
    assert!(
        first.message.contains("after an effect of token 7"),
        "{}",
        first.message
    );
    // Both effects are shown, the stale one marked.
    assert!(
        first.context.contains(">>     21.000ms token 3"),
        "{}",
        first.context
    );
    assert!(first.context.contains("k7-a"), "{}", first.context);
}

#[test]
fn an_effect_naming_no_stored_run_is_caught() {
    // Run 6 holds token 7, not 8; no run starts at seq 2.
    let h = two_runs_with(vec![
        effect(8, 6, "k8-a", 20, true),
        effect(8, 2, "k8-b", 21, true),
    ]);
    assert_eq!(effect_violations(&h), 2, "{}", check_server(&h));
}
