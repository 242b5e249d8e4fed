//! The cases. Each is a public `async fn(&impl LeaseFactory)` that panics
//! with a message naming the broken rule; [`suite!`](crate::suite) turns
//! every one into a test.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lease_port::{FencingToken, Lease, LeaseErrorKind, SessionLease};
use tokio::sync::Barrier;

use crate::LeaseFactory;
use crate::support::{check_grant, must, must_be_held, must_renew, owner, past_expiry, session};
use crate::timing::advance;

/// Rule 1: a free lease is granted, and the grant describes the request.
pub async fn acquire_free<F: LeaseFactory>(f: &F) {
    let c = f.client().await;
    let (s, a) = (session("acquire"), owner("a"));
    let lease = must("acquire a free lease", c.acquire(&s, &a).await);
    check_grant(f, "acquire a free lease", &lease, &s, &a);
}

/// Rule 1: the live holder may acquire again, from any client; the token is
/// kept or raised, the expiry does not move back, and others stay out.
pub async fn reacquire_same_owner<F: LeaseFactory>(f: &F) {
    let (c1, c2) = (f.client().await, f.client().await);
    let (s, a, b) = (session("reacquire"), owner("a"), owner("b"));
    let first = must("first acquire", c1.acquire(&s, &a).await);
    advance(f, f.ttl() / 4).await;
    let again = must("same owner re-acquires", c2.acquire(&s, &a).await);
    check_grant(f, "same owner re-acquires", &again, &s, &a);
    assert!(
        again.token() >= first.token(),
        "re-acquisition lowered the token: {first:?} then {again:?}"
    );
    assert!(
        again.expiry() >= first.expiry(),
        "re-acquisition moved the expiry back"
    );
    must_be_held(
        "another owner while held",
        c1.acquire(&s, &b).await,
        Some(&a),
    );
}

/// Rule 3: renew keeps the token and moves the expiry later; an older value
/// of the same grant still renews.
pub async fn renew_extends<F: LeaseFactory>(f: &F) {
    let (c, other) = (f.client().await, f.client().await);
    let (s, a, b) = (session("renew"), owner("a"), owner("b"));
    let lease = must("acquire", c.acquire(&s, &a).await);
    advance(f, f.ttl() / 2).await;
    let renewed = must_renew(f, "renew the live lease", &lease, c.renew(&lease).await);
    check_grant(f, "renew the live lease", &renewed, &s, &a);
    assert_eq!(renewed.token(), lease.token(), "renew changed the token");
    assert!(
        renewed.expiry() > lease.expiry(),
        "renew did not move the expiry later"
    );
    // Past the first grant's expiry, but within the renewed one.
    advance(f, f.ttl() * 3 / 5).await;
    must_be_held(
        "another owner after the renewal",
        other.acquire(&s, &b).await,
        Some(&a),
    );
    let again = must_renew(
        f,
        "renew an older value of the grant",
        &lease,
        c.renew(&lease).await,
    );
    assert_eq!(again.token(), lease.token());
}

/// Rule 4: release frees the session at once; the next owner gets a higher
/// token.
pub async fn release_frees<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, a, b) = (session("release"), owner("a"), owner("b"));
    let la = must("a acquires", ca.acquire(&s, &a).await);
    must("a releases", ca.release(&la).await);
    let lb = must(
        "b acquires right after the release",
        cb.acquire(&s, &b).await,
    );
    assert!(
        lb.token() > la.token(),
        "token did not rise after release: {la:?} then {lb:?}"
    );
    must_be_held("renew of the released lease", ca.renew(&la).await, Some(&b));
}

/// Rule 4: release is idempotent and never removes a hold that is not the
/// caller's.
pub async fn release_idempotent<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, a, b) = (session("idem"), owner("a"), owner("b"));
    let la = must("a acquires", ca.acquire(&s, &a).await);
    must("first release", ca.release(&la).await);
    must("second release", ca.release(&la).await);

    let never = Lease::new(
        session("never"),
        a.clone(),
        FencingToken::new(7),
        la.expiry(),
    );
    must("release of a lease never issued", ca.release(&never).await);

    let lb = must("b acquires", cb.acquire(&s, &b).await);
    for forged in [
        Lease::new(
            s.clone(),
            b.clone(),
            FencingToken::new(lb.token().get() + 1000),
            lb.expiry(),
        ),
        Lease::new(s.clone(), b.clone(), FencingToken::new(0), lb.expiry()),
        Lease::new(s.clone(), a.clone(), lb.token(), lb.expiry()),
    ] {
        must(
            "release under another token or owner",
            ca.release(&forged).await,
        );
    }
    must_be_held(
        "a after releases that were not b's",
        ca.acquire(&s, &a).await,
        Some(&b),
    );
    must_renew(f, "b still renews", &lb, cb.renew(&lb).await);
}

