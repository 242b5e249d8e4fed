//! Side effects fenced at their destination: what a downstream service,
//! guarding its effects with the run's token and idempotency key, was
//! asked and what it performed, checked against each other and against
//! the session's log.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::{Found, StoredEvent, kind, ms};
use crate::check::Property;

/// One request an agent sent to the service its effects go to, in the
/// order that service judged them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectAttempt {
    /// The session the run belongs to, as the agent named it.
    pub session: Arc<str>,
    /// The run's fencing token, as the agent sent it.
    pub token: u64,
    /// The run's id (the seq of its `run_started`), as the agent sent it.
    pub run_id: Option<u64>,
    /// The effect's idempotency key; empty when it was sent none.
    pub key: String,
    /// When the service judged it, on the history's timeline.
    pub at: Duration,
    /// Whether the service performed it; `false` with the refusal's name
    /// in `outcome`.
    pub performed: bool,
    /// The answer in a few words (`performed`, `stale`, `repeat`, …).
    pub outcome: String,
}

/// The effect rules ([`Property::EffectFencing`]) over `effects`, in the
/// order the service judged them, with the stored `logs`: a key is
/// performed at most once; no effect is performed under a token below one
/// already performed for its session (the destination's fence refuses an
/// owner that lost the session once it has seen a later one); and each
/// performed effect names a run the session's log holds under its token.
pub(super) fn check_effects(
    effects: &[EffectAttempt],
    logs: &BTreeMap<Arc<str>, Vec<StoredEvent>>,
    found: &mut Vec<Found>,
) {
    let mut push = |a: &EffectAttempt, message: String| {
        found.push(Found {
            property: Property::EffectFencing,
            session: Arc::clone(&a.session),
            at: a.at,
            seqs: a.run_id.into_iter().collect(),
            requests: Vec::new(),
            message,
        });
    };
    let runs: HashMap<(&str, u64), Option<u64>> = logs
        .iter()
        .flat_map(|(session, log)| {
            log.iter()
                .filter(|e| kind(&e.payload) == "run_started")
                .map(move |e| ((&**session, e.seq), e.token))
        })
        .collect();
    let mut performed: HashMap<&str, Duration> = HashMap::new();
    let mut highest: HashMap<&str, (u64, Duration)> = HashMap::new();
    for a in effects.iter().filter(|a| a.performed) {
        // Without a key only the token is checked, by the destination too.
        if let Some(first) = performed.insert(&a.key, a.at).filter(|_| !a.key.is_empty()) {
            push(
                a,
                format!(
                    "effect key {:?} performed twice: at {:.3} ms and again at {:.3} ms",
                    a.key,
                    ms(first),
                    ms(a.at)
                ),
            );
        }
        let high = highest.entry(&a.session).or_insert((a.token, a.at));
        if a.token < high.0 {
            push(
                a,
                format!(
                    "effect {:?} performed under token {} at {:.3} ms, after an effect \
                     of token {} at {:.3} ms: an owner that lost {} acted for it",
                    a.key,
                    a.token,
                    ms(a.at),
                    high.0,
                    ms(high.1),
                    a.session
                ),
            );
        } else {
            *high = (a.token, a.at);
        }
        let stored = a
            .run_id
            .and_then(|run| runs.get(&(&*a.session, run)).copied());
        if stored != Some(Some(a.token)) {
            push(
                a,
                format!(
                    "effect {:?} performed for run {:?} under token {}, but the log of {} \
                     holds {}",
                    a.key,
                    a.run_id,
                    a.token,
                    a.session,
                    match stored {
                        None => "no such run".to_owned(),
                        Some(t) => format!("that run under token {t:?}"),
                    }
                ),
            );
        }
    }
}

/// Effects of the violation's session shown around it.
const CONTEXT_EFFECTS: usize = 8;

/// For an effect-fencing violation `v`, the effects of its session judged
/// nearest to it, in the order they were judged, the one at its moment
/// marked `>>`.
pub(super) fn write_context(text: &mut String, effects: &[EffectAttempt], v: &Found) {
    if v.property != Property::EffectFencing {
        return;
    }
    let mut near: Vec<(usize, &EffectAttempt)> = effects
        .iter()
        .enumerate()
        .filter(|(_, a)| a.session == v.session)
        .collect();
    near.sort_by_key(|(i, a)| (a.at.abs_diff(v.at), *i));
    near.truncate(CONTEXT_EFFECTS);
    near.sort_by_key(|(i, _)| *i);
    let _ = writeln!(text, "effects of {} around it:", v.session);
    for (_, a) in near {
        let mark = if a.at == v.at { ">>" } else { "  " };
        let _ = writeln!(
            text,
            "{mark} {:>10.3}ms token {:<5} run {:<6} {:<12} {}",
            ms(a.at),
            a.token,
            a.run_id.map_or("-".into(), |r| r.to_string()),
            a.outcome,
            a.key
        );
    }
}
