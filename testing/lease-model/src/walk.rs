//! Random paths through the model, and the two verdicts on each: the
//! model's properties along the path, and `lease-history`'s checker on the
//! history of it.

use std::fmt;

use lease_history::{Property, Verdict, check};
use stateright::Model;

use crate::system::{Action, LeaseSystem, State, one_owner_per_token, single_holder, store_fenced};

/// A path of at most `max_steps` steps from the model's initial state,
/// each step chosen by a generator seeded with `seed`: the same seed gives
/// the same path.
pub fn random_path(
    model: &LeaseSystem,
    seed: u64,
    max_steps: usize,
) -> Vec<(State, Option<Action>)> {
    // xorshift64*: enough spread for choosing among a few actions, and
    // nothing outside the seed decides.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut state = model.init_states().remove(0);
    let mut steps = Vec::new();
    let mut actions = Vec::new();
    for _ in 0..max_steps {
        actions.clear();
        model.actions(&state, &mut actions);
        if actions.is_empty() {
            break;
        }
        let pick = usize::try_from(next() % actions.len() as u64).unwrap_or(0);
        let action = actions.swap_remove(pick);
        let Some(after) = model.next_state(&state, action.clone()) else {
            continue;
        };
        steps.push((state, Some(action)));
        state = after;
    }
    steps.push((state, None));
    steps
}

/// What the model and the checker said of one path.
#[derive(Debug)]
pub struct Agreement {
    /// Some state of the path has two processes counting on one lease.
    pub model_single_holder_broken: bool,
    /// Some state of the path has one token granted to two owners.
    pub model_token_owner_broken: bool,
    /// The store's log breaks the fence at the end of the path.
    pub model_fencing_broken: bool,
    /// The checker's verdict on the path's history.
    pub verdict: Verdict,
}

impl Agreement {
    /// Whether the two agree: on a single holder and on the store's fence
    /// both ways; and where the checker finds tokens out of order, the
    /// model has granted one token to two owners. (The converse does not
    /// hold: the model sees a token granted to an owner who never heard of
    /// it, and the checker judges what clients were told.)
    pub fn agrees(&self) -> bool {
        let found = |p| self.verdict.violations.contains_key(&p);
        self.model_single_holder_broken == found(Property::SingleHolder)
            && self.model_fencing_broken == found(Property::StoreFencing)
            && (!found(Property::TokenOrder) || self.model_token_owner_broken)
    }
}

impl fmt::Display for Agreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "model: single holder broken {}, one owner per token broken {}, fencing broken {}",
            self.model_single_holder_broken,
            self.model_token_owner_broken,
            self.model_fencing_broken
        )?;
        write!(f, "checker: {}", self.verdict)
    }
}

/// Both verdicts on `steps`.
pub fn judge(steps: &[(State, Option<Action>)]) -> Agreement {
    let states = || steps.iter().map(|(s, _)| s);
    Agreement {
        model_single_holder_broken: states().any(|s| !single_holder(s)),
        model_token_owner_broken: states().any(|s| !one_owner_per_token(s)),
        model_fencing_broken: states().any(|s| !store_fenced(s)),
        verdict: check(&crate::history_of(steps)),
    }
}