/// Rules 1–2: a lease is live until its expiry and free after it; the
/// takeover raises the token.
pub async fn expiry<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, a, b) = (session("expiry"), owner("a"), owner("b"));
    let la = must("a acquires", ca.acquire(&s, &a).await);
    advance(f, f.ttl() / 2).await;
    must_be_held("b before expiry", cb.acquire(&s, &b).await, Some(&a));
    advance(f, past_expiry(f)).await;
    let lb = must("b after expiry", cb.acquire(&s, &b).await);
    check_grant(f, "b after expiry", &lb, &s, &b);
    assert!(
        lb.token() > la.token(),
        "takeover after expiry kept the token"
    );
}

/// Rule 2–3: after a takeover the old holder cannot renew nor re-acquire.
pub async fn takeover<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, a, b) = (session("takeover"), owner("a"), owner("b"));
    let la = must("a acquires", ca.acquire(&s, &a).await);
    advance(f, past_expiry(f)).await;
    let lb = must("b takes over", cb.acquire(&s, &b).await);
    assert!(lb.token() > la.token(), "takeover did not raise the token");
    must_be_held("a renews after takeover", ca.renew(&la).await, Some(&b));
    must_be_held(
        "a re-acquires after takeover",
        ca.acquire(&s, &a).await,
        Some(&b),
    );
    let lb2 = must_renew(f, "b renews", &lb, cb.renew(&lb).await);
    assert_eq!(lb2.token(), lb.token());
}

/// Rule 2: tokens rise strictly over many takeovers, by release and by
/// expiry, alternating owners and clients — and across a restart when the
/// backend can restart.
pub async fn monotonic_tokens<F: LeaseFactory>(f: &F) {
    let s = session("mono");
    let owners = [owner("a"), owner("b"), owner("c")];
    let mut last: Option<Lease> = None;
    let mut clients = Vec::new();
    for _ in 0..owners.len() {
        clients.push(f.client().await);
    }
    for round in 0..24 {
        let i = round % owners.len();
        let lease = must(
            &format!("round {round}: acquire"),
            clients[i].acquire(&s, &owners[i]).await,
        );
        if let Some(prev) = &last {
            assert!(
                lease.token() > prev.token(),
                "round {round}: token {} not above {}",
                lease.token(),
                prev.token()
            );
        }
        // Every sixth round the holder just stops: the next round is a
        // takeover by expiry rather than after a release.
        if round % 6 == 5 {
            advance(f, past_expiry(f)).await;
        } else {
            must("release", clients[i].release(&lease).await);
        }
        last = Some(lease);
    }
    if !f.capabilities().restart {
        return;
    }
    let before = last.expect("24 rounds ran");
    let held = must(
        "acquire before restart",
        clients[0].acquire(&s, &owners[0]).await,
    );
    assert!(held.token() > before.token());
    drop(clients);
    f.restart().await;
    let c = f.client().await;
    must_be_held(
        "a live lease survives a restart",
        c.acquire(&s, &owners[1]).await,
        Some(&owners[0]),
    );
    must("release after restart", c.release(&held).await);
    let after = must("acquire after restart", c.acquire(&s, &owners[1]).await);
    assert!(
        after.token() > held.token(),
        "token went back across a restart: {held:?} then {after:?}"
    );
}

/// Rule 3: once lost — by release or by takeover — renew is `Held`.
pub async fn renew_after_loss<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, a, b) = (session("loss"), owner("a"), owner("b"));
    let la = must("a acquires", ca.acquire(&s, &a).await);
    must("a releases", ca.release(&la).await);
    must_be_held("renew after own release", ca.renew(&la).await, None);

    let la = must("a acquires again", ca.acquire(&s, &a).await);
    advance(f, past_expiry(f)).await;
    let lb = must("b takes over", cb.acquire(&s, &b).await);
    must_be_held("renew after takeover", ca.renew(&la).await, Some(&b));
    // The stale holder renewing must not have disturbed the new one.
    must_renew(f, "b renews", &lb, cb.renew(&lb).await);
    must_be_held("a still out", ca.acquire(&s, &a).await, Some(&b));
}

/// Rule 4: a late release by the old holder leaves the new holder's lease
/// intact.
pub async fn stale_release_after_takeover<F: LeaseFactory>(f: &F) {
    let (ca, cb, cc) = (f.client().await, f.client().await, f.client().await);
    let (s, a, b, c) = (session("stale"), owner("a"), owner("b"), owner("c"));
    let la = must("a acquires", ca.acquire(&s, &a).await);
    advance(f, past_expiry(f)).await;
    let lb = must("b takes over", cb.acquire(&s, &b).await);
    must("a's stale release", ca.release(&la).await);
    must_be_held(
        "c after the stale release",
        cc.acquire(&s, &c).await,
        Some(&b),
    );
    let lb2 = must_renew(
        f,
        "b renews after the stale release",
        &lb,
        cb.renew(&lb).await,
    );
    assert_eq!(lb2.token(), lb.token());
}

/// Rule 5: sessions are independent — holding, releasing, expiring or
/// forging one never affects another, including ids that an unsafe encoding
/// would merge.
pub async fn session_isolation<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (a, b) = (owner("a"), owner("b"));
    let base = session("iso");
    let variants = [
        base.to_string(),
        format!("{base}/x"),
        format!("{base}%2fx"),
        format!("{base}_2fx"),
        format!("{base}/../x"),
        base.as_str().to_uppercase(),
        format!("{base} ☕"),
        format!(
            "{base}{}",
            "y".repeat(lease_port::MAX_ID_LEN - base.as_str().len())
        ),
        format!(
            "{base}{}z",
            "y".repeat(lease_port::MAX_ID_LEN - base.as_str().len() - 1)
        ),
    ];
    let ids: Vec<_> = variants
        .iter()
        .map(|v| lease_port::SessionId::new(v).expect("variant ids are valid"))
        .collect();
    let mut held = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (c, o) = if i % 2 == 0 { (&ca, &a) } else { (&cb, &b) };
        held.push(must(&format!("acquire {id:?}"), c.acquire(id, o).await));
    }
    // Releasing every odd one frees exactly those.
    for (i, lease) in held.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        must(&format!("release #{i}"), cb.release(lease).await);
    }
    let mut retaken = BTreeMap::new();
    for (i, id) in ids.iter().enumerate() {
        if i % 2 == 1 {
            let l = must(&format!("a takes freed {id:?}"), ca.acquire(id, &a).await);
            retaken.insert(i, l);
        } else {
            must_be_held(
                &format!("b on held {id:?}"),
                cb.acquire(id, &b).await,
                Some(&a),
            );
        }
    }
    // A lease value for one session never renews another (unless its token
    // happens to be that session's own current token).
    let crossed = Lease::new(ids[1].clone(), a.clone(), held[0].token(), held[0].expiry());
    if retaken[&1].token() != held[0].token() {
        must_be_held(
            "renew with a token issued for another session",
            ca.renew(&crossed).await,
            Some(&a),
        );
    }
}

/// Rule 6: many clients racing for one session — exactly one wins each
/// round, and the winners' tokens rise.
pub async fn concurrent_race<F: LeaseFactory>(f: &F) {
    const RACERS: usize = 8;
    const ROUNDS: usize = 12;
    let s = session("race");
    let mut clients = Vec::new();
    for _ in 0..RACERS {
        clients.push(Arc::new(f.client().await));
    }
    let mut last_token: Option<FencingToken> = None;
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for (i, c) in clients.iter().enumerate() {
            let (c, s, barrier) = (Arc::clone(c), s.clone(), Arc::clone(&barrier));
            let o = owner(&format!("racer-{i}"));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                (i, c.acquire(&s, &o).await)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            let (i, r) = t.await.expect("racer task panicked");
            match r {
                Ok(lease) => winners.push((i, lease)),
                Err(e) if e.kind() == lease_port::LeaseErrorKind::Held => {}
                Err(e) => panic!("round {round}: racer {i} failed with {e:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} winners: {winners:?}",
            winners.len()
        );
        let (i, lease) = winners.remove(0);
        if let Some(t) = last_token {
            assert!(lease.token() > t, "round {round}: token did not rise");
        }
        last_token = Some(lease.token());
        must("winner releases", clients[i].release(&lease).await);
    }
}

/// Rule 6: tasks looping acquire/hold/release over a few sessions never
/// overlap their holds, and each session's successive holders see rising
/// tokens.
pub async fn concurrent_exclusion<F: LeaseFactory>(f: &F) {
    const WORKERS: usize = 6;
    const ITERATIONS: usize = 40;
    let sessions: Vec<_> = (0..2).map(|i| session(&format!("excl{i}"))).collect();
    let clock = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let c = f.client().await;
        let (sessions, clock) = (sessions.clone(), Arc::clone(&clock));
        tasks.push(tokio::spawn(async move {
            let o = owner(&format!("worker-{w}"));
            let mut holds = Vec::new();
            for it in 0..ITERATIONS {
                let idx = (w + it) % sessions.len();
                match c.acquire(&sessions[idx], &o).await {
                    Ok(lease) => {
                        let start = clock.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        let end = clock.fetch_add(1, Ordering::SeqCst);
                        c.release(&lease)
                            .await
                            .map_err(|e| format!("release: {e:?}"))?;
                        holds.push((idx, start, end, lease.token(), w));
                    }
                    Err(e) if e.kind() == lease_port::LeaseErrorKind::Held => {}
                    Err(e) => return Err(format!("acquire: {e:?}")),
                }
                tokio::task::yield_now().await;
            }
            Ok::<_, String>(holds)
        }));
    }
    let mut by_session: BTreeMap<usize, Vec<(u64, u64, FencingToken, usize)>> = BTreeMap::new();
    for t in tasks {
        for (idx, start, end, token, w) in t.await.expect("worker panicked").expect("worker failed")
        {
            by_session
                .entry(idx)
                .or_default()
                .push((start, end, token, w));
        }
    }
    assert!(
        !by_session.is_empty(),
        "no worker ever acquired: the race checked nothing"
    );
    for (idx, mut holds) in by_session {
        holds.sort();
        for pair in holds.windows(2) {
            let ((s1, e1, t1, w1), (s2, _, t2, w2)) = (pair[0], pair[1]);
            assert!(
                e1 < s2,
                "session {idx}: worker {w1} held [{s1},{e1}] while worker {w2} acquired at {s2}"
            );
            assert!(t2 > t1, "session {idx}: token {t2} after {t1} did not rise");
        }
    }
}

/// Bad input: lease values the backend never issued, with extreme tokens
/// and expiries, are answered by the contract (`Held` on renew, `Ok` on
/// release), never by a panic or a changed hold.
pub async fn invalid_input<F: LeaseFactory>(f: &F) {
    let c = f.client().await;
    let (s, a, b) = (session("bad"), owner("a"), owner("b"));
    let unknown = session("unknown");
    let far = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 40);
    for (token, expiry) in [
        (0, std::time::SystemTime::UNIX_EPOCH),
        (u64::MAX, far),
        (1, f.now()),
    ] {
        let forged = Lease::new(unknown.clone(), a.clone(), FencingToken::new(token), expiry);
        must_be_held(
            "renew of a never-issued lease",
            c.renew(&forged).await,
            None,
        );
        must("release of a never-issued lease", c.release(&forged).await);
    }
    let held = must("a acquires", c.acquire(&s, &a).await);
    for token in [0, held.token().get().wrapping_add(1), u64::MAX] {
        let forged = Lease::new(s.clone(), a.clone(), FencingToken::new(token), far);
        must_be_held(
            "renew under a forged token",
            c.renew(&forged).await,
            Some(&a),
        );
        must("release under a forged token", c.release(&forged).await);
    }
    must_be_held("b after the forgeries", c.acquire(&s, &b).await, Some(&a));
    let renewed = must_renew(
        f,
        "a renews after the forgeries",
        &held,
        c.renew(&held).await,
    );
    assert_eq!(renewed.token(), held.token());
    assert!(
        renewed.expiry() < far,
        "renew trusted the expiry carried by the caller"
    );
}

pub use crate::model::model_check;

/// Tokens compare only within one authority: every client of one store
/// names the same [`AuthorityId`](lease_port::AuthorityId), before and after
/// a restart, so a store can check that every token it is shown comes from
/// the sequence that fences it.
pub async fn authority_stable<F: LeaseFactory>(f: &F) {
    let (c1, c2) = (f.client().await, f.client().await);
    let first = must("authority of one client", c1.authority().await);
    let second = must("authority of another client", c2.authority().await);
    assert_eq!(
        first, second,
        "two clients of one store name different authorities"
    );
    assert_eq!(
        must("authority asked again", c1.authority().await),
        first,
        "a client's authority changed between calls"
    );
    if f.capabilities().restart {
        drop((c1, c2));
        f.restart().await;
        let after = must(
            "authority after a restart",
            f.client().await.authority().await,
        );
        assert_eq!(after, first, "the authority changed across a restart");
    }
}

/// Batch renewal answers one result per lease, in the order given, each by
/// the rules of a single renew: live leases keep their token and move their
/// expiry, a lost lease is `Held` without failing its neighbours, and an
/// empty batch is no error.
pub async fn renew_many<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (a, b) = (owner("a"), owner("b"));
    assert!(
        ca.renew_many(&[]).await.is_empty(),
        "an empty batch answered something"
    );
    let sessions: Vec<_> = (0..5).map(|i| session(&format!("batch-{i}"))).collect();
    let mut held = Vec::new();
    for s in &sessions {
        held.push(must("acquire for the batch", ca.acquire(s, &a).await));
    }
    // The middle lease is taken over (released, then acquired by b) so the
    // batch mixes live leases with a lost one.
    must("release the middle lease", ca.release(&held[2]).await);
    let taken = must(
        "b takes the middle session",
        cb.acquire(&sessions[2], &b).await,
    );
    advance(f, f.ttl() / 2).await;
    // Out of acquisition order, to catch answers matched by position in
    // some other list.
    let batch: Vec<Lease> = [4, 2, 0, 3, 1].iter().map(|&i| held[i].clone()).collect();
    let answers = ca.renew_many(&batch).await;
    assert_eq!(answers.len(), batch.len(), "one answer per lease");
    for (lease, answer) in batch.iter().zip(answers) {
        if lease.session_id() == &sessions[2] {
            must_be_held("the lost lease in a batch", answer, Some(&b));
            continue;
        }
        let renewed = must("a live lease in a batch", answer);
        check_grant(
            f,
            "a live lease in a batch",
            &renewed,
            lease.session_id(),
            &a,
        );
        assert_eq!(
            renewed.token(),
            lease.token(),
            "batch renewal changed a token"
        );
        assert!(
            renewed.expiry() > lease.expiry(),
            "batch renewal did not move {}'s expiry later",
            lease.session_id()
        );
    }
    // Past the first grants' expiry: the batch, not the acquire, keeps
    // a's sessions; b's session was never disturbed.
    advance(f, f.ttl() * 3 / 5).await;
    must_be_held(
        "b after the batch",
        cb.acquire(&sessions[0], &b).await,
        Some(&a),
    );
    must_renew(
        f,
        "b renews the session it took",
        &taken,
        cb.renew(&taken).await,
    );
}

/// `current` (optional: `Unsupported` passes) reports the live holder
/// only: nothing while free, the holder's owner and token while held and
/// after a renewal, nothing once released or expired, and one session's
/// hold never shows on another.
pub async fn current_reports_the_live_holder<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, other, a, b) = (
        session("current"),
        session("current-other"),
        owner("a"),
        owner("b"),
    );
    match cb.current(&s).await {
        Err(e) if e.kind() == LeaseErrorKind::Unsupported => return,
        r => assert_eq!(
            must("current of a free session", r),
            None,
            "a session never leased is reported held"
        ),
    }
    let la = must("a acquires", ca.acquire(&s, &a).await);
    let seen = check_current(f, "after the acquire", cb.current(&s).await, &la);
    assert_eq!(
        must("current of another session", cb.current(&other).await),
        None,
        "one session's hold is reported on another"
    );
    let lo = must("b acquires another session", cb.acquire(&other, &b).await);
    check_current(
        f,
        "while another session is taken",
        cb.current(&s).await,
        &la,
    );

    advance(f, f.ttl() / 2).await;
    let renewed = must_renew(f, "a renews", &la, ca.renew(&la).await);
    let after = check_current(f, "after the renewal", cb.current(&s).await, &renewed);
    assert!(
        after.expiry() > seen.expiry(),
        "the renewal did not move the reported expiry later: {seen:?} then {after:?}"
    );

    must("a releases", ca.release(&renewed).await);
    assert_eq!(
        must("current after the release", cb.current(&s).await),
        None,
        "a released lease is reported held"
    );
    check_current(
        f,
        "another session after the release",
        ca.current(&other).await,
        &lo,
    );

    must("a acquires again", ca.acquire(&s, &a).await);
    advance(f, past_expiry(f)).await;
    assert_eq!(
        must("current after the expiry", cb.current(&s).await),
        None,
        "an expired lease is reported held"
    );
}

/// Checks that `current` reported the live `held`, and returns the report.
#[track_caller]
fn check_current<F: LeaseFactory>(
    f: &F,
    step: &str,
    reported: Result<Option<Lease>, lease_port::LeaseError>,
    held: &Lease,
) -> Lease {
    let Some(lease) = must(&format!("current {step}"), reported) else {
        panic!("current {step}: a live lease ({held:?}) is reported free");
    };
    assert_eq!(
        lease.session_id(),
        held.session_id(),
        "{step}: wrong session"
    );
    assert_eq!(lease.owner(), held.owner(), "{step}: wrong holder");
    assert_eq!(lease.token(), held.token(), "{step}: wrong token");
    let now = f.now();
    assert!(
        lease.expiry() > now,
        "{step}: a live lease is reported with an expiry {:?} not after now {now:?}",
        lease.expiry()
    );
    // Backends may count the reported expiry from when they were asked
    // (a little later than the grant) or round it to whole seconds.
    assert!(
        lease.expiry() <= held.expiry() + Duration::from_secs(1),
        "{step}: reported expiry {:?} is later than the holder's {:?} by more than a second",
        lease.expiry(),
        held.expiry()
    );
    lease
}

/// Token continuity: an acquire above a floor (a store's high-water mark)
/// gets a token above it, and the floor holds for every later takeover.
/// A backend that cannot raise its tokens answers `Rewound` instead, and
/// leaves the session free. The live holder asking above its own token
/// gets a greater one and keeps the session. A floor above
/// [`FencingToken::MAX_FLOOR`] is `Invalid` and grants nothing.
pub async fn acquire_above_floor<F: LeaseFactory>(f: &F) {
    let (ca, cb) = (f.client().await, f.client().await);
    let (s, a, b) = (session("floor"), owner("a"), owner("b"));
    // A floor no store's mark comes near would use the session's tokens
    // up for good: refused, and nothing is held.
    let beyond = FencingToken::new(FencingToken::MAX_FLOOR.get() + 1);
    match cb.acquire_above(&s, &b, beyond).await {
        Err(e) if e.kind() == LeaseErrorKind::Invalid => {}
        other => panic!("acquire above {beyond}: {other:?}, not Invalid"),
    }
    let first = must("a acquires", ca.acquire(&s, &a).await);
    must("a releases", ca.release(&first).await);
    // A floor below what the backend would issue anyway changes nothing.
    let low = must(
        "b acquires above the last token",
        cb.acquire_above(&s, &b, first.token()).await,
    );
    assert!(low.token() > first.token(), "{low:?} not above {first:?}");

    let floor = FencingToken::new(low.token().get() + 1000);
    let raised = match cb.acquire_above(&s, &b, floor).await {
        Ok(raised) => raised,
        Err(e) if e.kind() == LeaseErrorKind::Rewound => {
            // Cannot raise: the session must not be left held by a grant
            // nobody may use.
            must("b releases", cb.release(&low).await);
            let next = must("a acquires after the refusal", ca.acquire(&s, &a).await);
            assert!(next.token() > low.token());
            return;
        }
        Err(e) => panic!("acquire above {floor}: {e}"),
    };
    assert!(
        raised.token() > floor,
        "the live holder asked above {floor} and got {raised:?}"
    );
    check_grant(f, "raised", &raised, &s, &b);
    must_be_held(
        "a acquires while b holds",
        ca.acquire(&s, &a).await,
        Some(&b),
    );
    must("b releases", cb.release(&raised).await);
    let next = must("a acquires after the raise", ca.acquire(&s, &a).await);
    assert!(
        next.token() > raised.token(),
        "the floor was not kept: {next:?} after {raised:?}"
    );
    advance(f, past_expiry(f)).await;
    let later = must("b takes over by expiry", cb.acquire(&s, &b).await);
    assert!(later.token() > next.token(), "{later:?} after {next:?}");
}
